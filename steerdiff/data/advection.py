"""Stochastic advection-diffusion sequences for forecasting (the CPU validation data of Dynamical Diffusion, Guo et
al., ICLR 2025; docs/methods/dydiff.md "The validation protocol").

1-D (default): a periodic field on ``N = 32`` cells, ``S = 10`` frames (4 context + 6 future). Frame 0 is a sum of 3
periodic Gaussian bumps (centre ``U[0, N)``, width ``U[1.5, 4]``, amplitude ``+-U[0.5, 1.5]``); each next frame is the
exact spectral step ``u_k <- u_k exp(-i k v - kappa k^2)`` (``v = 0.75`` cells/frame, ``kappa = 0.05``,
``k = 2 pi rfftfreq(N)``) plus smooth forcing ``xi`` (white noise filtered by ``exp(-(k l)^2 / 2)``, ``l = 2``, scaled
so that its standard deviation is 0.25 per cell: an analytic scale, so the process stays exactly Gaussian), and the
whole field is divided by 0.6. 2-D: the same process on a ``16 x 16`` periodic grid with a 2-D spectrum
(``|k|^2`` diffusion, velocity ``(0.75, 0.5)`` cells/frame, isotropic bumps and forcing filter).

Given the last context frame the future is Gaussian, so :func:`oracle_mean` (the last context frame propagated
without forcing) is the exact conditional mean and :func:`oracle_mse` its exact expected squared error per future
frame: the irreducible error of any forecaster. :func:`persistence` repeats the last context frame.

Randomness (docs/methods/conventions.md, "Randomness"): numpy streams keyed by ``(seed, key, purpose)``; draws fill
one fixed-size block per sequence, so the first ``m`` sequences of a call with ``n > m`` equal a call with
``n = m``. :func:`training_stream` gives fresh sequences every optimizer step (key = step + 1); :func:`test_set` is
the fixed set of 128 sequences of seed 1234 (key 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ._rng import check_count, check_seed

TEST_SEED = 1234
TEST_SIZE = 128
SCALE = 0.6  # the field is divided by this
# The range of the values the shipped forecasters were trained on (their checkpoints do not store it): the minimum and
# maximum over every frame of the first 64 batches of 64 sequences (4096) of ``training_stream(seed=0, dims)``, the
# data of configs/advection_dydiff.json and advection_baseline.json ("advection:1d", seed 0), rounded outward to 0.01.
# The process itself is bounded only in law (Gaussian forcing): its first frame lies within 3 x 1.5 / 0.6 = 7.5, and
# 20,000 further sequences reach about +-8.2. The 128 test sequences lie within it (1-D: [-6.06, 5.46]).
TRAINING_RANGE = {1: (-7.39, 7.94), 2: (-7.28, 8.02)}


@dataclass(frozen=True)
class AdvectionSpec:
    """Parameters of the process (validation protocol values by default); ``dims`` 1 or 2, ``size`` cells per axis."""

    dims: int = 1
    size: int = 32
    frames: int = 10
    n_context: int = 4
    velocity: tuple[float, ...] = (0.75,)
    kappa: float = 0.05
    forcing_length: float = 2.0
    forcing_std: float = 0.25
    bumps: int = 3

    def __post_init__(self) -> None:
        if self.dims not in (1, 2):
            raise ValueError(f"dims must be 1 or 2, got {self.dims!r}")
        if self.size < 2 or self.frames < 2 or not 1 <= self.n_context < self.frames:
            raise ValueError(f"need size >= 2, frames >= 2 and n_context in [1, frames), got {self.size}, "
                             f"{self.frames}, {self.n_context}")
        if len(self.velocity) != self.dims:
            raise ValueError(f"velocity must have {self.dims} components, got {self.velocity}")

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return (self.size,) * self.dims

    @property
    def future(self) -> int:
        return self.frames - self.n_context


SPEC_1D = AdvectionSpec()
SPEC_2D = AdvectionSpec(dims=2, size=16, velocity=(0.75, 0.5))


def spec_for(dims: int) -> AdvectionSpec:
    """The validation protocol's process: 1-D (32 cells) or 2-D (16 x 16)."""
    if dims not in (1, 2):
        raise ValueError(f"dims must be 1 or 2, got {dims!r}")
    return SPEC_1D if dims == 1 else SPEC_2D


