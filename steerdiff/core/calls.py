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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch
from torch import Tensor

from .denoiser import AT_LEAST_FLOAT32, NFECounter, tag_host_level


def flow_time(sigma: float) -> float:
    """The flow time ``t = sigma / (1 + sigma)`` of a noise level (``t = 1`` at ``sigma = inf``)."""
    return 1.0 if math.isinf(sigma) else sigma / (1.0 + sigma)


def where(step: int | None, sigma: float) -> str:
    """``step i (sigma=..., flow time t = ...)``: how errors name the place of a model call."""
    head = f"step {step} (sigma={sigma:.6g}, " if step is not None else f"sigma={sigma:.6g} ("
    return head + f"flow time t = sigma/(1+sigma) = {flow_time(sigma):.6g})"


def sigma_batch(x: Tensor, sigma: float) -> Tensor:
    """The level ``sigma`` as a ``[B]`` tensor on ``x``'s device, in ``x``'s dtype promoted to at least float32.

    The same shape and dtype at every step (a compiled model sees no new input signature), and tagged with its value
    as a host number (:func:`~steerdiff.core.denoiser.tag_host_level`), so that a denoiser's per-step fast path
    (:class:`~steerdiff.core.vp.VPDenoiser`, :class:`~steerdiff.core.flow.FlowDenoiser`) reads the level without
    reading the tensor back from an accelerator.
    """
    dtype = AT_LEAST_FLOAT32.get(x.dtype) or torch.promote_types(x.dtype, torch.float32)
    out = x.new_full((x.shape[0],), sigma, dtype=dtype)
    # The value the tensor holds (float32 rounds it), as the host read of it would give.
    return tag_host_level(out, float(np.float32(sigma)) if dtype == torch.float32 else float(sigma))


# ------------------------------------------------------------------------------------------------ finite checks
FINITE_CHECK_MODES = ("auto", "step", "end")
"""When :func:`checked_call` checks a model output for non-finite values (docs/methods/conventions.md, "Errors"):

* ``"step"``: at every call, with a host read of one sum (the run stops at the first bad call);
* ``"end"``: inside a :func:`trajectory_check` (what :func:`steerdiff.sample` opens around its loop) each call only
  records its per-row sums on the device, and the trajectory's end reads one flag for all of them; a bad call
  raises then, naming the first bad step as ``"step"`` would (no device synchronisation inside the loop, the cost
  a host read has on an accelerator);
* ``"auto"`` (the default): ``"end"`` on an accelerator, ``"step"`` on the CPU, where a host read costs no
  synchronisation and stopping at the first bad call saves the rest of a slow run.
"""

_MODE: ContextVar[str] = ContextVar("steerdiff_finite_check", default="auto")


def check_finite_mode(mode: str) -> str:
    """A mode of :data:`FINITE_CHECK_MODES`, or a ``ValueError`` naming ``finite_check``."""
    if not isinstance(mode, str) or mode not in FINITE_CHECK_MODES:
        raise ValueError(f"finite_check must be one of {FINITE_CHECK_MODES}, got {mode!r}")
    return mode


@contextmanager
def finite_check(mode: str) -> Iterator[None]:
    """Run the enclosed loops with the finite check in ``mode`` (:data:`FINITE_CHECK_MODES`), e.g.
    ``with sd.core.finite_check("end"): sd.sample(...)`` to check once per trajectory on the CPU too."""
    token = _MODE.set(check_finite_mode(mode))
    try:
        yield
    finally:
        _MODE.reset(token)


def non_finite_error(step: int | None, sigma: float, bad: int, n: int) -> FloatingPointError:
    """The error of a model output with non-finite values in ``bad`` of ``n`` rows at ``step`` / ``sigma``."""
    hint = ("; at sigma = inf the denoiser gets the unit noise as x and must return the limit of E[x0 | x] "
            "(FlowDenoiser and the exact GaussianMixture do): start a denoiser without that limit at a finite "
            "sigma" if math.isinf(sigma) else "")
    return FloatingPointError(
        f"denoiser returned non-finite values at step {step} (sigma={sigma:.6g}) for {bad} of {n} "
        f"samples (flow time t = sigma/(1+sigma) = {flow_time(sigma):.6g}){hint}"
    )


def _check_now(d: Tensor, sigma: float, step: int | None, n: int) -> None:
    # A sum is non-finite if any entry is: one cheap reduction (and one host read) per evaluation. The read is
    # tolist (it reads a host tensor's memory directly; item dispatches an op: about 1 us more per step).
    if not math.isfinite(d.sum().tolist()) and not torch.isfinite(d).all():
        raise non_finite_error(step, sigma, int((~torch.isfinite(d)).reshape(d.shape[0], -1).any(1).sum()), n)


_ACC = AT_LEAST_FLOAT32
_ROW_DIMS = [tuple(range(1, n)) for n in range(65)]  # the non-batch dimensions of a tensor of n dimensions


def host_copy(t: Tensor) -> Tensor:
    """``t`` on the host, for the one deliberate read at the end of a trajectory (the finite flag, the guided range).

    A CUDA tensor is copied without a blocking copy, into pinned memory, and waited for with an event: the run's
    one wait for the device, at the end of its work (which the caller waits for anyway to use the samples), and not
    one that ``torch.cuda.set_sync_debug_mode`` reports, so that a run under it flags any read inside the loop and
    not this one. Other devices: ``t.cpu()``; a CPU tensor is returned as it is.
    """
    if t.device.type == "cpu":
        return t
    if t.device.type != "cuda":
        return t.cpu()
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(t.device))
    done.synchronize()
    return out


