"""Two ways to generate a sequence with one sequence denoiser (Cheng et al., "DAWN: Dynamic frame Avatar With
Non-autoregressive diffusion framework", 2025; docs/methods/sequence.md, "The model"):

* :func:`generate_sequence`: all ``S`` frames jointly in one sampler run (DAWN's non-autoregressive strategy, Sec. 1 and
  Sec. 3);
* :func:`generate_autoregressive`: the baseline it replaces, chunks of ``chunk`` frames one after another, each
  conditioned on the last ``overlap`` frames generated before it.

Randomness is per sample (and per chunk): the noise of sample ``i`` comes from a seed hashed from ``(seed, i)``, so a
sample does not depend on the batch.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from ..core.noise import randn
from ..core.sampling import sample
from ..core.sigmas import karras
from .cond import SequenceCond, _check_float


def _sample_seeds(seed: int, batch: int, part: int) -> list[int]:
    """One torch seed per sample and chunk, hashed from ``(seed, row, part)`` (rows and chunks never collide)."""
    return [int(np.random.SeedSequence([seed, i, part]).generate_state(1, np.uint64)[0] >> 1) for i in range(batch)]


def _frame_shape(model, context: Tensor | None) -> tuple[int, ...]:
    shape = getattr(model, "frame_shape", None)
    if shape is None and context is not None:
        shape = tuple(context.shape[2:])
    if shape is None:
        raise ValueError("model has no frame_shape attribute: pass context= (its frames give the frame shape)")
    return tuple(shape)


def _check_request(signal: Tensor, length: int | None, context: Tensor | None) -> int:
    _check_float(signal, "signal (the driving signal [B, S, signal_dim])", 3)
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be an int >= 1 (frames to generate), got {length!r}")
        if length != signal.shape[1]:
            raise ValueError(f"signal has {signal.shape[1]} frames but length={length} frames were requested: the "
                             f"driving signal must give one row per generated frame ([B, {length}, signal_dim])")
    if signal.shape[1] < 1:
        raise ValueError("signal must have at least one frame")
    if context is not None:
        SequenceCond(signal, context)  # validates its form and batch
    return int(signal.shape[1])


def generate_sequence(model, signal: Tensor, context: Tensor | None = None, *, length: int | None = None,
                      steps: int = 16, sigma_min: float = 0.002, sigma_max: float = 80.0, method: str = "heun",
                      seed: int = 0, return_stats: bool = False):
    """Generate all ``S`` frames jointly (DAWN's non-autoregressive strategy): one sampler run over the whole sequence.

    Args:
        model: a sequence denoiser ``D(x [B, S, *frame], sigma, SequenceCond)`` (a :class:`SequencePrecond`).
        signal: ``[B, S, signal_dim]`` driving signal, one row per frame to generate.
        context: ``[B, k, *frame]`` known frames before the first one, or None.
        length: the number of frames wanted; must equal ``signal.shape[1]`` when given (a check, not a crop).
        steps, sigma_min, sigma_max: the Karras schedule (``steerdiff.sigmas.karras``).
        method: a registered sampler (``heun`` by default).
        seed: sample ``i`` draws its noise from a seed hashed from ``(seed, i)``, independent of the batch.
        return_stats: also return ``{"nfe", "calls", "wall_time", "frames"}``.

    Returns:
        Frames ``[B, S, *frame]`` (and the stats).
    """
    s = _check_request(signal, length, context)
    shape = (signal.shape[0], s, *_frame_shape(model, context))
    start = time.perf_counter()
    noise = randn(shape, _sample_seeds(seed, shape[0], 0), dtype=signal.dtype, device=signal.device)
    sigmas = karras(steps, sigma_min, sigma_max).to(signal.dtype)
    out, st = sample(model, noise, sigmas, method=method, cond=SequenceCond(signal, context), return_stats=True)
    stats = {"nfe": st.nfe, "calls": st.calls, "wall_time": time.perf_counter() - start, "frames": s}
    return (out, stats) if return_stats else out


def generate_autoregressive(model, signal: Tensor, context: Tensor | None = None, *, chunk: int = 16,
                            overlap: int = 4, length: int | None = None, steps: int = 16, sigma_min: float = 0.002,
                            sigma_max: float = 80.0, method: str = "heun", seed: int = 0, return_stats: bool = False):
    """The autoregressive baseline DAWN replaces: chunks of ``chunk`` frames generated one after another, each
    conditioned on the last ``overlap`` frames before it (the given context for the first chunk, generated frames
    after) and on its own window of the signal.

    Args:
        model: a sequence denoiser trained on windows of ``chunk`` frames after ``overlap`` context frames.
        signal: ``[B, S, signal_dim]``.
        context: ``[B, k, *frame]`` known frames before frame 0 (``k >= overlap``), or None when ``overlap = 0``.
        chunk: frames per chunk (the last chunk may be shorter). overlap: conditioning frames per chunk.
        length, steps, sigma_min, sigma_max, method, seed, return_stats: as in :func:`generate_sequence`
            (chunk ``j`` of sample ``i`` draws from a seed hashed from ``(seed, i, j + 1)``).

    Returns:
        Frames ``[B, S, *frame]`` (and the stats, NFE summed over the chunks).
    """
    s = _check_request(signal, length, context)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1 (frames per chunk), got {chunk!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
        raise ValueError(f"overlap must be an int >= 0 (conditioning frames per chunk), got {overlap!r}")
    have = 0 if context is None else context.shape[1]
    if have < overlap:
        raise ValueError(f"overlap={overlap} needs at least {overlap} context frames before the first chunk, got "
                         f"{have}")
    frame_shape = _frame_shape(model, context)
    sigmas = karras(steps, sigma_min, sigma_max).to(signal.dtype)
    start = time.perf_counter()
    history, outs = context, []
    nfe, calls = 0.0, 0
    for j, t in enumerate(range(0, s, chunk)):
        n = min(chunk, s - t)
        ctx = history[:, history.shape[1] - overlap:] if overlap else None  # the last `overlap` frames so far
        noise = randn((signal.shape[0], n, *frame_shape), _sample_seeds(seed, signal.shape[0], j + 1),
                      dtype=signal.dtype, device=signal.device)
        out, st = sample(model, noise, sigmas, method=method, cond=SequenceCond(signal[:, t:t + n], ctx),
                         return_stats=True)
        outs.append(out)
        history = out if history is None else torch.cat([history, out], dim=1)
        nfe, calls = nfe + st.nfe, calls + st.calls
    result = torch.cat(outs, dim=1)
    stats = {"nfe": nfe, "calls": calls, "wall_time": time.perf_counter() - start, "frames": s}
    return (result, stats) if return_stats else result
