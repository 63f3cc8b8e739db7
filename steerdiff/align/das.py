"""DAS: test-time reward alignment by tempered SMC (Kim, Kim, Park, "Test-time Alignment of Diffusion Models without
Reward Over-optimization", ICLR 2025, arXiv 2501.05803; Sections 3-4 and Algorithm 1 there).

Target ``p_tar(x0) ∝ p(x0) exp(r(x0) / alpha)`` (in practice the path measure of the discretised model chain tilted
by ``exp(r(x_N) / alpha)``). Each group of P particles is one SMC population (``docs/methods/das.md`` explains each
piece and why):

* twist ``psi_i(x) = exp(lambda_i r(D(x, sigma_i)) / alpha)``, ``psi_N(x) = exp(r(x) / alpha)``, with a tempering
  schedule ``lambda_i`` growing from 0 to 1;
* proposal ``N(mu_i(x) + delta_i, tau_i^2 I)``, ``delta_i = kappa tau_i^2 lambda_{i+1} grad_x r(D(x, sigma_i)) /
  alpha`` (the gradient goes through the denoiser), ``mu_i``, ``tau_i`` the ancestral (DDPM, eta = 1) step;
* incremental weight ``log p - log q + log psi_{i+1}(x_{i+1}) - log psi_i(x_i)`` with the closed form
  ``log p - log q = -(delta . z) / tau - |delta|^2 / (2 tau^2)``;
* resampling of a group when its ESS drops below ``ess_threshold * P``; *every* per-particle quantity (state,
  denoised value, gradient, reward, log-twist, condition) is reindexed (the official code leaves the gradient and
  the twist behind; "Fixes relative to the official code" in the methods page);
* a valid evidence estimate ``log Z += logsumexp(l + log w)`` with normalised ``l`` (the official ``log_Z`` is not).

Where the grid ends in 0 the last move is deterministic, ``x_N = D(x_{N-1})``, and the final increment is
``r(x_N) / alpha - log psi_{N-1}`` with no proposal term (TDS's rule; the LCM pipeline's re-added increment is not
copied). Non-finite particles (state, denoised value, reward or weight) get log-weight ``-inf``, are counted in
``result.nonfinite`` and force their group to resample, so they never spread to the others.

The step functions (look-ahead, reweight, resample, propose, record) are those of :mod:`.smc`; the shared argument
handling is :func:`.run.prepare`.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.flow_sde import FlowSDE
from ..core.noise import GeneratorLike
from ..distributed import DistContext
from .options import check_smc_options
from .registry import TEMPERING, register_aligner, register_tempering
from .result import AlignResult
from .run_setup import AlignRun, Callback, Reward, prepare
from .smc import (
    SMCState,
    accept_weights,
    ess,
    look_ahead,
    normalize,
    propose,
    raise_if_dead,
    resample_groups,
    row_finite,
    select_groups,
    select_output,
    start_state,
    twist_shift,
    use_sde,
)

SCHEDULES = TEMPERING  # the registry of named schedules (was a tuple of names)


def default_gamma(steps: int, tempering: str | float = "exp") -> float:
    """The tempering rate reaching ``lambda = 1`` at 87% of ``steps`` (``docs/methods/das.md``, "Tempering").

    ``exp``: ``2^(1 / (0.87 steps)) - 1`` (0.00800 for 100 steps, the official 0.008); polynomial:
    ``1 / (0.87 steps)``.
    """
    k = max(1.0, 0.87 * steps)
    return 2.0 ** (1.0 / k) - 1.0 if tempering == "exp" else 1.0 / k


@register_tempering("adaptive")
def _adaptive(k: Tensor, gamma: float | None, span: int) -> None:
    """No fixed levels: :func:`run_smc` picks each ``lambda_i`` by bisection on the ESS."""
    return None


@register_tempering("exp")
def _exp(k: Tensor, gamma: float | None, span: int) -> Tensor:
    """The paper's ``min((1 + gamma)^k - 1, 1)`` (Kim, Kim, Park 2025, Section 4; the official code's default)."""
    g = default_gamma(span) if gamma is None else gamma
    return ((1 + g) ** k - 1).clamp(max=1.0)


@register_tempering("constant")
def _constant(k: Tensor, gamma: float | None, span: int) -> Tensor:
    """``lambda = 1`` throughout (TDS's twist, Wu et al. 2023)."""
    return torch.full((k.numel(),), 1.0, dtype=torch.float64)


@register_tempering("zero")
def _zero(k: Tensor, gamma: float | None, span: int) -> Tensor:
    """``lambda = 0``: importance resampling at the end only."""
    return torch.full((k.numel(),), 0.0, dtype=torch.float64)


SIGMA_SCALE = 1.0  # the "sigma" schedule's default s, in the data's units (docs/methods/das.md, "Tempering by sigma")


@register_tempering("sigma")
def _sigma(k: Tensor, gamma: float | None, span: int, sigmas: Tensor) -> Tensor:
    """``min(1, (s / sigma_i)^2)`` with ``s = gamma`` (default :data:`SIGMA_SCALE`): the look-ahead twist, which omits
    a term of the size of the posterior covariance (of order ``sigma^2`` until the modes separate), is kept weak
    while ``sigma`` is large (``docs/methods/das.md``, "Tempering by sigma"; issue 38)."""
    s = SIGMA_SCALE if gamma is None else gamma
    return (s / sigmas.double()).pow(2).clamp(max=1.0)


def tempering_schedule(tempering, steps: int, gamma: float | None = None, start: float = 0.0,
                       sigmas=None) -> Tensor | None:
    """Fixed tempering levels ``[steps + 1]`` (``lambda_N = 1``), or None for ``"adaptive"``.

    ``tempering``: a registered schedule (:data:`steerdiff.align.registry.TEMPERING`: ``"exp"``
    ``min((1 + gamma)^(i - i_s) - 1, 1)``, ``"constant"`` ``lambda = 1`` (TDS), ``"zero"`` ``lambda = 0``
    (importance resampling at the end only), ``"sigma"`` ``min(1, (gamma / sigma_i)^2)`` (gamma default 1),
    ``"adaptive"``); a number e: ``min((gamma (i - i_s))^e, 1)`` (the exponent is applied to the next level too,
    unlike the official code); a sequence of ``steps`` levels in [0, 1]. Levels before ``i_s = int(steps * start)``
    are 0. ``sigmas``: the grid (at least ``steps`` noise levels), passed to registered schedules that take a
    ``sigmas`` keyword (``"sigma"``), which need it.
    """
    i_s = int(steps * start)
    k = torch.arange(steps, dtype=torch.float64) - i_s
    if isinstance(tempering, str):
        if tempering not in TEMPERING:
            raise ValueError(f"tempering must be one of {TEMPERING.names()}, a positive exponent or {steps} levels, "
                             f"got {tempering!r}")
        fn = TEMPERING.get(tempering)
        if "sigmas" in inspect.signature(fn).parameters:
            if sigmas is None:
                raise ValueError(f"tempering={tempering!r} reads the noise levels: pass sigmas")
            grid = torch.as_tensor(sigmas).detach().to("cpu", torch.float64).flatten()[:steps]
            lam = fn(k, gamma, steps - i_s, sigmas=grid)
        else:
            lam = fn(k, gamma, steps - i_s)
        if lam is None:
            return None
    elif isinstance(tempering, (int, float)) and not isinstance(tempering, bool):
        if not tempering > 0:
            raise ValueError(f"a polynomial tempering exponent must be positive, got {tempering}")
        g = default_gamma(steps - i_s, "poly") if gamma is None else gamma
        lam = (g * k).clamp(min=0.0).pow(float(tempering)).clamp(max=1.0)
    else:
        lam = torch.as_tensor(tempering, dtype=torch.float64).flatten()
        if lam.numel() != steps or not torch.all((lam >= 0) & (lam <= 1)):
            raise ValueError(f"tempering levels must be {steps} values in [0, 1], got {lam.numel()} values")
    if gamma is not None and not gamma > 0:
        raise ValueError(f"gamma must be positive, got {gamma}")
    lam = torch.where(k < 0, torch.zeros_like(lam), lam)
    return torch.cat([lam, lam.new_ones(1)])


def _adaptive_lambda(logw: Tensor, base: Tensor, rho: Tensor, lo: Tensor, target: float, iters: int = 40) -> Tensor:
    """Largest ``lambda`` in ``[lo, 1]`` (per group) whose would-be ESS stays >= ``target``, by bisection.

    Would-be weights: ``normalise(logw + base + lambda * rho)`` (the paper's adaptive tempering, Appendix A, with
    bisection instead of the official code's Adam iterations; ``docs/methods/das.md``, "Tempering").
    """

    def ess_at(lam):
        return ess(normalize(logw + base + lam[:, None] * rho))

    hi = torch.ones_like(lo)
    ok_hi = ess_at(hi) >= target
    ok_lo = ess_at(lo) >= target
    a, b = lo.clone(), hi.clone()
    for _ in range(iters):
        mid = 0.5 * (a + b)
        good = ess_at(mid) >= target
        a, b = torch.where(good, mid, a), torch.where(good, b, mid)
    return torch.where(ok_hi, hi, torch.where(ok_lo, a, lo))


@dataclass
class SMCOptions:
    """DAS's own options beyond the shared ones (TDS fixes them); see :func:`das` for their meaning."""

    tempering: str | float | Sequence[float] = "exp"
    gamma: float | None = None
    tempering_start: float = 0.0
    ess_threshold: float = 0.5
    resampler: str = "ssp"
    output: str = "sample_one"
    gradient: bool = True
    vp_compat: bool = False
    grad_clip: float | None = None
    shift_clip: float | None = None

    def check(self, particles: int) -> None:
        """Validate them (after the shared arguments, before the grid: :func:`.sampler.prepare`): the SMC options
        every aligner shares (:func:`.options.check_smc_options`), then DAS's own."""
        check_smc_options(particles, self.ess_threshold, self.resampler, self.output)
        if not 0 <= self.tempering_start < 1:
            raise ValueError(f"tempering_start must lie in [0, 1), got {self.tempering_start}")
        for name in ("grad_clip", "shift_clip"):
            c = getattr(self, name)
            if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c)
                                  or c <= 0):
                raise ValueError(f"{name} must be None or a positive finite number, got {c!r}")
            if c is not None and not self.gradient:
                raise ValueError(f"{name} caps the reward-gradient proposal: pass gradient=True with it (the "
                                 "default, gradient=False, has no gradient to cap)")

    def schedule(self, steps: int, sigmas=None) -> Tensor | None:
        return tempering_schedule(self.tempering, steps, self.gamma, self.tempering_start, sigmas)


