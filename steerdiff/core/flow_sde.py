"""Stochastic sampling of flow models: the flow ODE as an SDE with the same marginals (docs/methods/flow_sde.md).

Kim, Yoon, Hwang, Sung, "Inference-Time Scaling for Flow Models via Stochastic Generation and Rollover Budget
Forcing" (RBF), NeurIPS 2025, arXiv 2503.19385, Sec. 4.1 (SDE conversion) and 4.2 (interpolant conversion). A flow
model sees ``x_t = (1 - t) x0 + t eps`` and its ODE ``dx_t = v dt`` runs from ``t = 1`` to 0. For any diffusion
coefficient ``g(t) >= 0`` the reverse-time SDE

    dx_t = [v - (g^2 / 2) score] dt + g dW,      score = -(x_t - (1 - t) D) / t^2,   v = (x_t - D) / t,

(``dt < 0``) has the ODE's marginals: the mixture convolved with the interpolant's noise at every ``t``.

In steerdiff's one convention (``x = x_t / (1 - t) = x0 + sigma eps``, ``sigma = t / (1 - t)``) the same SDE is
the EDM-space reverse SDE ``dx = -(sigma + h^2 / 2) score_sigma dsigma + h dW`` with ``h(sigma) = g(t)``: the
noise variance ``g^2 |dt| / (1 - t)^2`` equals ``g^2 |dsigma|``. So a choice of ``g`` is a choice of how a step
``sigma -> sigma'`` splits into a deterministic part ``s_down`` and fresh noise ``s_up`` (``x' = D + (s_down / sigma)
(x - D) + s_up z``), the shape every ancestral step and every SMC proposal of :mod:`steerdiff.align` already has.
:class:`FlowSDE` computes that split two ways:

* ``step="exact"`` (default): the exponential integrator, exact when the data is one point (``D`` exact):
  ``s_down = sigma' exp(-I / 2)``, ``s_up = sigma' sqrt(1 - exp(-I))`` with ``I = int_{t'}^{t} g(u)^2 / u^2 du``
  (in any interpolant's own time ``s``: ``int g(s)^2 / sigma_s^2 ds``). For ``g^2 = 2 t / (1 - t)`` (``"edm"``)
  ``I = 2 ln(sigma / sigma')`` and the step is DDPM's posterior, the ancestral ``eta = 1`` step exactly.
* ``step="euler"``: RBF's Euler-Maruyama step in flow time, ``x_t' = x_t + (t' - t)(v - g^2 score / 2) +
  g sqrt(t - t') z`` (first order; ``g(1)`` must be finite to start from ``t = 1``).

Diffusion coefficients are registered by name (:data:`FLOW_SDES`, ``@register_flow_sde``), each with ``g`` as a
function of ``sigma`` and the closed form of ``I``:

* ``"rbf"``: ``g = c t`` (the official RBF code's default, ``g = c sigma_t`` of the linear interpolant): ``I =
  c^2 (t - t')``;
* ``"square"``: ``g = c t^2`` (``I = c^2 (t^3 - t'^3) / 3``);
* ``"edm"``: ``g = c sqrt(2 t / (1 - t))`` (also Flow-GRPO's ``a sqrt(t / (1 - t))``): ``c = 1`` is the
  ancestral ``eta = 1`` step that :mod:`steerdiff.align` takes by default;
* ``"vp"``: the interpolant conversion of RBF Sec. 4.2: ``g = c sigma_r`` in the time ``r`` of the VP interpolant
  ``alpha_r = exp(-(r^2 (b1 - b0) / 4 + r b0 / 2))``, ``sigma_r = sqrt(1 - alpha_r^2)`` (``b0 = 0.1, b1 = 20``),
  ``I = c^2 (r - r')``. In the EDM convention the converted velocity is the same denoiser: what the conversion
  changes is ``g``'s time and the grid (:func:`vp_sigmas`, uniform in ``r``);
* ``"constant"``: ``g = c``; ``"ode"``: ``g = 0`` (the deterministic DDIM step).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..io.plugins import Registry
from .calls import emit
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, ddim_step, denoise_step, step_range

VP_BETA = (0.1, 20.0)
"""``(beta_min, beta_max)`` of the VP interpolant (the linear-beta VP-SDE of Song et al. 2021, the
``VPScheduler`` of facebookresearch/flow_matching used by RBF's interpolant conversion)."""


@dataclass(frozen=True)
class FlowSDESpec:
    """A registered diffusion coefficient.

    Attributes:
        g2: ``g(sigma)^2`` at scale ``c = 1`` (``sigma`` the EDM level; ``g`` of the linear flow time ``t(sigma)``),
            ``inf`` allowed where ``g`` has no finite value.
        integral: ``I(sigma', sigma) = int g^2 / u^2 du`` over the step at ``c = 1`` (``sigma = inf`` allowed).
    """

    name: str
    g2: Callable[[float], float]
    integral: Callable[[float, float], float]
    note: str = ""


FLOW_SDES: Registry[FlowSDESpec] = Registry("flow SDE", argument="sde")


def register_flow_sde(name: str, *, integral: Callable[[float, float], float], note: str = "",
                      aliases: tuple[str, ...] = ()) -> Callable[[Callable[[float], float]], Callable[[float], float]]:
    """Decorator registering ``g2(sigma) -> g^2`` under ``name`` with the closed form ``integral(s_next, s)``."""

    def decorate(g2: Callable[[float], float]) -> Callable[[float], float]:
        FLOW_SDES.add(name, FlowSDESpec(name, g2, integral, note), aliases)
        return g2

    return decorate


def flow_t(sigma: float) -> float:
    """The flow time ``t = sigma / (1 + sigma)`` of an EDM level (1 at ``inf``)."""
    return 1.0 if math.isinf(sigma) else sigma / (1.0 + sigma)


def vp_r(sigma: float, beta: tuple[float, float] = VP_BETA) -> float:
    """The VP interpolant's time ``r`` with ``sigma_r / alpha_r = sigma``: the root of ``r^2 (b1 - b0) / 2 + r b0 =
    ln(1 + sigma^2)`` (``inf`` at ``sigma = inf``; ``r = 1`` is ``sigma`` about 152 for the default betas)."""
    if math.isinf(sigma):
        return math.inf
    b0, b1 = beta
    log1p = math.log1p(sigma * sigma) if sigma < 1e150 else 2 * math.log(sigma)
    return 2 * log1p / (b0 + math.sqrt(b0 * b0 + 2 * (b1 - b0) * log1p))  # the root, without cancellation


def vp_sigma(r: float, beta: tuple[float, float] = VP_BETA) -> float:
    """The EDM level ``sigma_r / alpha_r = sqrt(exp(r^2 (b1 - b0) / 2 + r b0) - 1)`` of VP time ``r``."""
    b0, b1 = beta
    return math.sqrt(math.expm1(r * r * (b1 - b0) / 2 + r * b0))


def vp_sigmas(steps: int, r_max: float = 1.0, beta: tuple[float, float] = VP_BETA, inf_start: bool = True) -> Tensor:
    """A grid uniform in the VP interpolant's time ``r`` (RBF Sec. 4.2's sampling grid), ``[steps + 1]`` float64
    ending in 0; ``inf_start``: the first level is ``inf`` (pure noise, as :func:`steerdiff.sigmas.flow`) in place
    of ``vp_sigma(r_max)``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not 0 < r_max <= 1:
        raise ValueError(f"r_max must lie in (0, 1], got {r_max!r}")
    levels = [vp_sigma(r_max * (steps - i) / steps, beta) for i in range(steps + 1)]
    if inf_start:
        levels[0] = math.inf
    return torch.tensor(levels, dtype=torch.float64)


# ---------------------------------------------------------------------------------------- the coefficients
@register_flow_sde("ode", integral=lambda s1, s: 0.0, note="g = 0: the deterministic (DDIM, eta = 0) step")
def _ode(sigma: float) -> float:
    return 0.0


def _edm_integral(s1: float, s: float) -> float:
    return math.inf if math.isinf(s) or s1 == 0 else 2.0 * math.log(s / s1)


@register_flow_sde("edm", integral=_edm_integral, aliases=("ddpm",),
                   note="g = c sqrt(2t / (1 - t)): c = 1 is the ancestral eta = 1 (DDPM) step")
def _edm(sigma: float) -> float:
    return 2.0 * sigma  # 2 t / (1 - t)


@register_flow_sde("rbf", integral=lambda s1, s: flow_t(s) - flow_t(s1),
                   note="g = c t (RBF, Kim et al. 2025: the official code's default g = c sigma_t)")
def _rbf(sigma: float) -> float:
    return flow_t(sigma) ** 2


@register_flow_sde("square", integral=lambda s1, s: (flow_t(s) ** 3 - flow_t(s1) ** 3) / 3,
                   note="g = c t^2 (RBF's 'square' coefficient)")
def _square(sigma: float) -> float:
    return flow_t(sigma) ** 4


def _constant_integral(s1: float, s: float) -> float:
    return math.inf if s1 == 0 else 1.0 / flow_t(s1) - 1.0 / flow_t(s)


@register_flow_sde("constant", integral=_constant_integral, note="g = c")
def _constant(sigma: float) -> float:
    return 1.0


@register_flow_sde("vp", integral=lambda s1, s: vp_r(s) - vp_r(s1),
                   note="g = c sigma_r in the VP interpolant's time r (RBF's interpolant conversion)")
def _vp(sigma: float) -> float:
    # g_t^2 = g_r^2 (dr/dsigma) / alpha_r^2 = sigma^2 dr/dsigma, with dr/dsigma = 2 sigma / ((1 + sigma^2) B'(r))
    if math.isinf(sigma):
        return math.inf
    b0, b1 = VP_BETA
    return 2.0 * sigma**3 / ((1.0 + sigma * sigma) * (vp_r(sigma) * (b1 - b0) + b0))


FLOW_SDE_STEPS = ("exact", "euler")


class FlowSDE:
    """A flow SDE: a registered diffusion coefficient ``g``, its scale ``c`` and a discretisation (module docstring).

    It is accepted wherever an ancestral ``eta`` is (``ancestral_split(s, s_next, FlowSDE(...))`` returns its
    split), so :func:`steerdiff.core.sampling.ddim_step`, the ``flow_sde`` sampler and the proposals of every
    aligner (``sde=`` of :func:`steerdiff.align.das`, ``fk_steering``, ``best_of_n``, ...) take its steps.

    Args:
        name: a registered coefficient (:data:`FLOW_SDES`: ``rbf``, ``square``, ``edm``, ``vp``, ``constant``,
            ``ode``).
        scale: ``c >= 0``, multiplying ``g`` (RBF's ``diffusion_norm``).
        step: ``"exact"`` (exponential integrator) or ``"euler"`` (RBF's Euler-Maruyama in flow time).

    Raises:
        ValueError: an unknown name or step, a negative or non-finite scale.
    """

    def __init__(self, name: str = "rbf", scale: float = 1.0, step: str = "exact"):
        self.spec = FLOW_SDES.get(name)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale >= 0):
            raise ValueError(f"scale must be a finite number >= 0 (g's multiplier), got {scale!r}")
        if step not in FLOW_SDE_STEPS:
            raise ValueError(f"step must be one of {FLOW_SDE_STEPS}, got {step!r}")
        self.name, self.scale, self.step = self.spec.name, float(scale), step

    def g(self, sigma: float) -> float:
        """The diffusion coefficient ``g`` at level ``sigma`` (of the linear flow time ``t(sigma)``)."""
        return self.scale * math.sqrt(self.spec.g2(sigma)) if self.scale else 0.0

    def split(self, s: float, s_next: float) -> tuple[float, float]:
        """``(s_down, s_up)`` of the step ``s -> s_next``: ``x' = D + (s_down / s)(x - D) + s_up z`` (from ``s = inf``,
        state the unit noise: ``D + s_down x + s_up z``); ``(0, 0)`` into ``s_next = 0`` (``x' = D``)."""
        if s_next == 0:
            return 0.0, 0.0
        if self.step == "exact":
            i = self.scale**2 * self.spec.integral(s_next, s) if self.scale else 0.0
            return s_next * math.exp(-i / 2), s_next * math.sqrt(-math.expm1(-i))
        g = self.g(s)
        if not math.isfinite(g):
            raise ValueError(f"sde={self.name!r} with step='euler' has no finite g at sigma={s:g} (t = 1); use "
                             "step='exact', or a coefficient finite at t = 1 ('rbf', 'square', 'constant')")
        t, t1 = flow_t(s), flow_t(s_next)
        # x_t' = x_t + (t' - t)(v - g^2 score / 2) + g sqrt(t - t') z, mapped to x = x_t / (1 - t) (module docstring)
        return s_next - (t - t1) * g * g / (2 * t * (1 - t1)), g * math.sqrt(t - t1) / (1 - t1)

    def __repr__(self) -> str:
        return f"FlowSDE({self.name!r}, scale={self.scale:g}, step={self.step!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FlowSDE) and (self.name, self.scale, self.step) == (other.name, other.scale,
                                                                                    other.step)

    def __hash__(self) -> int:
        return hash((self.name, self.scale, self.step))


def as_flow_sde(sde: str | FlowSDE) -> FlowSDE:
    """``sde`` as a :class:`FlowSDE`: a registered name (scale 1, exact step) or the object itself."""
    if isinstance(sde, FlowSDE):
        return sde
    if isinstance(sde, str):
        return FlowSDE(sde)
    raise ValueError(f"sde must be one of {FLOW_SDES.names()} or a FlowSDE, got {sde!r}")


@register_sampler("flow_sde", inf_start=True, nfe=lambda steps: steps, stochastic=True, options=("sde",),
                  corrector=True, note="a flow SDE with the ODE's marginals (core.flow_sde)")
def sample_flow_sde(
    model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None,
    sde: str | FlowSDE = "rbf", x0_corrector: X0Corrector | None = None, **_,
) -> Tensor:
    """Steps of a flow SDE (:class:`FlowSDE`; ``sde=`` a registered name or the object): ``x' = D + (s_down / s)
    (x - D) + s_up z`` with its split; NFE = ``len(sigmas) - 1``, no noise on the last step to sigma = 0.

    ``sd.sample(flow, noise, sd.sigmas.flow(50), method="flow_sde", sde=FlowSDE("rbf", scale=2))``.
    """
    sde = as_flow_sde(sde)
    noise = noise or SampleNoise(None)
    for i in step_range(sigmas, progress, "flow_sde"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        x = ddim_step(x, d, s, s_next, sde, noise)
    return x
