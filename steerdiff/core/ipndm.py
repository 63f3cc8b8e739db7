"""Improved PNDM samplers (Zhang and Chen, "Fast Sampling of Diffusion Models with Exponential Integrator", ICLR 2023,
Sec. 4.1 / Appendix: iPNDM; Zhou et al., "Fast ODE-based Sampling for Diffusion Models in Around 5 Steps", CVPR
2024, whose ``diff-solvers`` code ComfyUI's ``sample_ipndm`` / ``sample_ipndm_v`` follow; docs/methods/samplers.md).

Both are Adams-Bashforth methods on ``dx/dsigma = d = (x - D)/sigma`` in ``sigma``, one evaluation per step, with
the order rising by one per step up to ``max_order`` (default 4) and ``x = D`` on the last step to sigma = 0:

* ``ipndm``: the fixed (equal-step) Adams-Bashforth weights, ``x' = x + (s' - s) sum_j b_j d_{i-j}`` with
  ``b = (1)``, ``(3, -1)/2``, ``(23, -16, 5)/12``, ``(55, -59, 37, -9)/24``, whatever the steps.
* ``ipndm_v``: the variable-step weights of ``diff-solvers`` (functions of the step ratios ``h_n / h_{n-1}``...);
  equal to ``ipndm`` on an equally spaced schedule up to order 3; ComfyUI's order-4 weights are not Adams-Bashforth's
  there (``57/24, ..., -11/24`` instead of ``55/24, ..., -9/24``), and we keep ComfyUI's definition. (Not the exact
  Lagrange integral of ``lms`` beyond order 2.)

From ``sigma_0 = inf`` (a flow model's pure noise) the first step is the Euler limit ``x_1 = D_0 + sigma_1 eps``
and the history restarts after it (as ``lms``): a derivative at ``sigma = inf`` is no point of a polynomial in
``sigma``.
"""

from __future__ import annotations

import math

from torch import Tensor

from .calls import emit
from .registry import register_sampler
from .sampling import Model, X0Corrector, denoise_step, euler_step, step_range

IPNDM_MAX_ORDER = 4
_AB = {1: (1.0,), 2: (1.5, -0.5), 3: (23 / 12, -16 / 12, 5 / 12), 4: (55 / 24, -59 / 24, 37 / 24, -9 / 24)}


def _check_order(max_order: int, name: str) -> int:
    if isinstance(max_order, bool) or not isinstance(max_order, int) or not 1 <= max_order <= IPNDM_MAX_ORDER:
        raise ValueError(f"max_order must be an integer in 1..{IPNDM_MAX_ORDER} for {name}, got {max_order!r}")
    return max_order


def ipndm_v_weights(levels: list[float], s_next: float) -> tuple[float, ...]:
    """The variable-step iPNDM weights on ``d`` at ``levels`` (oldest first, the current level last; 1 to 4 of
    them) for the step to ``s_next``, without the factor ``h = s_next - levels[-1]``."""
    k = len(levels)
    h = s_next - levels[-1]
    if k == 1:
        return (1.0,)
    h1 = levels[-1] - levels[-2]
    if k == 2:
        return (1 + h / (2 * h1), -h / (2 * h1))
    h2 = levels[-2] - levels[-3]
    t1 = (1 - h / (3 * (h + h1)) * h * (h + h1) / (h1 * (h1 + h2))) / 2
    c1 = 1 + h / (2 * h1) + t1
    c2 = -h / (2 * h1) - (1 + h1 / h2) * t1
    c3 = t1 * h1 / h2
    if k == 3:
        return (c1, c2, c3)
    h3 = levels[-3] - levels[-4]
    g = h1 * (h1 + h2) / (h2 * (h2 + h3))
    t2 = ((1 - h / (3 * (h + h1))) / 2 + (1 - h / (2 * (h + h1))) * h / (6 * (h + h1 + h2))) * (
        h * (h + h1) * (h + h1 + h2)) / (h1 * (h1 + h2) * (h1 + h2 + h3))
    return (c1 + t2, c2 - (1 + h1 / h2 + g) * t2, c3 + (h1 / h2 + g * (1 + h2 / h3)) * t2, -t2 * g * h1 / h2)


def _run(model, x, sigmas, callback, progress, max_order, variable, x0_corrector, name):
    ds: list[Tensor] = []  # derivatives at the last finite levels, oldest first
    levels: list[float] = []
    for i in step_range(sigmas, progress, name):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        if math.isinf(s) or s_next == 0:
            x = euler_step(x, d, s, s_next)  # the Euler limit from inf; x = D on the last step
            ds, levels = [], []
            continue
        ds.append((x - d) / s)
        levels.append(s)
        del ds[:-max_order], levels[:-max_order]
        w = ipndm_v_weights(levels, s_next) if variable else _AB[len(ds)]
        step = ds[-1] * w[0]
        for wj, dj in zip(w[1:], reversed(ds[:-1]), strict=True):
            step = step + dj * wj
        x = x + step * (s_next - s)
    return x


@register_sampler("ipndm", inf_start=True, nfe=lambda steps: steps, options=("max_order",), corrector=True)
def sample_ipndm(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, max_order: int = 4,
                 x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """iPNDM with the fixed Adams-Bashforth weights (ComfyUI's ``sample_ipndm``); NFE = ``len(sigmas) - 1``."""
    return _run(model, x, sigmas, callback, progress, _check_order(max_order, "ipndm"), False, x0_corrector, "ipndm")


@register_sampler("ipndm_v", inf_start=True, nfe=lambda steps: steps, options=("max_order",), corrector=True)
def sample_ipndm_v(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False,
                   max_order: int = 4, x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """iPNDM with variable-step weights (:func:`ipndm_v_weights`; ComfyUI's ``sample_ipndm_v``);
    NFE = ``len(sigmas) - 1``."""
    return _run(model, x, sigmas, callback, progress, _check_order(max_order, "ipndm_v"), True, x0_corrector,
                "ipndm_v")