def smc_sample(method: str, denoiser: Callable, reward: Reward, noise: Tensor, sigmas, opts: SMCOptions,
               sde: str | FlowSDE | None = None, **shared) -> AlignResult:
    """Validate (:func:`.run.prepare` with ``opts``' checks and schedule) and run :func:`run_smc` (with the moves of
    the flow SDE ``sde``, :func:`.smc.use_sde`, when given)."""
    def schedule(steps: int) -> Tensor | None:  # called by prepare after it has checked the grid
        return opts.schedule(steps, sigmas)

    return run_smc(use_sde(prepare(method, denoiser, reward, noise, sigmas, check=opts.check, schedule=schedule,
                                   options=opts, **shared), sde), opts)


def _row_norms(t: Tensor) -> Tensor:
    """Per-row L2 norm ``[B]`` in float64."""
    return t.double().flatten(1).norm(dim=1)


def _rescale_rows(t: Tensor, factor: Tensor) -> Tensor:
    return t * factor.to(t.dtype).view(-1, *([1] * (t.ndim - 1)))


def clip_grad(grad: Tensor, max_norm: float | None) -> Tensor:
    """``grad`` with each row's L2 norm capped at ``max_norm`` (reward units per unit of x); None: unchanged."""
    if max_norm is None:
        return grad
    return _rescale_rows(grad, (max_norm / _row_norms(grad).clamp_min(1e-300)).clamp(max=1.0))


