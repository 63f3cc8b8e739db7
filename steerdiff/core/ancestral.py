"""Euler ancestral and linear multistep (LMS) samplers, as k-diffusion's ``sample_euler_ancestral`` and
``sample_lms`` (docs/methods/samplers.md).

* ``euler_ancestral``: an Euler step of the probability-flow ODE down to ``sigma_down`` followed by fresh noise of
  std ``sigma_up`` (``ancestral_split``: DDIM's ``sigma_t(eta)``, Song et al. 2021, eq. 16, in sigma space), so
  ``x' = D + (s_down / s)(x - D) + s_up z``. It is the same update as ``ddim`` at the same ``eta``; it exists under
  the name practitioners use and defaults to ``eta = 1`` (the DDPM posterior's noise, as k-diffusion).
* ``lms``: the linear multistep method on ``dx/dsigma = (x - D)/sigma`` in ``sigma`` (Karras et al. 2022 use it as a
  baseline; k-diffusion's implementation): the last ``order`` derivatives are interpolated by a Lagrange polynomial
  in ``sigma`` and integrated exactly over the step (Gauss-Legendre quadrature with ``order`` nodes is exact for
  polynomials of degree ``2 order - 1``; k-diffusion integrates numerically with scipy).

From ``sigma_0 = inf`` (the state is then the unit noise ``eps``): euler_ancestral's first step is
``x_1 = D_0 + s_down eps + s_up z`` with ``s_up = eta sigma_1``, ``s_down = sigma_1 sqrt(1 - eta^2)`` (at ``eta = 1``
``x_1 = D_0 + sigma_1 z``); lms's is the Euler step ``x_1 = D_0 + sigma_1 eps``, and the derivative at inf leaves the
history (its Lagrange weight over a finite step tends to 0 as the node goes to infinity; the integral of the
interpolant over ``(inf, sigma_1]`` would not exist).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from torch import Tensor

from .calls import emit
from .dpm_solver import check_eta, state_scale
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, ancestral_split, denoise_step, step_range

LMS_MAX_ORDER = 4


@register_sampler("euler_ancestral", inf_start=True, nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=1.0, corrector=True)
def sample_euler_ancestral(
    model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None, eta: float = 1.0,
    x0_corrector: X0Corrector | None = None, **_,
) -> Tensor:
    """Euler ancestral steps (k-diffusion's ``sample_euler_ancestral``); NFE = ``len(sigmas) - 1``.

    ``x' = D + (s_down / s)(x - D) + s_up z`` with ``(s_down, s_up)`` from :func:`ancestral_split` and fresh
    per-sample noise ``z``; no noise on the last step to sigma = 0. ``eta = 0`` is the Euler sampler.
    """
    eta = check_eta(eta)
    noise = noise or SampleNoise(None)
    for i in step_range(sigmas, progress, "euler_ancestral"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        x = euler_ancestral_step(x, d, s, s_next, eta, noise)
    return x


def euler_ancestral_step(x: Tensor, denoised: Tensor, s: float, s_next: float, eta: float,
                         noise: SampleNoise) -> Tensor:
    """One Euler ancestral step (k-diffusion's arithmetic): ``D + (s_down / s)(x - D) + s_up z`` with
    :func:`ancestral_split`; from ``s = inf`` (state = the unit noise) ``D + s_down x + s_up z``."""
    s_down, s_up = ancestral_split(s, s_next, eta)
    a = state_scale(s, s_down)  # s_down / s; at s = inf the state is eps and its weight s_down
    x = denoised + (x - denoised) * a if not math.isinf(s) else denoised + x * a
    if s_up > 0:
        x = x + noise.randn_like(x) * s_up
    return x


@functools.lru_cache(maxsize=8)
def _gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(n)


def lms_coefficients(nodes: list[float], a: float, b: float) -> list[float]:
    """``c_j = int_a^b l_j(tau) dtau`` for the Lagrange basis ``l_j`` on ``nodes`` (the newest node first).

    The integrand has degree ``len(nodes) - 1``, so Gauss-Legendre quadrature with ``len(nodes)`` points is exact.
    """
    n = len(nodes)
    xi, w = _gauss_legendre(n)
    tau = 0.5 * (a + b) + 0.5 * (b - a) * xi
    out = []
    for j in range(n):
        basis = np.ones_like(tau)
        for k in range(n):
            if k != j:
                basis *= (tau - nodes[k]) / (nodes[j] - nodes[k])
        out.append(float(0.5 * (b - a) * np.dot(w, basis)))
    return out


@register_sampler("lms", inf_start=True, nfe=lambda steps: steps, options=("order",), corrector=True)
def sample_lms(
    model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, order: int = 4,
    x0_corrector: X0Corrector | None = None, **_,
) -> Tensor:
    """Linear multistep in sigma (k-diffusion's ``sample_lms``); NFE = ``len(sigmas) - 1``.

    ``x' = x + sum_j c_j d_{i-j}``, ``d = (x - D)/sigma``, ``c_j`` the integral over ``[sigma_i, sigma_{i+1}]`` of
    the Lagrange basis polynomial through the last ``min(order, i + 1)`` levels (:func:`lms_coefficients`).
    ``order`` in 1..4 (default 4, as k-diffusion); the first steps use the history they have.
    """
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= LMS_MAX_ORDER:
        raise ValueError(f"order must be an integer in 1..{LMS_MAX_ORDER} for lms, got {order!r}")
    ds: list[Tensor] = []  # derivatives at the last finite levels, newest last
    levels: list[float] = []
    for i in step_range(sigmas, progress, "lms"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        if math.isinf(s):
            x = d + x * s_next  # the Euler step's limit: (x - D)/s -> eps, x + (s_next - s) eps -> D + s_next eps
            ds, levels = [], []
            continue
        ds.append((x - d) / s)
        levels.append(s)
        if len(ds) > order:
            ds.pop(0)
            levels.pop(0)
        coeffs = lms_coefficients(levels[::-1], s, s_next)
        for c, deriv in zip(coeffs, reversed(ds), strict=True):
            x = x + deriv * c
    return x
