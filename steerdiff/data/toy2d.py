"""2-D toy distributions: two moons, concentric rings, checkerboard (embedded data sets; docs/methods/conventions.md,
"Embedded data and models").

Each set is a float32 tensor ``[n, 2]`` scaled by a *fixed* affine map (not by the sample's own mean and
std, which would make a point depend on ``n``) so that every axis has a standard deviation between about
0.5 and 1: an EDM model with ``sigma_data`` in 0.5..1 fits them without rescaling. Draws come from seeded
numpy streams in fixed-size per-sample blocks (see ``_rng``), so row ``i`` is the same for every ``n > i``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ._rng import check_count, stream

# Stream keys: uniform draws (which component, where on it) and Gaussian jitter never share a stream.
_UNIFORM, _NORMAL = 0, 1


def two_moons(n: int, seed: int = 0, noise: float = 0.05) -> Tensor:
    """Two interleaved half circles, sample ``i`` on either moon with probability 1/2.

    The raw moons follow the usual construction (upper arc of the unit circle; lower arc mirrored and
    shifted by ``(1, 0.5)``) with isotropic Gaussian ``noise`` added in raw units, then centred at the raw
    mean ``(0.5, 0.25)`` and scaled by 1.1, giving per-axis std about ``(0.96, 0.56)``.

    Args:
        n: number of points.
        seed: non-negative int; equal seeds give equal points.
        noise: standard deviation of the Gaussian jitter, in raw (unscaled) units.

    Returns:
        float32 tensor ``[n, 2]``.
    """
    n = check_count(n)
    if not noise >= 0:
        raise ValueError(f"noise must be a non-negative float, got {noise!r}")
    u = stream(seed, _UNIFORM).random((n, 2))
    jitter = stream(seed, _NORMAL).standard_normal((n, 2))
    lower = u[:, 0] < 0.5
    t = np.pi * u[:, 1]
    # Upper moon: (cos t, sin t); lower moon: (1 - cos t, 0.5 - sin t), the upper one mirrored and shifted.
    x = np.where(lower, 1.0 - np.cos(t), np.cos(t))
    y = np.where(lower, 0.5 - np.sin(t), np.sin(t))
    pts = np.stack([x, y], axis=1) + noise * jitter
    return _to_tensor((pts - np.array([0.5, 0.25])) * 1.1)


def rings(n: int, seed: int = 0) -> Tensor:
    """Three concentric rings of radii 0.5, 1.0 and 1.5 with radial Gaussian jitter of std 0.04.

    A ring is chosen with probability proportional to its radius, so the density along every ring is the same
    (equal ring weights would crowd the inner ring). Per-axis std is about 0.87.

    Args:
        n: number of points.
        seed: non-negative int; equal seeds give equal points.

    Returns:
        float32 tensor ``[n, 2]``.
    """
    n = check_count(n)
    u = stream(seed, _UNIFORM).random((n, 2))
    jitter = stream(seed, _NORMAL).standard_normal(n)
    # Cumulative weights 1/6, 3/6, 6/6 for radii 0.5, 1.0, 1.5 (proportional to the circumference).
    ring = np.searchsorted(np.array([1 / 6, 3 / 6]), u[:, 0], side="right")
    radius = 0.5 * (ring + 1) + 0.04 * jitter
    angle = 2.0 * np.pi * u[:, 1]
    return _to_tensor(np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1))


def checkerboard(n: int, seed: int = 0) -> Tensor:
    """Uniform points on the 8 dark cells of a 4x4 checkerboard covering ``[-1, 1]^2``.

    Cells have side 0.5; cell ``(i, j)`` (column, row from the lower left) is dark when ``i + j`` is even. The
    marginal of each axis is uniform on ``[-1, 1]``, so the per-axis std is ``1/sqrt(3)``, about 0.58.

    Args:
        n: number of points.
        seed: non-negative int; equal seeds give equal points.

    Returns:
        float32 tensor ``[n, 2]``.
    """
    n = check_count(n)
    u = stream(seed, _UNIFORM).random((n, 3))
    cell = np.minimum((u[:, 0] * 8).astype(np.int64), 7)  # guards the (measure-zero) float edge at 8
    row = cell // 2
    col = 2 * (cell % 2) + row % 2  # the two dark columns of row r are r % 2 and r % 2 + 2
    pts = np.stack([col + u[:, 1], row + u[:, 2]], axis=1)
    return _to_tensor(0.5 * pts - 1.0)


def _to_tensor(pts: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(pts, dtype=np.float32))


TOY2D: dict[str, Callable[..., Tensor]] = {"moons": two_moons, "rings": rings, "checkerboard": checkerboard}


def load_toy(name: str, n: int, seed: int = 0) -> Tensor:
    """Draw ``n`` points of the toy set ``name`` (one of ``TOY2D``'s keys) with default parameters.

    Raises:
        ValueError: for an unknown name; the message lists the valid names.
    """
    if name not in TOY2D:
        raise ValueError(f"unknown toy data set {name!r}; valid names: {', '.join(sorted(TOY2D))}")
    return TOY2D[name](n, seed=seed)