def clip_shift(delta: Callable[[float], Tensor], max_ratio: float | None) -> Callable[[float], Tensor]:
    """A ``shift`` whose per-row norm is capped at ``max_ratio * tau * sqrt(d)`` (the step's noise norm); None:
    unchanged. The mean of the proposal's ``log p - log q`` per step is then at least ``-max_ratio^2 d / 2``."""
    if max_ratio is None:
        return delta

    def clipped(tau: float) -> Tensor:
        dl = delta(tau)
        cap = max_ratio * tau * math.sqrt(dl[0].numel())
        return _rescale_rows(dl, (cap / _row_norms(dl).clamp_min(1e-300)).clamp(max=1.0))

    return clipped


def run_smc(run: AlignRun, opts: SMCOptions) -> AlignResult:
    """The tempered SMC loop behind :func:`das` and :func:`steerdiff.align.tds` (the methods page, "One SMC step").

    Per step ``i >= i_s``: look ahead, choose ``lambda_i``, reweight by ``log p/q + log psi_i - log psi_{i-1}``,
    record, resample the groups whose ESS fell (or that lost a particle), call back, propose; before ``i_s`` the
    plain chain. Then the final weight ``psi_N = exp(r(x_N) / alpha)`` and the output rule.
    """
    G, P, N, sig, alpha = run.groups, run.particles, run.steps, run.sigmas, run.alpha
    fixed = run.schedule
    adaptive = fixed is None
    i_s = int(N * opts.tempering_start)
    dev = run.noise.device
    host = run.host_decisions
    # The fixed levels, read once on the host (for the gradient decision) and moved once to the device.
    fixed_host, fixed_dev = (None, None) if adaptive else (fixed.tolist(), fixed.to(dev))
    noise = run.sample_noise()
    state = SMCState.start(start_state(run.noise, sig[0], opts.vp_compat), run.cond, G, P, N)
    tr = state.traces
    smc_time = 0.0
    # Particles whose look-ahead reward was NaN or +-inf, per step and group (counted on the device, read once at
    # the end): they are among the killed ones, and the reward is the usual culprit, so it is reported apart.
    reward_bad = torch.zeros(N + 1, G, dtype=torch.long, device=dev)

    bar = run.bar()
    for i in bar:
        s, s1 = sig[i], sig[i + 1]
        if i >= i_s:
            # At sigma = inf the state is the unit noise eps = x / sigma: the gradient w.r.t. x is 0 (no shift).
            need_grad = opts.gradient and s1 != 0 and not math.isinf(s) and (adaptive or fixed_host[i + 1] > 0)
            bad = look_ahead(state, run.calls, s, need_grad, i)
            reward_bad[i] = (~torch.isfinite(state.reward)).sum(1)
            rho_safe = torch.where(bad, torch.zeros_like(state.reward), state.reward)
            t_smc = time.perf_counter()
            if adaptive:
                base = torch.where(bad, torch.full_like(rho_safe, -math.inf), state.log_proposal - state.log_twist)
                state.lam = _adaptive_lambda(state.log_weights, base, rho_safe / alpha, state.lam,
                                             opts.ess_threshold * P)
            else:
                state.lam = fixed_dev[i].expand(G)
            tr.lambdas[i] = state.lam
            logpsi = state.lam[:, None] * rho_safe / alpha
            w = accept_weights(run, state, state.log_proposal + logpsi - state.log_twist, bad, i)
            state.log_twist = logpsi
            tr.record(i, w, state.reward, bad)
            do = tr.resampled[i] = select_groups(w.ess, w.killed, opts.ess_threshold)
            anc = resample_groups(state, do, run.group_generators, opts.resampler, run.shard, host)
            smc_time += time.perf_counter() - t_smc
            run.emit(i, state.x, state.denoised, grad=None if state.grad is None else state.grad / alpha,
                     reward=state.reward, log_twist=state.log_twist, log_weights=state.log_weights, ess=w.ess,
                     lam=state.lam, resampled=do, ancestors=anc)
        else:
            state.denoised, state.grad = run.calls.denoise(state.x, s, state.cond, i), None
            state.log_twist = torch.zeros(G, P, dtype=torch.float64, device=dev)
            run.emit(i, state.x, state.denoised, log_twist=state.log_twist, log_weights=state.log_weights,
                     lam=state.lam)
        shift = None
        if state.grad is not None:
            lam_next = state.lam if adaptive else fixed_dev[i + 1].expand(G)
            kappa = math.sqrt((1 + s * s) / (1 + s1 * s1)) if opts.vp_compat else 1.0
            shift = clip_shift(twist_shift(clip_grad(state.grad, opts.grad_clip), lam_next, alpha, kappa),
                               opts.shift_clip)
        state.x, ratio = propose(state.x, state.denoised, s, s1, run.eta, noise, shift)
        state.log_proposal = torch.zeros_like(state.log_proposal) if ratio is None else run.shard.per_particle(ratio)
        if run.progress and not torch.isnan(tr.ess[i]).all():
            bar.set_postfix(ess=f"{float(tr.ess[i].mean()) / P:.2f}", lam=f"{float(state.lam.mean()):.3f}")
    bar.close()

    # --- final weight: psi_N = exp(r(x_N) / alpha), lambda_N = 1
    if sig[-1] == 0 and state.reward is not None and N - 1 >= i_s:
        r_final = state.reward  # x_N = D(x_{N-1}) and r(D(x_{N-1})) was reindexed with it: no new reward call
    else:
        r_final = run.shard.per_particle(run.calls.rewards(state.x))
    extras = {"tempering": opts.tempering if isinstance(opts.tempering, str) else "custom"}
    return finish_smc(run, state, r_final, lambda r_safe: state.log_proposal + r_safe / alpha - state.log_twist,
                      opts.output, opts.resampler, opts.ess_threshold, smc_time, extras, reward_bad)


