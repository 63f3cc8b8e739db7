"""The RES multistep sampler: the second-order multistep exponential integrator of Zhang et al., "Improved Order
Analysis and Design of Exponential Integrator for Diffusion Models Sampling" (RES, arXiv:2308.02157), as ComfyUI's
``res_multistep`` / ``res_multistep_ancestral`` (docs/methods/samplers.md).

In ``lambda = -log sigma`` with data prediction ``D``: ``x' = e^{-h} x + h (b_1 D + b_2 D_prev)``, ``h`` the step
to ``s_down`` (:func:`~steerdiff.core.sampling.ancestral_split`; ``s_down = s'`` at ``eta = 0``),
``b_2 = phi_2(-h) / c_2``, ``b_1 = phi_1(-h) - b_2``, ``phi_1(z) = expm1(z)/z``, ``phi_2(z) = (phi_1(z) - 1)/z``
and ``c_2 = (lambda_{i-1} - lambda_old) / h`` with ``lambda_old`` that of the previous step's ``s_down`` (ComfyUI's
definition; at ``eta = 0`` it is ``-h_prev / h``). The first step, and the step to ``s_down = 0``, are Euler; then
``+ s_up z`` with fresh per-sample noise.

From ``sigma_0 = inf`` the first step is the Euler ancestral limit ``D_0 + s_down eps + s_up z``; the next step's
``c_2`` is infinite there (``lambda_{-1} = -inf``), so ``b_2 = 0`` and it is the exponential Euler step (the
history restarts).
"""

from __future__ import annotations

import math

from torch import Tensor

from .ancestral import euler_ancestral_step
from .calls import emit
from .dpm_solver import check_eta
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, ancestral_split, denoise_step, euler_step, step_range


def _phi(h: float) -> tuple[float, float]:
    z = -h
    phi1 = math.expm1(z) / z
    return phi1, (phi1 - 1.0) / z


def _res_multistep(model, x, sigmas, callback, progress, noise, eta, x0_corrector, name):
    eta = check_eta(eta)
    noise = noise or SampleNoise(None)
    old = None  # the previous step's D (None after the first step and after a step from sigma = inf)
    old_down = math.nan
    for i in step_range(sigmas, progress, name):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        if math.isinf(s):
            x = euler_ancestral_step(x, d, s, s_next, eta, noise)
            old, old_down = None, math.nan
            continue
        s_down, s_up = ancestral_split(s, s_next, eta)
        if s_down == 0 or old is None:
            x = euler_step(x, d, s, s_down)
        else:
            h = math.log(s) - math.log(s_down)
            c2 = (math.log(old_down) - math.log(sigmas[i - 1])) / h  # (lambda_{i-1} - lambda_old) / h
            phi1, phi2 = _phi(h)
            b2 = phi2 / c2
            x = x * math.exp(-h) + (d * (phi1 - b2) + old * b2) * h
        if s_up > 0:
            x = x + noise.randn_like(x) * s_up
        old, old_down = d, s_down
    return x


@register_sampler("res_multistep", inf_start=True, nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=0.0, corrector=True)
def sample_res_multistep(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None,
                         eta: float = 0.0, x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """RES second-order multistep (ComfyUI's ``sample_res_multistep``, ``eta = 0``); NFE = ``len(sigmas) - 1``."""
    return _res_multistep(model, x, sigmas, callback, progress, noise, eta, x0_corrector, "res_multistep")


@register_sampler("res_multistep_ancestral", inf_start=True, nfe=lambda steps: steps, stochastic=lambda eta: eta > 0,
                  eta=True, default_eta=1.0, corrector=True)
def sample_res_multistep_ancestral(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False,
                                   noise=None, eta: float = 1.0, x0_corrector: X0Corrector | None = None,
                                   **_) -> Tensor:
    """RES multistep with ancestral noise (ComfyUI's ``sample_res_multistep_ancestral``, default ``eta = 1``)."""
    return _res_multistep(model, x, sigmas, callback, progress, noise, eta, x0_corrector, "res_multistep_ancestral")
