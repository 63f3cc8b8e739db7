"""Training loop: a registered objective (EDM by default), AdamW, EMA, condition dropout, gradient clipping, atomic
checkpoints, exact resume.

Every random draw of a run comes from state that is checkpointed: the batch order from a per-epoch permutation
seeded by ``(seed, epoch)`` plus the position inside the epoch; sigmas, noise and condition dropout from one
``torch.Generator``; dropout layers from the global torch RNG, which is seeded inside a ``fork_rng`` block
(the caller's global RNG is left untouched) and saved too. A run killed after ``k`` steps and resumed
therefore ends with weights bit-identical to an uninterrupted run (on the same machine and thread count).

Data parallel (``torchrun`` / ``accelerate launch``, :mod:`.ddp`): the global batch is split into
``config.data_shards`` chunks (default: the number of processes), each with its own generator and dropout RNG
state seeded from ``(seed, chunk)``; every rank computes its chunks, the gradients are summed with one
all-reduce, and every rank takes the same AdamW and EMA step. A run on ``W`` processes therefore equals a
one-process run with the same ``data_shards`` up to float rounding of the gradient sum (bit-equal for ``W = 2``
on CPU), and ``data_shards=1`` is the one-process trainer exactly. Rank 0 alone writes checkpoints, the log and
the final model; a resume needs the same number of processes. Dropout on a CUDA model draws from the CUDA RNG,
which is neither per chunk nor checkpointed: exact equality and exact resume on GPUs need ``dropout=0``.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..core.denoiser import NULL
from ..distributed import DistContext, barrier, check_same, resolve
from ..io import CheckpointError, load_state_strict
from ..models.io import model_spec, save
from . import flow as _flow  # registers the "flow" objective (selected by objective="flow")
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, write_log
from .config import config_from_dict, config_to_dict, cosine_lr
from .ddp import (
    broadcast_model,
    chunk_generator,
    chunk_torch_state,
    gather_states,
    local_chunks,
    resolve_shards,
    sum_gradients,
)
from .ema import EMA
from .objectives import OBJECTIVES, objective_for

# Fields a resumed run may change: bookkeeping, and ``steps`` (to extend or shorten a run on purpose; with the
# cosine schedule this reshapes the learning rates of the remaining steps).
_RESUMABLE_CHANGES = {"steps", "checkpoint_every", "log_every", "keep_checkpoints"}


@dataclass
class TrainConfig:
    """Training hyper-parameters (all JSON-serialisable; ``TrainConfig(**json_dict)`` rebuilds one)."""

    steps: int = 4000  # optimizer steps
    batch_size: int = 128
    lr: float = 1e-3  # peak AdamW learning rate
    lr_schedule: str = "cosine"  # "constant", "cosine" (decay to lr * min_lr_ratio after warmup) or "linear"
    min_lr_ratio: float = 0.05
    decay_fraction: float = 0.3  # "linear": constant, then a linear decay to lr * min_lr_ratio over this last share
    warmup_steps: int = 200  # linear warmup from 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = 1.0  # max global gradient norm; None = off
    ema_decay: float = 0.999
    ema_warmup: bool = True  # decay min(ema_decay, (1+n)/(10+n))
    p_uncond: float = 0.1  # drop the whole condition (all slots -> -1); DiT default 0.1
    p_null: float = 0.0  # drop each slot independently (CoInD-ready models: 0.2)
    # Options of the registered "coind" objective (steerdiff.guidance.coind_objective), kept here so that recipes and
    # checkpoints stay one flat JSON object: coind_lambda > 0 selects it.
    coind_lambda: float = 0.0  # CoInD CI-term weight; 0 = vanilla (the plain EDM objective)
    ci_fraction: float = 1.0  # fraction of each batch that gets the CI term (official 1.0)
    p_mean: float = -1.2  # ln sigma ~ N(p_mean, p_std^2) (EDM)
    p_std: float = 1.2
    # "edm" (the default, the loss above) or "flow" (rectified flow on the velocity, steerdiff.train.flow; the model
    # must then be a flow denoiser). Flow times: logit t ~ N(flow_t_mean, flow_t_std^2) (SD3: 0, 1) or uniform.
    objective: str = "edm"
    flow_t_sampling: str = "logit_normal"  # "logit_normal" or "uniform"
    flow_t_mean: float = 0.0
    flow_t_std: float = 1.0
    seed: int = 0
    checkpoint_every: int = 500
    log_every: int = 50
    keep_checkpoints: int = 1
    # Chunks of the global batch, each with its own random streams (steerdiff.train.ddp); None = the number of
    # processes. Stored resolved, so that a one-process run with data_shards=W reproduces a W-process run.
    data_shards: int | None = None
    # Mixed precision: "bfloat16" runs each forward pass and loss under torch.autocast in bfloat16 (matrix products
    # and convolutions in bfloat16, reductions in float32); the weights, gradients, optimizer state and EMA stay
    # float32 (the master copy). None: everything in float32. float16 is refused: its 5-bit exponent needs loss
    # scaling (a GradScaler, whose state the checkpoints would have to carry for an exact resume).
    autocast: str | None = None

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.autocast == "float16":
            raise ValueError("autocast='float16' is not supported: float16 training needs loss scaling (its gradients "
                             "underflow), which this trainer does not do; use autocast='bfloat16' (float32's range)")
        if self.autocast not in (None, "bfloat16"):
            raise ValueError(f"autocast must be None (float32) or 'bfloat16', got {self.autocast!r}")
        if self.steps < 0 or self.batch_size < 1:
            raise ValueError(f"steps must be >= 0 and batch_size >= 1, got {self.steps}, {self.batch_size}")
        if self.lr_schedule not in ("constant", "cosine", "linear"):
            raise ValueError(f"lr_schedule must be 'constant', 'cosine' or 'linear', got {self.lr_schedule!r}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        for name in ("p_uncond", "p_null"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.coind_lambda < 0 or not 0.0 < self.ci_fraction <= 1.0:
            raise ValueError(
                f"coind_lambda must be >= 0 and ci_fraction in (0, 1], got {self.coind_lambda}, {self.ci_fraction}"
            )
        if self.checkpoint_every < 1 or self.log_every < 1:
            raise ValueError("checkpoint_every and log_every must be >= 1")
        if self.grad_clip is not None and not self.grad_clip > 0:  # 0 would silently zero every update
            raise ValueError(f"grad_clip must be > 0 or None (off), got {self.grad_clip}")
        # A zero or NaN learning rate, an EMA that never moves, or a negative warm-up train nothing without a word.
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1) (Adam's beta1, beta2), got {self.betas}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if not (math.isfinite(self.p_mean) and math.isfinite(self.p_std) and self.p_std > 0):
            raise ValueError(f"p_mean must be finite and p_std positive (ln sigma ~ N(p_mean, p_std^2)), got "
                             f"{self.p_mean}, {self.p_std}")
        if self.objective not in OBJECTIVES:  # method packages register more (steerdiff.temporal: "dydiff")
            others = [n for n in OBJECTIVES.names() if n not in ("edm", "flow", "coind")]
            raise ValueError(f"objective must be 'edm' or 'flow' or a registered one {others} (import the package "
                             f"that defines it first, e.g. steerdiff.temporal for 'dydiff'), got {self.objective!r}")
        if self.flow_t_sampling not in _flow.T_SAMPLINGS:
            raise ValueError(f"flow_t_sampling must be one of {list(_flow.T_SAMPLINGS)}, got {self.flow_t_sampling!r}")
        if not (math.isfinite(self.flow_t_mean) and math.isfinite(self.flow_t_std) and self.flow_t_std > 0):
            raise ValueError(f"flow_t_mean must be finite and flow_t_std positive (logit t ~ N(mean, std^2)), got "
                             f"{self.flow_t_mean}, {self.flow_t_std}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.data_shards is not None:
            if isinstance(self.data_shards, bool) or not isinstance(self.data_shards, int) or self.data_shards < 1:
                raise ValueError(f"data_shards must be an integer >= 1 or None (the number of processes), got "
                                 f"{self.data_shards!r}")
            if self.batch_size % self.data_shards:
                raise ValueError(f"batch_size ({self.batch_size}) must be divisible by data_shards "
                                 f"({self.data_shards}): every chunk of the global batch has the same size")

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        """Build from a JSON dict; unknown keys are an error (a typo must not fall back to a default)."""
        return config_from_dict(cls, values, "training config")

    def to_dict(self) -> dict:
        return config_to_dict(self)

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step ``step`` (0-based): linear warm-up, then constant or cosine."""
        if self.lr_schedule == "constant":
            return self.lr * (step + 1) / self.warmup_steps if step < self.warmup_steps else self.lr
        if self.lr_schedule == "linear":
            if step < self.warmup_steps:
                return self.lr * (step + 1) / self.warmup_steps
            start = self.steps * (1.0 - self.decay_fraction)
            frac = min(1.0, max(0.0, (step - start) / max(1e-12, self.steps - start)))
            return self.lr * (1.0 - (1.0 - self.min_lr_ratio) * frac)
        return cosine_lr(self.lr, step, self.steps, warmup_steps=self.warmup_steps, min_lr_ratio=self.min_lr_ratio)


