"""UniPC, the unified predictor-corrector multistep sampler (Zhao et al. 2023, "UniPC: A Unified
Predictor-Corrector Framework for Fast Sampling of Diffusion Models", Algorithms 1-3; docs/methods/samplers.md).

Data-prediction form (``predict_x0``) in ``lambda = -log sigma``, with ``h = lambda_next - lambda``:

* predictor UniP-p (Algorithm 2 with B(h)): ``x' = (s'/s) x - expm1(-h) D_i - B(h) sum_k rho_k (D_{i-k} - D_i)/r_k``,
  ``r_k = (lambda_{i-k} - lambda_i)/h``, ``rho`` solving the order conditions ``R rho = b`` (``rho = 1/2`` for p = 2);
* corrector UniC-p (Algorithm 1): once ``D`` has been evaluated at the predicted state, the last step is redone with
  the new ``D`` as one more node (``rho = 1/2`` for p = 1); it costs no evaluation, and the next predictor starts
  from the corrected state with the ``D`` of the predicted one (Algorithm 3, UniPC-p).
* ``variant``: ``B(h) = h`` ("bh1") or ``expm1(h)`` ("bh2", the default, better at few steps).

The shape follows diffusers' ``UniPCMultistepScheduler`` (``predict_x0=True``, ``lower_order_final=True``): the
order warms up over the first steps, drops to ``min(order, steps left)`` at the end (first order on the last step to
sigma = 0, where ``x = D``: at ``h = inf`` a higher order is undefined), and every evaluation but the first corrects
the step before it (but the last, whose correction the final step to 0 would discard); the final state is not
corrected (that would cost an evaluation). An order above what the
schedule allows is lowered this way, never refused.

From ``sigma_0 = inf`` (the state is the unit noise ``eps``): the first step is ``x_1 = D_0 + sigma_1 eps`` and is
not corrected, and ``D_0`` leaves the history. At ``h = inf`` the corrector's linear model in ``lambda`` spans an
infinite interval: bh1's ``B(h) = h`` diverges, and bh2's limit would be ``D_0 + (D_1 - D_0)/2`` only because the
order-1 weight 1/2 is the small-``h`` value (the exact weight tends to 1). Dropping the point is the limit of every
other sampler's multistep term here (its weight ``1/r`` vanishes).
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from .calls import emit
from .dpm_solver import half_log_snr, state_scale
from .registry import register_sampler
from .sampling import Model, X0Corrector, apply_x0_corrector, denoise_checked, project_state, step_range

UNIPC_VARIANTS = ("bh1", "bh2")
UNIPC_ORDERS = (1, 2, 3)


def _order_system(rks: list[float], h: float, variant: str) -> tuple[np.ndarray, np.ndarray, float, float]:
    """``R`` (rows ``r_k^(j-1)``), ``b_j = j! h phi_{j+1}(-h) / B(h)`` for ``j = 1..len(rks)``, ``expm1(-h)``, ``B``.

    ``rks`` ends with 1 (the step's own end point). diffusers' recursion for ``h phi_k``, in float64.
    """
    hh = -h
    h_phi_1 = math.expm1(hh)
    b_h = hh if variant == "bh1" else math.expm1(hh)
    h_phi_k, fact = h_phi_1 / hh - 1, 1
    R, b = [], []
    for j in range(1, len(rks) + 1):
        R.append([r ** (j - 1) for r in rks])
        b.append(h_phi_k * fact / b_h)
        fact *= j + 1
        h_phi_k = h_phi_k / hh - 1 / fact
    return np.array(R), np.array(b), h_phi_1, b_h


def _multistep(x: Tensor, a: float, hist: list[tuple[float, Tensor]], p: int, lam_end: float, variant: str,
               d_new: Tensor | None) -> Tensor:
    """One UniP-p step from ``hist[-1]`` to ``lam_end`` (``d_new`` None) or the UniC-p redo of it with the
    evaluation ``d_new`` at its end; ``a`` is the state weight ``s_end / s_start``."""
    lam0, m0 = hist[-1]
    h = lam_end - lam0
    rks = [(hist[-(k + 1)][0] - lam0) / h for k in range(1, p)]
    d1s = [(hist[-(k + 1)][1] - m0) / r for k, r in enumerate(rks, start=1)]
    n = p if d_new is not None else p - 1  # the corrector has the new point as one more node
    R, b, h_phi_1, b_h = _order_system(rks + [1.0], h, variant)
    if d_new is None:
        rhos = [] if p == 1 else ([0.5] if p == 2 else np.linalg.solve(R[:n, :n], b[:n]).tolist())
    else:
        rhos = [0.5] if p == 1 else np.linalg.solve(R, b).tolist()
    out = x * a - m0 * h_phi_1
    for rho, d1 in zip(rhos[: len(d1s)], d1s, strict=True):
        out = out - d1 * (b_h * rho)
    if d_new is not None:
        out = out - (d_new - m0) * (b_h * rhos[-1])
    return out


@register_sampler("unipc", inf_start=True, nfe=lambda steps: steps, options=("variant", "order"), corrector=True)
def sample_unipc(
    model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, variant: str = "bh2",
    order: int = 2, x0_corrector: X0Corrector | None = None, **_,
) -> Tensor:
    """UniPC-p (Zhao et al. 2023, UniPC, Algorithm 3 with the B(h) predictor and corrector of Algorithms 1-2);
    NFE = ``len(sigmas) - 1``.

    ``order`` p in 1..3 (the predictor's order; with the corrector the update is of order p + 1, Theorem 3.1),
    ``variant`` "bh1" or "bh2". Matches diffusers' ``UniPCMultistepScheduler(solver_order=p, solver_type=variant,
    predict_x0=True, lower_order_final=True)`` on the same sigmas.
    """
    if variant not in UNIPC_VARIANTS:
        raise ValueError(f"variant must be one of {UNIPC_VARIANTS} for unipc, got {variant!r}")
    if isinstance(order, bool) or not isinstance(order, int) or order not in UNIPC_ORDERS:
        raise ValueError(f"order must be one of {UNIPC_ORDERS} for unipc, got {order!r}")
    steps = len(sigmas) - 1
    hist: list[tuple[float, Tensor]] = []  # (lambda, D) at the last finite levels, newest last
    last_x, last_p, last_s = None, 0, math.nan
    for i in step_range(sigmas, progress, "unipc"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x = project_state(x0_corrector, x, s, i)
        d = denoise_checked(model, x, s, i)
        x_used, u = apply_x0_corrector(x0_corrector, x, d, s, i)  # the step's corrector (u is d without one)
        emit(callback, i, s, s_next, x_used, u)
        lam = half_log_snr(s)
        # UniC: redo the last step with this evaluation (not before the final step to 0, which keeps none of x).
        if last_x is not None and hist and s_next > 0:
            x = _multistep(last_x, s / last_s, hist, last_p, lam, variant, d)
        if u is not d:  # a corrected x0-hat: shift the (corrected) state by the control u - D, keep eps-hat
            x = x if math.isinf(s) else x + (u - d)
            d = u
        if math.isinf(s):
            x = d + x * s_next  # x_1 = D_0 + sigma_1 eps; no corrector for it, D_0 leaves the history
            hist, last_x = [], None
            continue
        hist = (hist + [(lam, d)])[-order:]
        p = min(order, steps - i, len(hist))  # warm-up at the start, lower order at the end
        last_x, last_p, last_s = x, p, s
        x = d if s_next == 0 else _multistep(x, state_scale(s, s_next), hist, p, half_log_snr(s_next), variant, None)
    return x
