"""SA-Solver, the stochastic Adams predictor-corrector of Xue et al., "SA-Solver: Stochastic Adams Solver for Fast
Sampling of Diffusion Models" (NeurIPS 2023, arXiv:2309.05019), as ComfyUI's ``sample_sa_solver`` /
``sample_sa_solver_pece`` (docs/methods/samplers.md).

In ``lambda = -log sigma`` (ComfyUI's half-log-SNR of a VE / k-diffusion model, ``alpha = 1``) with data predictions
``D_j`` at ``lambda_j`` and stochasticity ``tau`` on the step ``h = lambda' - lambda``, the paper's data-prediction
update (eqs. 15 and 18) is ``x' = (s'/s) e^{-tau^2 h} x + sum_j b_j D_j + s' sqrt(1 - e^{-2 tau^2 h}) z`` with
``b_j = int_lambda^lambda' (1 + tau^2) e^{-(1 + tau^2)(lambda' - u)} L_j(u) du``, ``L_j`` the Lagrange basis on the
``lambda_j`` used. Each step ``i``: evaluate ``D_i`` at the predicted state; the corrector (order ``min(4, i + 1)``,
nodes ``lambda_{i-k+1..i}`` including the new ``D_i``) redoes the previous step from the previous corrected state,
with the previous step's ``tau`` and the same noise ``z``; PECE (``sa_solver_pece``) then re-evaluates ``D_i`` at the
corrected state; the predictor (order ``min(3, i + 1)``) steps on. No corrector at step 0 nor, without PECE, on the
step to ``sigma = 0``; towards ``sigma = 0`` the orders drop so that no node lies past the grid (ComfyUI's rule); the
step to 0 returns ``D``.

``tau(sigma') = eta`` on a window of levels, else 0 (an ODE step). ComfyUI's window is its model's
``percent_to_sigma(0.2) >= sigma' >= percent_to_sigma(0.8)``, which depends on the model's training schedule;
steerdiff's samplers see only the grid, so the window is the ``tau_window=(sigma_hi, sigma_lo)`` option (default: the
whole schedule). An infinite first level is refused (``lambda_0 = -inf`` breaks the interpolation nodes).
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from .calls import emit
from .dpm_solver import check_eta
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, denoise_checked, denoise_step, step_range


def sa_coefficients(lams: list[float], lam_s: float, lam_t: float, tau: float) -> list[float]:
    """The stochastic Adams weights ``b_j`` (Xue et al. eq. 15 / 18, ``alpha = 1``) of the nodes ``lams`` over
    ``[lam_s, lam_t]``: ``int (1 + tau^2) e^{-(1 + tau^2)(lam_t - u)} L_j(u) du``.

    Computed in the shifted variable ``v = u - lam_t`` (better conditioned than powers of ``lambda``): the moments
    ``m_p = int_{-h}^0 c e^{c v} v^p dv`` (``c = 1 + tau^2``) follow ``m_p = -(-h)^p e^{-c h} - (p / c) m_{p-1}``
    with ``m_0 = 1 - e^{-c h}``, then ``b`` solves ``V^T b = m`` (``V`` the Vandermonde matrix of the shifted nodes).
    Host arithmetic on the schedule only."""
    c = 1.0 + tau * tau
    h = lam_t - lam_s
    n = len(lams)
    decay = math.exp(-c * h)
    m = np.empty(n)
    m[0] = -math.expm1(-c * h)
    for p in range(1, n):
        m[p] = -((-h) ** p) * decay - p / c * m[p - 1]
    v = np.asarray(lams, dtype=np.float64) - lam_t
    return np.linalg.solve(np.vander(v, n, increasing=True).T, m).tolist()


def _check_order(value, name: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise ValueError(f"{name} must be an integer in 1..{top} for sa_solver, got {value!r}")
    return value


def _tau_window(tau_window) -> tuple[float, float]:
    if tau_window is None:
        return math.inf, 0.0
    try:
        hi, lo = (float(v) for v in tau_window)
    except (TypeError, ValueError):
        raise ValueError(f"tau_window must be a pair (sigma_hi, sigma_lo), got {tau_window!r}") from None
    if not (math.isfinite(lo) and lo >= 0 and hi >= lo):
        raise ValueError(f"tau_window must be (sigma_hi, sigma_lo) with sigma_hi >= sigma_lo >= 0, got {tau_window!r}")
    return hi, lo


def _sa_solver(model, x, sigmas, callback, progress, noise, eta, predictor_order, corrector_order, tau_window,
               pece, x0_corrector, name):
    eta = check_eta(eta)
    p_order = _check_order(predictor_order, "predictor_order", 6)
    c_order = _check_order(corrector_order, "corrector_order", 6)
    hi, lo = _tau_window(tau_window)
    if math.isinf(sigmas[0]):
        raise ValueError(f"{name} cannot start at sigma = inf (lambda = -inf is no interpolation node); "
                         "give a finite first level")
    noise = noise or SampleNoise(None)
    lams = [-math.log(s) if s > 0 else math.inf for s in sigmas]
    steps = len(sigmas) - 1
    to_zero = sigmas[-1] == 0
    keep = max(p_order, c_order)
    hist: list[Tensor] = []  # D at the last levels, newest last
    x_pred = x
    tau, h, z = 0.0, 0.0, None  # the previous predictor step's tau, step and noise term
    for i in step_range(sigmas, progress, name):
        s, s_next = sigmas[i], sigmas[i + 1]
        x_pred, d = denoise_step(model, x_pred, s, i, x0_corrector)
        emit(callback, i, s, s_next, x_pred, d)
        hist = [*hist[-(keep - 1):], d] if keep > 1 else [d]
        p_used = min(p_order, len(hist))
        c_used = 0 if i == 0 or (s_next == 0 and not pece) else min(c_order, len(hist))
        if to_zero:
            p_used, c_used = min(p_used, steps - 1 - i), min(c_used, steps - i)
        if c_used == 0:
            x = x_pred
        else:
            b = sa_coefficients(lams[i - c_used + 1:i + 1], lams[i - 1], lams[i], tau)
            x = x * (s / sigmas[i - 1] * math.exp(-tau * tau * h))
            for bj, dj in zip(b, hist[-c_used:], strict=True):
                x = x + dj * bj
            if z is not None:
                x = x + z
            if pece:
                d = denoise_checked(model, x, s, i)
                hist[-1] = d
        if s_next == 0:
            x_pred = d
            continue
        tau = eta if hi >= s_next >= lo else 0.0
        h = lams[i + 1] - lams[i]
        b = sa_coefficients(lams[i - p_used + 1:i + 1], lams[i], lams[i + 1], tau)
        x_pred = x * (s_next / s * math.exp(-tau * tau * h))
        for bj, dj in zip(b, hist[-p_used:], strict=True):
            x_pred = x_pred + dj * bj
        z = noise.randn_like(x) * (s_next * math.sqrt(-math.expm1(-2 * tau * tau * h))) if tau > 0 else None
        if z is not None:
            x_pred = x_pred + z
    return x_pred


_OPTIONS = ("predictor_order", "corrector_order", "tau_window")


@register_sampler("sa_solver", nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True, default_eta=1.0,
                  options=_OPTIONS, corrector=True)
def sample_sa_solver(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None,
                     eta: float = 1.0, predictor_order: int = 3, corrector_order: int = 4,
                     tau_window: tuple[float, float] | None = None, x0_corrector: X0Corrector | None = None,
                     **_) -> Tensor:
    """SA-Solver, PEC mode (ComfyUI's ``sample_sa_solver``): predictor order 3, corrector order 4, ``tau = eta``
    (default 1) on ``tau_window``; NFE = ``len(sigmas) - 1``."""
    return _sa_solver(model, x, sigmas, callback, progress, noise, eta, predictor_order, corrector_order,
                      tau_window, False, x0_corrector, "sa_solver")


# no x0_corrector hook: the PECE re-evaluation replaces the step's (corrected) x0-hat with a plain evaluation, so
# the hook's control would be dropped on every step, the last included
@register_sampler("sa_solver_pece", nfe=lambda steps: max(2 * steps - 1, 0), stochastic=lambda eta: eta > 0,
                  eta=True, default_eta=1.0, options=_OPTIONS)
def sample_sa_solver_pece(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False,
                          noise=None, eta: float = 1.0, predictor_order: int = 3, corrector_order: int = 4,
                          tau_window: tuple[float, float] | None = None, **_) -> Tensor:
    """SA-Solver, PECE mode (ComfyUI's ``sample_sa_solver_pece``): the corrected state is re-evaluated, one more
    evaluation on every step after the first (the step to 0 included): NFE = ``2 (len(sigmas) - 1) - 1``."""
    return _sa_solver(model, x, sigmas, callback, progress, noise, eta, predictor_order, corrector_order,
                      tau_window, True, None, "sa_solver_pece")