@dataclass
class TrainResult:
    """What :func:`train` returns: the EMA model (eval mode), the raw model, the loss history and paths."""

    model: nn.Module
    raw_model: nn.Module
    step: int
    finished: bool
    history: list[dict] = field(default_factory=list)
    out_dir: Path | None = None
    final_dir: Path | None = None


def drop_condition(
    cond: Tensor | None, p_uncond: float = 0.0, p_null: float = 0.0, generator: torch.Generator | None = None
) -> Tensor | None:
    """Condition dropout for classifier-free guidance: replace labels by ``-1`` (null).

    Each row is fully nulled with probability ``p_uncond``; independently, each slot of each row is nulled with
    probability ``p_null`` (per-attribute dropout for multi-slot labels, as the official CoInD trainer; its 2-D notebook
    drops whole labels instead; docs/methods/conventions.md, "Training recipes"). The draws are made whenever the
    probability is positive, whatever the labels, so the generator advances the same way on every run.
    """
    if cond is None:
        return None
    c = cond[:, None] if cond.ndim == 1 else cond
    out = c.clone()
    gen_device = generator.device if generator is not None else "cpu"
    if p_uncond > 0:
        whole = (torch.rand(c.shape[0], generator=generator, device=gen_device) < p_uncond).to(c.device)
        out[whole] = NULL
    if p_null > 0:
        slot = (torch.rand(c.shape, generator=generator, device=gen_device) < p_null).to(c.device)
        out[slot] = NULL
    return out.reshape(cond.shape)