def finish_smc(run: AlignRun, state: SMCState, r_final: Tensor, final_increment: Callable[[Tensor], Tensor],
               output: str, resampler: str, ess_threshold: float, smc_time: float, extras: dict,
               reward_bad: Tensor | None = None) -> AlignResult:
    """The last SMC weight and the output, shared by :func:`das` / TDS and FK steering: particles whose final
    reward or state is not finite are killed, the others get ``final_increment(r_final)`` (``r_final`` with the
    killed rows zeroed), then one output per group is drawn (``output``) and the :class:`AlignResult` assembled.

    ``reward_bad [steps + 1, G]``: the particles whose reward was not finite at each look-ahead (None: only the
    final reward is counted); the final step's count is added here. When any particle was killed, a
    ``RuntimeWarning`` says how many and why (one host read, after the loop)."""
    G, P, N, tr = run.groups, run.particles, run.steps, state.traces
    if reward_bad is None:
        reward_bad = torch.zeros(N + 1, G, dtype=torch.long, device=r_final.device)
    reward_bad[N] = (~torch.isfinite(r_final)).sum(1)
    bad = ~torch.isfinite(r_final) | ~run.shard.per_particle(row_finite(state.x))
    r_safe = torch.where(bad, torch.zeros_like(r_final), r_final)
    tr.lambdas[N] = 1.0
    t_smc = time.perf_counter()
    tr.record(N, accept_weights(run, state, final_increment(r_safe), bad, N), r_final, bad)
    raise_if_dead(run, state)
    samples, out_rewards = select_output(state.x, r_final, state.log_weights, output, resampler,
                                         run.group_generators, run.shard)
    smc_time += time.perf_counter() - t_smc
    if not run.shard.local:
        extras = {**extras, "communication": communication(run, state.x)}
    _warn_nonfinite(run.method, tr.nonfinite, reward_bad, G * P)
    return AlignResult(
        samples=samples, rewards=out_rewards, method=run.method, groups=G, particles=P,
        log_weights=state.log_weights, particles_final=state.x, ess=tr.ess, lambdas=tr.lambdas,
        resampled=tr.resampled, log_evidence=state.log_evidence, nonfinite=tr.nonfinite,
        nonfinite_reward=reward_bad.cpu(), smc_time=smc_time,
        extras={"reward_mean_per_step": tr.reward_mean, **extras, "ess_threshold": ess_threshold,
                "resampler": resampler, "output": output},
        **run.costs(),
    )


