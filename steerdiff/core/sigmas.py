"""Noise-level schedules and their validation: each schedule is a decreasing float64 1-D tensor.

``karras`` is Karras et al. 2022, eq. 5. ``from_alphas_cumprod`` turns a discrete VP/DDPM schedule into the
sigma convention, ``sigma_t = sqrt((1 - alphabar_t) / alphabar_t)``, with diffusers' timestep spacings. The two
grids on DDPM's linear schedule (betas ``linspace(1e-4, 0.02, 1000)``) that the methods' official code uses are
here too: :func:`vp_linear` (OCM and Analytic-DPM's index choice, ending in 0) and :func:`vp_linear_levels`
(HRDIS's strided timesteps, positive levels for the inverse solvers). :func:`check_sigmas` validates a schedule
for every consumer.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

SPACINGS = ("leading", "trailing", "linspace")
FINALS = ("zero", "any", "positive")
VP_BETA_START, VP_BETA_END, VP_TRAIN_STEPS = 1e-4, 0.02, 1000  # DDPM's linear schedule (Ho et al. 2020)


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


def check_sigmas(sigmas, final: str = "zero") -> Tensor:
    """Validate a schedule: 1-D, finite, strictly decreasing; returned as a float64 CPU tensor.

    Args:
        sigmas: the schedule (a tensor or a sequence of numbers).
        final: what the last entry must be. ``"zero"`` (samplers): it is 0. ``"any"`` (SMC, whose grid may end at
            ``sigma_min > 0``): every entry is >= 0 and the first > 0. ``"positive"`` (inverse solvers, which visit
            levels): a single trailing 0 is dropped and every remaining level is > 0.
    """
    if final not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    if not isinstance(sigmas, Tensor):
        try:
            sigmas = torch.as_tensor(sigmas, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"sigmas must be a 1-D tensor or a sequence of numbers, got {type(sigmas).__name__}") from e
    if sigmas.dtype == torch.bool or sigmas.is_complex():
        raise TypeError(f"sigmas must be real numbers, got dtype {sigmas.dtype}")
    s = sigmas.detach().to("cpu", torch.float64)
    if final == "positive":
        if s.ndim != 1 or s.numel() < 1:
            raise ValueError(f"sigmas must be a 1-D tensor of noise levels, got shape {tuple(s.shape)}")
        if s.numel() > 1 and s[-1] == 0:
            s = s[:-1]
        if not torch.isfinite(s).all() or (s <= 0).any():
            raise ValueError("sigmas must be finite and positive (a single trailing 0 is allowed and ignored)")
        if not torch.all(s[1:] < s[:-1]):
            raise ValueError("sigmas must be strictly decreasing (levels are visited from high to low)")
        return s
    if s.ndim != 1 or s.numel() < 2:
        raise ValueError(f"sigmas must be a 1-D tensor with at least 2 entries, got shape {tuple(s.shape)}")
    if final == "zero":
        if not torch.isfinite(s).all():
            raise ValueError("sigmas must be finite")
        if s[-1] != 0:
            raise ValueError(f"sigmas must end at 0 (got last value {s[-1].item():g}); append a 0")
    elif not torch.isfinite(s).all() or (s < 0).any():
        raise ValueError("sigmas must be finite and non-negative")
    if not torch.all(s[1:] < s[:-1]):
        i = int(torch.nonzero(s[1:] >= s[:-1])[0])
        raise ValueError(
            f"sigmas must be strictly decreasing; sigmas[{i}]={s[i].item():g} <= sigmas[{i + 1}]={s[i + 1].item():g}"
        )
    if final == "any" and s[0] <= 0:
        raise ValueError("sigmas[0] must be positive")
    return s


@functools.lru_cache(maxsize=4)
def _vp_linear_table(n: int) -> Tensor:
    betas = torch.linspace(VP_BETA_START, VP_BETA_END, n, dtype=torch.float64)
    return sigmas_from_alphas_cumprod(torch.cumprod(1 - betas, 0))


def vp_linear_table(n: int = VP_TRAIN_STEPS) -> Tensor:
    """``[n]`` increasing sigmas of DDPM's linear schedule (timestep 1..n maps to entry 0..n-1); a float64 copy."""
    return _vp_linear_table(n).clone()


def vp_linear(steps: int, n: int = VP_TRAIN_STEPS) -> Tensor:
    """OCM's (Ou et al. 2025) and Analytic-DPM's grid: ``[steps + 1]`` decreasing sigmas on the linear schedule,
    ending in 0.

    ``K = steps`` uses the timesteps ``round(1 + k (n - 1) / (K - 1))``, ``k = 0..K-1`` (the official code's
    ``_choice_steps_linear``), then 0 is appended; ``K = 1`` uses the single timestep ``n`` (one deterministic step
    ``x0 = D(x_{sigma_n})``). ``sigma_1 = 0.0100``, ``sigma_1000 = 157.4``.

    Raises:
        ValueError: ``steps`` is not an integer in ``[1, n]``.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= n:
        raise ValueError(f"steps must be an integer in [1, {n}], got {steps!r}")
    table = _vp_linear_table(n)
    if steps == 1:
        idx = torch.tensor([n])
    else:
        k = torch.arange(steps, dtype=torch.float64)
        idx = torch.round(1 + k * (n - 1) / (steps - 1)).to(torch.int64)
    sig = table[idx - 1].flip(0)
    return torch.cat([sig, sig.new_zeros(1)])


def vp_linear_levels(steps: int = 100, start: int = VP_TRAIN_STEPS, end: int = 0) -> Tensor:
    """HRDIS's ``get_timesteps`` grid (the inverse solvers' levels): ``[steps]`` positive decreasing sigmas on the
    linear schedule, **without** a trailing 0.

    ``skip = (start - end) // steps``, timesteps ``t_k = end + k * skip`` for ``k = steps-1 ... 0`` (0-based into
    the table, so ``t = 0`` is ``sigma = 0.0100``). For 100 steps: 143.78 (t = 990) down to 0.0100; ``end=100``
    stops at 0.342.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= end < start <= VP_TRAIN_STEPS):
        raise ValueError(f"need integers 0 <= end < start <= {VP_TRAIN_STEPS}, got start={start}, end={end}")
    skip = (start - end) // steps
    if skip < 1:
        raise ValueError(f"steps={steps} is more than the {start - end} timesteps between end={end} and start={start}")
    t = end + skip * torch.arange(steps - 1, -1, -1)
    return _vp_linear_table(VP_TRAIN_STEPS)[t].clone()