def _rng(seed: int, key: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([check_seed(seed), int(key), purpose]))


def _wavenumbers(spec: AdvectionSpec) -> list[np.ndarray]:
    """Angular wavenumbers per axis, broadcast to the rfftn grid (last axis: rfftfreq)."""
    n = spec.size
    if spec.dims == 1:
        return [2 * np.pi * np.fft.rfftfreq(n)]
    return [2 * np.pi * np.fft.fftfreq(n)[:, None], 2 * np.pi * np.fft.rfftfreq(n)[None, :]]


def propagator(spec: AdvectionSpec, frames: int = 1) -> np.ndarray:
    """Spectral multiplier of ``frames`` forcing-free steps: ``exp(-frames (i k.v + kappa |k|^2))``."""
    ks = _wavenumbers(spec)
    phase = sum(k * v for k, v in zip(ks, spec.velocity, strict=True))
    k2 = sum(k**2 for k in ks)
    return np.exp(-frames * (1j * phase + spec.kappa * k2))


def _forcing_filter(spec: AdvectionSpec) -> np.ndarray:
    """``exp(-(|k| l)^2 / 2)`` scaled so that filtered unit white noise has standard deviation ``forcing_std``."""
    ks = _wavenumbers(spec)
    filt = np.exp(-0.5 * sum(k**2 for k in ks) * spec.forcing_length**2)
    axes = tuple(range(spec.dims))
    kernel = np.fft.irfftn(filt, s=spec.frame_shape, axes=axes)  # filtered noise = kernel (circ-conv) white noise
    return filt * (spec.forcing_std / np.sqrt((kernel**2).sum()))


def _initial(spec: AdvectionSpec, u: np.ndarray) -> np.ndarray:
    """Sum of periodic Gaussian bumps from uniforms ``u: [n, bumps, dims + 3]``."""
    n, size = u.shape[0], spec.size
    grid = np.arange(size, dtype=np.float64)
    field = np.zeros((n, *spec.frame_shape))
    for j in range(spec.bumps):
        width = 1.5 + 2.5 * u[:, j, spec.dims]
        amp = (0.5 + u[:, j, spec.dims + 1]) * np.where(u[:, j, spec.dims + 2] < 0.5, -1.0, 1.0)
        r2 = 0.0
        for axis in range(spec.dims):
            centre = size * u[:, j, axis]
            d = (grid[None, :] - centre[:, None] + size / 2) % size - size / 2  # periodic distance
            shape = [n] + [1] * spec.dims
            shape[axis + 1] = size
            r2 = r2 + (d**2).reshape(shape)
        field += amp.reshape([n] + [1] * spec.dims) * np.exp(-0.5 * r2 / width.reshape([n] + [1] * spec.dims) ** 2)
    return field


def simulate(n: int, seed: int = 0, key: int = 0, spec: AdvectionSpec = SPEC_1D) -> Tensor:
    """``n`` sequences ``[n, frames, *frame_shape]`` (float32) of the process, drawn from streams ``(seed, key)``.

    Raises:
        ValueError: ``n`` or ``seed`` is not a non-negative int.
    """
    n, seed = check_count(n), check_seed(seed)
    if n == 0:
        return torch.zeros((0, spec.frames, *spec.frame_shape))
    u = _rng(seed, key, 0).random((n, spec.bumps, spec.dims + 3))
    white = _rng(seed, key, 1).standard_normal((n, spec.frames - 1, *spec.frame_shape))
    axes = tuple(range(1, spec.dims + 1))
    prop, filt = propagator(spec), _forcing_filter(spec)
    field = _initial(spec, u)
    out = [field]
    for s in range(spec.frames - 1):
        xi = np.fft.irfftn(np.fft.rfftn(white[:, s], axes=axes) * filt, s=spec.frame_shape, axes=axes)
        field = np.fft.irfftn(np.fft.rfftn(field, axes=axes) * prop, s=spec.frame_shape, axes=axes) + xi
        out.append(field)
    return torch.from_numpy(np.stack(out, axis=1) / SCALE).float()


