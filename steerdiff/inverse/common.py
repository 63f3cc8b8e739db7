"""Pieces every inverse solver shares: one checked denoiser call per level and the guard that marks non-finite
chains (their level schedule is :func:`steerdiff.core.sigmas.vp_linear_levels`)."""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from ..core.sampling import denoise_checked


def denoise(denoiser, x: Tensor, sigma: float, cond: Tensor | None, i: int) -> Tensor:
    """``D(x, sigma, cond)`` with core's checks (output shape; non-finite output names the step and sigma)."""
    return denoise_checked(lambda z, s, step=None: denoiser(z, s, cond), x, sigma, i)


def raw_denoise(denoiser, x: Tensor, sigma: float, cond: Tensor | None) -> Tensor:
    """``D(x, sigma, cond)`` with the shape check only: DPS guards non-finite rows itself."""
    d = denoiser(x, x.new_full((x.shape[0],), sigma, dtype=torch.promote_types(x.dtype, torch.float32)), cond)
    if not isinstance(d, Tensor) or d.shape != x.shape:
        got = tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__
        raise ValueError(f"denoiser returned shape {got}, expected the input's shape {tuple(x.shape)}")
    return d.to(x.dtype)


def finite_rows(x: Tensor) -> Tensor:
    """``[B]`` bool: rows whose every entry is finite."""
    return torch.isfinite(x).flatten(1).all(1)


def is_number(v) -> bool:
    """A finite real scalar (Python or numpy; not a bool)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
