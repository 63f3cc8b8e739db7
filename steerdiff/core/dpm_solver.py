"""DPM-Solver++ multistep samplers (Lu et al. 2022, "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion
Probabilistic Models"; docs/methods/samplers.md).

All three integrate in ``lambda = -log sigma`` (the half log-SNR in our convention; k-diffusion's ``t``) with the
data prediction ``D`` held polynomial in ``lambda`` over a step ``h = lambda_next - lambda``:

* ``dpmpp_2m``: Algorithm 2 of the paper (multistep second order; the first step and the step to sigma = 0 are
  first order): ``x' = (s'/s) x - expm1(-h) ((1 + 1/(2r)) D - D_prev / (2r))``, ``r = h_prev / h``.
* ``dpmpp_2m_sde``: the SDE variant of k-diffusion's ``sample_dpmpp_2m_sde`` (``solver_type`` "midpoint" or
  "heun" for the second-order term); ``eta`` scales the injected noise (0 gives ``dpmpp_2m``).
* ``dpmpp_3m_sde``: k-diffusion's ``sample_dpmpp_3m_sde``, the third-order multistep SDE solver.

A schedule may start at ``sigma = inf`` (a flow model's pure noise). The state is then the unit noise ``eps`` (the
limit of ``x / sigma``) and the first step is the closed-form limit of the step (no division by sigma): the
deterministic ``x_1 = D_0 + sigma_1 eps`` and, for the SDE samplers with ``eta > 0``, ``x_1 = D_0 + sigma_1 z``
with fresh noise ``z``. The step from inf has ``h = inf``, so its ``D_0`` drops out of the next step's multistep term
(the ``1/r`` weights vanish); we drop it from the history explicitly, so no ``0 * inf`` can arise.

Coefficients are Python floats (the schedule is a list of floats): no host synchronisation inside the loop.
"""

from __future__ import annotations

import math

from torch import Tensor

from .calls import emit
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, denoise_step, step_range

SDE_SOLVER_TYPES = ("midpoint", "heun")


def half_log_snr(sigma: float) -> float:
    """``lambda = -log sigma``: ``-inf`` at ``sigma = inf``, ``inf`` at ``sigma = 0``."""
    return math.inf if sigma == 0 else -math.log(sigma)


def state_scale(sigma: float, sigma_next: float) -> float:
    """The weight of the state in ``x_next = (sigma_next / sigma) x + ...``.

    At ``sigma = inf`` the state handed to the sampler is the unit noise ``eps = lim x / sigma``, so the weight of
    that state is ``sigma_next`` itself.
    """
    return sigma_next if math.isinf(sigma) else sigma_next / sigma


def _eta_times(eta: float, h: float) -> float:
    # eta * h with 0 * inf = 0: eta = 0 is the deterministic solver even on the step from sigma = inf.
    return eta * h if eta else 0.0


def check_eta(eta: float) -> float:
    """The noise share of an SDE / ancestral sampler called directly (``sd.sample`` checks it too)."""
    if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be a number in [0, 1], got {eta!r}")
    return float(eta)