def test_set(dims: int = 1, n: int = TEST_SIZE) -> Tensor:
    """The fixed test sequences (seed 1234): ``[n, frames, *frame]``."""
    return simulate(n, TEST_SEED, 0, spec_for(dims))


def training_stream(seed: int = 0, dims: int = 1):
    """A data stream for :func:`steerdiff.train.train`: ``stream(step, batch_size)`` -> fresh sequences of step
    ``step`` (a pure function of ``(seed, step)``, so a resumed run sees the same batches)."""
    seed, spec = check_seed(seed), spec_for(dims)

    def stream(step: int, batch_size: int) -> Tensor:
        return simulate(batch_size, seed, step + 1, spec)

    return stream


def _check_context(context: Tensor, spec: AdvectionSpec) -> None:
    if not isinstance(context, Tensor) or context.ndim != spec.dims + 2 or tuple(context.shape[2:]) != spec.frame_shape:
        raise ValueError(f"context must be a tensor [B, n_context, {', '.join(map(str, spec.frame_shape))}], got "
                         f"{getattr(context, 'shape', type(context).__name__)}")


def oracle_mean(context: Tensor, future: int | None = None, spec: AdvectionSpec = SPEC_1D) -> Tensor:
    """Exact conditional mean of the next ``future`` frames given the context: the last context frame propagated
    without forcing. Returns ``[B, future, *frame]``."""
    _check_context(context, spec)
    future = spec.future if future is None else check_count(future, "future")
    axes = tuple(range(1, spec.dims + 1))
    last = np.fft.rfftn(context[:, -1].double().numpy(), axes=axes)
    frames = [np.fft.irfftn(last * propagator(spec, h), s=spec.frame_shape, axes=axes) for h in range(1, future + 1)]
    return torch.from_numpy(np.stack(frames, axis=1)).to(context.dtype)


def oracle_mse(future: int | None = None, spec: AdvectionSpec = SPEC_1D) -> Tensor:
    """Expected squared error per element of :func:`oracle_mean` at lead times ``1..future``: ``[future]``.

    The error at lead ``h`` is the accumulated forcing ``sum_{j<h} P^j xi_j / 0.6``; its variance per cell is
    ``sum_j sum_k |P_k|^{2j} |f_k|^2 / N`` over the full spectrum (``f`` the forcing filter).
    """
    future = spec.future if future is None else check_count(future, "future")
    axes = tuple(range(spec.dims))
    filt_full = np.abs(np.fft.fftn(np.fft.irfftn(_forcing_filter(spec), s=spec.frame_shape, axes=axes)))
    n = np.prod(spec.frame_shape)
    damp = np.abs(np.fft.fftn(np.fft.irfftn(propagator(spec), s=spec.frame_shape, axes=axes)))  # |P_k|, full grid
    per_step = [float((damp ** (2 * j) * filt_full**2).sum() / n) for j in range(future)]
    return torch.tensor(np.cumsum(per_step) / SCALE**2, dtype=torch.float32)


def persistence(context: Tensor, future: int | None = None, spec: AdvectionSpec = SPEC_1D) -> Tensor:
    """The last context frame repeated ``future`` times: ``[B, future, *frame]``."""
    _check_context(context, spec)
    future = spec.future if future is None else check_count(future, "future")
    return context[:, -1:].expand(-1, future, *spec.frame_shape).clone()
