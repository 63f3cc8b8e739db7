"""The extended reverse-time SDE solver (Cui et al., "Elucidating the Solution Space of Extended Reverse-Time SDEs
for Diffusion Models", arXiv:2309.06169: ER-SDE-Solver-3, as ComfyUI's ``sample_er_sde``; docs/methods/samplers.md).

In the sigma convention (ComfyUI's VP form with ``alpha = 1``, ``lambda = sigma``), with the noise scaler
``f(s) = s (e^{s^0.3} + 10)`` (the paper's default) and ``r = f(s') / f(s)``:

* stage 1: ``x' = r x + (1 - r) D``;
* stage 2: ``+ (s' - s + f(s') int_s^{s'} dl / f(l)) D_1`` with ``D_1 = (D - D_prev) / (s - s_prev)``;
* stage 3: ``+ ((s' - s)^2 / 2 + f(s') int_s^{s'} (l - s) / f(l) dl) D_2`` with
  ``D_2 = (D_1 - D_1,prev) / ((s - s_prev2) / 2)``;
* noise ``eta sqrt(s'^2 - s^2 r^2) z`` (``eta``: ComfyUI's ``s_noise``, default 1; 0 gives the ODE solver).

The integrals are ComfyUI's 200-point left Riemann sums from ``s'`` (in float64 here; ComfyUI's sum runs in float32,
the dtype of its ``arange``). The stage is ``min(max_stage, i + 1)``; the last step to sigma = 0 is ``x = D``.

From ``sigma_0 = inf`` (the state is the unit noise ``eps``): ``r -> 0`` and ``s r -> 0``, so the first step is
``x_1 = D_0 + eta s_1 z``; the divided differences through ``sigma = inf`` vanish, so the history restarts after it.
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from .calls import emit
from .dpm_solver import check_eta
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, denoise_step, step_range

ER_SDE_POINTS = 200


def er_noise_scaler(s: float) -> float:
    """The ER-SDE noise scaler ``f(s) = s (e^{s^0.3} + 10)`` (Cui et al., the official code's default)."""
    return s * (math.exp(s**0.3) + 10.0)


def er_integrals(s: float, s_next: float) -> tuple[float, float]:
    """``(int 1/f, int (l - s)/f)`` over the step by ComfyUI's rule: ``n = 200`` left points from ``s_next`` with
    spacing ``(s - s_next) / n``."""
    step = (s - s_next) / ER_SDE_POINTS
    pos = s_next + np.arange(ER_SDE_POINTS, dtype=np.float64) * step  # host arithmetic: schedule only
    f = pos * (np.exp(pos**0.3) + 10.0)
    return float((1 / f).sum()) * step, float(((pos - s) / f).sum()) * step


@register_sampler("er_sde", inf_start=True, nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=1.0, options=("max_stage",), corrector=True)
def sample_er_sde(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None,
                  eta: float = 1.0, max_stage: int = 3, x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """ER-SDE-Solver-3 (ComfyUI's ``sample_er_sde``); NFE = ``len(sigmas) - 1``. ``eta`` scales the noise (ComfyUI's
    ``s_noise``); ``max_stage`` in 1..3."""
    eta = check_eta(eta)
    if isinstance(max_stage, bool) or not isinstance(max_stage, int) or not 1 <= max_stage <= 3:
        raise ValueError(f"max_stage must be an integer in 1..3 for er_sde, got {max_stage!r}")
    noise = noise or SampleNoise(None)
    hist: list[tuple[float, Tensor]] = []  # (sigma, D) at the last finite levels, newest last
    old_d1 = None
    for i in step_range(sigmas, progress, "er_sde"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        if s_next == 0:
            x = d
            continue
        if math.isinf(s):
            x = d + noise.randn_like(d) * (eta * s_next) if eta else d
            hist, old_d1 = [], None
            continue
        hist = [*hist[-2:], (s, d)]
        f_next = er_noise_scaler(s_next)
        r = f_next / er_noise_scaler(s)
        x = x * r + d * (1 - r)
        stage = min(max_stage, i + 1, len(hist))
        if stage >= 2:
            dt = s_next - s
            i1, i2 = er_integrals(s, s_next)
            d1 = (d - hist[-2][1]) / (s - hist[-2][0])
            x = x + d1 * (dt + i1 * f_next)
            if stage >= 3 and old_d1 is not None:
                d2 = (d1 - old_d1) / ((s - hist[-3][0]) / 2)
                x = x + d2 * (dt**2 / 2 + i2 * f_next)
            old_d1 = d1
        if eta:
            x = x + noise.randn_like(x) * (eta * math.sqrt(max(s_next**2 - (s * r) ** 2, 0.0)))
    return x
