"""The one convention: a denoiser ``D(x, sigma, cond=None) -> E[x0 | x]`` (EDM / k-diffusion; Karras et al. 2022;
docs/methods/conventions.md, "The denoiser").

Data ``x0``, noisy sample ``x = x0 + sigma * eps``; ``x: [B, *shape]``, ``sigma: [B]``. Everything derived from
``D`` (eps-prediction, score) is computed here and nowhere else, so that no method module needs to know which
parameterisation sits behind a denoiser.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

NULL = -1
"""Condition value meaning "no condition" in any slot (docs/methods/conventions.md, "Conditions")."""


@runtime_checkable
class Denoiser(Protocol):
    """Any callable returning ``E[x0 | x_sigma = x]``; ``sigma`` is a float tensor of shape ``[B]``."""

    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor: ...


AT_LEAST_FLOAT32 = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32,
                    torch.float64: torch.float64}
"""``torch.promote_types(dtype, torch.float32)`` of the floating dtypes, as a table: ``torch.promote_types`` is a
dispatched op, and the per-step paths (:func:`steerdiff.core.calls.sigma_batch`, the denoisers' timesteps) ask it at
every model call."""


def append_dims(v: Tensor, ndim: int) -> Tensor:
    """Reshape a per-sample tensor ``[B]`` to ``[B, 1, ..., 1]`` with ``ndim`` dimensions."""
    return v.reshape(v.shape + (1,) * (ndim - v.ndim))


HOST_LEVEL_ATTR = "_steerdiff_host_level"
"""The attribute under which a sigma batch carries its one level as a host number (:func:`tag_host_level`)."""


PLAN_ATTR = "_steerdiff_level_plan"
"""The attribute under which a sampler's sigma batch from a :class:`LevelPlan` carries ``(plan, index of its
level)``, for :func:`planned_batch`."""


class LevelPlan:
    """The levels of one trajectory and, for one batch size, dtype and device, the ``[rows]`` sigma batch of every
    level, made before the loop (issue 36: the loop's own work per step, benchmarks/pipeline_overhead.py's step
    gap). On the CPU the batches of all levels are the rows of one tensor (one op for the whole trajectory, where a
    batch made per step is one op per step); elsewhere one ``full`` per level, all before the loop. Each batch is
    tagged with its host level (:func:`tag_host_level`) and with ``(plan, index)`` (:data:`PLAN_ATTR`), so a
    denoiser finds there the ``[rows]`` batches of its own per-level values (its timesteps) made once for all levels
    (:func:`planned_batch`). The values are the tensors a per-step ``new_full`` would make, bit for bit (the levels
    are given as ``dtype`` holds them).

    A batch changed in place is never handed out again: every batch of the plan starts at version 0 (on the CPU
    they share one version counter), and :meth:`sigma_batch` and :func:`planned_batch` give a batch only while it
    is still at 0 (callers then make a fresh one, as without a plan). Not made in inference mode (whose tensors keep
    no version counter)."""

    __slots__ = ("levels", "rows", "dtype", "device", "memo", "sigmas", "by_level")

    def __init__(self, levels: list[float], rows: int, dtype: torch.dtype, device: torch.device):
        self.levels = levels  # distinct, as dtype holds them (Python floats)
        self.rows, self.dtype, self.device = rows, dtype, device
        self.memo: dict = {}  # key -> the per-level batches of a denoiser's values (planned_batch)
        self.sigmas = self.batches(levels, dtype)
        for k, (b, s) in enumerate(zip(self.sigmas, levels, strict=True)):
            setattr(b, HOST_LEVEL_ATTR, (s, 0))
            setattr(b, PLAN_ATTR, (self, k))
        self.by_level = dict(zip(levels, self.sigmas, strict=True))  # level -> its tagged batch (the loop's lookup)

    def batches(self, values: list[float | None], dtype: torch.dtype) -> list[Tensor | None]:
        """``[rows]`` tensors of ``dtype`` on the plan's device filled with each value (None for None)."""
        rows = self.rows
        if self.device.type == "cpu":
            filled = [0.0 if v is None else v for v in values]
            out = list(torch.tensor([[v] * rows for v in filled], dtype=dtype).unbind(0))
        else:  # no host-to-device copy: one fill per level, before the loop
            out = [None if v is None else torch.full((rows,), v, dtype=dtype, device=self.device) for v in values]
        return [None if v is None else b for v, b in zip(values, out, strict=True)]

    @staticmethod
    def scalars(values: list[float | None], dtype: torch.dtype) -> list[Tensor | None]:
        """0-dim host tensors of ``dtype`` holding each value (None for None), made in one op: a factor of a
        per-step product as such a tensor costs no allocation per step, where a Python number is wrapped into a new
        tensor at every product (the same product: both are a host scalar of the kernel)."""
        out = list(torch.tensor([0.0 if v is None else v for v in values], dtype=dtype).unbind(0))
        return [None if v is None else b for v, b in zip(values, out, strict=True)]

    def sigma_batch(self, level: float) -> Tensor | None:
        """The tagged ``[rows]`` batch of ``level`` (as ``dtype`` holds it); None if it is not a level of the plan
        or the plan's batches were changed in place. (The samplers' loop reads :attr:`by_level` inline.)"""
        b = self.by_level.get(level)
        return b if b is not None and b._version == 0 else None


