"""Noise-level schedules (DESIGN.md, "Public API"): each returns a decreasing 1-D tensor that ends in 0.

``karras`` is Karras et al. 2022, eq. 5. ``from_alphas_cumprod`` turns a discrete VP/DDPM schedule into the
sigma convention, ``sigma_t = sqrt((1 - alphabar_t) / alphabar_t)``, with diffusers' timestep spacings.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SPACINGS = ("leading", "trailing", "linspace")


def karras(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0) -> Tensor:
    """Karras et al. (2022) eq. 5: ``steps`` noise levels from ``sigma_max`` to ``sigma_min``, then 0.

    Returns a float64 tensor of shape ``[steps + 1]``.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not (0 < sigma_min < sigma_max) or not math.isfinite(sigma_max):
        raise ValueError(f"need 0 < sigma_min < sigma_max < inf, got sigma_min={sigma_min}, sigma_max={sigma_max}")
    if rho <= 0:
        raise ValueError(f"rho must be positive, got {rho}")
    if steps == 1:
        return torch.tensor([sigma_max, 0.0], dtype=torch.float64)
    ramp = torch.linspace(0, 1, steps, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    sig = (hi + ramp * (lo - hi)) ** rho
    return torch.cat([sig, sig.new_zeros(1)])


def sigmas_from_alphas_cumprod(alphas_cumprod: Tensor) -> Tensor:
    """Per-timestep sigmas of a discrete VP schedule, ``sqrt((1 - abar) / abar)`` (float64)."""
    abar = torch.as_tensor(alphas_cumprod, dtype=torch.float64)
    if abar.ndim != 1 or abar.numel() < 2:
        raise ValueError(f"alphas_cumprod must be 1-D with at least 2 entries, got shape {tuple(abar.shape)}")
    if not torch.all((abar > 0) & (abar <= 1)):
        raise ValueError("alphas_cumprod must lie in (0, 1]")
    if not torch.all(abar[1:] <= abar[:-1]):
        raise ValueError("alphas_cumprod must be non-increasing in t")
    return ((1 - abar) / abar).sqrt()


def vp_timesteps(num_train_timesteps: int, steps: int, spacing: str = "leading", offset: int = 0) -> Tensor:
    """Decreasing integer timesteps used for ``steps`` sampling steps (diffusers' ``timestep_spacing``).

    ``leading``: ``arange(steps) * (T // steps) + offset``; ``trailing``: ``round(arange(T, 0, -T/steps)) - 1``;
    ``linspace``: ``round(linspace(0, T - 1, steps))``.
    """
    T = num_train_timesteps
    if not isinstance(steps, int) or not 1 <= steps <= T:
        raise ValueError(f"steps must be an integer in [1, {T}], got {steps!r}")
    if spacing == "leading":
        ts = torch.arange(steps, dtype=torch.int64) * (T // steps) + offset
    elif spacing == "trailing":
        ts = torch.round(torch.arange(T, 0, -T / steps, dtype=torch.float64)).to(torch.int64).flip(0) - 1
    elif spacing == "linspace":
        ts = torch.round(torch.linspace(0, T - 1, steps, dtype=torch.float64)).to(torch.int64)
    else:
        raise ValueError(f"spacing must be one of {SPACINGS}, got {spacing!r}")
    return ts.clamp(0, T - 1).flip(0)


def from_alphas_cumprod(
    alphas_cumprod: Tensor, steps: int | None = None, spacing: str = "leading", offset: int = 0
) -> Tensor:
    """Sigma schedule of a discrete VP model: sigmas at the sampling timesteps (decreasing), then 0.

    With ``steps=None`` every training timestep is used. Returns float64 ``[steps + 1]``.
    """
    table = sigmas_from_alphas_cumprod(alphas_cumprod)
    if steps is None:
        return torch.cat([table.flip(0), table.new_zeros(1)])
    ts = vp_timesteps(table.numel(), steps, spacing, offset)
    return torch.cat([table[ts], table.new_zeros(1)])


def check_sigmas(sigmas: Tensor) -> Tensor:
    """Validate a sampling schedule: 1-D, finite, strictly decreasing, ending in 0. Returns it as float64."""
    if not isinstance(sigmas, Tensor):
        sigmas = torch.as_tensor(sigmas)
    if sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(f"sigmas must be a 1-D tensor with at least 2 entries, got shape {tuple(sigmas.shape)}")
    s = sigmas.detach().to("cpu", torch.float64)
    if not torch.isfinite(s).all():
        raise ValueError("sigmas must be finite")
    if s[-1] != 0:
        raise ValueError(f"sigmas must end at 0 (got last value {s[-1].item():g}); append a 0")
    if not torch.all(s[1:] < s[:-1]):
        i = int(torch.nonzero(s[1:] >= s[:-1])[0])
        raise ValueError(
            f"sigmas must be strictly decreasing; sigmas[{i}]={s[i].item():g} <= sigmas[{i + 1}]={s[i + 1].item():g}"
        )
    return s
