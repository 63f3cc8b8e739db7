"""The one checked model call of every step loop (docs/methods/conventions.md, "Samplers" and "Errors").

Every loop that evaluates a denoiser ``D(x, sigma, cond)`` step by step (core's registered samplers, the OCM
kernels, the SMC family of :mod:`steerdiff.align`, DPS and DR/CR/HR of :mod:`steerdiff.inverse`) goes through
:func:`checked_call`, so the rules live in one place:

* the noise level is handed over as a ``[B]`` tensor of at least float32 (a half-precision sigma would be
  rounded, e.g. 0.002 -> 0.0019989), made once per call;
* the output must be a tensor of the input's shape, cast to the input's dtype;
* a non-finite output raises ``FloatingPointError`` naming the step, the sigma, the flow time
  ``t = sigma / (1 + sigma)`` and how many samples (``finite=True``; loops that guard non-finite rows themselves,
  SMC and DPS, pass ``finite=False``); a ``ValueError`` raised inside the denoiser gets the step appended.

:class:`ModelCall` adds what a loop over many rows needs around it: NFE counting (an
:class:`~steerdiff.core.denoiser.NFECounter`, rows and batched calls), micro-batching (rows per call, or the cuts a
caller chooses, such as a sharded particle population's) and the seconds spent in the model. :func:`emit` is the
per-step callback with the sampler dict ``{"i", "sigma", "sigma_next", "x", "denoised"}``.

The shapes follow k-diffusion's samplers (Crowson, ``k_diffusion/sampling.py``: a denoiser callable and a callback
dict per step) and EDM's denoiser interface (Karras et al., "Elucidating the Design Space of Diffusion-Based
Generative Models", NeurIPS 2022, Section 2).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import Tensor

from .denoiser import NFECounter


def flow_time(sigma: float) -> float:
    """The flow time ``t = sigma / (1 + sigma)`` of a noise level (``t = 1`` at ``sigma = inf``)."""
    return 1.0 if math.isinf(sigma) else sigma / (1.0 + sigma)


def where(step: int | None, sigma: float) -> str:
    """``step i (sigma=..., flow time t = ...)``: how errors name the place of a model call."""
    head = f"step {step} (sigma={sigma:.6g}, " if step is not None else f"sigma={sigma:.6g} ("
    return head + f"flow time t = sigma/(1+sigma) = {flow_time(sigma):.6g})"


def sigma_batch(x: Tensor, sigma: float) -> Tensor:
    """The level ``sigma`` as a ``[B]`` tensor on ``x``'s device, in ``x``'s dtype promoted to at least float32."""
    return x.new_full((x.shape[0],), sigma, dtype=torch.promote_types(x.dtype, torch.float32))


def checked_call(fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, sigma: float, step: int | None = None, *,
                 finite: bool = True) -> Tensor:
    """``fn(x, sigma_batch)`` with the checks of every model call (see the module docstring).

    Args:
        fn: the model, called with the state and the level as a ``[B]`` tensor (:func:`sigma_batch`).
        x: the state ``[B, ...]``; at ``sigma = inf`` (the first level of a flow schedule) the unit noise itself
            (docs/methods/conventions.md, "Flow-matching models").
        sigma: the noise level (a Python float: no host read here).
        step: the sampler step the call belongs to, named in errors (None: the message names the sigma only).
        finite: raise on a non-finite output (one sum and one host read per call); False for loops that handle
            non-finite rows themselves.

    Returns:
        The output in ``x``'s dtype.

    Raises:
        ValueError: the output is not a tensor of ``x``'s shape (or the model raised a ``ValueError``, re-raised
            with the step appended).
        FloatingPointError: ``finite`` and the output has a non-finite entry.
    """
    try:
        d = fn(x, sigma_batch(x, sigma))
    except ValueError as e:
        if type(e) is not ValueError or " at step " in str(e) or step is None:
            raise
        raise ValueError(f"{e} (at {where(step, sigma)})") from e
    if not isinstance(d, Tensor) or d.shape != x.shape:
        got = tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__
        raise ValueError(f"denoiser returned shape {got}, expected the input's shape {tuple(x.shape)}"
                         + (f" at {where(step, sigma)}" if step is not None else ""))
    # A sum is non-finite if any entry is: one cheap reduction (and one host sync) per evaluation.
    if finite and not math.isfinite(d.sum().item()) and not torch.isfinite(d).all():
        bad = int((~torch.isfinite(d)).flatten(1).any(1).sum())
        hint = ("; at sigma = inf the denoiser gets the unit noise as x and must return the limit of E[x0 | x] "
                "(FlowDenoiser and the exact GaussianMixture do): start a denoiser without that limit at a finite "
                "sigma" if math.isinf(sigma) else "")
        raise FloatingPointError(
            f"denoiser returned non-finite values at step {step} (sigma={sigma:.6g}) for {bad} of {x.shape[0]} "
            f"samples (flow time t = sigma/(1+sigma) = {flow_time(sigma):.6g}){hint}"
        )
    return d if d.dtype == x.dtype else d.to(x.dtype)


def emit(callback: Callable[[dict], None] | None, i: int, sigma: float, sigma_next: float, x: Tensor,
         denoised: Tensor) -> None:
    """Call a sampler's ``callback`` (if any) with ``{"i", "sigma", "sigma_next", "x", "denoised"}``."""
    if callback is not None:
        callback({"i": i, "sigma": sigma, "sigma_next": sigma_next, "x": x, "denoised": denoised})