def _as_tensors(data) -> tuple[Tensor, Tensor | None]:
    """Accept a ``TensorDataset``, an ``(x, cond)`` / ``(x,)`` tuple, or a bare tensor ``x``."""
    tensors = getattr(data, "tensors", data)
    if isinstance(tensors, Tensor):
        tensors = (tensors,)
    if not isinstance(tensors, (tuple, list)) or len(tensors) not in (1, 2):
        raise TypeError("data must be a TensorDataset(x[, cond]), a tuple (x, cond) / (x,), or a tensor x")
    x = tensors[0]
    cond = tensors[1] if len(tensors) == 2 else None
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.ndim < 2 or x.shape[0] < 1:
        raise ValueError(
            f"data: x must be a floating-point tensor [N, *shape] with N >= 1, got {getattr(x, 'shape', x)}"
        )
    if cond is not None:
        if not isinstance(cond, Tensor) or cond.dtype.is_floating_point or cond.shape[0] != x.shape[0]:
            raise ValueError("data: cond must be an integer tensor [N] or [N, m] with as many rows as x")
        if cond.ndim not in (1, 2):
            raise ValueError(f"data: cond must have shape [N] or [N, m], got {tuple(cond.shape)}")
    return x, cond


def _epoch_permutation(seed: int, epoch: int, n: int) -> Tensor:
    # A fresh generator per epoch: the data position is just (epoch, offset), nothing else to checkpoint.
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7919 + 17) % (2**63))
    return torch.randperm(n, generator=g)


class _BatchStream:
    """Indices of consecutive batches over per-epoch permutations (a batch may span an epoch boundary)."""

    def __init__(self, n: int, seed: int, epoch: int = 0, offset: int = 0):
        self.n, self.seed, self.epoch, self.offset = n, seed, epoch, offset
        self.perm = _epoch_permutation(seed, epoch, n)

    def next(self, size: int) -> Tensor:
        parts = []
        while size > 0:
            if self.offset == self.n:
                self.epoch, self.offset = self.epoch + 1, 0
                self.perm = _epoch_permutation(self.seed, self.epoch, self.n)
            k = min(size, self.n - self.offset)
            parts.append(self.perm[self.offset : self.offset + k])
            self.offset += k
            size -= k
        return torch.cat(parts)


