"""Samplers for consistency-distilled models: ``lcm`` and ``tcd`` (docs/methods/samplers.md, "lcm and tcd").

One denoiser call per level: ``x0 = D(x, sigma)``, then a jump to the next level.

* ``lcm``: multistep consistency sampling (Song et al., "Consistency Models", ICML 2023, Algorithm 1; Luo et al.,
  "Latent Consistency Models", 2023, Algorithm 3; diffusers' ``LCMScheduler``, ComfyUI's ``sample_lcm``):
  ``x' = D + s' z`` with fresh per-sample noise ``z``; the last step returns ``D``. The consistency boundary
  condition (LCM's ``c_skip``, ``c_out``) belongs to the model, as in ComfyUI (its "lcm" model sampling); the
  sampler takes the model's ``D`` as the consistency function.
* ``tcd``: strategic stochastic sampling (Zheng et al., "Trajectory Consistency Distillation", 2024, Sec. 4.3;
  diffusers' ``TCDScheduler``): a DDIM jump to an intermediate level ``s_s <= s'`` set by ``gamma`` (``eta`` here,
  default 0.3), ``x_s = D + (s_s / s)(x - D)``, then forward noise to ``s'``, ``x' = x_s + sqrt(s'^2 - s_s^2) z``.
  The intermediate level is TCD's ``tau_s = floor((1 - gamma) tau')`` on the model's discrete timesteps where the
  denoiser has a table of per-timestep sigmas (``denoiser.sigmas``, a :class:`~steerdiff.core.VPDenoiser`), with
  ``tau'`` the timestep of ``s'``; otherwise ``s_s = (1 - gamma) s'`` (time = sigma, EDM's VE convention).
  ``gamma = 0`` is DDIM (deterministic), ``gamma = 1`` is ``lcm``. The last step (``s' = 0``) returns ``D`` (diffusers'
  ``TCDScheduler`` stops at its smallest timestep instead, ``D + s_0 (x - D)/s`` with ``s_0`` the table's first
  level; ``tcd_final="table"`` reproduces that).

From ``sigma_0 = inf`` (the state is the unit noise): ``x_1 = D_0 + s_1 z`` (``lcm``); ``tcd``'s DDIM jump keeps
the state's weight ``s_s`` (the limit of ``s_s x / s`` with ``x = s eps``): ``x_s = D_0 + s_s eps``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .calls import emit
from .dpm_solver import check_eta
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, denoise_step, euler_step, step_range

TCD_FINALS = ("zero", "table")


@register_sampler("lcm", inf_start=True, nfe=lambda steps: steps, stochastic=True, corrector=True)
def sample_lcm(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None,
               x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """Multistep consistency sampling (LCM, Luo et al. 2023, Algorithm 3): ``x' = D(x, s) + s' z``, ``x = D`` on the
    last step; NFE = ``len(sigmas) - 1``."""
    noise = noise or SampleNoise(None)
    for i in step_range(sigmas, progress, "lcm"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        x = d + noise.randn_like(d) * s_next if s_next > 0 else d
    return x


def tcd_level(s_next: float, gamma: float, table: list[float] | None) -> float:
    """TCD's intermediate level ``s_s`` for the jump to ``s_next`` (see the module docstring); ``table`` the model's
    per-timestep sigmas as floats (increasing), or None."""
    if table is None:
        return (1 - gamma) * s_next
    log_s = math.log(s_next)
    tau = min(range(len(table)), key=lambda k: abs(math.log(table[k]) - log_s))  # the timestep of s_next
    return table[math.floor((1 - gamma) * tau)]


@register_sampler("tcd", inf_start=True, nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=0.3, options=("tcd_final",), corrector=True)
def sample_tcd(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None,
               eta: float = 0.3, denoiser=None, tcd_final: str = "zero", x0_corrector: X0Corrector | None = None,
               **_) -> Tensor:
    """TCD's strategic stochastic sampling (Zheng et al. 2024, Sec. 4.3; diffusers' ``TCDScheduler``) with
    ``gamma = eta`` (default 0.3); NFE = ``len(sigmas) - 1``. ``tcd_final="table"``: the last step lands on the
    table's first level, as diffusers' scheduler (needs a denoiser with a table)."""
    gamma = check_eta(eta)
    if tcd_final not in TCD_FINALS:
        raise ValueError(f"tcd_final must be one of {TCD_FINALS}, got {tcd_final!r}")
    table = getattr(denoiser, "sigmas", None)
    # One host copy of the model's fixed table before the loop (a CPU buffer of the denoiser, not a device state).
    table = table.detach().to("cpu", torch.float64).tolist() if isinstance(table, Tensor) and table.ndim == 1 \
        and table.numel() > 1 else None
    if tcd_final == "table" and table is None:
        raise ValueError("tcd_final='table' needs a denoiser with a per-timestep sigma table (denoiser.sigmas)")
    noise = noise or SampleNoise(None)
    for i in step_range(sigmas, progress, "tcd"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        if s_next == 0:
            x = euler_step(x, d, s, table[0]) if tcd_final == "table" else d
            continue
        s_s = tcd_level(s_next, gamma, table)
        x = euler_step(x, d, s, s_s) if s_s > 0 else d
        if gamma > 0 and s_next > s_s:
            x = x + noise.randn_like(x) * math.sqrt(s_next**2 - s_s**2)
    return x