class ModelCall:
    """A denoiser ``D(x, sigma, cond)`` evaluated through :func:`checked_call` in micro-batches, counted and timed.

    Args:
        denoiser: ``D(x, sigma, cond=None)``; wrapped in an :class:`~steerdiff.core.denoiser.NFECounter` unless it
            is one (``self.denoiser.rows`` / ``.calls`` are the counts).
        batch_size: rows per call (memory stays flat in the number of rows); None = all rows at once.
        chunks: optional ``chunks(n) -> [slice, ...]``, the cuts of ``n`` rows into calls, for a caller whose cuts
            must match another run's (a sharded population: :class:`steerdiff.align.shard.ParticleShard`); it may
            return None to fall back to ``batch_size``.
        finite: passed to :func:`checked_call` (False: non-finite rows are the caller's to handle).
    """

    def __init__(self, denoiser: Callable, *, batch_size: int | None = None,
                 chunks: Callable[[int], list[slice] | None] | None = None, finite: bool = True):
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.denoiser = denoiser if isinstance(denoiser, NFECounter) else NFECounter(denoiser)
        self.batch_size = batch_size
        self.finite = finite
        self._chunks = chunks
        self.time = 0.0

    def chunks(self, n: int) -> list[slice]:
        """The row slices of one call over ``n`` rows."""
        if self._chunks is not None:
            cuts = self._chunks(n)
            if cuts is not None:
                return cuts
        step = n if self.batch_size is None else self.batch_size
        return [slice(k, min(k + step, n)) for k in range(0, n, step)]

    def one(self, x: Tensor, sigma: float, cond=None, step: int | None = None) -> Tensor:
        """One checked call on all of ``x`` (no micro-batching, not timed), in the current grad mode."""
        return checked_call(lambda z, sb: self.denoiser(z, sb, cond), x, sigma, step, finite=self.finite)

    def __call__(self, x: Tensor, sigma: float, cond=None, step: int | None = None) -> Tensor:
        """``D(x, sigma, cond)`` in micro-batches (in the current grad mode), timed."""
        start = time.perf_counter()
        parts = [self.one(x[c], sigma, None if cond is None else cond[c], step) for c in self.chunks(x.shape[0])]
        self.time += time.perf_counter() - start
        return parts[0] if len(parts) == 1 else torch.cat(parts)
