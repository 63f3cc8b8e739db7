"""Training an OCM covariance head on a frozen denoiser (Ou et al., ICLR 2025: regression onto a Hutchinson
estimate of the denoiser's Jacobian diagonal; docs/methods/ocm.md, "OCM objective"), with atomic checkpoints and
exact resume (docs/methods/conventions.md, "Errors").

Per step: ``x0`` from the data, ``sigma`` from :func:`draw_training_sigmas`, ``x = x0 + sigma eps``; one forward pass of
the frozen denoiser (in eval mode: the official trainer leaves the backbone in train mode, so dropout leaks into its
targets; "Where steerdiff differs") gives ``D`` and, for a trunk head, the features; ``n_probes`` vector-Jacobian
products give the Hutchinson target; the loss is ``sum_i (head_i - target_i)^2`` averaged over the batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..core.denoiser import NULL, append_dims
from ..core.sigmas import VP_TRAIN_STEPS, vp_linear_table
from ..io import (
    CheckpointError,
    atomic_dir,
    flatten_optimizer_state,
    load_state_strict,
    load_tensors,
    read_json,
    save_tensors,
    unflatten_optimizer_state,
    write_json,
)
from ..models.io import model_spec
from ..models.ocm_heads import InputHead, OCMHead, regression_output, unet_trunk_head
from ..train.config import cosine_lr
from .target import hutchinson_diag, ocm_target


@dataclass
class OCMTrainResult:
    """A trained head with its loss curve (mean loss per logged window), steps done and wall time."""

    head: OCMHead
    losses: list[float] = field(default_factory=list)
    steps: int = 0
    wall_time: float = 0.0


def draw_training_sigmas(
    n: int, generator: torch.Generator | None = None, mode: str = "mixed", n_train: int = VP_TRAIN_STEPS,
    sigma_max: float | None = None,
) -> Tensor:
    """Training noise levels ``[n]`` float64 (docs/methods/ocm.md, "Training noise levels").

    ``mode="vp_index"``: uniform over the VP-linear indices 1..N (the official code). ``mode="mixed"``
    (steerdiff): the first half from that, the second half log-uniform on ``[sigma_1, sigma_N]``.
    ``sigma_max`` (steerdiff option, default None = ``sigma_N``) truncates both parts to ``sigma <= sigma_max``.
    """
    table = vp_linear_table(n_train)
    if mode not in ("mixed", "vp_index"):
        raise ValueError(f"mode must be 'mixed' or 'vp_index', got {mode!r}")
    if sigma_max is not None:
        if not sigma_max > table[0]:
            raise ValueError(f"sigma_max must exceed sigma_1={float(table[0]):.4g}, got {sigma_max}")
        table = table[table <= sigma_max]
    idx = torch.randint(0, table.numel(), (n,), generator=generator)
    sig = table[idx]
    if mode == "mixed":
        m = n // 2
        lo, hi = math.log(float(table[0])), math.log(float(sigma_max) if sigma_max is not None else float(table[-1]))
        u = torch.rand(n - m, generator=generator, dtype=torch.float64)
        sig = torch.cat([sig[:m], (lo + u * (hi - lo)).exp()])
    return sig


def default_head(denoiser, sample_shape: tuple[int, ...], param: str = "direct",
                 data_range: tuple[float, float] | None = None) -> OCMHead:
    """A trunk head for an ``EDMPrecond(UNet)``, otherwise an :class:`InputHead` on the flattened data."""
    net = getattr(denoiser, "net", None)
    if isinstance(denoiser, nn.Module) and isinstance(getattr(net, "norm_out", None), nn.GroupNorm):
        return unet_trunk_head(denoiser, param=param, data_range=data_range)
    dim = 1
    for s in sample_shape:
        dim *= int(s)
    return InputHead(dim, param=param, sigma_data=float(getattr(denoiser, "sigma_data", 1.0)), data_range=data_range)


class _Data:
    """Uniform access to a tensor of examples (with optional labels) or a sampler with ``.sample(n, generator)``."""

    def __init__(self, data, labels: Tensor | None):
        if isinstance(data, Tensor):
            if data.ndim < 2 or data.shape[0] < 1 or not data.is_floating_point():
                raise ValueError(f"data must be a float tensor [N, *shape] with N >= 1, got {tuple(data.shape)}")
            if labels is not None and (labels.shape[0] != data.shape[0] or labels.dtype.is_floating_point):
                raise ValueError(f"labels must be an integer tensor with {data.shape[0]} rows (one per example)")
            self.x, self.labels, self.sampler = data, labels, None
            self.shape = tuple(data.shape[1:])
        elif hasattr(data, "sample") and callable(data.sample):
            if labels is not None:
                raise ValueError("labels can only be given with a tensor of examples")
            self.x, self.labels, self.sampler = None, None, data
            self.shape = tuple(data.sample(1).shape[1:])
        else:
            raise TypeError(f"data must be a tensor [N, *shape] or have .sample(n, generator=...); got {type(data)}")

    def draw(self, n: int, g: torch.Generator) -> tuple[Tensor, Tensor | None]:
        if self.sampler is not None:
            return self.sampler.sample(n, generator=g).float(), None
        idx = torch.randint(0, self.x.shape[0], (n,), generator=g)
        return self.x[idx].float(), None if self.labels is None else self.labels[idx]


def _save_checkpoint(path: Path, head: OCMHead, opt: torch.optim.Optimizer, gen: torch.Generator, step: int,
                     losses: list[float], window: list[float]) -> None:
    opt_tensors, opt_meta = flatten_optimizer_state(opt.state_dict(), prefix="opt")
    tensors = {**{f"head.{k}": v for k, v in head.state_dict().items()}, **opt_tensors, "rng": gen.get_state()}
    with atomic_dir(path) as tmp:
        save_tensors(tensors, tmp / "state.safetensors")
        write_json(tmp / "progress.json", {"step": step, "losses": losses, "window": window,
                                           "head": model_spec(head), "optimizer": opt_meta})


def _load_checkpoint(path: Path, head: OCMHead, opt: torch.optim.Optimizer, gen: torch.Generator):
    meta = read_json(path / "progress.json")
    if meta.get("head") != model_spec(head):
        raise CheckpointError(f"{path}: checkpoint was written for a different head config: {meta.get('head')}")
    if "optimizer" not in meta:
        raise CheckpointError(f"{path}/progress.json: missing optimizer section")
    tensors = load_tensors(path / "state.safetensors")
    load_state_strict(head, {k[5:]: v for k, v in tensors.items() if k.startswith("head.")}, str(path))
    opt_tensors = {k: v for k, v in tensors.items() if k.startswith("opt.")}
    opt.load_state_dict(unflatten_optimizer_state(opt_tensors, meta["optimizer"], prefix="opt"))
    gen.set_state(tensors["rng"])
    return int(meta["step"]), list(meta["losses"]), list(meta.get("window", []))


def train_ocm(
    denoiser,
    data,
    head: OCMHead | None = None,
    *,
    steps: int = 3000,
    batch_size: int = 512,
    lr: float = 1e-3,
    n_probes: int = 1,
    param: str = "direct",
    labels: Tensor | None = None,
    p_uncond: float = 0.0,
    sigma_mode: str = "mixed",
    sigma_max: float | None = None,
    loss_weight: str = "unit",
    lr_schedule: str = "constant",
    target: str = "ocm",
    data_range: tuple[float, float] | None = None,
    seed: int = 0,
    log_every: int = 100,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 500,
    resume: bool = False,
    callback: Callable[[dict], None] | None = None,
) -> OCMTrainResult:
    """Train a covariance head by OCM regression on a frozen denoiser (``sd.covariance.train_ocm``).

    Args:
        denoiser: ``D(x, sigma, cond)``; frozen here (``eval()``, no parameter gradients) and restored afterwards.
        data: training examples ``[N, *shape]`` or an object with ``.sample(n, generator=)`` (a mixture).
        head: the head to train; default :func:`default_head` (trunk head for a UNet, else an MLP on inputs).
        steps, batch_size, lr: Adam iterations, batch and learning rate (the mixture heads' 3000, 512, 1e-3).
        n_probes: Rademacher probes per example (the official code: 1).
        param: ``direct`` or ``hess`` for the default head (a given head keeps its own).
        labels: integer labels ``[N]`` of the examples, passed as the condition.
        p_uncond: share of labels replaced by null (``-1``), so the head also serves unconditional sampling.
        sigma_mode: ``mixed`` (steerdiff) or ``vp_index`` (official code); see ``draw_training_sigmas``.
        sigma_max: truncate the training sigmas to ``<= sigma_max`` (None: the whole grid, up to 157.4).
        loss_weight: ``unit`` (OCM's loss) or ``balanced``: each example's loss times ``sd^2 / (sigma^2 + sd^2)``,
            which evens out the Hutchinson noise of the ``direct`` target (it grows like ``sigma / sd``); a
            per-sigma weight leaves the minimiser, ``E[target | x]``, unchanged (steerdiff addition, not OCM).
        lr_schedule: ``constant`` (official code) or ``cosine`` (decay to 5% of ``lr``).
        target: ``ocm`` (the Hutchinson Jacobian diagonal) or ``npr``: the squared residual
            ``(x0 - D)^2``, whose regression minimiser is ``E[(x0 - D)^2 | x] = Cov + bias^2`` (NPR-DPM, Bao et al.,
            ICML 2022; no
            VJP, and it also covers the mean's error). The head's parameterisation maps ``c`` either way.
        data_range: ``(a, b)`` bounds of the data for the default head (sets ``c_max`` and the D clip).
        seed: seeds the generator of every draw (data, sigma, noise, probes, null labels).
        log_every: steps per loss window recorded in ``losses`` (and passed to ``callback``).
        checkpoint_dir: if given, an atomic checkpoint every ``checkpoint_every`` steps; ``resume=True`` continues
            from it exactly.

    Returns:
        :class:`OCMTrainResult` with the head in eval mode.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if loss_weight not in ("unit", "balanced"):
        raise ValueError(f"loss_weight must be 'unit' or 'balanced', got {loss_weight!r}")
    if target not in ("ocm", "npr"):
        raise ValueError(f"target must be 'ocm' or 'npr', got {target!r}")
    if lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {lr_schedule!r}")
    if not 0.0 <= p_uncond <= 1.0:
        raise ValueError(f"p_uncond must lie in [0, 1], got {p_uncond}")
    src = _Data(data, labels)
    if head is None:
        head = default_head(denoiser, src.shape, param, data_range)
    if not isinstance(head, OCMHead):
        raise TypeError(f"head must be an OCMHead (InputHead, TrunkHead), got {type(head).__name__}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(head.parameters(), lr=lr)

    def lr_at(i: int) -> float:  # a function of the step alone, so a resumed run continues the schedule exactly
        return lr if lr_schedule == "constant" else cosine_lr(lr, i, steps)

    step, losses, window = 0, [], []
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if resume and ckpt is not None and (ckpt / "progress.json").is_file():
        step, losses, window = _load_checkpoint(ckpt, head, opt, gen)

    frozen = isinstance(denoiser, nn.Module)
    if frozen:
        was_training = denoiser.training
        flags = [p.requires_grad for p in denoiser.parameters()]
        denoiser.eval().requires_grad_(False)
    head.train()
    start = time.perf_counter()
    try:
        while step < steps:
            x0, lab = src.draw(batch_size, gen)
            sigma = draw_training_sigmas(batch_size, gen, sigma_mode, sigma_max=sigma_max).to(x0.dtype)
            eps = torch.randn(x0.shape, generator=gen, dtype=x0.dtype)
            x = (x0 + append_dims(sigma, x0.ndim) * eps).requires_grad_(target == "ocm")
            cond = None
            if lab is not None:
                drop = torch.rand(batch_size, generator=gen) < p_uncond
                cond = lab.masked_fill(drop, NULL)
            with torch.set_grad_enabled(target == "ocm"), head.capture(denoiser) as store:
                denoised = denoiser(x, sigma, cond)
                if target == "ocm":
                    tau = hutchinson_diag(denoised, x, n_probes, gen)
                else:  # (x0 - D)^2 = sigma^2 tau in c units, i.e. tau = (x0 - D)^2 / sigma^2
                    tau = ((x0 - denoised.detach()) / append_dims(sigma, x0.ndim)).pow(2)
            y = ocm_target(tau, sigma, head.param, head.sigma_data)
            out = regression_output(head.raw_output(x.detach(), sigma, store["features"]), head.param)
            per = (out - y).pow(2).flatten(1).sum(1)
            if loss_weight == "balanced":
                per = per * head.sigma_data**2 / (sigma**2 + head.sigma_data**2)
            loss = per.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            opt.step()
            step += 1
            window.append(loss.item())
            if log_every and step % log_every == 0:
                losses.append(sum(window) / len(window))
                window = []
                if callback is not None:
                    callback({"step": step, "loss": losses[-1], "elapsed": time.perf_counter() - start})
            if ckpt is not None and (step % checkpoint_every == 0 or step == steps):
                _save_checkpoint(ckpt, head, opt, gen, step, losses, window)
    finally:
        if frozen:
            denoiser.train(was_training)
            for p, f in zip(denoiser.parameters(), flags, strict=True):
                p.requires_grad_(f)
    head.eval()
    return OCMTrainResult(head=head, losses=losses, steps=step, wall_time=time.perf_counter() - start)


__all__ = ["OCMTrainResult", "default_head", "train_ocm"]