def _warn_nonfinite(method: str, killed: Tensor, reward_bad: Tensor, population: int) -> None:
    """A ``RuntimeWarning`` when particles were killed for non-finite values (the run went on without them)."""
    n_killed, n_reward = int(killed.sum()), int(reward_bad.sum())
    if n_killed:
        steps = int((killed.sum(1) > 0).sum())
        # stacklevel: this function, finish_smc, the method's loop, smc_sample, das / tds: the caller's line
        warnings.warn(f"{method}: particles were dropped {n_killed} times (at {steps} of {killed.shape[0]} "
                      f"weightings, population {population}) for a non-finite value, {n_reward} of them for a reward "
                      "of NaN or inf; the other particles carry the estimate. Counts per step and group: "
                      "result.nonfinite, result.nonfinite_reward", RuntimeWarning, stacklevel=6)


def communication(run: AlignRun, x: Tensor) -> dict:
    """What this rank sent in a sharded run (bytes gathered and moved, per step too) and the population's state size
    (``G * P`` rows of ``x``), so that communication can be read against the state it saves moving."""
    stats = run.shard.stats.as_dict()
    row_bytes = x[0].numel() * x.element_size() if x.shape[0] else 0
    return {**stats, "layout": run.shard.layout, "world": run.shard.ctx.world,
            "gathered_bytes_per_step": stats["gathered_bytes"] / run.steps,
            "moved_bytes_per_step": stats["moved_bytes"] / run.steps,
            "state_bytes": row_bytes * run.groups * run.particles}


