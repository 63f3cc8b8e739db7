"""Constraint distances ``l(x) >= 0`` (``l = 0`` on the constraint set) and the data sets that obey them.

CPU-sized versions of the constraints of Feng, Baptista, Bouman (ICLR 2025: total brightness, a PDE residual) and
the circle of test N1; docs/methods/namm.md, "Constraint distances". A distance is a plain
callable ``[B, *shape] -> [B]``, differentiable in ``x`` (NAMM's constraint loss back-propagates through it).

* :func:`unit_circle_distance` (N1): ``|‖x‖ - 1|`` for 2-D points; data :func:`unit_circle_data`.
* :class:`TotalBrightness` (N2, the paper's constant-flux constraint): ``|Σ_j x_j - total|``; data
  :func:`brightness_digits` (``x = 20 u / Σu`` with ``u`` = pixels / 16).
* :class:`HeatResidual` (N3): ``mean|u_{n+1} - Φ(u_n)|`` for the explicit periodic heat step; data :func:`heat_data`.

:func:`check_distance` validates a user's callable (shape ``[B]``, finite, non-negative) with errors that name it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

Distance = Callable[[Tensor], Tensor]


def unit_circle_distance(x: Tensor) -> Tensor:
    """``l(x) = | ||x||_2 - 1 |`` per sample (N1); ``x: [B, 2] -> [B]``."""
    if x.ndim != 2 or x.shape[1] != 2:
        raise ValueError(f"unit_circle_distance: x must have shape [B, 2], got {tuple(x.shape)}")
    return (torch.linalg.vector_norm(x, dim=1) - 1.0).abs()


def unit_circle_data(n: int, seed: int = 0) -> Tensor:
    """N1 data: ``(cos θ, sin θ)`` with ``θ ~ U(0, 2π)`` w.p. 1/2, else ``θ ~ N(1.0, 0.4²)``; ``[n, 2]``."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    rng = np.random.default_rng(seed)
    uniform = rng.random(n) < 0.5
    theta = np.where(uniform, rng.uniform(0.0, 2 * math.pi, n), rng.normal(1.0, 0.4, n))
    return torch.tensor(np.stack([np.cos(theta), np.sin(theta)], axis=1), dtype=torch.float32)


class TotalBrightness:
    """``l(x) = |Σ_j x_j - total|`` over all non-batch entries (the paper's constant-flux constraint; N2).

    Args:
        total: the fixed sum (N2: 20; the paper's black-hole images: 120).
    """

    def __init__(self, total: float = 20.0):
        if not math.isfinite(total):
            raise ValueError(f"total must be finite, got {total!r}")
        self.total = float(total)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            raise ValueError(f"TotalBrightness: x must be a batch [B, *shape], got shape {tuple(x.shape)}")
        return (x.flatten(1).sum(1) - self.total).abs()

    def __repr__(self) -> str:
        return f"TotalBrightness(total={self.total:g})"


BRIGHTNESS_TOTAL = 20.0


def brightness_digits(split: str = "train", total: float = BRIGHTNESS_TOTAL) -> tuple[Tensor, Tensor]:
    """N2 data: sklearn digits with ``u = pixels / 16`` rescaled to ``x = total · u / Σu``.

    Returns:
        ``(x [N, 1, 8, 8] float32, labels [N])``; every image sums to ``total`` (up to float32 rounding).
    """
    from ..data.digits import load_digits

    x, y = load_digits(split)
    u = (x.double() + 1.0) / 2.0  # load_digits gives pixels / 8 - 1
    return (total * u / u.sum(dim=(1, 2, 3), keepdim=True)).float(), y


def brightness_to_classifier(x: Tensor) -> Tensor:
    """Brightness-normalised digits back to the classifier's ``[-1, 1]`` pixel range (``2x - 1``).

    ``x = 20 u / Σu`` with ``Σu ≈ 19.6`` on average, so ``x ≈ u`` and ``2x - 1`` is the digits' usual scale; used
    only to compute FID-digits with the shipped classifier.
    """
    return 2.0 * x - 1.0


class HeatResidual:
    """``l(x) = mean_{i,n} |u_{n+1,i} - Φ(u_n)_i|``, ``Φ(u)_i = u_i + r (u_{i+1} - 2u_i + u_{i-1})`` (periodic).

    The N3 constraint (like the paper's Burgers residual). ``x: [B, 1, T, N]`` (time rows, space columns) or
    ``[B, T, N]``.
    """

    def __init__(self, r: float = 0.2):
        if not 0 < r <= 0.5:
            raise ValueError(f"r must lie in (0, 0.5] (explicit-scheme stability), got {r!r}")
        self.r = float(r)

    def step(self, u: Tensor) -> Tensor:
        """One explicit periodic heat step along the last axis."""
        return u + self.r * (torch.roll(u, -1, -1) - 2 * u + torch.roll(u, 1, -1))

    def __call__(self, x: Tensor) -> Tensor:
        u = x[:, 0] if x.ndim == 4 else x
        if u.ndim != 3 or u.shape[1] < 2:
            raise ValueError(f"HeatResidual: x must have shape [B, 1, T, N] or [B, T, N] with T >= 2, got "
                             f"{tuple(x.shape)}")
        return (u[:, 1:] - self.step(u[:, :-1])).abs().flatten(1).mean(1)


def heat_data(n: int, steps: int = 16, points: int = 32, r: float = 0.2, seed: int = 0) -> Tensor:
    """N3 data: random smooth periodic initial conditions (3 sines) advanced by :class:`HeatResidual` steps.

    Returns:
        ``[n, 1, steps, points]`` float32 (row ``t`` is ``Φ^t(u_0)``).
    """
    rng = np.random.default_rng(seed)
    s = np.linspace(0, 2 * math.pi, points, endpoint=False)
    u0 = np.zeros((n, points))
    for k in (1, 2, 3):
        amp, phase = rng.uniform(-1, 1, (n, 1)) / k, rng.uniform(0, 2 * math.pi, (n, 1))
        u0 += amp * np.sin(k * s[None] + phase)
    heat = HeatResidual(r)
    rows = [torch.tensor(u0, dtype=torch.float64)]
    for _ in range(steps - 1):
        rows.append(heat.step(rows[-1]))
    return torch.stack(rows, 1)[:, None].float()


def check_distance(distance: Distance, x: Tensor, name: str = "distance") -> Tensor:
    """Evaluate ``distance(x)`` and check it: a tensor ``[B]``, finite and non-negative.

    Raises:
        TypeError: ``distance`` is not callable or returns no tensor.
        ValueError: wrong shape, NaN/inf, or negative values (naming ``name``).
    """
    if not callable(distance):
        raise TypeError(f"{name} must be a callable [B, *shape] -> [B], got {type(distance).__name__}")
    d = distance(x)
    if not isinstance(d, Tensor):
        raise TypeError(f"{name} must return a tensor [B], got {type(d).__name__}")
    if tuple(d.shape) != (x.shape[0],):
        raise ValueError(f"{name} must return one value per sample, shape [B] = [{x.shape[0]}], got {tuple(d.shape)}")
    if not torch.isfinite(d).all():
        bad = int((~torch.isfinite(d)).sum())
        raise ValueError(f"{name} returned NaN or infinite values for {bad} of {x.shape[0]} samples")
    if (d < 0).any():
        raise ValueError(f"{name} returned negative values (min {float(d.min()):.3g}); a distance is >= 0")
    return d