def planned(sigma: Tensor, key, make) -> tuple | None:
    """A denoiser's per-level values at ``sigma``'s level, ``sigma`` a :class:`LevelPlan`'s sigma batch:
    ``make(plan)`` returns them for every level of the plan (a tuple per level, or None for a level without them),
    called once per plan and ``key``, at the first call (not in inference mode). None when ``sigma`` has no plan or
    was changed in place, or for such a level. A denoiser hands a tensor of the tuple to its network only while it
    is unchanged (``_version == 0``, as :meth:`LevelPlan.sigma_batch`)."""
    entry = getattr(sigma, PLAN_ATTR, None)
    if entry is None or sigma._version != 0:  # changed in place: its level is no longer the plan's
        return None
    plan, k = entry
    made = plan.memo.get(key)
    if made is None:
        if torch.is_inference_mode_enabled():
            return None
        made = plan.memo[key] = make(plan)
    return made[k]


def tag_host_level(sigma: Tensor, level: float) -> Tensor:
    """Mark the ``[B]`` batch ``sigma`` (every entry ``level``, as the tensor holds it) with its level as a Python
    float, for :func:`host_level`; returns ``sigma``. The samplers' sigma batches carry it
    (:func:`steerdiff.core.calls.sigma_batch`), so a denoiser's per-step fast path needs no read of a device
    tensor (one device synchronisation per call on an accelerator)."""
    setattr(sigma, HOST_LEVEL_ATTR, (level, _version(sigma)))  # an in-place change of sigma voids the tag
    return sigma


def _version(t: Tensor) -> int | None:
    # Inference tensors keep no version counter (then the tag is trusted as it is).
    return None if t.is_inference() else t._version


def tagged_level(sigma: Tensor) -> float | None:
    """The level :func:`tag_host_level` gave ``sigma`` (None: untagged, or changed in place since)."""
    tag = getattr(sigma, HOST_LEVEL_ATTR, None)
    return tag[0] if tag is not None and tag[1] == _version(sigma) else None


def host_level(sigma: Tensor) -> float | None:
    """The one noise level of a per-sample ``sigma`` batch as a Python float, when ``sigma`` has no gradient and is
    either tagged with it (:func:`tag_host_level`: the samplers' batches, on any device) or a host tensor whose
    entries are all equal; else None. Denoisers use it for a per-step fast path: their conversions in numbers
    instead of tensor ops, which cost more than the arithmetic on a small network
    (benchmarks/pipeline_overhead.py). No device tensor is ever read here."""
    if not isinstance(sigma, Tensor) or sigma.requires_grad or sigma.numel() == 0:
        return None
    level = tagged_level(sigma)
    if level is not None:
        return level
    if not sigma.is_cpu:
        return None
    levels = sigma.reshape(-1).tolist()
    level = levels[0]
    return float(level) if levels.count(level) == len(levels) else None


