"""DEIS, the diffusion exponential integrator sampler in its ``tAB`` form (Zhang and Chen, "Fast Sampling of Diffusion
Models with Exponential Integrator", ICLR 2023, Sec. 3.3 / eq. 15), as ComfyUI's ``sample_deis`` (after the
``diff-sampler`` reimplementation; docs/methods/samplers.md).

On ``dx/dsigma = d = (x - D)/sigma`` the last ``order`` derivatives are interpolated by a Lagrange polynomial in the
VP time ``t`` of EDM's VP fit (``sigma(t)^2 = e^{beta_d t^2 / 2 + beta_min t} - 1`` with ``beta_d``, ``beta_min``
set so that ``sigma(1) = 80`` and ``sigma(1e-3) = 0.002``; ComfyUI uses these fixed values whatever the schedule)
and integrated over the step in ``sigma``: ``x' = x + sum_j c_j d_{i-j}``, ``c_j = int l_j(t) (dsigma/dt) dt``.
The integral is ComfyUI's rule (``n = 10000`` points ``linspace(t, t', n)`` times ``(t' - t)/n``), so the weights
equal ComfyUI's (in float64; ComfyUI computes the VP fit in float32). Order 1, the first step and the last step to
sigma = 0 are Euler (``x = D`` on the last). One evaluation per step.

From ``sigma_0 = inf`` (``t = inf``) the first step is the Euler limit ``x_1 = D_0 + sigma_1 eps`` and the history
restarts after it (as ``lms`` and ``ipndm``).
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from .calls import emit
from .registry import register_sampler
from .sampling import Model, X0Corrector, denoise_step, euler_step, step_range

DEIS_MAX_ORDER = 4
DEIS_POINTS = 10_000
_EPS_S, _SIGMA_MIN, _SIGMA_MAX = 1e-3, 0.002, 80.0


def _vp_fit() -> tuple[float, float]:
    lo, hi = math.log(_SIGMA_MIN**2 + 1), math.log(_SIGMA_MAX**2 + 1)
    beta_d = 2 * (lo / _EPS_S - hi) / (_EPS_S - 1)
    return beta_d, hi - 0.5 * beta_d


def deis_time(sigma: float) -> float:
    """The VP time ``t`` of ``sigma`` on EDM's VP fit (the inverse of ``sigma(t)``; 0 at ``sigma = 0``)."""
    beta_d, beta_min = _vp_fit()
    return (math.sqrt(beta_min**2 + 2 * beta_d * math.log(sigma**2 + 1)) - beta_min) / beta_d


def deis_weights(times: list[float], t_next: float, n: int = DEIS_POINTS) -> list[float]:
    """``c_j``: the Lagrange basis on ``times`` (the current level's time first, then older ones) times
    ``dsigma/dt``, summed over ComfyUI's ``n`` points from ``times[0]`` to ``t_next``."""
    beta_d, beta_min = _vp_fit()
    # Host arithmetic (numpy): the weights depend on the schedule only, never on a device tensor.
    taus = np.linspace(times[0], t_next, n)
    alpha = np.exp(-0.5 * taus**2 * beta_d - taus * beta_min)
    integrand = 0.5 * (taus * beta_d + beta_min) / np.sqrt(alpha * (1 - alpha))  # dsigma/dt
    dtau = (t_next - times[0]) / n
    out = []
    for j, tj in enumerate(times):
        poly = np.ones_like(taus)
        for k, tk in enumerate(times):
            if k != j:
                poly = poly * (taus - tk) / (tj - tk)
        out.append(float((integrand * poly).sum()) * dtau)
    return out


@register_sampler("deis", inf_start=True, nfe=lambda steps: steps, options=("max_order",), corrector=True)
def sample_deis(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, max_order: int = 3,
                x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """DEIS-tAB (ComfyUI's ``sample_deis``, ``deis_mode="tab"``); ``max_order`` in 1..4 (default 3, ComfyUI's);
    NFE = ``len(sigmas) - 1``."""
    if isinstance(max_order, bool) or not isinstance(max_order, int) or not 1 <= max_order <= DEIS_MAX_ORDER:
        raise ValueError(f"max_order must be an integer in 1..{DEIS_MAX_ORDER} for deis, got {max_order!r}")
    ds: list[Tensor] = []  # derivatives at the last finite levels, newest first
    times: list[float] = []
    for i in step_range(sigmas, progress, "deis"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        if math.isinf(s):
            x = euler_step(x, d, s, s_next)
            ds, times = [], []
            continue
        ds = [(x - d) / s, *ds][:max_order]
        times = [deis_time(s), *times][:max_order]
        if len(ds) == 1 or s_next == 0:
            x = euler_step(x, d, s, s_next)
            continue
        for c, dj in zip(deis_weights(times, deis_time(s_next)), ds, strict=True):
            x = x + dj * c
    return x