@register_sampler("dpmpp_2m", inf_start=True, nfe=lambda steps: steps, corrector=True)
def sample_dpmpp_2m(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False,
                    x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """DPM-Solver++(2M) (Lu et al. 2022, DPM-Solver++, Algorithm 2); NFE = ``len(sigmas) - 1``.

    Second order in the step size (first order on the first step and on the last step to sigma = 0, where the
    update is ``x = D``). ``x`` is the state at ``sigmas[0]`` (the unit noise if ``sigmas[0]`` is inf).
    """
    old, h_last = None, math.nan
    for i in step_range(sigmas, progress, "dpmpp_2m"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        x, h_last = dpmpp_2m_step(x, d, s, s_next, old, h_last)
        old = None if math.isinf(s) else d  # D at sigma = inf has no weight in the next step (h_last = inf)
    return x


def dpmpp_2m_step(x: Tensor, denoised: Tensor, s: float, s_next: float, old: Tensor | None = None,
                  h_last: float = math.nan) -> tuple[Tensor, float]:
    """One DPM-Solver++(2M) step (Lu et al. 2022, Algorithm 2): first order without ``old`` (the previous step's
    ``D``, None on the first step and after a step from ``sigma = inf``), second order with it and ``h_last``, the
    previous step in ``lambda = -log sigma``. Returns ``(x_next, h)``, ``h`` the ``h_last`` of the next step; the
    step to ``s_next = 0`` is ``x = D`` (the limit ``h -> inf``)."""
    if s_next == 0:
        return denoised, h_last  # the limit h -> inf of the first-order step: the denoised estimate itself
    h = half_log_snr(s_next) - half_log_snr(s)
    a, c = state_scale(s, s_next), -math.expm1(-h)
    if old is None:
        return x * a + denoised * c, h
    w = h / (2 * h_last)  # 1 / (2 r), r = h_last / h
    return x * a + denoised * (c * (1 + w)) - old * (c * w), h


@register_sampler("dpmpp_2m_sde", inf_start=True, nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=1.0, options=("solver_type",), corrector=True)
def sample_dpmpp_2m_sde(
    model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None, eta: float = 1.0,
    solver_type: str = "midpoint", x0_corrector: X0Corrector | None = None, **_,
) -> Tensor:
    """DPM-Solver++(2M) SDE, as k-diffusion's ``sample_dpmpp_2m_sde``; NFE = ``len(sigmas) - 1``.

    With ``h`` the step in ``lambda`` and ``eta h`` its noise share:
    ``x' = (s'/s) e^{-eta h} x + (1 - e^{-(1+eta) h}) D + c_2 (D - D_prev) / r + s' sqrt(1 - e^{-2 eta h}) z``,
    ``c_2 = (1 - e^{-(1+eta) h}) / 2`` (``solver_type="midpoint"``) or ``1 - (1 - e^{-(1+eta) h}) / ((1+eta) h)``
    (``"heun"``). Fresh per-sample noise ``z`` from ``noise`` each step (k-diffusion's default is a Brownian tree;
    both are unit Gaussians per step). ``eta = 0`` with "midpoint" is :func:`sample_dpmpp_2m`.
    """
    if solver_type not in SDE_SOLVER_TYPES:
        raise ValueError(f"solver_type must be one of {SDE_SOLVER_TYPES} for dpmpp_2m_sde, got {solver_type!r}")
    eta = check_eta(eta)
    noise = noise or SampleNoise(None)
    old, h_last = None, math.nan
    for i in step_range(sigmas, progress, "dpmpp_2m_sde"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        x, h_last = dpmpp_2m_sde_step(x, d, s, s_next, eta, noise, old, h_last, solver_type)
        old = None if math.isinf(s) else d
    return x


def dpmpp_2m_sde_step(x: Tensor, denoised: Tensor, s: float, s_next: float, eta: float, noise: SampleNoise,
                      old: Tensor | None = None, h_last: float = math.nan,
                      solver_type: str = "midpoint") -> tuple[Tensor, float]:
    """One DPM-Solver++(2M) SDE step (the update of :func:`sample_dpmpp_2m_sde`; ``old``, ``h_last`` as in
    :func:`dpmpp_2m_step`). Returns ``(x_next, h)``; the step to ``s_next = 0`` is ``x = D``."""
    if s_next == 0:
        return denoised, h_last
    h = half_log_snr(s_next) - half_log_snr(s)
    eta_h = _eta_times(eta, h)
    c = -math.expm1(-h - eta_h)
    x = x * (state_scale(s, s_next) * math.exp(-eta_h)) + denoised * c
    if old is not None:
        c2 = 0.5 * c if solver_type == "midpoint" else 1 - c / (h + eta_h)
        x = x + (denoised - old) * (c2 * h / h_last)  # c2 / r
    if eta:
        x = x + noise.randn_like(x) * (s_next * math.sqrt(-math.expm1(-2 * eta_h)))
    return x, h


@register_sampler("dpmpp_3m_sde", inf_start=True, nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=1.0, options=("solver_type", "lower_order_final"), corrector=True)
def sample_dpmpp_3m_sde(
    model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None, eta: float = 1.0,
    solver_type: str = "heun", lower_order_final: bool = False, x0_corrector: X0Corrector | None = None, **_,
) -> Tensor:
    """DPM-Solver++(3M) SDE, as k-diffusion's ``sample_dpmpp_3m_sde``; NFE = ``len(sigmas) - 1``.

    With ``g = (1 + eta) h``: ``x' = e^{-g} x_scaled + (1 - e^{-g}) D + phi_2 D_1 - phi_3 D_2 + noise``, where
    ``phi_2 = (e^{-g} - 1)/g + 1``, ``phi_3 = phi_2/g - 1/2`` and ``D_1``, ``D_2`` are the first and second divided
    differences of the last three ``D`` in ``lambda`` (one history point: ``phi_2 (D - D_prev) / r``; none: first
    order). Noise ``s' sqrt(1 - e^{-2 eta h}) z``, fresh per sample each step. At ``eta = 0`` it is the
    deterministic DPM-Solver++(3M) (Lu et al. 2022, DPM-Solver++, Sec. 4 and Appendix; diffusers'
    ``DPMSolverMultistepScheduler(solver_order=3)``).

    ``solver_type``: the second-order steps (the warm-up step with one history point and, with
    ``lower_order_final``, the step before the last): "heun" weighs the difference by ``phi_2`` (k-diffusion),
    "midpoint" by ``(1 - e^{-g}) / 2`` (:func:`sample_dpmpp_2m_sde`'s two forms). ``lower_order_final``: the step
    before the last is at most second order (diffusers' rule below 15 steps; the last step to sigma = 0 is always
    ``x = D``).
    """
    eta = check_eta(eta)
    if solver_type not in SDE_SOLVER_TYPES:
        raise ValueError(f"solver_type must be one of {SDE_SOLVER_TYPES} for dpmpp_3m_sde, got {solver_type!r}")
    if not isinstance(lower_order_final, bool):
        raise ValueError(f"lower_order_final must be True or False for dpmpp_3m_sde, got {lower_order_final!r}")
    last_third = len(sigmas) - 3 if lower_order_final else len(sigmas)  # the first step index held to order 2
    noise = noise or SampleNoise(None)
    d1 = d2 = None  # the two previous denoised estimates (finite sigmas only)
    h1 = h2 = math.nan
    for i in step_range(sigmas, progress, "dpmpp_3m_sde"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        if s_next == 0:
            x = d
        else:
            h = half_log_snr(s_next) - half_log_snr(s)
            eta_h = _eta_times(eta, h)
            g = h + eta_h
            x = x * (state_scale(s, s_next) * math.exp(-eta_h)) + d * (-math.expm1(-g))
            if d1 is not None:
                phi2 = math.expm1(-g) / g + 1
                if d2 is not None and i < last_third:
                    r0, r1 = h1 / h, h2 / h
                    phi3 = phi2 / g - 0.5
                    q = r0 / (r0 + r1)
                    # phi2 * D_1 - phi3 * D_2 with D_1 = d1_0 (1 + q) - d1_1 q, D_2 = (d1_0 - d1_1) / (r0 + r1),
                    # d1_0 = (d - d1) / r0, d1_1 = (d1 - d2) / r1, as weights on the two differences.
                    w0 = (phi2 * (1 + q) - phi3 / (r0 + r1)) / r0
                    w1 = (phi3 / (r0 + r1) - phi2 * q) / r1
                    x = x + (d - d1) * w0 + (d1 - d2) * w1
                else:
                    c2 = phi2 if solver_type == "heun" else -0.5 * math.expm1(-g)
                    x = x + (d - d1) * (c2 * h / h1)
            if eta:
                x = x + noise.randn_like(x) * (s_next * math.sqrt(-math.expm1(-2 * eta_h)))
            h1, h2 = h, h1
        if math.isinf(s):
            d1 = d2 = None
        else:
            d1, d2 = d, d1
    return x
