"""Samplers over a denoiser (docs/methods/conventions.md, "Samplers"; shapes follow k-diffusion's ``sample_<name>``
functions).

Each sampler is a function of a model ``model(x, sigma_batch, step) -> D``, a starting state ``x`` (already scaled to
``sigmas[0]``) and a schedule ``sigmas`` (decreasing, ending in 0), integrating the probability-flow ODE
``dx/dsigma = (x - D(x, sigma)) / sigma`` (Karras et al. 2022, eq. 1 with sigma(t) = t) or its ancestral SDE.

* ``euler``: first order.
* ``heun``: Karras et al. 2022, Algorithm 2 without churn (second order; Euler on the last step to sigma = 0).
* ``ddim``: Song et al. 2021 in sigma space; ``eta`` sets the stochasticity. With ``eta = 0`` it is the
  Euler step exactly (``D + sigma_next * (x - D) / sigma``).
* ``ddpm``: ancestral sampling from the DDPM posterior ``q(x_next | x, x0 = D)``, written in sigma space as the
  posterior of the variance-exploding chain (mean ``(s'^2/s^2) x + (1 - s'^2/s^2) D``, variance
  ``s'^2 (s^2 - s'^2) / s^2``); it equals ``ddim`` with ``eta = 1``.

A schedule may start at ``sigma = inf`` (pure noise, a flow schedule's ``t = 1``; :func:`steerdiff.sigmas.flow`).
:func:`sample` then hands the sampler the unit noise itself as the state, and each sampler takes its first step in
closed form, the limit ``sigma_0 -> inf`` of its step, with no division by sigma (euler, ddim, ddpm: ``x_1 = D_0 +
sigma_1 eps`` or its stochastic split; heun: a trapezoid in the flow time ``t``; docs/methods/conventions.md,
"Flow-matching models").

Each sampler is a loop over public pieces a caller can also use one step at a time: :func:`denoise_step` (core's
one checked model call, :mod:`steerdiff.core.calls`, then the step's ``x0_corrector``) and the per-step updates
:func:`euler_step`, :func:`heun_step`, :func:`ddim_step`, :func:`ddpm_step` (with :func:`ancestral_split` and
:func:`ancestral_mean`, which the SMC proposals of :mod:`steerdiff.align` and DPS build on).

The ``model`` that :func:`sample` hands a sampler is a :class:`SampleModel`: besides ``model(x, sigma_batch, step)``
it has :meth:`SampleModel.denoise`, the checked evaluation with the layers between the sampler and the network
flattened into one call (the loop's own work per step, benchmarks/pipeline_step_ops.py), which
:func:`denoise_checked` and :func:`denoise_step` use when they are given it, and which a loop can call directly
(:func:`direct_denoise`); any other callable works as ``model`` too, through :func:`~steerdiff.core.calls.checked_call`.

Every sampler is registered with :func:`~steerdiff.core.registry.register_sampler`; other packages add theirs the
same way (``steerdiff.covariance`` registers ``ocm-ddpm`` / ``ocm-ddim``), and :func:`sample` knows them only
through the registry.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .calls import (  # noqa: F401  (flow_time: re-exported)
    _ACTIVE_GUARD,
    active_guard,
    check_finite_mode,
    checked_call,
    emit,
    flow_time,
    host_copy,
    non_finite_error,
    trajectory_check,
    where,
)
from .denoiser import AT_LEAST_FLOAT32, HOST_LEVEL_ATTR, Denoiser, LevelPlan, NFECounter, is_structured_cond
from .guided import GuidedDenoiser
from .noise import GeneratorLike, SampleNoise, make_generators
from .registry import SAMPLERS, register_sampler
from .sigmas import check_sigmas

Model = Callable[..., Tensor]
"""``model(x, sigma_batch, step=None) -> D``: ``step`` is the index of the sampler step the evaluation belongs to
(several evaluations of one step, such as Heun's two, share it), so stateful guiders advance once per step."""
Callback = Callable[[dict], None]


def denoise_checked(model: Model, x: Tensor, sigma: float, i: int) -> Tensor:
    """One checked model evaluation at noise level ``sigma`` for sampler step ``i`` (passed on as ``step``):
    :func:`~steerdiff.core.calls.checked_call`, the one place of the checks (output shape; a non-finite output
    names the step, the sigma, the flow time ``t = sigma / (1 + sigma)`` and how many samples; a ``ValueError``
    raised inside the denoiser gets the step appended).

    At ``sigma = inf`` (the first level of a flow schedule) ``x`` is the unit noise itself, not ``noise * inf``
    (docs/methods/conventions.md, "Flow-matching models").
    """
    if type(model) is SampleModel:
        return model.denoise(x, sigma, i)
    return checked_call(lambda z, sb: model(z, sb, i), x, sigma, i)


class SampleModel:
    """The ``model(x, sigma_batch, step)`` that :func:`sample` hands its sampler: the counted denoiser
    (:class:`~steerdiff.core.denoiser.NFECounter`) with the sample's condition, through a
    :class:`~steerdiff.core.guided.GuidedDenoiser` when there is guidance; plus :meth:`denoise`, the checked
    evaluation at a host level in one function.

    :meth:`denoise` is :func:`~steerdiff.core.calls.checked_call` of ``model`` with the layers between the sampler
    and the network flattened (the loop's own work per step, issue 36: benchmarks/pipeline_step_ops.py counts it):
    the sigma batch, the NFE count, the guider's direct combiner on one doubled batch
    (:meth:`~steerdiff.core.guided.GuidedDenoiser.begin`) and the checks are done here, with the same tensors, the
    same ops on them and the same errors as the layered call, so the samples are the same bit for bit. A call the
    direct combiner does not cover (the trajectory's first, a changed condition or batch size, a guider that is not
    one rule) goes through the layered call.
    """

    __slots__ = ("counter", "guided", "cond", "levels", "plans")

    def __init__(self, counter: NFECounter, guided: GuidedDenoiser | None, cond, levels: list[float] | None = None):
        self.counter = counter
        self.guided = guided
        self.cond = cond
        self.levels = levels  # the trajectory's levels: the sigma batches are made for all of them at once
        self.plans: dict[tuple, LevelPlan | None] = {}  # (rows, dtype, device) -> the batches of every level

    def _plan(self, rows: int, dtype: torch.dtype, device: torch.device) -> LevelPlan | None:
        """The :class:`~steerdiff.core.denoiser.LevelPlan` of ``rows``, ``dtype`` and ``device`` for the
        trajectory's levels, made at its first need (None without levels, in inference mode or for a dtype other
        than float32 / float64)."""
        key = (rows, dtype, device)
        if key not in self.plans:
            plan = None
            if self.levels is not None and rows > 0 and dtype in (torch.float32, torch.float64) and \
                    not torch.is_inference_mode_enabled():
                levels = [float(np.float32(s)) if dtype is torch.float32 else float(s) for s in self.levels]
                plan = LevelPlan(list(dict.fromkeys(levels)), rows, dtype, device)
                # The loop looks its batches up by the schedule's own values: a value that float32 rounds maps to
                # the batch of its rounded level (no other level equals it: a level is a float32 value).
                for s, level in zip(self.levels, levels, strict=True):
                    plan.by_level.setdefault(s, plan.by_level[level])
            self.plans[key] = plan
        return self.plans[key]

    def __call__(self, x: Tensor, s: Tensor, step: int | None = None) -> Tensor:
        if self.guided is not None:
            return self.guided(x, s, step=step)
        return self.counter(x, s, self.cond)

    def denoise(self, x: Tensor, sigma: float, i: int) -> Tensor:
        """``D(x, sigma)`` of step ``i``, checked: :func:`denoise_checked` (the same result and errors)."""
        guided = self.guided
        n = x.shape[0]
        if guided is not None:
            direct = guided._direct  # (combiner, rows, doubled condition, versions, uses sigma) once taken
            if direct is None or n != direct[1]:
                return checked_call(lambda z, sb: guided(z, sb, step=i), x, sigma, i)
            if direct[3] is not None:  # integer labels: unchanged in place since the doubled ones were built
                c, doubled = guided.cond, direct[2]
                if (None if c.is_inference() else c._version) != direct[3] or \
                        (None if doubled.is_inference() else doubled._version) != direct[4]:
                    return checked_call(lambda z, sb: guided(z, sb, step=i), x, sigma, i)
        # The sigma batch of calls.sigma_batch, tagged with its host level as denoiser.tag_host_level tags it:
        # made before the loop for every level (LevelPlan, looked up by the schedule's own value), else here.
        dtype = AT_LEAST_FLOAT32.get(x.dtype) or torch.promote_types(x.dtype, torch.float32)
        counter = self.counter
        try:
            if guided is None:
                plan = self.plans.get((n, dtype, x.device), False)
                if plan is False:
                    plan = self._plan(n, dtype, x.device)
                sb = None if plan is None else plan.by_level.get(sigma)  # LevelPlan.sigma_batch, inline
                if sb is None or sb._version:  # not planned, or changed in place
                    sb = _tagged_batch(x, n, sigma, dtype)
                counter.calls += 1
                counter.rows += n
                d = counter.denoiser(x, sb, self.cond)
            else:
                # guided._doubled_call's batch: [x, x] at the level, one sigma batch of 2B rows (the values of
                # cat([sb, sb])); the combiner's own [B] batch only if it reads it.
                plan = self.plans.get((2 * n, dtype, x.device), False)
                if plan is False:
                    plan = self._plan(2 * n, dtype, x.device)
                sb2 = None if plan is None else plan.by_level.get(sigma)  # LevelPlan.sigma_batch, inline
                if sb2 is None or sb2._version:  # not planned, or changed in place
                    sb2 = _tagged_batch(x, 2 * n, sigma, dtype)
                counter.calls += 1
                counter.rows += 2 * n
                out = counter.denoiser(torch.cat([x, x]), sb2, direct[2])
                if out.shape[0] != 2 * n:
                    raise ValueError(f"denoiser returned {out.shape[0]} rows for a doubled batch of {2 * n}")
                d_cond, d_null = out.chunk(2)
                w = direct[6]
                if w is not None:  # CFG's combiner: its lerp, called here
                    d = torch.lerp(d_null, d_cond, w)
                else:
                    d = direct[0](d_cond, d_null, x, _tagged_batch(x, n, sigma, dtype) if direct[5] else None, i)
        except ValueError as e:
            if type(e) is not ValueError or " at step " in str(e):
                raise
            raise ValueError(f"{e} (at {where(i, sigma)})") from e
        if not isinstance(d, Tensor) or d.shape != x.shape:
            got = tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__
            raise ValueError(f"denoiser returned shape {got}, expected the input's shape {tuple(x.shape)} at "
                             f"{where(i, sigma)}")
        guard = _ACTIVE_GUARD.get()
        if guard is not None and guard.deferred:
            guard.record(d, sigma, i, n)
        elif not math.isfinite(d.sum().tolist()) and not torch.isfinite(d).all():  # calls._check_now
            raise non_finite_error(i, sigma, int((~torch.isfinite(d)).reshape(n, -1).any(1).sum()), n)
        return d if d.dtype == x.dtype else d.to(x.dtype)


_F32_LEVEL: dict[float, float] = {}  # a level as float32 holds it (what the host read of a float32 batch gives)


def _tagged_batch(x: Tensor, rows: int, sigma: float, dtype: torch.dtype) -> Tensor:
    """:func:`~steerdiff.core.calls.sigma_batch` of ``rows`` rows in ``dtype`` (the level as float32 holds it
    remembered per level)."""
    if dtype is torch.float32:
        level = _F32_LEVEL.get(sigma)
        if level is None:
            level = float(np.float32(sigma))
            if len(_F32_LEVEL) < 4096:
                _F32_LEVEL[sigma] = level
    else:
        level = float(sigma)
    sb = x.new_full((rows,), sigma, dtype=dtype)
    setattr(sb, HOST_LEVEL_ATTR, (level, None if sb.is_inference() else sb._version))
    return sb


def direct_denoise(model: Model, x0_corrector: X0Corrector | None = None) -> Callable | None:
    """``denoise(x, sigma, i) -> D``, the :func:`denoise_checked` of ``model`` in one call, for a sampler's loop:
    :meth:`SampleModel.denoise` when ``model`` is :func:`sample`'s and there is no corrector; else None (then the
    loop calls :func:`denoise_step`)."""
    if x0_corrector is None and type(model) is SampleModel:
        return model.denoise
    return None


X0Corrector = Callable[[Tensor, Tensor, float, int], Tensor]
"""``x0_corrector(denoised, x, sigma, i) -> denoised'``: the hook of :func:`sample` (see :func:`apply_x0_corrector`)."""


def apply_x0_corrector(x0_corrector: X0Corrector | None, x: Tensor, denoised: Tensor, sigma: float,
                       i: int) -> tuple[Tensor, Tensor]:
    """Apply an ``x0_corrector`` to step ``i`` (identity when it is None).

    The corrector maps the denoised estimate ``D`` of step ``i`` (at state ``x``, level ``sigma``) to a corrected
    estimate ``u``. The sampler then takes its step with ``u`` as ``x0-hat`` while ``eps-hat = (x - D) / sigma``
    keeps the *uncorrected* ``D`` (the controller of RB-Modulation, Rout et al., "RB-Modulation: Training-Free
    Stylization using Reference-Based Modulation", ICLR 2025, Section 4; docs/methods/samplers.md, "The
    x0-corrector hook"). Every update is a function of the pair
    (state, ``x0-hat``) through ``x = x0-hat + sigma eps-hat``, so this is the pair ``(x + (u - D), u)``: the state
    moves by the control ``u - D`` and ``(x' - u) / sigma`` is the old ``eps-hat``. For DDIM (eta = 0) the step
    becomes ``u + (sigma' / sigma)(x - D)``. At ``sigma = inf`` the state is the unit noise (``eps-hat`` itself)
    and stays as it is. A corrector returning ``D`` (the same object or an equal tensor) leaves the run
    bit-identical.

    A corrector whose attribute ``reentry`` is ``"consistent"`` (:class:`steerdiff.control.RBModulation`'s default,
    docs/methods/rb_modulation.md "Re-entry") re-enters with ``eps-hat`` formed from ``u`` instead: the pair is
    ``(x, u)``, the step the sampler would take if the denoiser had returned ``u`` (for DDIM
    ``u + (sigma' / sigma)(x - u)``). Any other corrector (no such attribute) re-enters as above.

    Returns:
        ``(state, x0-hat)`` for the step.

    Raises:
        ValueError: the corrector returned a tensor of another shape.
        FloatingPointError: the corrector returned non-finite values (at the trajectory's end when the finite
            check is deferred, :data:`~steerdiff.core.calls.FINITE_CHECK_MODES`).
    """
    if x0_corrector is None:
        return x, denoised
    u = x0_corrector(denoised, x, sigma, i)
    if u is denoised:
        return x, denoised
    if not isinstance(u, Tensor) or u.shape != denoised.shape:
        got = tuple(u.shape) if isinstance(u, Tensor) else type(u).__name__
        raise ValueError(f"x0_corrector returned {got}, expected a tensor of the denoised estimate's shape "
                         f"{tuple(denoised.shape)} at {where(i, sigma)}")
    guard = active_guard()
    if guard is not None and guard.deferred:
        guard.record(u, sigma, i, u.shape[0], kind="x0_corrector")  # checked at the trajectory's end
    elif not torch.isfinite(u).all():
        raise FloatingPointError(f"x0_corrector returned non-finite values at {where(i, sigma)}")
    u = u.to(denoised.dtype)
    if getattr(x0_corrector, "reentry", None) == "consistent" or math.isinf(sigma):
        return x, u
    return x + (u - denoised), u


def correct_x0(model: Model, x: Tensor, denoised: Tensor, sigma: float, i: int) -> tuple[Tensor, Tensor]:
    """Deprecated: the ``x0_corrector`` is an argument of the step now (:func:`apply_x0_corrector`,
    :func:`denoise_step`). Applies a corrector still attached to ``model`` as an attribute (identity without)."""
    warnings.warn("correct_x0(model, ...) is deprecated: pass the corrector to the step, "
                  "apply_x0_corrector(x0_corrector, x, denoised, sigma, i) or denoise_step(..., x0_corrector)",
                  DeprecationWarning, stacklevel=2)
    return apply_x0_corrector(getattr(model, "x0_corrector", None), x, denoised, sigma, i)


def project_state(x0_corrector: X0Corrector | None, x: Tensor, sigma: float, i: int) -> Tensor:
    """The state at the start of step ``i`` (level ``sigma``) through the corrector's optional ``project(x, sigma,
    i) -> x'`` (identity when it has none): a projection of the state itself, before the step's evaluation, such as
    inpainting's replacement of the known region (:class:`steerdiff.pipelines.image_inputs.InpaintBlend`).
    :func:`sample` also applies it to the final state (``i = len(sigmas) - 1``, at ``sigmas[-1]``)."""
    project = getattr(x0_corrector, "project", None)
    if project is None:
        return x
    y = project(x, sigma, i)
    if y is x:
        return x
    if not isinstance(y, Tensor) or y.shape != x.shape:
        got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
        raise ValueError(f"x0_corrector.project returned {got}, expected a tensor of the state's shape "
                         f"{tuple(x.shape)} at {where(i, sigma)}")
    return y.to(x.dtype)


def denoise_step(model: Model, x: Tensor, sigma: float, i: int,
                 x0_corrector: X0Corrector | None = None) -> tuple[Tensor, Tensor]:
    """The first evaluation of sampler step ``i``: the corrector's state projection (:func:`project_state`), then
    :func:`denoise_checked`, then the step's ``x0_corrector`` (:func:`apply_x0_corrector`). Returns ``(state,
    x0-hat)`` for the update; without a corrector ``(x, D)``."""
    if x0_corrector is None:
        return x, denoise_checked(model, x, sigma, i)
    x = project_state(x0_corrector, x, sigma, i)
    return apply_x0_corrector(x0_corrector, x, denoise_checked(model, x, sigma, i), sigma, i)


def step_range(sigmas: list[float], progress: bool, desc: str):
    """The step indices ``0 .. len(sigmas) - 2``, with a tqdm bar when ``progress`` (else the range itself: a
    disabled bar still costs a generator frame per step)."""
    if not progress:
        return range(len(sigmas) - 1)
    return tqdm(range(len(sigmas) - 1), desc=desc, leave=False)


# ------------------------------------------------------------------------------------------------ one step each
# The per-step updates of the registered samplers, usable one step at a time: ``x_next = *_step(x, D, s, s_next,
# ...)`` with ``(x, D)`` the pair :func:`denoise_step` returns. The samplers below are loops over them.


def euler_step(x: Tensor, denoised: Tensor, s: float, s_next: float) -> Tensor:
    """The first-order step ``D + s_next * (x - D) / s`` of the probability-flow ODE (DDIM's ``eta = 0`` step).

    From ``s = inf`` the state ``x`` is the unit noise ``eps`` and the step is its limit ``D + s_next * eps``
    (``(x - D) / s`` with ``x = s * eps`` tends to ``eps``): no division by ``s``.
    """
    if math.isinf(s):
        return denoised.add(x, alpha=s_next) if s_next != 0 else denoised  # (an SDE's Euler split may be < 0)
    return torch.lerp(denoised, x, s_next / s)  # = x + (s_next - s) * (x - D) / s


def heun_step(model: Model, x: Tensor, denoised: Tensor, s: float, s_next: float, i: int) -> Tensor:
    """One step of Karras et al. (2022), Algorithm 2 without churn: Euler, then (unless ``s_next = 0``) the trapezoid
    with a second checked evaluation ``D(x_euler, s_next)`` of step ``i``.

    From ``s = inf`` the trapezoid is taken in the flow time ``t = sigma / (1 + sigma)`` on the flow state
    ``x_t = x / (1 + sigma)`` (the integrator of diffusers' ``FlowMatchHeunDiscreteScheduler``), where the ODE
    ``dx_t/dt = (x_t - D) / t`` is smooth at ``t = 1``: with ``eps`` the unit noise, ``x_e = D_0 + s' eps`` the
    Euler point and ``D' = D(x_e, s')``, it lands on ``x' = x_e + (1 + 1/s') (D' - D_0) / 2``, second order and
    finite (the trapezoid in sigma has no limit there: its step ``s' - s`` is infinite).
    """
    x_euler = euler_step(x, denoised, s, s_next)
    if s_next == 0:
        return x_euler
    if math.isinf(s):
        # x_t' = eps + (t' - 1) (v_0 + v') / 2 with v = (x_t - D) / t, mapped back by x' = (1 + s') x_t'.
        d_next = denoise_checked(model, x_euler, s_next, i)
        return x_euler.add(d_next - denoised, alpha=0.5 * (1.0 + 1.0 / s_next))
    # Trapezoid: x + h/2 (d + d'), with d = (x - D)/s, d' = (x_euler - D')/s', h = s' - s.
    h = s_next - s
    d_sum = (x - denoised) / s + (x_euler - denoise_checked(model, x_euler, s_next, i)) / s_next
    return x.add(d_sum, alpha=0.5 * h)


def ancestral_split(s: float, s_next: float, eta: float) -> tuple[float, float]:
    """Split the step ``s -> s_next`` into a deterministic part ``s_down`` and fresh noise ``s_up``.

    ``s_up = eta * s_next * sqrt(1 - s_next^2 / s^2)`` is DDIM's sigma_t(eta) (Song et al. 2021, eq. 16) mapped to
    sigma space (divide the VP variance by alphabar_next); ``s_down = sqrt(s_next^2 - s_up^2)``. ``eta`` may also be
    an object with ``split(s, s_next) -> (s_down, s_up)`` (a :class:`~steerdiff.core.flow_sde.FlowSDE`), whose split
    is returned.
    """
    split = getattr(eta, "split", None)  # a noise rule in place of a number, e.g. core.flow_sde.FlowSDE
    if split is not None:
        return split(s, s_next)
    if s_next == 0:
        return 0.0, 0.0
    s_up = min(s_next, eta * s_next * math.sqrt(max(0.0, 1 - (s_next / s) ** 2)))
    return math.sqrt(max(0.0, s_next**2 - s_up**2)), s_up


def ancestral_mean(x: Tensor, denoised: Tensor, s: float, s_next: float, eta: float) -> tuple[Tensor, float]:
    """The deterministic part of an ancestral (DDIM ``eta``) step and the noise std still to add:
    ``(euler_step(x, D, s, s_down), s_up)`` with :func:`ancestral_split` (``eta = 1``: the DDPM posterior mean
    ``D + (s'^2/s^2)(x - D)``). The DDIM sampler, the SMC proposals of :mod:`steerdiff.align` and DPS build on it."""
    s_down, s_up = ancestral_split(s, s_next, eta)
    return euler_step(x, denoised, s, s_down), s_up


def ddim_step(x: Tensor, denoised: Tensor, s: float, s_next: float, eta: float, noise: SampleNoise) -> Tensor:
    """DDIM in sigma space: ``x_next = D + s_down (x - D) / s + s_up z`` (Song et al., "Denoising Diffusion Implicit
    Models", ICLR 2021, eq. 12 with sigma_t(eta) of eq. 16), ``z`` from ``noise`` only where ``s_up > 0``.

    From ``sigma = inf`` (state = the unit noise ``eps``): ``s_up = eta s_1``, ``s_down = s_1 sqrt(1 - eta^2)`` and
    ``x_1 = D + s_down eps + s_up z``, the limit of the step (``eta = 1``: ``D + s_1 z``).
    """
    x, s_up = ancestral_mean(x, denoised, s, s_next, eta)
    return x.add(noise.randn_like(x), alpha=s_up) if s_up > 0 else x


def ddpm_step(x: Tensor, denoised: Tensor, s: float, s_next: float, noise: SampleNoise) -> Tensor:
    """A draw from the DDPM posterior ``q(x_next | x, x0 = D)`` (Ho, Jain, Abbeel, NeurIPS 2020, eq. 7, beta-tilde
    variance) in sigma space: mean ``(s'^2/s^2) x + (1 - s'^2/s^2) D``, variance ``s'^2 (s^2 - s'^2) / s^2``.

    From ``sigma = inf`` the posterior mean keeps none of ``x`` (``keep = (s_1/s)^2 = 0``) and the variance is
    ``s_1^2``: ``x_1 = D + s_1 z``, the limit of the step.
    """
    keep = 0.0 if math.isinf(s) else (s_next / s) ** 2  # weight of x_t in the posterior mean
    x = torch.lerp(denoised, x, keep) if keep > 0 else denoised
    var = s_next**2 * (1 - keep)
    return x.add(noise.randn_like(x), alpha=math.sqrt(var)) if var > 0 else x


# ------------------------------------------------------------------------------------------------ the samplers
@register_sampler("euler", nfe=lambda steps: steps, inf_start=True, corrector=True)
def sample_euler(model: Model, x: Tensor, sigmas: list[float], callback=None, progress=False,
                 x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """Euler steps of the probability-flow ODE (:func:`euler_step`); NFE = ``len(sigmas) - 1``. A first level
    ``sigma = inf`` takes the closed-form limit ``x_1 = D(eps, inf) + sigma_1 eps``."""
    denoise = direct_denoise(model, x0_corrector)
    ratios = _ratios(sigmas)
    for i in step_range(sigmas, progress, "euler"):
        s, s_next = sigmas[i], sigmas[i + 1]
        if denoise is not None:
            denoised = denoise(x, s, i)
        else:
            x, denoised = denoise_step(model, x, s, i, x0_corrector)
        if callback is not None:
            emit(callback, i, s, s_next, x, denoised)
        ratio = ratios[i]
        x = euler_step(x, denoised, s, s_next) if ratio is None else torch.lerp(denoised, x, ratio)
    return x


def _ratios(sigmas: list[float]) -> list[float | None]:
    """``s_next / s`` of each step, the weight of :func:`euler_step`'s ``lerp``; None where ``s`` is infinite (its
    closed-form first step; and at ``s = 0``, where the step raises as it did): computed before the loop, so a step
    of the loop calls no helper."""
    return [None if math.isinf(s) or s == 0 else s_next / s
            for s, s_next in zip(sigmas[:-1], sigmas[1:], strict=True)]


@register_sampler("heun", nfe=lambda steps: 2 * steps - 1, inf_start=True, corrector=True)
def sample_heun(model: Model, x: Tensor, sigmas: list[float], callback=None, progress=False,
                x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """Karras et al. (2022) Algorithm 2 without churn (:func:`heun_step`); NFE = ``2 * (len(sigmas) - 1) - 1``."""
    denoise = direct_denoise(model, x0_corrector)
    for i in step_range(sigmas, progress, "heun"):
        s, s_next = sigmas[i], sigmas[i + 1]
        if denoise is not None:
            denoised = denoise(x, s, i)
        else:
            x, denoised = denoise_step(model, x, s, i, x0_corrector)
        if callback is not None:
            emit(callback, i, s, s_next, x, denoised)
        x = heun_step(model, x, denoised, s, s_next, i)
    return x


@register_sampler("ddim", nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True, inf_start=True,
                  corrector=True)
def sample_ddim(
    model: Model, x: Tensor, sigmas: list[float], callback=None, progress=False, noise=None, eta: float = 0.0,
    x0_corrector: X0Corrector | None = None, **_
) -> Tensor:
    """DDIM in sigma space (:func:`ddim_step`); NFE = ``len(sigmas) - 1``."""
    noise = noise or SampleNoise(None)
    denoise = direct_denoise(model, x0_corrector)
    # ddim_step's split and lerp weight of each step, before the loop (a number eta: a pure function of the levels)
    plan = None
    if isinstance(eta, (int, float)):
        plan = []
        for s, s_next in zip(sigmas[:-1], sigmas[1:], strict=True):
            s_down, s_up = ancestral_split(s, s_next, eta)
            plan.append((None if math.isinf(s) or s == 0 else s_down / s, s_up))
    for i in step_range(sigmas, progress, "ddim"):
        s, s_next = sigmas[i], sigmas[i + 1]
        if denoise is not None:
            denoised = denoise(x, s, i)
        else:
            x, denoised = denoise_step(model, x, s, i, x0_corrector)
        if callback is not None:
            emit(callback, i, s, s_next, x, denoised)
        if plan is None or plan[i][0] is None:
            x = ddim_step(x, denoised, s, s_next, eta, noise)
            continue
        ratio, s_up = plan[i]  # ddim_step: euler_step to s_down (a lerp), then the noise
        x = torch.lerp(denoised, x, ratio)
        if s_up > 0:
            x = x.add(noise.randn_like(x), alpha=s_up)
    return x


@register_sampler("ddpm", nfe=lambda steps: steps, stochastic=True, inf_start=True, corrector=True)
def sample_ddpm(model: Model, x: Tensor, sigmas: list[float], callback=None, progress=False, noise=None,
                x0_corrector: X0Corrector | None = None, **_) -> Tensor:
    """Ancestral sampling from the DDPM posterior (:func:`ddpm_step`); NFE = ``len(sigmas) - 1``."""
    noise = noise or SampleNoise(None)
    denoise = direct_denoise(model, x0_corrector)
    for i in step_range(sigmas, progress, "ddpm"):
        s, s_next = sigmas[i], sigmas[i + 1]
        if denoise is not None:
            denoised = denoise(x, s, i)
        else:
            x, denoised = denoise_step(model, x, s, i, x0_corrector)
        if callback is not None:
            emit(callback, i, s, s_next, x, denoised)
        x = ddpm_step(x, denoised, s, s_next, noise)
    return x


def nfe_of(method: str, steps: int) -> int:
    """Denoiser evaluations per sample (without guidance) for ``steps`` steps of ``method``."""
    return SAMPLERS.get(method).nfe(steps)


@dataclass
class SampleStats:
    """Cost of a sampling run: ``nfe`` per sample (a doubled guidance batch counts 2), batched ``calls``, seconds.

    ``extras`` holds the statistics a sampler reports for itself (e.g. ``clamped`` for the ``ocm-*`` kernels); they
    read as attributes too (``stats.clamped``).
    """

    nfe: float
    calls: int
    wall_time: float
    extras: dict = field(default_factory=dict)

    def __getattr__(self, name: str):
        extras = self.__dict__.get("extras") or {}
        if name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (this run's extras: {sorted(extras)})")


def check_sample_inputs(denoiser, noise, cond) -> None:
    """Validate what every sampler receives: a denoiser callable as ``D(x, sigma, cond)``, noise ``[B, *shape]``
    matching the denoiser's ``sample_shape`` (if it declares one), and an integer condition ``[B]`` / ``[B, m]``, a
    structured condition with ``B`` rows (a pipeline's text condition), or None."""
    check_denoiser(denoiser)
    if not isinstance(noise, Tensor) or noise.ndim < 2 or noise.shape[0] < 1:
        got = tuple(noise.shape) if isinstance(noise, Tensor) else type(noise).__name__
        raise ValueError(f"noise must be a tensor [B, *shape] with B >= 1, got {got}")
    if not noise.is_floating_point():
        raise ValueError(f"noise must be a floating-point tensor, got dtype {noise.dtype}")
    shape = getattr(denoiser, "sample_shape", None)
    if shape is not None and tuple(noise.shape[1:]) != tuple(shape):
        raise ValueError(
            f"noise has sample shape {tuple(noise.shape[1:])} but the denoiser expects {tuple(shape)} "
            f"(noise must be [B, {', '.join(map(str, shape))}])"
        )
    if is_structured_cond(cond):
        if cond.batch_size != noise.shape[0]:
            raise ValueError(f"cond has {cond.batch_size} rows (prompts) but noise has B={noise.shape[0]}; a "
                             "structured condition needs one row per sample")
    elif cond is not None:
        if not isinstance(cond, Tensor) or cond.dtype.is_floating_point or cond.dtype == torch.bool:
            raise ValueError("cond must be an integer tensor [B] or [B, m] (-1 = null)")
        if cond.ndim not in (1, 2) or cond.shape[0] != noise.shape[0]:
            raise ValueError(f"cond must have shape [B] or [B, m] with B={noise.shape[0]}, got {tuple(cond.shape)}")


def _takes_three_arguments(fn) -> bool:
    """Whether ``fn(x, sigma, cond)`` can be called (False only when its signature says it cannot)."""
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): assume it can
        return True
    return True


def check_denoiser(denoiser) -> None:
    """A denoiser is called ``D(x, sigma, cond)``: refuse a callable that cannot take three arguments, naming the
    convention (a two-argument ``f(x, sigma)`` is the commonest mistake)."""
    if not callable(denoiser):
        raise TypeError(f"denoiser must be callable D(x, sigma, cond), got {type(denoiser).__name__}")
    target = denoiser.forward if hasattr(denoiser, "forward") and callable(denoiser.forward) else denoiser
    if not _takes_three_arguments(target):
        raise TypeError(
            f"denoiser must accept (x, sigma, cond): steerdiff calls D(x, sigma, cond) with cond=None for an "
            f"unconditional model, but {getattr(denoiser, '__name__', type(denoiser).__name__)}"
            f"{inspect.signature(target)} does not; add a cond=None parameter"
        )


RANGE_TOL = 1e-3  # relative slack on a model's sigma range (its table goes through float32 in places)
START_PRIOR_RATIO = 10.0  # a run from noise must start at sigma >= this x the data's scale (1% prior variance error)
# A guided sample further from 0 than this x the data's scale is no sample of the data: the guidance is far past where
# it steers. Images in [-1, 1] (sigma_data 0.5) lie within 2 data scales, and a run's start, noise * sigmas[0], within
# about 5 x 160 = 1600 (sigmas[0] <= 160 for the shipped models); so 1e4 is beyond both, and beyond what a coarse
# schedule alone gives (2 unguided Heun steps on digits: 590), while CFG(1e9) on digits reaches 3e6.
GUIDED_RANGE_RATIO = 1e4


def check_schedule_range(denoiser, sigmas: list[float], from_noise: bool, allow_out_of_range: bool = False) -> None:
    """Check a schedule against what the denoiser was trained for.

    A denoiser that knows its noise range exposes ``sigma_range = (sigma_min, sigma_max)`` (a VP model's timestep
    table, :class:`~steerdiff.core.vp.VPDenoiser`; the range an :class:`~steerdiff.models.EDMPrecond` was trained
    for, up to its ``sigma_max``, 160 by default). A level above ``sigma_max`` would be evaluated at the clamped
    top timestep, a wrong answer: that raises ``ValueError`` unless ``allow_out_of_range`` (then it warns). A level
    below ``sigma_min`` is evaluated at the bottom timestep: a warning. A run from pure noise (no ``x_start``) must
    start where the noise dominates the data (``sigmas[0] >= 10 x`` the data's scale: ``sigma_data`` of an EDM
    model, ``data_scale`` where a denoiser declares one (a :class:`~steerdiff.core.flow.FlowDenoiser`: 1), 1 for a
    VP model), else its start ``noise * sigmas[0]`` is not the model's prior (a flow t-grid passed as sigmas is the
    usual cause): a warning. An infinite first level (pure noise) never warns.

    ``sigmas[0] = inf`` needs a denoiser that can be evaluated there: one whose ``sigma_range`` reaches ``inf``
    (``FlowDenoiser``, the exact ``GaussianMixture``) or that declares no range (a plain function, which must then
    return the limit itself). A finite ``sigma_max`` (``VPDenoiser``, ``EDMPrecond``, whose ``c_noise = ln(sigma)/4``
    is infinite there) refuses it with a ``ValueError``, even with ``allow_out_of_range``.
    """
    levels = [s for s in sigmas if s > 0]
    rng = getattr(denoiser, "sigma_range", None)
    if rng is not None:
        lo, hi = float(rng[0]), float(rng[1])
        if levels and math.isinf(levels[0]) and not math.isinf(hi):
            raise ValueError(
                f"sigmas[0] = inf (pure noise: a flow schedule's t = 1) but the denoiser "
                f"({type(denoiser).__name__}) cannot be evaluated at sigma = inf: its sigma_range is "
                f"({lo:.6g}, {hi:.6g}); start at a finite level within it (e.g. sd.sigmas.karras(steps, sigma_min, "
                f"{min(hi, 80.0):.4g})) or use a flow model (sd.core.FlowDenoiser)")
        above = [s for s in levels if s > hi * (1 + RANGE_TOL)]
        if above:
            msg = (f"sigmas reach {max(above):.6g}, above the denoiser's sigma_max {hi:.6g} ({len(above)} levels): "
                   "it was not trained there (a VP model would be evaluated at its top timestep, an EDM model "
                   "extrapolates); use a schedule within its range (e.g. "
                   f"sd.sigmas.karras(steps, sigma_min, {hi:.4g}))")
            if not allow_out_of_range:
                raise ValueError(msg + ", or pass allow_out_of_range=True")
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
        below = [s for s in levels if s < lo * (1 - RANGE_TOL)]
        if below:
            warnings.warn(f"sigmas go down to {min(below):.6g}, below the denoiser's sigma_min {lo:.6g} "
                          f"({len(below)} levels): it is evaluated at its smallest timestep there",
                          RuntimeWarning, stacklevel=3)
    scale = getattr(denoiser, "sigma_data", None)
    if scale is None:
        scale = getattr(denoiser, "data_scale", None)
    if scale is None and rng is not None and math.isfinite(float(rng[1])):
        scale = 1.0  # VP models are trained on data of unit scale (an exact mixture's range is unbounded: no rule)
    if from_noise and scale is not None and levels and levels[0] < START_PRIOR_RATIO * float(scale):
        warnings.warn(f"the schedule starts at sigma {levels[0]:.6g}, not far above the data's scale "
                      f"{float(scale):g}: the start noise * sigmas[0] is not the model's pure-noise prior (a flow "
                      "t-grid is not a sigma schedule: convert t to sigma = t / (1 - t)); to start from an image, "
                      "pass x_start=", RuntimeWarning, stacklevel=3)


def sample(
    denoiser: Denoiser,
    noise: Tensor,
    sigmas: Tensor,
    method: str = "heun",
    cond: Tensor | None = None,
    guidance: object | None = None,
    generator: GeneratorLike = None,
    progress: bool = False,
    callback: Callback | None = None,
    eta: float | None = None,
    enable_grad: bool = False,
    return_stats: bool = False,
    x_start: Tensor | None = None,
    strength: float | None = None,
    allow_out_of_range: bool = False,
    x0_corrector: X0Corrector | None = None,
    finite_check: str | None = None,
    **options,
) -> Tensor | tuple[Tensor, SampleStats]:
    """Draw samples by integrating from ``sigmas[0]`` to 0.

    Args:
        denoiser: ``D(x, sigma, cond=None) -> E[x0 | x]``.
        noise: standard normal ``[B, *shape]``; scaled by ``sigmas[0]`` here, or, when ``sigmas[0] = inf``, handed
            to the sampler as the state itself (pure noise, the flow state at ``t = 1``). Make it per sample with
            :func:`steerdiff.randn` so a sample does not depend on its batch.
        sigmas: decreasing schedule ending in 0 (e.g. :func:`steerdiff.sigmas.karras`); the first level may be
            ``inf`` (:func:`steerdiff.sigmas.flow`), for a denoiser that can be evaluated there (see
            :func:`check_schedule_range`).
        method: a registered sampler (:data:`steerdiff.core.SAMPLERS`): ``euler``, ``heun``, ``ddim``, ``ddpm``,
            and those other packages register (``ocm-ddpm`` / ``ocm-ddim``, which need ``covariance=``).
        cond: integer condition ``[B]`` or ``[B, m]`` (``-1`` = null), passed to the denoiser.
        guidance: a combiner ``f(d_cond, d_uncond, x, sigma)`` or a guider with ``guide(denoiser, x, sigma,
            cond)`` (see :mod:`steerdiff.core.guided`); needs ``cond``.
        generator: per-sample randomness for ``ddim`` (eta > 0) and ``ddpm``: an int seed (row ``i`` gets
            ``seed + i``), a list of seeds or generators, one shared generator, or None (global RNG).
        progress: show a tqdm bar.
        callback: called each step with ``{"i", "sigma", "sigma_next", "x", "denoised"}``.
        eta: the noise share in [0, 1] of samplers that take one (DDIM's stochasticity for ``ddim`` and
            ``ocm-ddim``, default 0; an ancestral or SDE sampler's, default 1); None uses the sampler's default.
        enable_grad: keep the autograd graph through the sampler (for gradients w.r.t. noise or parameters).
        return_stats: also return :class:`SampleStats` (NFE per sample, calls, wall time, the sampler's extras).
        x_start: a clean image ``[B, *shape]`` to start from (SDEdit / img2img): the run begins at
            ``x_start + sigma * noise`` part of the way down the schedule, set by ``strength``. At a start of
            ``sigma = inf`` (``strength = 1`` on a flow schedule) nothing of ``x_start`` survives: the run starts
            from the noise alone.
        strength: with ``x_start``, the fraction of the schedule to run, in (0, 1] (diffusers' img2img rule: the
            last ``min(int(steps * strength), steps)`` steps; 1 starts from the top of the schedule). Default 1.
        allow_out_of_range: run a schedule that leaves the denoiser's ``sigma_range`` with a warning instead of an
            error (see :func:`check_schedule_range`).
        x0_corrector: ``x0_corrector(denoised, x, sigma, i) -> denoised'``, called after the (guided) denoiser on the
            first evaluation of every step; the sampler uses the returned estimate as ``x0-hat`` and keeps
            ``eps-hat = (x - D) / sigma`` of the uncorrected ``D`` (:func:`apply_x0_corrector`; e.g.
            :class:`steerdiff.control.RBModulation`). An object with ``begin(sigmas)`` is handed the run's schedule
            (a list of floats) first; one with ``project(x, sigma, i) -> x'`` has the state replaced by it at the
            start of every step and at the end (:func:`project_state`; inpainting's known-region blend). Honoured
            by every sampler registered with ``corrector=True`` (all of core's); ``sd.sample`` refuses it for the
            others.
        finite_check: when a non-finite model output raises (:data:`steerdiff.core.calls.FINITE_CHECK_MODES`):
            ``"end"`` records every output on the device and reads one flag after the loop (no host
            synchronisation inside it; the error still names the first bad step), ``"step"`` reads one sum per
            model call and stops at the first bad one; None or ``"auto"`` (default; :func:`steerdiff.core.calls.
            finite_check` can change it for a block): ``"end"`` on an accelerator, ``"step"`` on the CPU.
        **options: options of the chosen sampler (its registered ``options``), e.g. ``covariance=`` for the
            ``ocm-*`` samplers (a head from :func:`steerdiff.covariance.load_head`, a ``GaussianMixture`` oracle or a
            baseline name; see :func:`steerdiff.covariance.as_covariance`). None counts as not given.

    Returns:
        The samples ``[B, *shape]`` in ``noise``'s dtype, and the stats if asked.
    """
    spec = SAMPLERS.get(method)
    options = {k: v for k, v in options.items() if v is not None}
    for key in spec.required:
        if key not in options:
            raise ValueError(f"method={method!r} needs {key}=" + (f" ({spec.note})" if spec.note else ""))
    if guidance is not None and not spec.guidance:
        raise ValueError(f"guidance= is not supported with method={method!r}" + (f": {spec.note}" if spec.note else ""))
    for key in options:
        if key not in spec.options:
            takers = [n for n, s in SAMPLERS.items() if key in s.options]
            raise ValueError(f"{key}= applies to methods {takers} only, got method={method!r}" if takers else
                             f"sample() got an unexpected keyword argument {key!r}")
    if eta is None:
        eta = spec.default_eta
    else:
        if not spec.eta:
            raise ValueError(f"eta applies to methods {[n for n, s in SAMPLERS.items() if s.eta]} only, "
                             f"got method={method!r}")
        if not (0.0 <= eta <= 1.0):
            raise ValueError(f"eta must lie in [0, 1], got {eta}")
    if x0_corrector is not None:
        if not callable(x0_corrector):
            raise TypeError(f"x0_corrector must be callable (denoised, x, sigma, i) -> denoised, got "
                            f"{type(x0_corrector).__name__}")
        if not spec.corrector:
            raise ValueError(f"x0_corrector= is not supported with method={method!r}; samplers that honour it: "
                             f"{[n for n, s in SAMPLERS.items() if s.corrector]}")
        if "x0_corrector" not in inspect.signature(spec.fn).parameters:
            raise TypeError(f"sampler {method!r} is registered with corrector=True but its function takes no "
                            "x0_corrector= argument: add x0_corrector=None to its signature and pass it to "
                            "denoise_step(model, x, sigma, i, x0_corrector)")
    if finite_check is not None:
        check_finite_mode(finite_check)
    if not isinstance(allow_out_of_range, bool):  # a string such as "no" would be truthy
        raise TypeError(f"allow_out_of_range must be True or False, got {allow_out_of_range!r}")
    check_sample_inputs(denoiser, noise, cond)
    sig = check_sigmas(sigmas).tolist()  # one host transfer; the loop then uses Python floats only
    sig = _start_of_run(sig, noise, x_start, strength)
    if math.isinf(sig[0]) and not spec.inf_start:
        takers = [n for n, s in SAMPLERS.items() if s.inf_start]
        raise ValueError(f"sigmas[0] = inf (pure noise) but method={method!r} was not written for an infinite first "
                         f"level; use one that is ({takers}) or start the schedule at a finite sigma")
    check_schedule_range(denoiser, sig, from_noise=x_start is None, allow_out_of_range=allow_out_of_range)
    gens = make_generators(generator, noise.shape[0], noise.device) if spec.stochastic(eta) else None

    counter = NFECounter(denoiser)
    guided = None
    if guidance is not None:
        guided = GuidedDenoiser(counter, guidance, cond)
        guided.begin(torch.tensor(sig, dtype=torch.float64))
    model = SampleModel(counter, guided, None if guided is not None else cond, sig)

    kwargs = {}
    if x0_corrector is not None:
        kwargs["x0_corrector"] = x0_corrector  # an argument of every step (denoise_step), never a model attribute
        if callable(getattr(x0_corrector, "begin", None)):
            x0_corrector.begin(list(sig))
    start = time.perf_counter()
    with torch.set_grad_enabled(enable_grad), trajectory_check(noise.device, finite_check):
        if math.isinf(sig[0]):
            start_state = noise  # the limit of x / sigma_0: samplers take their closed-form first step from it
        elif x_start is None:
            start_state = noise * sig[0]
        else:
            start_state = x_start.to(noise.dtype) + noise * sig[0]
        out = spec.fn(model, start_state, sig, callback=callback, progress=progress, noise=SampleNoise(gens),
                      eta=eta, denoiser=denoiser, cond=cond, **kwargs, **options)
    x, extras = out if isinstance(out, tuple) else (out, {})
    x = project_state(x0_corrector, x, sig[-1], len(sig) - 1)
    if guidance is not None:
        check_guided_range(denoiser, x, guidance)
    stats = SampleStats(nfe=counter.nfe(noise.shape[0]), calls=counter.calls, wall_time=time.perf_counter() - start,
                        extras=dict(extras))
    return (x, stats) if return_stats else x


def check_guided_range(denoiser, x: Tensor, guidance: object) -> None:
    """Warn (``RuntimeWarning``) when guided samples leave the data's range by far: more than
    :data:`GUIDED_RANGE_RATIO` times the data's scale (``sigma_data`` of an EDM model, ``data_scale`` where a denoiser
    declares one; no rule for a denoiser that declares neither, such as an exact mixture).

    One host read, after the sampler's loop. Such samples are what an extreme guidance scale gives (``CFG(1e9)``:
    values of 1e6 for data in [-1, 1]), and look like any other tensor; a scale that overflows to inf or NaN is a
    ``FloatingPointError`` of the denoiser call instead.
    """
    scale = getattr(denoiser, "sigma_data", None)
    if scale is None:
        scale = getattr(denoiser, "data_scale", None)
    if scale is None or not x.numel():
        return
    reach = float(host_copy(x.detach().abs().amax()))
    if reach > GUIDED_RANGE_RATIO * float(scale):
        warnings.warn(f"the guided samples reach |x| = {reach:.4g}, {reach / float(scale):.3g} times the data's scale "
                      f"{float(scale):g} (more than {GUIDED_RANGE_RATIO:g}): no data lie there; the guidance "
                      f"({type(guidance).__name__}{_scale_of(guidance)}) is far past where it steers: lower its scale",
                      RuntimeWarning, stacklevel=3)


def _scale_of(guidance: object) -> str:
    scale = getattr(guidance, "scale", None)
    return f", scale {scale:g}" if isinstance(scale, (int, float)) else ""


def _start_of_run(sig: list[float], noise: Tensor, x_start: Tensor | None, strength: float | None) -> list[float]:
    """The part of the schedule a run covers: all of it from noise, the last ``strength`` of it from ``x_start``."""
    if x_start is None:
        if strength is not None:
            raise ValueError("strength applies with x_start= only (the image to start from)")
        return sig
    if not isinstance(x_start, Tensor) or tuple(x_start.shape) != tuple(noise.shape):
        got = tuple(x_start.shape) if isinstance(x_start, Tensor) else type(x_start).__name__
        raise ValueError(f"x_start must be a tensor of the noise's shape {tuple(noise.shape)}, got {got}")
    if not x_start.is_floating_point() or not torch.isfinite(x_start).all():
        raise ValueError("x_start must be a finite floating-point tensor")
    strength = 1.0 if strength is None else strength
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not 0 < strength <= 1:
        raise ValueError(f"strength must be a number in (0, 1], got {strength!r}")
    steps = len(sig) - 1
    run = min(int(steps * strength), steps)
    if run < 1:
        raise ValueError(f"strength={strength} runs no step of a {steps}-step schedule (int(steps * strength) = 0); "
                         "raise strength or use more steps")
    return sig[steps - run:]
