"""Pieces every inverse solver shares (constraints_inverse.md section 1): the VP-linear level schedule, one checked
denoiser call per level, and the guard that marks non-finite chains.

``vp_linear_sigmas`` would sit naturally in :mod:`steerdiff.core.sigmas`; it lives here until core takes it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.sampling import _denoise

VP_BETA_START, VP_BETA_END, VP_TRAIN_STEPS = 1e-4, 0.02, 1000  # DDPM linear schedule (HRDIS linear1000.yaml)


def vp_linear_sigmas(steps: int = 100, start: int = 1000, end: int = 0) -> Tensor:
    """Descending EDM noise levels of HRDIS' ``get_timesteps`` on the linear DDPM schedule (spec section 1).

    ``beta_j = linspace(1e-4, 0.02, 1000)``, ``abar_t = prod_{j<=t} (1 - beta_j)``, ``skip = (start - end) // steps``,
    ``t_k = end + k * skip`` for ``k = steps-1 ... 0``, ``sigma_k = sqrt((1 - abar_{t_k}) / abar_{t_k})``. For 100
    steps: 143.78 (t = 990) down to 0.0100 (t = 0); ``end=100`` stops at 0.342.

    Returns:
        float64 ``[steps]`` of positive levels, strictly decreasing, **without** a trailing 0.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= end < start <= VP_TRAIN_STEPS):
        raise ValueError(f"need integers 0 <= end < start <= {VP_TRAIN_STEPS}, got start={start}, end={end}")
    skip = (start - end) // steps
    if skip < 1:
        raise ValueError(f"steps={steps} is more than the {start - end} timesteps between end={end} and start={start}")
    betas = torch.linspace(VP_BETA_START, VP_BETA_END, VP_TRAIN_STEPS, dtype=torch.float64)
    abar = torch.cumprod(1 - betas, 0)
    t = end + skip * torch.arange(steps - 1, -1, -1)
    return ((1 - abar[t]) / abar[t]).sqrt()


def check_levels(sigmas) -> list[float]:
    """Validate a level schedule: 1-D, finite, strictly decreasing, positive (one trailing 0 is dropped)."""
    s = torch.as_tensor(sigmas, dtype=torch.float64).detach().cpu()
    if s.ndim != 1 or s.numel() < 1:
        raise ValueError(f"sigmas must be a 1-D tensor of noise levels, got shape {tuple(s.shape)}")
    if s.numel() > 1 and s[-1] == 0:
        s = s[:-1]
    if not torch.isfinite(s).all() or (s <= 0).any():
        raise ValueError("sigmas must be finite and positive (a single trailing 0 is allowed and ignored)")
    if not torch.all(s[1:] < s[:-1]):
        raise ValueError("sigmas must be strictly decreasing (levels are visited from high to low; spec section 8.5)")
    return s.tolist()


def denoise(denoiser, x: Tensor, sigma: float, cond: Tensor | None, i: int) -> Tensor:
    """``D(x, sigma, cond)`` with core's checks (output shape; non-finite output names the step and sigma)."""
    return _denoise(lambda z, s: denoiser(z, s, cond), x, sigma, i)


def raw_denoise(denoiser, x: Tensor, sigma: float, cond: Tensor | None) -> Tensor:
    """``D(x, sigma, cond)`` with the shape check only: DPS guards non-finite rows itself (spec section 8.11)."""
    d = denoiser(x, x.new_full((x.shape[0],), sigma, dtype=torch.promote_types(x.dtype, torch.float32)), cond)
    if not isinstance(d, Tensor) or d.shape != x.shape:
        got = tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__
        raise ValueError(f"denoiser returned shape {got}, expected the input's shape {tuple(x.shape)}")
    return d.to(x.dtype)


def finite_rows(x: Tensor) -> Tensor:
    """``[B]`` bool: rows whose every entry is finite."""
    return torch.isfinite(x).flatten(1).all(1)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
