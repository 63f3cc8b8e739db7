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
