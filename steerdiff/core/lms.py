"""The linear multistep (LMS) sampler, as k-diffusion's ``sample_lms`` (docs/methods/samplers.md).

``lms``: the linear multistep method on ``dx/dsigma = (x - D)/sigma`` in ``sigma`` (Karras et al., "Elucidating the
Design Space of Diffusion-Based Generative Models", NeurIPS 2022, use it as a baseline; k-diffusion's
implementation): the last ``order`` derivatives are interpolated by a Lagrange polynomial in ``sigma`` and integrated
exactly over the step (Gauss-Legendre quadrature with ``order`` nodes is exact for polynomials of degree
``2 order - 1``; k-diffusion integrates numerically with scipy).

From ``sigma_0 = inf`` (the state is then the unit noise ``eps``) the first step is the Euler step
``x_1 = D_0 + sigma_1 eps``, and the derivative at inf leaves the history (its Lagrange weight over a finite step
tends to 0 as the node goes to infinity; the integral of the interpolant over ``(inf, sigma_1]`` would not exist).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from torch import Tensor

from .calls import emit
from .registry import register_sampler
from .sampling import Model, X0Corrector, denoise_step, step_range

LMS_MAX_ORDER = 4


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