def _smc_cost(steps: int, particles: int, gradient: bool = False, **_) -> dict:
    """Nominal cost per output of DAS / TDS: one denoiser call per particle and step, and one VJP with the gradient
    proposal (``docs/methods/das.md``, "Cost in NFE")."""
    return {"nfe": particles * steps, "nfe_grad": particles * steps if gradient else 0}


@register_aligner("das", cost=_smc_cost, options_class=SMCOptions,
                  note="tempered SMC (Kim, Kim, Park, ICLR 2025): gradient-free and adaptive by default")
def das(
    denoiser: Callable, reward: Reward, noise: Tensor, sigmas: Tensor, *, alpha: float, particles: int = 16,
    cond: Tensor | None = None, tempering: str | float | Sequence[float] = "adaptive", gamma: float | None = None,
    tempering_start: float = 0.0, ess_threshold: float = 0.5, resampler: str = "ssp", output: str = "sample_one",
    gradient: bool = False, eta: float = 1.0, vp_compat: bool = False, batch_size: int | None = 512,
    generator: GeneratorLike = None, progress: bool = False, callback: Callback | None = None,
    grad_clip: float | None = None, shift_clip: float | None = None, dist: DistContext | None = None,
    shard_by: str = "auto", sde: str | FlowSDE | None = None,
) -> AlignResult:
    """Sample ``∝ p(x0) exp(r(x0) / alpha)`` with DAS, one SMC population per group of ``particles`` rows.

    The defaults are gradient-free DAS with adaptive tempering (``gradient=False, tempering="adaptive"``), chosen on
    validation seeds before the test seeds were run (``docs/methods/das_diagnosis.md``): on the shipped digits model
    it is closer to the tilted target than the paper's gradient proposal (``gradient=True, tempering="exp"``) at the
    same cost, since a VJP costs about two forward passes, so the gradient proposal buys ``P`` particles for the
    price of ``3 P`` gradient-free ones, and its shifts make the weights degenerate at high noise. Pass
    ``gradient=True, tempering="exp"`` for the paper's (and the official code's) sampler; both are exact on the
    Gaussian-mixture problems.

    Args:
        denoiser: ``D(x, sigma, cond=None) -> E[x0 | x]``.
        reward: ``r(x0) -> [B]`` (differentiable unless ``gradient=False``), or a list of ``(weight, reward)``
            pairs (their weighted sum; the paper's multi-objective setting).
        noise: standard normal ``[G * P, *shape]`` (make it per row with :func:`steerdiff.randn`); rows
            ``g * P ... g * P + P - 1`` are group g. Scaled by ``sigmas[0]`` here (``sqrt(1 + sigma_0^2)`` with
            ``vp_compat``).
        sigmas: decreasing grid ``sigma_0 > ... > sigma_N >= 0``. Ending at ``sigma_min > 0`` (the official
            setting) makes every step stochastic; ending in 0 makes the last step ``x_N = D(x_{N-1})``.
        alpha: KL weight (> 0); the twist strength is ``lambda / alpha``.
        particles: P >= 2 particles per group.
        cond: integer condition per group ``[G]`` or per row ``[G * P]``; reindexed with the particles.
        tempering: ``"adaptive"`` (the default: bisection on the ESS), ``"exp"`` (official), a polynomial exponent,
            ``"constant"`` (lambda = 1, TDS), ``"zero"``, ``"sigma"`` (``min(1, (gamma / sigma_i)^2)``, gamma
            default 1 in the data's units: unbiased on tilts where the adaptive twist misranks anisotropic modes,
            ``docs/methods/das.md``, "Tempering by sigma"), or ``N`` explicit levels.
        gamma: tempering rate; default reaches lambda = 1 at 87% of the steps (0.008 for 100 steps). For
            ``tempering="sigma"``, the scale ``s`` (default 1).
        tempering_start: fraction of steps run as the plain sampler (no reward, no weights) before tempering.
        ess_threshold: resample a group when ``ESS < ess_threshold * P``; in (0, 1], 1 resamples every step.
        resampler: ``ssp`` (official), ``systematic``, ``stratified``, ``multinomial`` or ``residual``.
        output: ``"sample_one"`` (one draw ∝ final weights per group, ``samples [G, *shape]``), ``"weighted"``
            (all particles ``[G * P, *shape]`` with ``log_weights``), ``"resample"`` (P equally weighted draws
            per group) or ``"argmax"`` (the official pipelines' largest-weight particle).
        gradient: use the reward gradient in the proposal (the paper's twisted proposal; costs one VJP per particle
            and step). False (the default, and the only choice for black-box rewards): the proposal is the plain
            kernel and only the weights steer.
        eta: DDIM stochasticity in (0, 1] (1 = DDPM, the default).
        sde: instead of ``eta``, the moves of a flow SDE with the model's marginals (``"rbf"``, ``"vp"``,
            ``"edm"``, ... or a :class:`~steerdiff.core.flow_sde.FlowSDE` with its scale and step;
            ``docs/methods/flow_sde.md``). None (the default): the ancestral ``eta`` step (``"edm"`` at ``eta = 1``).
        vp_compat: VP prior ``N(0, (1 + sigma_0^2) I)`` and shift factor ``kappa`` of the official code.
        batch_size: rows per denoiser/VJP call (memory does not grow with P); None = all rows at once.
        generator: per-row randomness as in :func:`steerdiff.sample` (int seed: row i gets seed + i).
        progress: tqdm bar showing the mean ESS / P and lambda.
        callback: called each step (after resampling) with the dict of :func:`steerdiff.align.run_setup.step_info`,
            the same keys for every align sampler.
        grad_clip: cap on each particle's reward-gradient norm ``|grad_x r(D(x, sigma))|`` used in the proposal
            shift (None, the default: no cap). Only the proposal changes; the twist and the weights (with the
            closed-form ``log p - log q`` of the shift actually made) stay exact (``docs/methods/das_diagnosis.md``).
        shift_clip: cap on each particle's shift norm ``|delta_i|`` at ``shift_clip * tau_i * sqrt(d)``, in units
            of the step's noise norm (None, the default: no cap); exact like ``grad_clip``. The callback's ``grad``
            is the uncapped gradient in both cases.
        dist: the process group to spread the particles over (``sd.distributed.init()``); None: the one
            :func:`steerdiff.distributed.init` installed, else one process. Every rank passes the same arguments
            and gets the same result, bit-identical to one process when ``batch_size`` divides the rows a rank
            holds per group (``docs/distributed.md``).
        shard_by: ``"auto"`` (whole groups per rank when the world size divides the groups, else particles),
            ``"groups"`` or ``"particles"``.

    Non-finite values: a particle whose state, denoised value, reward (NaN, +inf or -inf) or weight is not
    finite gets log-weight ``-inf``, is counted in ``result.nonfinite`` and its group is resampled at once, so it
    never reaches the output nor affects other particles; a non-finite gradient is replaced by 0 (the weights stay
    exact for the move actually made). Only when every particle of a group is non-finite does the run stop.

    Returns:
        :class:`AlignResult` with ``log_weights``, ``ess``, ``lambdas``, ``resampled``, ``log_evidence``,
        ``nonfinite`` and the per-group costs ``nfe`` (denoiser) and ``nfe_grad`` (VJPs).

    Raises:
        ValueError: alpha <= 0, particles < 2, ess_threshold outside (0, 1], a reward of the wrong shape, ...
        FloatingPointError: every particle of a group is non-finite at some step.
    """
    opts = SMCOptions(tempering, gamma, tempering_start, ess_threshold, resampler, output, gradient, vp_compat,
                      grad_clip, shift_clip)
    return smc_sample("das", denoiser, reward, noise, sigmas, opts, alpha=alpha, particles=particles, cond=cond,
                      eta=eta, batch_size=batch_size, generator=generator, progress=progress, callback=callback,
                      dist=dist, shard_by=shard_by, sde=sde)
