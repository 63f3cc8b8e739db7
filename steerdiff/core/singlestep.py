"""Two-evaluation single-step samplers, as k-diffusion's (docs/methods/samplers.md, "More samplers: k-diffusion's
and ComfyUI's remaining ones").

* ``dpm_2``: k-diffusion's ``sample_dpm_2`` (a sampler "inspired by DPM-Solver-2 and Karras et al. 2022,
  Algorithm 2"): an Euler half step to the geometric midpoint ``s_mid = sqrt(s s')``, a second evaluation there,
  and the full step with the midpoint's derivative. Euler on the last step to sigma = 0.
* ``dpm_2_ancestral``: the same step down to ``s_down`` of :func:`~steerdiff.core.sampling.ancestral_split`, then
  fresh noise of std ``s_up`` (k-diffusion's ``sample_dpm_2_ancestral``).
* ``dpmpp_2s_ancestral``: DPM-Solver++(2S) (Lu et al. 2022, "DPM-Solver++", Algorithm 1 with ``r = 1/2``) down to
  ``s_down``, then noise ``s_up`` (k-diffusion's ``sample_dpmpp_2s_ancestral``).
* ``dpmpp_sde``: k-diffusion's ``sample_dpmpp_sde``, the stochastic DPM-Solver++ with an intermediate level at the
  fraction ``r`` of the step in ``lambda = -log sigma``; each of its two sub-steps is an ancestral data-prediction
  step (noise share ``eta``). k-diffusion draws its noise from a Brownian tree; here it is fresh per-sample unit
  noise, two draws per step (both are unit Gaussians per draw; on a tree the two draws of a step are correlated
  increments of one path). The test feeds our draws through k-diffusion's ``noise_sampler`` argument, so both
  integrate the same path to rounding.

NFE per sample: two evaluations per step but the last one to sigma = 0 (one): ``2 steps - 1``.

From ``sigma_0 = inf`` (a flow model's pure noise; the state is the unit noise ``eps``) only ``dpmpp_2s_ancestral``
is registered (``inf_start``): the limit of its step, with the same two evaluations, is ``x_1 = D(D_0 + s_1 eps,
s_1) + s_1 z`` at ``eta = 1`` (its intermediate level is ``s_1`` itself) and ``x_1 = D(eps, inf) + s_down eps + s_up
z`` below (the intermediate level goes to inf, its estimate to ``D_0`` as ``O(1/sqrt(sigma_0))``). ``dpm_2``'s limit
needs the derivative of ``D`` in ``1/sigma`` at inf (the midpoint ``sqrt(sigma_0 s')`` goes to inf while the
difference of the two estimates is amplified by ``sqrt(sigma_0 / s')``), ``dpm_2_ancestral``'s step diverges at
``eta = 1`` and ``dpmpp_sde``'s has none written here: ``sd.sample`` refuses an infinite first level for them (start
at ``sigmas[1:]``).
"""

from __future__ import annotations

import math

from torch import Tensor

from .calls import emit
from .dpm_solver import check_eta
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, ancestral_split, denoise_checked, denoise_step, euler_step, step_range


def _two_evals(steps: int) -> int:
    return max(2 * steps - 1, 0)


def geometric_midpoint(s: float, s_next: float) -> float:
    """``exp((log s + log s') / 2)``, k-diffusion's ``sigma_mid`` of ``sample_dpm_2`` (the midpoint in log sigma)."""
    return math.exp(0.5 * (math.log(s) + math.log(s_next)))


def dpm_2_step(model: Model, x: Tensor, denoised: Tensor, s: float, s_next: float, i: int) -> Tensor:
    """One ``dpm_2`` step from ``s`` to ``s_next > 0``: ``x_mid = x + (s_mid - s) d``, ``d = (x - D)/s``, then
    ``x' = x + (s' - s) d_mid`` with ``d_mid = (x_mid - D(x_mid, s_mid))/s_mid`` (a second checked evaluation of
    step ``i``)."""
    s_mid = geometric_midpoint(s, s_next)
    d = (x - denoised) / s
    x_mid = x + d * (s_mid - s)
    d_mid = (x_mid - denoise_checked(model, x_mid, s_mid, i)) / s_mid
    return x + d_mid * (s_next - s)


