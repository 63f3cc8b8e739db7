"""Neural approximate mirror maps (Feng, Baptista, Bouman, ICLR 2025): the map-training stage of the official
``train_namm.py``; docs/methods/namm.md, "Loss", "Training defaults" and "Finetuning".

A :class:`NAMM` holds the forward map ``g`` (:mod:`steerdiff.models.icnn`), the approximate inverse ``f``
(:mod:`.inverse_net`) and the constraint distance ``l``. :func:`train_namm` trains both maps jointly with the L1 loss of
:mod:`.losses` (Adam, betas (0.5, 0.999), no clipping, non-negativity clamp after every step, EMA of both maps);
:meth:`NAMM.finetune` is the optional second stage (``g`` frozen, ``f`` trained on perturbed MDM samples).

Choices recorded (docs/methods/namm.md, "Differences from the paper and its code"): the returned maps carry the
**EMA** weights and both decoding and the mirror-space model use them (the code decodes with non-EMA inverse
weights). The EMA uses the library's warm-up ramp ``min(d, (1+n)/(10+n))``. (The official ``get_namm_step_fn``
averages the *current* parameters with the new ones, ``p_ema = p * rate + p_new * (1 - rate)``, which makes its
"EMA" the previous step's weights; we average properly.) Finetuning starts ``f`` from its EMA weights with a fresh
Adam state.
"""

from __future__ import annotations

import copy
import hashlib
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..train.config import config_from_dict, config_to_dict, cosine_lr
from ..train.ema import EMA
from .distances import check_distance
from .losses import REGULARIZERS, namm_loss, perturbation_levels

DATA_TOL = 1e-2  # train_namm.py: assert l(x) < 1e-2 on a data batch
_RECORD_KEYS = ("finetune_stages", "data_violation_fraction")  # NAMM.config entries that are records, not settings


class ConstraintWarning(UserWarning):
    """Training data violate their own constraint beyond the tolerance."""


