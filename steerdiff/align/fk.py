"""FK steering: gradient-free SMC with intermediate reward potentials (Singhal, Horvitz, Teehan, Ren, Yu, Cho,
Ranganath, "A General Framework for Inference-time Scaling and Steering of Diffusion Models", 2025; reference code
``zacharyhorvitz/Fk-Diffusion-Steering``). ``docs/methods/fk_steering.md`` explains each piece.

Target ``p(x0) exp(r(x0) / alpha)`` (the paper's ``exp(lambda r)`` with ``lambda = 1 / alpha``). Each group of P
particles runs the model's own ancestral chain (no reward gradient, no shifted proposal). At the *potential steps*
(every ``resample_every`` steps: ``i = k - 1, 2k - 1, ...``) the reward of the denoised estimate
``rho_i = r(D(x_i, sigma_i)) / alpha`` is evaluated and the particle's weight is multiplied by a potential ``G_i``
built from the rho's of its own lineage:

* ``difference``: ``log G_i = rho_i - rho_prev`` (``rho_prev = 0`` before the first); the product telescopes, so the
  intermediate target after step ``i`` is ``p exp(rho_i)``;
* ``max``: ``log G_i = max_{s <= i} rho_s`` (over the lineage's potential steps so far);
* ``sum``: ``log G_i = sum_{s <= i} rho_s``.

The final weight is ``r(x_N) / alpha - sum_i log G_i`` (the lineage's log-product of potentials), so for every
potential the product of all potentials is ``exp(r(x_N) / alpha)`` and the particle system targets the tilted law
(for ``difference`` the final weight is the last difference; for ``max`` and ``sum`` it is the paper's corrected
final potential). The potentials only decide *which* particles are multiplied along the way.

Weights are carried between potential steps (a group is resampled when its ESS falls below ``ess_threshold * P``;
``ess_threshold = 1`` resamples at every potential step); the reference code drops the weights of a step where it
does not resample, which is not a valid SMC update. Non-finite particles (state, denoised value, reward) are killed
(log-weight ``-inf``) at the step they appear and their group is resampled at once, as in DAS. The SMC pieces
(state, reweighting, resampling, proposals, outputs) are those of :mod:`.smc`; the arguments are checked by
:func:`.run.prepare`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.flow_sde import FlowSDE
from ..core.noise import GeneratorLike
from ..distributed import DistContext
from .das import finish_smc
from .options import check_smc_options
from .registry import POTENTIALS, register_aligner, register_potential
from .result import AlignResult
from .run_setup import AlignRun, Callback, Reward, prepare
from .smc import (
    SMCState,
    accept_weights,
    ancestor_rows,
    look_ahead,
    propose,
    resample_groups,
    row_finite,
    select_groups,
    start_state,
    use_sde,
)


@register_potential("difference")
def _difference(rho: Tensor, carried: Tensor) -> tuple[Tensor, Tensor]:
    """``log G_i = rho_i - rho_prev`` (the previous rho carried, 0 before the first): the product telescopes."""
    return rho - carried, rho


@register_potential("max", initial=-math.inf)
def _max(rho: Tensor, carried: Tensor) -> tuple[Tensor, Tensor]:
    """``log G_i = max_{s <= i} rho_s`` (the running maximum carried, ``-inf`` before the first)."""
    m = torch.maximum(rho, carried)
    return m, m


@register_potential("sum")
def _sum(rho: Tensor, carried: Tensor) -> tuple[Tensor, Tensor]:
    """``log G_i = sum_{s <= i} rho_s`` (the running sum carried, 0 before the first)."""
    s = rho + carried
    return s, s


def potential_step(potential: str, rho: Tensor, carried: Tensor) -> tuple[Tensor, Tensor]:
    """One potential: ``(log G_i, carried')`` from ``rho = r(D(x_i)) / alpha`` and the lineage's carried statistic.

    ``potential`` is a registered one (:data:`steerdiff.align.registry.POTENTIALS`): ``difference`` carries the
    previous rho (0 before the first potential step), ``max`` the running maximum (``-inf`` before the first),
    ``sum`` the running sum (0 before the first). Pure.
    """
    return POTENTIALS.get(potential).fn(rho, carried)


def initial_carried(potential: str, like: Tensor) -> Tensor:
    """The carried statistic before the first potential step (the registered ``initial``: ``-inf`` for ``max``, else
    0)."""
    return torch.full_like(like, POTENTIALS.get(potential).initial)


def log_potentials(potential: str, rho: Tensor, rho_final: Tensor) -> Tensor:
    """The log-potentials ``[K + 1, ...]`` of one lineage: ``rho [K, ...]`` at its K potential steps (rewards / alpha),
    then the final potential from ``rho_final = r(x_N) / alpha``; pure. Their sum is ``rho_final`` for every
    potential (for ``difference``: ``rho_1 + (rho_2 - rho_1) + ... + (rho_final - rho_K)``)."""
    carried = initial_carried(potential, rho_final)
    total = torch.zeros_like(rho_final)
    out = []
    for k in range(rho.shape[0]):
        g, carried = potential_step(potential, rho[k], carried)
        out.append(g)
        total = total + g
    out.append(rho_final - total)
    return torch.stack(out)


def potential_steps(steps: int, resample_every: int) -> Tensor:
    """``[steps]`` bool: the steps ``i`` with ``(i + 1) % resample_every == 0`` (``resample_every = steps``: only the
    last step, then the final weight)."""
    if isinstance(resample_every, bool) or not isinstance(resample_every, int) or not 1 <= resample_every <= steps:
        raise ValueError(f"resample_every must be an integer in [1, steps] = [1, {steps}] (steps of the sigma grid), "
                         f"got {resample_every!r}")
    return (torch.arange(steps) + 1) % resample_every == 0


@dataclass
class FKOptions:
    """FK steering's own options (see :func:`fk_steering`)."""

    potential: str = "difference"
    resample_every: int = 1
    ess_threshold: float = 0.5
    resampler: str = "ssp"
    output: str = "sample_one"

    def check(self, particles: int) -> None:
        """Validate them: a registered potential, then the SMC options every aligner shares
        (:func:`.options.check_smc_options`)."""
        if self.potential not in POTENTIALS:
            raise ValueError(f"potential must be one of {POTENTIALS.names()}, got {self.potential!r}")
        check_smc_options(particles, self.ess_threshold, self.resampler, self.output)

    def schedule(self, steps: int) -> Tensor:
        return potential_steps(steps, self.resample_every)


def run_fk(run: AlignRun, opts: FKOptions) -> AlignResult:
    """The FK loop: per step, look ahead and weigh at potential steps (plain denoising elsewhere), resample the groups
    whose ESS fell or that lost a particle, call back, make the plain ancestral move; then the final weight."""
    G, P, N, sig, alpha = run.groups, run.particles, run.steps, run.sigmas, run.alpha
    at = run.schedule.tolist()
    dev = run.noise.device
    host = run.host_decisions
    noise = run.sample_noise()
    state = SMCState.start(start_state(run.noise, sig[0]), run.cond, G, P, N)
    tr = state.traces
    f64 = dict(dtype=torch.float64, device=dev)
    state.log_twist = initial_carried(opts.potential, torch.zeros(G, P, **f64))  # the carried statistic
    log_prod = torch.zeros(G, P, **f64)  # sum of log G along each lineage
    started = False
    smc_time = 0.0

    bar = run.bar()
    for i in bar:
        s, s1 = sig[i], sig[i + 1]
        do = anc = w = None
        if at[i]:
            bad = look_ahead(state, run.calls, s, False, i)
            t_smc = time.perf_counter()
            rho = torch.where(bad, torch.zeros_like(state.reward), state.reward) / alpha
            log_g, carried = potential_step(opts.potential, rho, state.log_twist)
            w = accept_weights(run, state, log_g, bad, i)
            state.log_twist = torch.where(bad, state.log_twist, carried)
            log_prod = log_prod + torch.where(bad, torch.zeros_like(log_g), log_g)
            tr.record(i, w, state.reward, bad)
            do = select_groups(w.ess, w.killed, opts.ess_threshold)
            started = True
        else:
            state.denoised = run.calls.denoise(state.x, s, state.cond, i)
            t_smc = time.perf_counter()
            bad = ~run.shard.per_particle(row_finite(state.denoised) & row_finite(state.x))
            if host and bad.any():  # kill them now; their groups are resampled below
                w = accept_weights(run, state, torch.zeros(G, P, **f64), bad, i)
                tr.ess[i], tr.nonfinite[i] = w.ess, w.killed.sum(1)
                do = w.killed.any(1)
            elif not host:  # the same without reading `bad`: only the groups that lost a particle take the update
                keep_w, keep_z = state.log_weights, state.log_evidence
                w = accept_weights(run, state, torch.zeros(G, P, **f64), bad, i)
                do = w.killed.any(1)
                state.log_weights = torch.where(do[:, None], state.log_weights, keep_w)
                state.log_evidence = torch.where(do, state.log_evidence, keep_z)
                tr.ess[i] = torch.where(do, w.ess, tr.ess[i])
                tr.nonfinite[i] = w.killed.sum(1)
        tr.lambdas[i] = 1.0 if started else 0.0
        if do is not None:
            tr.resampled[i] = do
            anc = resample_groups(state, do, run.group_generators, opts.resampler, run.shard, host)
            if anc is not None:
                log_prod = log_prod.flatten()[ancestor_rows(anc)].view(G, P)
        smc_time += time.perf_counter() - t_smc
        run.emit(i, state.x, state.denoised, reward=state.reward if at[i] else None, log_twist=state.log_twist,
                 log_weights=state.log_weights, ess=None if w is None else w.ess, lam=tr.lambdas[i],
                 resampled=do, ancestors=anc)
        state.x, _ = propose(state.x, state.denoised, s, s1, run.eta, noise)
        if run.progress and w is not None:
            bar.set_postfix(ess=f"{float(w.ess.mean()) / P:.2f}")
    bar.close()

    # --- final weight: r(x_N) / alpha over the lineage's product of potentials
    if sig[-1] == 0 and at[N - 1]:
        r_final = state.reward  # x_N = D(x_{N-1}), whose reward was taken (and reindexed) at step N - 1
    else:
        r_final = run.shard.per_particle(run.calls.rewards(state.x))
    extras = {"potential": opts.potential, "potential_steps": [k for k, a in enumerate(at) if a]}
    return finish_smc(run, state, r_final, lambda r_safe: r_safe / alpha - log_prod, opts.output, opts.resampler,
                      opts.ess_threshold, smc_time, extras)


def _fk_cost(steps: int, particles: int, **_) -> dict:
    """One denoiser call per particle and step, no gradient (``docs/methods/fk_steering.md``, "Cost")."""
    return {"nfe": particles * steps, "nfe_grad": 0}


@register_aligner("fk", aliases=("fk_steering",), cost=_fk_cost, options_class=FKOptions,
                  note="FK steering (Singhal et al. 2025): gradient-free SMC with reward potentials")
def fk_steering(
    denoiser: Callable, reward: Reward, noise: Tensor, sigmas: Tensor, *, alpha: float, particles: int = 16,
    potential: str = "difference", resample_every: int = 1, ess_threshold: float = 0.5,
    resampler: str = "ssp", output: str = "sample_one", cond: Tensor | None = None, eta: float = 1.0,
    batch_size: int | None = 512, generator: GeneratorLike = None, progress: bool = False,
    callback: Callback | None = None, dist: DistContext | None = None, shard_by: str = "auto",
    sde: str | FlowSDE | None = None,
) -> AlignResult:
    """Sample ``∝ p(x0) exp(r(x0) / alpha)`` with FK steering, one SMC population per group of ``particles`` rows.

    Args:
        denoiser: ``D(x, sigma, cond=None) -> E[x0 | x]``.
        reward: ``r(x0) -> [B]`` (any callable: no gradient is taken), or a list of ``(weight, reward)`` pairs.
        noise: standard normal ``[G * P, *shape]`` (rows ``g * P ... g * P + P - 1`` are group g), scaled by
            ``sigmas[0]`` here.
        sigmas: decreasing grid ``sigma_0 > ... > sigma_N >= 0`` (ending in 0: the last step is ``x_N = D``).
        alpha: KL weight (> 0); the paper's ``lambda`` is ``1 / alpha``.
        particles: P >= 2 particles per group.
        potential: ``"difference"`` (``exp((r_i - r_prev) / alpha)``), ``"max"`` (``exp(max_{s<=i} r_s / alpha)``)
            or ``"sum"`` (``exp(sum_{s<=i} r_s / alpha)``), over the lineage's potential steps.
        resample_every: potential (and resampling) steps ``i = k - 1, 2k - 1, ...`` for ``k = resample_every`` in
            ``[1, steps]``; default 1, every step (on the mixtures 5 is as good in 2-D and worse in 16-D, 20 fails
            P3: ``docs/methods/fk_steering.md``). ``steps``: one potential, at the last step.
        ess_threshold: at a potential step, resample a group when ``ESS < ess_threshold * P``; in (0, 1], 1
            resamples at every potential step (the reference code's non-adaptive mode).
        resampler: ``ssp``, ``systematic``, ``stratified``, ``multinomial`` (the reference code's) or ``residual``.
        output: ``"sample_one"``, ``"weighted"``, ``"resample"`` or ``"argmax"`` (as :func:`~steerdiff.align.das`).
        cond: integer condition per group ``[G]`` or per row ``[G * P]``; reindexed with the particles.
        eta: DDIM stochasticity in (0, 1] (1 = DDPM, the default).
        sde: instead of ``eta``, the moves of a flow SDE with the model's marginals (a name of
            :data:`steerdiff.core.flow_sde.FLOW_SDES` or a ``FlowSDE``; ``docs/methods/flow_sde.md``).
        batch_size: rows per denoiser / reward call; None = all rows at once.
        generator: per-row randomness as in :func:`steerdiff.sample` (int seed: row i gets seed + i).
        progress: tqdm bar showing the mean ESS / P.
        callback: called each step with :func:`steerdiff.align.run_setup.step_info`'s dict (``reward`` and ``ess``
            set at potential steps; ``log_twist`` holds the carried statistic over alpha).
        dist: the process group to spread the particles over (``sd.distributed.init()``); None: the one
            :func:`steerdiff.distributed.init` installed, else one process. Every rank passes the same arguments
            and gets the same result, bit-identical to one process when ``batch_size`` divides the rows a rank
            holds per group (``docs/distributed.md``).
        shard_by: ``"auto"`` (whole groups per rank when the world size divides the groups, else particles),
            ``"groups"`` or ``"particles"``.

    Returns:
        :class:`AlignResult` (``method="fk"``) with ``log_weights``, ``ess``, ``resampled``, ``log_evidence``,
        ``nonfinite``, ``nfe`` (``P * steps`` per group), ``nfe_grad = 0`` and ``reward_evals``.

    Raises:
        ValueError: an unknown potential, ``resample_every`` outside ``[1, steps]``, and everything
            :func:`~steerdiff.align.das` rejects (alpha, particles, ess_threshold, reward shape, grid, ...).
        FloatingPointError: every particle of a group is non-finite at some step.
    """
    opts = FKOptions(potential, resample_every, ess_threshold, resampler, output)
    run = prepare("fk", denoiser, reward, noise, sigmas, particles=particles, alpha=alpha, cond=cond, eta=eta,
                  batch_size=batch_size, generator=generator, progress=progress, callback=callback, check=opts.check,
                  schedule=opts.schedule, dist=dist, shard_by=shard_by, options=opts)
    return run_fk(use_sde(run, sde), opts)