@register_sampler("dpm_2", nfe=_two_evals)
def sample_dpm_2(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False,
                 x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """k-diffusion's ``sample_dpm_2`` without churn (:func:`dpm_2_step`); NFE = ``2 steps - 1`` (Euler on the last
    step to sigma = 0).

    Not registered for ``sd.sample``'s ``x0_corrector=``: the update uses the midpoint's slope only, so a corrected
    first estimate moves just the midpoint and barely the result (RB-Modulation's style cost did not fall at all).
    Called directly, the argument is still applied to the first evaluation of each step."""
    for i in step_range(sigmas, progress, "dpm_2"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        x = euler_step(x, d, s, s_next) if s_next == 0 else dpm_2_step(model, x, d, s, s_next, i)
    return x


@register_sampler("dpm_2_ancestral", nfe=_two_evals, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=1.0)
def sample_dpm_2_ancestral(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False,
                           noise=None, eta: float = 1.0, x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """k-diffusion's ``sample_dpm_2_ancestral``: :func:`dpm_2_step` to ``s_down``, then ``+ s_up z``
    (:func:`~steerdiff.core.sampling.ancestral_split`); NFE = ``2 steps - 1``. ``eta = 0`` is ``dpm_2``. Not
    registered for ``x0_corrector=`` (see :func:`sample_dpm_2`)."""
    eta = check_eta(eta)
    noise = noise or SampleNoise(None)
    for i in step_range(sigmas, progress, "dpm_2_ancestral"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        s_down, s_up = ancestral_split(s, s_next, eta)
        if s_down == 0:
            x = euler_step(x, d, s, 0.0)
            continue
        x = dpm_2_step(model, x, d, s, s_down, i)
        if s_up > 0:
            x = x + noise.randn_like(x) * s_up
    return x


def dpmpp_2s_step(model: Model, x: Tensor, denoised: Tensor, s: float, s_next: float, i: int,
                  r: float = 0.5) -> Tensor:
    """One DPM-Solver++(2S) step (Lu et al. 2022, Algorithm 1) from ``s`` to ``s_next > 0``: with ``h`` the step in
    ``lambda = -log sigma`` and ``s_r = s e^{-r h}``, ``u = (s_r/s) x - expm1(-r h) D`` and
    ``x' = (s'/s) x - expm1(-h) D(u, s_r)`` (k-diffusion's form with ``r = 1/2``)."""
    h = math.log(s) - math.log(s_next)
    s_r = math.exp(-(-math.log(s) + r * h))
    u = x * (s_r / s) - denoised * math.expm1(-r * h)
    return x * (s_next / s) - denoise_checked(model, u, s_r, i) * math.expm1(-h)


@register_sampler("dpmpp_2s_ancestral", inf_start=True, nfe=_two_evals, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=1.0, corrector=True)
def sample_dpmpp_2s_ancestral(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False,
                              noise=None, eta: float = 1.0, x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """k-diffusion's ``sample_dpmpp_2s_ancestral``: :func:`dpmpp_2s_step` to ``s_down``, then ``+ s_up z``;
    NFE = ``2 steps - 1``."""
    eta = check_eta(eta)
    noise = noise or SampleNoise(None)
    for i in step_range(sigmas, progress, "dpmpp_2s_ancestral"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        s_down, s_up = ancestral_split(s, s_next, eta)
        if math.isinf(s) and s_next > 0:
            # The limit of the step (state = eps): at eta = 1 the intermediate level is s' itself, u = D + s' eps,
            # x' = D(u, s'); below, it lies at inf (state eps again) and x' = D(eps, inf) + s_down eps.
            if s_down == 0:
                x = denoise_checked(model, euler_step(x, d, s, s_next), s_next, i)
            else:
                x = euler_step(x, denoise_checked(model, x, s, i), s, s_down)
        else:
            x = euler_step(x, d, s, 0.0) if s_down == 0 else dpmpp_2s_step(model, x, d, s, s_down, i)
        if s_up > 0:
            x = x + noise.randn_like(x) * s_up
    return x


def _data_step(x: Tensor, denoised: Tensor, s: float, s_to: float, eta: float, noise: SampleNoise) -> Tensor:
    # The ancestral data-prediction step of dpmpp_sde: down to s_down = ancestral_split(s, s_to)[0] by
    # x (s_down / s) - expm1(log s_down - log s)... written as (s_down/s) x + (1 - s_down/s) D, then + s_up z.
    s_down, s_up = ancestral_split(s, s_to, eta)
    x = x * (s_down / s) - denoised * math.expm1(math.log(s_down) - math.log(s))
    return x + noise.randn_like(x) * s_up if s_up > 0 else x


@register_sampler("dpmpp_sde", nfe=_two_evals, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=1.0, options=("r",), corrector=True)
def sample_dpmpp_sde(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None,
                     eta: float = 1.0, r: float = 0.5, x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """Stochastic DPM-Solver++, k-diffusion's ``sample_dpmpp_sde``; NFE = ``2 steps - 1``.

    With ``h`` the step in ``lambda = -log sigma`` and ``s_r = s e^{-r h}``: an ancestral data-prediction step
    ``s -> s_r`` from ``D`` (noise share ``eta``), a second evaluation ``D_r`` there, and an ancestral step
    ``s -> s'`` from ``x`` with ``(1 - 1/(2r)) D + D_r / (2r)``. ``r`` in (0, 1] (default 1/2). Two fresh
    per-sample unit draws per step where ``eta > 0`` (k-diffusion: increments of a Brownian tree).
    """
    eta = check_eta(eta)
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1:
        raise ValueError(f"r must be a number in (0, 1] for dpmpp_sde, got {r!r}")
    noise = noise or SampleNoise(None)
    fac = 1 / (2 * r)
    for i in step_range(sigmas, progress, "dpmpp_sde"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        if s_next == 0:
            x = euler_step(x, d, s, 0.0)
            continue
        h = math.log(s) - math.log(s_next)
        s_r = math.exp(math.log(s) - r * h)
        x_r = _data_step(x, d, s, s_r, eta, noise)
        d_r = denoise_checked(model, x_r, s_r, i)
        x = _data_step(x, d * (1 - fac) + d_r * fac, s, s_next, eta, noise)
    return x


def _heunpp2_nfe(steps: int) -> int:
    return max(3 * steps - 3, 1)


@register_sampler("heunpp2", nfe=_heunpp2_nfe, corrector=True)
def sample_heunpp2(model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False,
                   x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """ComfyUI's ``sample_heunpp2`` (from sd-webui-samplers-scheduler; no churn); NFE = ``3 steps - 3``.

    Each step takes Euler points one and two levels ahead, ``x_2 = x + (s_1 - s) d`` and ``x_3 = x_2 + (s_2 - s_1)
    d_2``, and steps by ``x' = x + (s_1 - s)(w_1 d + w_2 d_2 + w_3 d_3)`` with ``w_2 = s_1 / (3 sigma_0)``,
    ``w_3 = s_2 / (3 sigma_0)``, ``w_1 = 1 - w_2 - w_3`` (``sigma_0`` the schedule's first level). The step before
    the last uses two points (``w_2 = s_1 / (2 sigma_0)``), the last one is Euler.

    Not registered for ``sigma_0 = inf``: every weight but ``w_1`` would be 0 (the method would be Euler with wasted
    evaluations).
    """
    s_end, s0 = sigmas[-1], sigmas[0]
    for i in step_range(sigmas, progress, "heunpp2"):
        s, s1 = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s1, x, d)
        if s1 == s_end:
            x = euler_step(x, d, s, s1)
            continue
        d = (x - d) / s
        x2 = x + d * (s1 - s)
        d2 = (x2 - denoise_checked(model, x2, s1, i)) / s1
        s2 = sigmas[i + 2]
        if s2 == s_end:
            w2 = s1 / (2 * s0)
            x = x + (d * (1 - w2) + d2 * w2) * (s1 - s)
            continue
        x3 = x2 + d2 * (s2 - s1)
        d3 = (x3 - denoise_checked(model, x3, s2, i)) / s2
        w2, w3 = s1 / (3 * s0), s2 / (3 * s0)
        x = x + (d * (1 - w2 - w3) + d2 * w2 + d3 * w3) * (s1 - s)
    return x
