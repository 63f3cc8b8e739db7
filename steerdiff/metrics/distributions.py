"""Distances between sample sets and a mixture's mode-weight error (docs/methods/conventions.md, "Measuring").

Sliced Wasserstein (``p`` = 1 or 2) uses POT (a maintained library) for sets of unequal size; for equal sizes it
sorts the projections directly (the exact 1-D optimal coupling), which is ~100x faster than POT's
quantile path and is tested to agree with POT on the same projections. RBF-MMD is written here and tested against
a direct kernel computation.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import ot
import torch
from torch import Tensor


def _as_2d_numpy(x, name: str) -> np.ndarray:
    a = x.detach().cpu().double().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=np.float64)
    if a.ndim < 2:
        raise ValueError(f"{name} must be [N, ...] with N samples, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty (shape {a.shape}): give at least one sample of at least one value")
    a = a.reshape(a.shape[0], -1)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains non-finite values")
    return a


def random_projections(dim: int, n_projections: int, seed: int = 0) -> np.ndarray:
    """``[dim, n_projections]`` unit directions, uniform on the sphere."""
    p = np.random.default_rng(seed).standard_normal((dim, n_projections))
    return p / np.linalg.norm(p, axis=0, keepdims=True)


def sliced_wasserstein(x, y, n_projections: int = 512, seed: int = 0, p: int = 2,
                       projections: np.ndarray | None = None) -> float:
    """Sliced Wasserstein-``p`` distance between sample sets ``[N, ...]`` and ``[M, ...]`` (uniform weights).

    ``(mean over directions theta of W_p^p(theta.x, theta.y))^(1/p)``, ``p`` in {1, 2}. The directions are
    ``projections`` (``[dim, n]`` unit columns) if given, else ``n_projections`` random ones (the same ``seed``
    gives the same directions); in 1-D the single direction gives the exact ``W_p``.
    """
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p!r}")
    if projections is None:  # checked here: numpy would answer 0 directions with NaN, and bad ones with its own words
        if isinstance(n_projections, bool) or not isinstance(n_projections, numbers.Integral) or n_projections < 1:
            raise ValueError(f"n_projections must be a positive integer, got {n_projections!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    a, b = _as_2d_numpy(x, "x"), _as_2d_numpy(y, "y")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x and y must have the same dimension, got {a.shape[1]} and {b.shape[1]}")
    if projections is not None:
        proj = np.asarray(projections, dtype=np.float64)
    elif a.shape[1] == 1:
        proj = np.ones((1, 1))
    else:
        proj = random_projections(a.shape[1], n_projections, seed)
    if a.shape[0] != b.shape[0]:
        return float(ot.sliced_wasserstein_distance(a, b, p=p, projections=proj))
    diff = np.abs(np.sort(a @ proj, axis=0) - np.sort(b @ proj, axis=0))
    return float(diff.mean()) if p == 1 else float(np.sqrt(np.mean(diff**2)))


def mmd_rbf(x, y, bandwidth: float | None = None) -> float:
    """Unbiased squared MMD with the kernel ``exp(-||u - v||^2 / (2 h^2))``.

    ``bandwidth=None`` takes the median pairwise distance of the pooled samples (median heuristic).
    """
    a = torch.as_tensor(_as_2d_numpy(x, "x"))
    b = torch.as_tensor(_as_2d_numpy(y, "y"))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x and y must have the same dimension, got {a.shape[1]} and {b.shape[1]}")
    if a.shape[0] < 2 or b.shape[0] < 2:
        raise ValueError("mmd_rbf needs at least 2 samples in each set")
    if bandwidth is None:
        pooled = torch.cat([a, b])[:2000]
        bandwidth = float(torch.cdist(pooled, pooled).median())
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, numbers.Real) or not 0 < bandwidth < math.inf:
        raise ValueError(f"bandwidth must be a positive finite number, got {bandwidth!r}")  # inf: MMD 0 for any x, y

    def k(u, v):
        return torch.exp(-torch.cdist(u, v).pow(2) / (2 * bandwidth**2))

    n, m = a.shape[0], b.shape[0]
    kxx = (k(a, a).sum() - n) / (n * (n - 1))
    kyy = (k(b, b).sum() - m) / (m * (m - 1))
    return float(kxx + kyy - 2 * k(a, b).mean())


def mode_weight_error(samples, mixture) -> float:
    """Total variation between the fraction of samples per mode and the mixture's weights.

    Each sample is assigned to its most probable component (the arg-max responsibility at sigma = 0).
    """
    if not callable(getattr(mixture, "responsibilities", None)):
        raise TypeError(f"mixture must be a GaussianMixture (steerdiff.models.GaussianMixture), got "
                        f"{type(mixture).__name__}")
    x = torch.as_tensor(_as_2d_numpy(samples, "samples"))
    assign = mixture.responsibilities(x).argmax(-1)
    frac = torch.bincount(assign, minlength=mixture.n_components).double() / x.shape[0]
    return float(0.5 * (frac - mixture.weights).abs().sum())