@dataclass
class NAMMConfig:
    """NAMM map-training hyper-parameters: the paper's, with the N1 test's lr, batch and steps (docs/methods/namm.md,
    "Training defaults")."""

    steps: int = 3000
    batch_size: int = 256
    lr: float = 1e-3  # the N1 setting (the paper: 2e-4, which under-trains N1 on a CPU budget)
    betas: tuple[float, float] = (0.5, 0.999)
    lr_schedule: str = "constant"  # "constant" (the paper) or "cosine" (steerdiff option: decay to lr * 0.05)
    lam_cyc: float = 1.0
    lam_con: float = 1.0  # 1 for N1 / PDEs, 0.01-0.1 for brightness (the paper's runs; N2)
    lam_reg: float = 1e-3
    reg: str = "sparse_icnn"  # or "fwdid"
    sigma_max: float = 0.1
    fixed_sigma: bool = False
    ema_decay: float = 0.999
    seed: int = 0
    data_tol: float = DATA_TOL
    log_every: int = 100  # history entry every this many steps

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.steps < 0 or self.batch_size < 1:
            raise ValueError(f"steps must be >= 0 and batch_size >= 1, got {self.steps}, {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}")
        if self.reg not in REGULARIZERS:
            raise ValueError(f"reg must be one of {REGULARIZERS}, got {self.reg!r}")
        for name in ("lam_cyc", "lam_con", "lam_reg", "sigma_max", "data_tol"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must lie in [0, 1), got {self.ema_decay}")

    @classmethod
    def from_dict(cls, values: dict) -> NAMMConfig:
        return config_from_dict(cls, values, "NAMM config")

    def to_dict(self) -> dict:
        return config_to_dict(self)

    def lr_at(self, step: int) -> float:
        return self.lr if self.lr_schedule == "constant" else cosine_lr(self.lr, step, self.steps)


class NAMM(nn.Module):
    """A trained (or untrained) pair of maps with its constraint: ``encode = g``, ``decode = f``.

    Args:
        forward: the forward map ``g`` (:class:`~steerdiff.models.icnn.ICNNMap` or
            :class:`~steerdiff.models.icnn.ConvICNNMap`).
        inverse: the inverse map ``f`` (:class:`~.inverse_net.ResidualMLP`).
        distance: the constraint distance ``l: [B, *shape] -> [B]``.
    """

    def __init__(self, forward: nn.Module, inverse: nn.Module, distance: Callable[[Tensor], Tensor]):
        super().__init__()
        if tuple(forward.sample_shape) != tuple(inverse.sample_shape):
            raise ValueError(f"forward and inverse maps act on different shapes: {tuple(forward.sample_shape)} vs "
                             f"{tuple(inverse.sample_shape)}")
        if not callable(distance):
            raise TypeError(f"distance must be a callable [B, *shape] -> [B], got {type(distance).__name__}")
        self.forward_map, self.inverse_map, self.distance = forward, inverse, distance
        self.sample_shape = tuple(forward.sample_shape)
        self.history: list[dict] = []
        self.config: dict = {}

    def encode(self, x: Tensor) -> Tensor:
        """``g(x)``: data -> mirror space."""
        return self.forward_map(x)

    def decode(self, y: Tensor) -> Tensor:
        """``f(y)``: mirror space -> (approximately) the constraint set."""
        return self.inverse_map(y)

    def forward(self, x: Tensor) -> Tensor:  # nn.Module call = the forward map
        return self.encode(x)

    @property
    def fingerprint(self) -> str:
        """SHA-256 (first 16 hex digits) of the forward map's weights: names the mirror space a model was trained in."""
        h = hashlib.sha256()
        for k, v in sorted(self.forward_map.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().to(torch.float64).numpy().tobytes())
        return h.hexdigest()[:16]

    @torch.no_grad()
    def evaluate(self, x: Tensor, sigma: float | None = None, seed: int = 0) -> dict[str, float]:
        """Held-out diagnostics: cycle error ``mean|f(g(x)) - x|``, ``mean l(f(g(x)))``, ``mean l(f(g(x) + σ z))``
        (the pre-check before the MDM is trained, ``σ`` default the training ``sigma_max``) and ``mean l(x)``."""
        sigma = self.config.get("sigma_max", 0.1) if sigma is None else sigma
        xt = self.encode(x)
        z = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
        return {"cycle_error": float((self.decode(xt) - x).abs().mean()),
                "constraint_cycle": float(self.distance(self.decode(xt)).mean()),
                "constraint_perturbed": float(self.distance(self.decode(xt + sigma * z)).mean()),
                "constraint_data": float(self.distance(x).mean()), "sigma": float(sigma)}

    def finetune(self, data: Tensor, mdm_samples: Tensor | None, config: NAMMConfig | dict | None = None,
                 progress: bool = False) -> NAMM:
        """Optional second stage (docs/methods/namm.md, "Finetuning"): ``g`` frozen, ``f`` trained with
        ``yt = mdm + σ_b z``.

        Args:
            data: training data ``x`` (the forward-cycle term still uses it).
            mdm_samples: mirror-space samples of the MDM (drawn once, like ``gen_mdm_data.py``); ``None`` continues
                stage 1 for ``f`` alone (``yt = g(x) + σ_b z``, ``g`` frozen), e.g. to train ``f`` longer after the
                mirror-space model was trained on ``g``.
            config: hyper-parameters (default: the stage-1 config).

        Returns:
            ``self``, with ``inverse_map`` replaced by the EMA of the finetuned one.
        """
        cfg = _config(config if config is not None else self.config)
        data = _check_data(data, self.sample_shape, "data")
        if mdm_samples is not None:
            mdm_samples = _check_data(mdm_samples, self.sample_shape, "mdm_samples")
        inverse = copy.deepcopy(self.inverse_map).train()
        forward = self.forward_map.eval()
        for p in forward.parameters():
            p.requires_grad_(False)
        try:
            ema = _run(forward, inverse, self.distance, data, cfg, train_forward=False, mdm=mdm_samples,
                       history=self.history, stage="finetune", progress=progress)
        finally:
            for p in forward.parameters():
                p.requires_grad_(True)
        self.inverse_map = ema[1].averaged_model(inverse)
        stages = [*self.config.get("finetune_stages", []), {**cfg.to_dict(), "mdm_samples": mdm_samples is not None}]
        self.config = {**self.config, "finetune_stages": stages}
        return self


def _config(config) -> NAMMConfig:
    if isinstance(config, NAMMConfig):
        return config
    if config is None:
        return NAMMConfig()
    if isinstance(config, dict):
        return NAMMConfig.from_dict({k: v for k, v in config.items() if k not in _RECORD_KEYS})
    raise TypeError(f"config must be a NAMMConfig or dict, got {type(config).__name__}")


def _check_data(x, shape: tuple[int, ...] | None, name: str) -> Tensor:
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.ndim < 2 or x.shape[0] < 1:
        raise ValueError(f"{name} must be a floating-point tensor [N, *shape] with N >= 1, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if shape is not None and tuple(x.shape[1:]) != tuple(shape):
        raise ValueError(f"{name} has sample shape {tuple(x.shape[1:])}, the maps expect {tuple(shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def check_data_constraint(distance, x: Tensor, tol: float = DATA_TOL) -> float:
    """Fraction of ``x`` with ``l(x) > tol``; warns (:class:`ConstraintWarning`) with that fraction if positive.

    The paper asserts ``l(x) < 1e-2`` on a data batch before training (``train_namm.py``): data that do not obey
    the constraint cannot teach a map onto it.
    """
    with torch.no_grad():
        d = check_distance(distance, x)
    frac = float((d > tol).double().mean())
    if frac > 0:
        warnings.warn(f"{frac:.1%} of the training data violate the constraint by more than tol={tol:g} "
                      f"(max distance {float(d.max()):.3g}); the maps are trained towards a set the data do not "
                      "lie on", ConstraintWarning, stacklevel=3)
    return frac


def _run(forward, inverse, distance, data: Tensor, cfg: NAMMConfig, *, train_forward: bool,
         mdm: Tensor | None, history: list, stage: str, progress: bool) -> tuple[EMA | None, EMA]:
    gen = torch.Generator().manual_seed(cfg.seed + (0 if train_forward else 7919))
    params = [*inverse.parameters()] + ([*forward.parameters()] if train_forward else [])
    opt = torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas)
    ema_f = EMA(forward, cfg.ema_decay) if train_forward else None
    ema_i = EMA(inverse, cfg.ema_decay)
    n, start = data.shape[0], time.perf_counter()
    acc: dict[str, float] = {}
    from tqdm.auto import tqdm

    for step in tqdm(range(cfg.steps), disable=not progress, desc=f"namm {stage}"):
        idx = torch.randint(0, n, (min(cfg.batch_size, n),), generator=gen)
        x = data[idx]
        sig = perturbation_levels(x.shape[0], cfg.sigma_max, cfg.fixed_sigma, gen, x.dtype)
        z = torch.randn(x.shape, generator=gen, dtype=x.dtype)
        base = None if mdm is None else mdm[torch.randint(0, mdm.shape[0], (x.shape[0],), generator=gen)]
        parts = namm_loss(forward, inverse, distance, x, sig, z, lam_cyc=cfg.lam_cyc, lam_con=cfg.lam_con,
                          lam_reg=cfg.lam_reg, reg=cfg.reg, mirror_base=base)
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        opt.zero_grad(set_to_none=True)
        parts["loss"].backward()
        opt.step()
        if train_forward:
            forward.clamp_()  # keeps Ψ convex, hence g invertible
            ema_f.update(forward)
        ema_i.update(inverse)
        value = parts["loss"].item()
        if not math.isfinite(value):
            raise FloatingPointError(f"NAMM {stage} loss is {value} at step {step + 1}")
        for k, v in parts.items():
            acc[k] = acc.get(k, 0.0) + v.item()
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            cnt = (step % cfg.log_every) + 1
            history.append({"stage": stage, "step": step + 1, **{k: v / cnt for k, v in acc.items()},
                            "seconds": round(time.perf_counter() - start, 2)})
            acc = {}
    return ema_f, ema_i


def train_namm(data: Tensor, distance: Callable[[Tensor], Tensor], forward: nn.Module | None = None,
               inverse: nn.Module | None = None, config: NAMMConfig | dict | None = None,
               progress: bool = False, on_violation: str = "warn") -> NAMM:
    """Train a NAMM map pair on ``data`` for the constraint ``distance`` (N1 / N2 settings: configs/*namm*.json).

    Args:
        data: training samples ``[N, *shape]`` that satisfy the constraint.
        distance: differentiable ``l: [B, *shape] -> [B]``, ``l >= 0``, zero on the constraint set.
        forward: the forward map (default :class:`~steerdiff.models.icnn.ICNNMap` with hidden 32, L=2, α=0.9 on
            ``shape``).
        inverse: the inverse map (default :class:`~.inverse_net.ResidualMLP` 3x128).
        config: :class:`NAMMConfig` or its dict.
        progress: show a progress bar.
        on_violation: data with ``l(x) > config.data_tol``: ``"warn"`` (with the fraction), ``"error"``, ``"ignore"``.

    Returns:
        A :class:`NAMM` with the EMA maps (eval mode), ``history`` (loss pieces every ``log_every`` steps) and
        ``config``.

    Raises:
        ValueError: bad data (shape, NaN), a distance returning the wrong shape / NaN / negatives, maps whose shape
            differs from the data's, ``on_violation="error"`` with violating data.
    """
    from ..models.icnn import ICNNMap
    from .inverse_net import ResidualMLP

    cfg = _config(config)
    data = _check_data(data, None, "data")
    shape = tuple(data.shape[1:])
    forward = ICNNMap(shape=shape) if forward is None else forward
    inverse = ResidualMLP(shape=shape) if inverse is None else inverse
    for name, m in (("forward", forward), ("inverse", inverse)):
        if tuple(getattr(m, "sample_shape", ())) != shape:
            raise ValueError(f"{name} map acts on shape {tuple(getattr(m, 'sample_shape', ()))}, data on {shape}")
    if on_violation not in ("warn", "error", "ignore"):
        raise ValueError(f"on_violation must be 'warn', 'error' or 'ignore', got {on_violation!r}")
    with warnings.catch_warnings():
        if on_violation != "warn":
            warnings.simplefilter("ignore", ConstraintWarning)
        frac = check_data_constraint(distance, data[: min(len(data), 4096)], cfg.data_tol)
    if frac > 0 and on_violation == "error":
        raise ValueError(f"data: {frac:.1%} of the samples violate the constraint by more than {cfg.data_tol:g}")
    forward.train()
    inverse.train()
    history: list[dict] = []
    ema_f, ema_i = _run(forward, inverse, distance, data, cfg, train_forward=True, mdm=None, history=history,
                        stage="train", progress=progress)
    namm = NAMM(ema_f.averaged_model(forward), ema_i.averaged_model(inverse), distance)
    namm.history, namm.config = history, cfg.to_dict()
    namm.config["data_violation_fraction"] = frac
    return namm.eval()