class FiniteGuard:
    """The finite checks of one trajectory (:func:`trajectory_check`): deferred ones are recorded on the device.

    Each recorded call keeps its per-row sums (one reduction, in the output's dtype promoted to at least float32,
    so a half-precision row cannot overflow at 65504) and, on the host, its step and sigma; :meth:`check` reads one
    flag for all of them. A row sum is non-finite when an entry is, and also when finite entries sum beyond the
    float range (entries near 1e38 in float32): such an output counts as non-finite here (the ``"step"`` mode
    checks the entries themselves then). A float64 accumulator would rule that out, at twice the cost of the
    reduction on the CPU.
    """

    def __init__(self, deferred: bool):
        self.deferred = deferred
        self._sums: list[Tensor] = []
        self._where: list[tuple[str, int | None, float, int]] = []

    def record(self, d: Tensor, sigma: float, step: int | None, n: int, kind: str = "denoiser") -> None:
        """Record the output ``d`` of a call at ``step`` / ``sigma`` (``kind``: whose output, for the message)."""
        if d.requires_grad:
            d = d.detach()  # keep no graph alive until the end
        acc = _ACC.get(d.dtype) or torch.promote_types(d.dtype, torch.float32)
        self._sums.append(d.sum(_ROW_DIMS[d.ndim], dtype=acc) if d.ndim > 1 else d.to(acc))
        self._where.append((kind, step, sigma, n))

    def first_error(self) -> Exception | None:
        """The error of the first recorded call with a non-finite output (None if all are finite): one host read
        when all are; more to name the bad call."""
        if not self._sums:
            return None
        flat = self._sums[0] if len(self._sums) == 1 else torch.cat(self._sums)
        if bool(host_copy(torch.isfinite(flat).all())):
            return None
        for sums, (kind, step, sigma, n) in zip(self._sums, self._where, strict=True):
            bad = int((~torch.isfinite(sums)).sum())
            if bad:
                if kind == "denoiser":
                    return non_finite_error(step, sigma, bad, n)
                return FloatingPointError(f"{kind} returned non-finite values at {where(step, sigma)}")
        return None

    def check(self) -> None:
        """Raise the error of the first bad recorded call, if any; then start afresh."""
        err = self.first_error()
        self._sums.clear()
        self._where.clear()
        if err is not None:
            raise err


_ACTIVE_GUARD: ContextVar[FiniteGuard | None] = ContextVar("steerdiff_finite_guard", default=None)


def active_guard() -> FiniteGuard | None:
    """The :class:`FiniteGuard` of the innermost open :func:`trajectory_check` (None outside one)."""
    return _ACTIVE_GUARD.get()


@contextmanager
def trajectory_check(device: torch.device | str, mode: str | None = None) -> Iterator[FiniteGuard]:
    """The finite checks of one trajectory on ``device``: in ``"end"`` mode (``"auto"`` off the CPU; see
    :data:`FINITE_CHECK_MODES`) every :func:`checked_call` inside records its output and the block's end raises
    the first bad call's error. An exception leaving the block after a non-finite output (a model that fails on
    the NaN it was handed) is reported as that output's ``FloatingPointError``, raised from it.

    Args:
        device: the trajectory's device (the state's).
        mode: a mode of :data:`FINITE_CHECK_MODES`; None: the one :func:`finite_check` set (default ``"auto"``).
    """
    mode = _MODE.get() if mode is None else check_finite_mode(mode)
    deferred = mode == "end" or (mode == "auto" and torch.device(device).type != "cpu")
    guard = FiniteGuard(deferred)
    token = _ACTIVE_GUARD.set(guard)
    try:
        yield guard
    except Exception as exc:
        err = guard.first_error() if deferred else None
        if err is not None:
            raise err from exc
        raise
    finally:
        _ACTIVE_GUARD.reset(token)
    guard.check()


def checked_call(fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, sigma: float, step: int | None = None, *,
                 finite: bool = True) -> Tensor:
    """``fn(x, sigma_batch)`` with the checks of every model call (see the module docstring).

    Args:
        fn: the model, called with the state and the level as a ``[B]`` tensor (:func:`sigma_batch`).
        x: the state ``[B, ...]``; at ``sigma = inf`` (the first level of a flow schedule) the unit noise itself
            (docs/methods/conventions.md, "Flow-matching models").
        sigma: the noise level (a Python float: no host read here).
        step: the sampler step the call belongs to, named in errors (None: the message names the sigma only).
        finite: raise on a non-finite output; False for loops that handle non-finite rows themselves. Inside a
            deferred :func:`trajectory_check` the output is recorded and checked at the trajectory's end (no host
            read here); else one sum and one host read per call (see :data:`FINITE_CHECK_MODES`).

    Returns:
        The output in ``x``'s dtype.

    Raises:
        ValueError: the output is not a tensor of ``x``'s shape (or the model raised a ``ValueError``, re-raised
            with the step appended).
        FloatingPointError: ``finite`` and the output has a non-finite entry (at the end of the trajectory when
            the check is deferred).
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
    if finite:
        guard = _ACTIVE_GUARD.get()
        if guard is not None and guard.deferred:
            guard.record(d, sigma, step, x.shape[0])
        else:
            _check_now(d, sigma, step, x.shape[0])
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