def eps_from_denoised(x: Tensor, sigma: Tensor, denoised: Tensor) -> Tensor:
    """eps-prediction ``(x - D) / sigma``."""
    return (x - denoised) / append_dims(sigma, x.ndim)


def score_from_denoised(x: Tensor, sigma: Tensor, denoised: Tensor) -> Tensor:
    """Score of the diffused density, ``(D - x) / sigma**2`` (Tweedie)."""
    return (denoised - x) / append_dims(sigma, x.ndim) ** 2


def denoised_from_eps(x: Tensor, sigma: Tensor, eps: Tensor) -> Tensor:
    """Inverse of :func:`eps_from_denoised`: ``x - sigma * eps``."""
    return x - append_dims(sigma, x.ndim) * eps


def as_sigma_batch(sigma: Tensor | float, x: Tensor) -> Tensor:
    """Broadcast a scalar or ``[B]`` sigma to a ``[B]`` tensor in ``x``'s dtype and device."""
    sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device)
    if sigma.ndim == 0:
        return sigma.expand(x.shape[0])
    if sigma.shape != (x.shape[0],):
        raise ValueError(f"sigma must be a scalar or have shape [B]=[{x.shape[0]}], got {tuple(sigma.shape)}")
    return sigma


def is_structured_cond(cond: object) -> bool:
    """Whether ``cond`` is a structured condition (docs/methods/pipelines.md, "Text conditions"): a pipeline's text
    condition (:class:`steerdiff.pipelines.TextCond`), a mapping of tensors with a batch axis that carries its own
    null counterpart. Such an object sets ``is_structured_cond = True`` and has ``batch_size``, ``null_like()``,
    ``index(rows)`` and a class method ``cat(conds)``; this module only relies on those (core cannot import the
    pipelines layer)."""
    return getattr(type(cond), "is_structured_cond", False) is True


def null_cond_like(cond):
    """A condition of the same shape with every slot null (``-1``); for a structured condition, its null
    counterpart (the empty or negative prompt the pipeline encoded)."""
    if is_structured_cond(cond):
        return cond.null_like()
    return torch.full_like(cond, NULL)


def cat_conds(conds: list):
    """Stack conditions along the batch axis: ``torch.cat`` for integer labels, ``type(c).cat`` for structured
    ones (all of one kind)."""
    if is_structured_cond(conds[0]):
        return type(conds[0]).cat(conds)
    return torch.cat(conds)


class NFECounter:
    """Wraps a denoiser and counts its evaluations.

    ``calls`` counts batched calls; ``rows`` counts evaluated samples (a doubled guidance batch of 2B rows counts
    2B). ``nfe(n)`` is the cost per sample of an ``n``-sample run, the unit every comparison uses: a CFG step on
    one doubled batch costs 2.
    """

    def __init__(self, denoiser: Denoiser):
        if not callable(denoiser):
            raise TypeError(f"denoiser must be callable D(x, sigma, cond), got {type(denoiser).__name__}")
        self.denoiser = denoiser
        self.calls = 0
        self.rows = 0

    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        self.calls += 1
        self.rows += x.shape[0]
        return self.denoiser(x, sigma, cond)

    def __getattr__(self, name: str):
        # Forward model attributes (sample_shape, ...) so a counted denoiser is a drop-in replacement.
        if name == "denoiser":
            raise AttributeError(name)
        return getattr(self.denoiser, name)

    def nfe(self, n: int) -> float:
        """Denoiser evaluations per sample for a run that produced ``n`` samples."""
        if n <= 0:
            raise ValueError(f"n must be positive, got {n}")
        return self.rows / n

    def reset(self) -> None:
        self.calls = 0
        self.rows = 0