def _check_resumable(saved: dict, cfg: TrainConfig, spec: dict, n_data: int, world: int) -> None:
    # A field missing from an older checkpoint had its default value then; older checkpoints are one-process runs.
    saved_world = saved.get("world", 1)
    if saved_world != world:
        raise ValueError(f"resume: the checkpoint was written by a run on {saved_world} process(es) but this run has "
                         f"{world}; resume with the same number of processes (e.g. torchrun --nproc_per_node="
                         f"{saved_world}), or start a new out_dir")
    defaults = {**TrainConfig().to_dict(), "data_shards": 1}
    diffs = [
        k
        for k, v in cfg.to_dict().items()
        if k not in _RESUMABLE_CHANGES and saved["config"].get(k, defaults[k]) != v
    ]
    if diffs:
        raise ValueError(f"resume: training config differs from the checkpoint in {diffs}; use a new out_dir")
    if saved["model"] != spec:
        raise ValueError("resume: the model config differs from the checkpoint's; use a new out_dir")
    if saved["n_data"] != n_data:
        raise ValueError(f"resume: data has {n_data} rows but the checkpoint was trained on {saved['n_data']}")


def train(
    model: nn.Module,
    data,
    config: TrainConfig | dict,
    out_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    *,
    stop_after: int | None = None,
    callback: Callable[[dict], None] | None = None,
    dist: DistContext | None = None,
) -> TrainResult:
    """Train a registered denoiser (e.g. ``EDMPrecond(UNet(...))``) with the EDM loss; save its EMA.

    The EMA model is written with :func:`steerdiff.models.io.save` to ``out_dir/final``.

    Args:
        model: the model to train in place (its device is used for the data).
        data: ``TensorDataset(x, cond)``, ``(x, cond)``, ``(x,)`` or ``x``; ``cond``: ``[N]``/``[N, m]`` ints. Or a
            data stream: a callable ``data(step, batch_size)`` returning the batch of optimizer step ``step`` in one
            of those forms (fresh samples every step, e.g. a simulator). It must be a pure function of ``step`` (draw
            from a generator seeded by the step), so that a resumed run sees the same batches.
        config: a :class:`TrainConfig` or its dict.
        out_dir: run directory (checkpoints, ``train_log.json``, ``final/``).
        resume: continue from the newest checkpoint in ``out_dir`` (fresh start, with a warning, if none).
        progress: show a tqdm bar with the loss.
        stop_after: stop (with a checkpoint) once this many total steps are done, e.g. to split a run into
            time-boxed sessions; the final model is written only when ``config.steps`` is reached.
        callback: called after every step with ``{"step", "loss", "lr"}`` (after any checkpoint of that step), on
            every rank (the values are the same on every rank; print from ``dist.is_main`` only).
        dist: the process group (:func:`steerdiff.distributed.init`); None = :func:`steerdiff.distributed.current`.
            With several processes every rank passes the same arguments and an equal model (rank 0's weights are
            broadcast at the start), each computes its chunks of the global batch ``config.batch_size``, and rank 0
            alone writes to ``out_dir`` (which must be the same directory for every rank, e.g. on a shared file
            system, for a resume).

    Returns:
        A :class:`TrainResult`; ``result.model`` carries the EMA weights.

    Raises:
        FileExistsError: ``out_dir`` already holds checkpoints and ``resume`` is False.
        ValueError: bad data, ``batch_size`` / ``data_shards`` / the number of processes not dividing each other,
            ranks given different arguments (raised on every rank), or a resume whose config, model, data size or
            number of processes differ from the checkpoint's.
    """
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_dict(config)
    ctx = resolve(dist)
    out_dir = Path(out_dir)
    spec = model_spec(model)  # fails early, not after an hour, if the model cannot be saved
    device = next(model.parameters()).device
    stream_fn = data if callable(data) and not isinstance(data, Tensor) and not hasattr(data, "tensors") else None
    if stream_fn is not None:  # a data stream: fresh samples each step, a pure function of the step
        x, cond = _as_tensors(stream_fn(0, cfg.batch_size))
    else:
        x, cond = _as_tensors(data)
    shape = getattr(model, "sample_shape", None)
    if shape is not None and tuple(x.shape[1:]) != tuple(shape):
        raise ValueError(f"data: samples have shape {tuple(x.shape[1:])} but the model expects {tuple(shape)}")
    x = x.to(device)
    cond = cond.to(device) if cond is not None else None
    n_data = -1 if stream_fn is not None else x.shape[0]  # -1 marks a stream in checkpoints

    ckpt_dir = latest_checkpoint(out_dir)
    # Before anything that waits on the other ranks: ranks given different arguments (or seeing different
    # checkpoints) would otherwise run different collectives and hang; this raises on every rank instead.
    # The data enter by shape and about 256 evenly spaced rows: cheap on a large data set, and enough to catch
    # ranks that loaded different files or seeds.
    every = max(1, x.shape[0] // 256)
    check_same(ctx, "train", config=cfg.to_dict(), model=spec, x=x[::every], x_shape=tuple(x.shape),
               cond=None if cond is None else cond[::every], n_data=n_data, resume=bool(resume),
               stop_after=stop_after, checkpoint=None if ckpt_dir is None else ckpt_dir.name)
    shards = resolve_shards(cfg.data_shards, cfg.batch_size, ctx.world)
    cfg = dataclasses.replace(cfg, data_shards=shards)  # stored resolved in checkpoints and the log
    if ckpt_dir is not None and not resume:
        raise FileExistsError(f"{out_dir} already holds checkpoints; pass resume=True or choose a new out_dir")
    if resume and ckpt_dir is None and ctx.is_main:
        warnings.warn(f"resume=True but no checkpoint in {out_dir}; starting from scratch", stacklevel=2)

    objective = objective_for(cfg)
    target = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    broadcast_model(model, ctx)  # every rank starts from rank 0's weights (before the EMA copies them)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    ema = EMA(model, cfg.ema_decay, cfg.ema_warmup)
    chunks = local_chunks(shards, ctx)  # this rank's chunks of each global batch
    chunk_size = cfg.batch_size // shards
    gens = {c: chunk_generator(cfg.seed, c) for c in chunks}
    step, history, acc, seconds = 0, [], [0.0, 0], 0.0

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)  # as before the chunks existed (it also seeds CUDA's RNG)
        # Dropout draws from the global RNG: each chunk swaps its own state in, so the masks of chunk c do not
        # depend on which rank computes it or on the chunks computed before it.
        torch_states = {c: chunk_torch_state(cfg.seed, c) for c in chunks}
        stream = _BatchStream(x.shape[0], cfg.seed)
        if ckpt_dir is not None:
            ck = load_checkpoint(ckpt_dir)
            st = ck["state"]
            _check_resumable(st, cfg, spec, n_data, ctx.world)
            load_state_strict(model, ck["model"], str(ckpt_dir / "model.safetensors"))
            opt.load_state_dict(ck["optimizer"])
            ema.load_state_dict(ck["ema"], st["ema_updates"])
            for c in chunks:
                keys = (_rng_key("train", c), _rng_key("torch", c))
                if not all(k in ck["rng"] for k in keys):
                    raise CheckpointError(f"{ckpt_dir}/rng.safetensors: missing the generator states {keys}")
                gens[c].set_state(ck["rng"][keys[0]])
                torch_states[c] = ck["rng"][keys[1]]
            stream = _BatchStream(x.shape[0], cfg.seed, st["epoch"], st["offset"])
            step, history, acc, seconds = st["step"], st["history"], st["loss_acc"], st["seconds"]

        def checkpoint() -> None:
            state = {
                "config": cfg.to_dict(),
                "model": spec,
                "n_data": n_data,
                "epoch": stream.epoch,
                "offset": stream.offset,
                "ema_updates": ema.num_updates,
                "history": history,
                "loss_acc": acc,
                "seconds": seconds,
                "world": ctx.world,
            }
            # Collectives on every rank; then rank 0 writes while the others wait, so that nobody (a resume, a
            # reader) sees a checkpoint before it is complete.
            gen_states = gather_states({c: gens[c].get_state() for c in chunks}, shards, ctx)
            rng_states = gather_states(torch_states, shards, ctx)
            if ctx.is_main:
                rng = {}
                for c in range(shards):
                    rng[_rng_key("train", c)], rng[_rng_key("torch", c)] = gen_states[c], rng_states[c]
                save_checkpoint(out_dir, step, model, ema.state_dict(), opt, rng, state, cfg.keep_checkpoints)
                write_log(out_dir, {"config": cfg.to_dict(), "model": spec, "step": step, "history": history})
            barrier(ctx)

        from tqdm.auto import tqdm

        model.train()
        bar = tqdm(total=target, initial=step, disable=not (progress and ctx.is_main), desc="train",
                   dynamic_ncols=True)
        smooth, t0 = None, time.perf_counter()
        try:
            while step < target:
                # Every rank draws the global batch (a pure function of the step) and keeps its chunks' rows.
                if stream_fn is not None:
                    xb, cond_b = _as_tensors(stream_fn(step, cfg.batch_size))
                    xb, cond_b = xb.to(device), (cond_b.to(device) if cond_b is not None else None)
                else:
                    idx = stream.next(cfg.batch_size).to(device)
                    xb, cond_b = x[idx], (None if cond is None else cond[idx])
                lr = cfg.lr_at(step)
                for group in opt.param_groups:
                    group["lr"] = lr
                opt.zero_grad(set_to_none=True)
                # [loss of each chunk, extra term of each chunk]; zeros for other ranks' chunks until summed
                stats = torch.zeros(2 * shards, dtype=torch.float64)
                has_extra = False
                for c in chunks:
                    rows = slice(c * chunk_size, (c + 1) * chunk_size)
                    xc, cc = (xb, cond_b) if shards == 1 else (xb[rows], None if cond_b is None else cond_b[rows])
                    torch.set_rng_state(torch_states[c])
                    cb = drop_condition(cc, cfg.p_uncond, cfg.p_null, gens[c]) if cc is not None else None
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast is not None):
                        loss, extra = objective.fn(model, xc, cc, cb, gens[c], cfg)
                    # The mean of the chunk losses: the batch mean for the per-sample losses of the objectives.
                    (loss if shards == 1 else loss / shards).backward()
                    torch_states[c] = torch.get_rng_state()
                    stats[c] = loss.item()
                    if extra is not None:
                        stats[shards + c], has_extra = extra.item(), True
                stats = sum_gradients(params, ctx, stats).tolist()
                if cfg.grad_clip is not None:
                    nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                opt.step()
                ema.update(model)
                step += 1

                # Summed in chunk order from the gathered values: the same number on every rank and in one process.
                value = sum(stats[:shards]) / shards
                extra_value = sum(stats[shards:]) / shards if has_extra else None
                if not math.isfinite(value):  # stop before a checkpoint is overwritten with garbage
                    raise FloatingPointError(f"loss is {value} at step {step} (lr {lr:.3g}); last checkpoint kept")
                # An objective's auxiliary term (CoInD's l_ci) is averaged too: acc = [loss sum, count, extra sum]
                extra_sum = (acc[2] if len(acc) > 2 else 0.0) + (extra_value if has_extra else 0.0)
                acc = [acc[0] + value, acc[1] + 1] + ([extra_sum] if has_extra else [])
                smooth = value if smooth is None else 0.98 * smooth + 0.02 * value
                bar.update(1)
                if step % 10 == 0 or step == target:
                    bar.set_postfix(loss=f"{smooth:.4f}", lr=f"{lr:.2e}")
                if step % cfg.log_every == 0 or step == target:
                    seconds += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    history.append({"step": step, "loss": acc[0] / acc[1], "lr": lr, "seconds": round(seconds, 3)})
                    if has_extra:
                        history[-1][objective.extra_name or "extra"] = acc[2] / acc[1]
                    acc = [0.0, 0]
                if step % cfg.checkpoint_every == 0 or step == target:
                    checkpoint()
                if callback is not None:
                    callback({"step": step, "loss": value, "lr": lr})
        finally:
            bar.close()

    finished = step >= cfg.steps
    ema_model = ema.averaged_model(model)
    final_dir = None
    if finished:
        final_dir = save(ema_model, out_dir / "final") if ctx.is_main else out_dir / "final"
        barrier(ctx)  # the final model is complete on disk when train returns, on every rank
    return TrainResult(ema_model, model, step, finished, history, out_dir, final_dir)


def _rng_key(stream: str, chunk: int) -> str:
    # Chunk 0 keeps the names of one-process checkpoints ("train", "torch"), so older checkpoints resume.
    return stream if chunk == 0 else f"{stream}.{chunk}"
