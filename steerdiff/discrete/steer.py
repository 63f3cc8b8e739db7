"""Steering discrete diffusion toward a reward: SMC with the discrete reverse kernels as proposals, and best-of-N.

The target is the reward-tilted law ``p_alpha(x) ∝ p(x) exp(r(x) / alpha)`` of the continuous aligners
(``docs/methods/das.md``, ``docs/methods/fk_steering.md``). :func:`smc` is FK steering (Singhal et al. 2025, Sec. 3;
they run it on masked text diffusion) on a discrete state: ``P`` particles per output follow a registered discrete
sampler's step, and at every step each gets the FK potential (:data:`steerdiff.align.registry.POTENTIALS`) of
``rho_i = r(x0_hat(x_t)) / alpha``, ``x0_hat`` the denoiser's most likely clean sequence (unmasked tokens kept); the
final weight ``exp(r(x_0)/alpha - sum_i log G_i)`` makes the product of the potentials the exact tilt whatever the
intermediate ones, so with a sampler that draws ``p`` exactly the weighted particles are a consistent estimate of
``p_alpha`` (``docs/methods/discrete.md``, "Steering"). Weights, ESS, resampling (the registered resamplers) and the
potentials are :mod:`steerdiff.align`'s; nothing is read on the host inside the loop (every group draws its uniforms
at every step and keeps the identity where its ESS needs no resampling).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..align.fk import initial_carried, potential_step
from ..align.options import check_smc_options
from ..align.registry import POTENTIALS
from ..align.smc import ancestor_rows, resample, reweight, select_groups
from ..core.noise import GeneratorLike, make_generators
from ..distributed import SINGLE, DistContext, all_gather, resolve
from .process import Process, make_process
from .registry import SAMPLERS
from .sampling import RowCounter, RowRandom, checked_probs, plan, prepare

Reward = Callable[[Tensor], Tensor]


@dataclass
class DiscreteSteerResult:
    """The particles of a steered discrete run.

    Attributes:
        samples: ``[G * P, L]`` (group-major) the final particles; for best-of-N ``[G, L]`` the chosen ones.
        log_weights: ``[G, P]`` normalised final log-weights (best-of-N: None).
        rewards: ``[G * P]`` (best-of-N ``[G]``) the rewards of ``samples``.
        ess: ``[steps + 1, G]`` the effective sample size after each weighting (the last: the final weight).
        log_evidence: ``[G]`` each group's estimate of ``log E_p[exp(r(x)/alpha)]`` (unbiased in ``Z``).
        nfe: denoiser evaluations per output (per group of ``P`` particles; a CFG batch counts 2).
    """

    samples: Tensor
    log_weights: Tensor | None
    rewards: Tensor
    ess: Tensor | None
    nfe: float
    log_evidence: Tensor | None = None

    def weights(self, pool: str = "evidence") -> Tensor:
        """``[G * P]`` weights of all particles summing to 1.

        ``pool="evidence"`` weighs group ``g`` by its evidence estimate ``Z_g`` (``sum_g Z_g W_gj``: consistent as the
        number of groups grows at any ``P``, since ``Z_g W_gj`` is unbiased for the unnormalised target);
        ``"equal"`` averages the groups' normalised weights (each group's estimate carries a ``O(1/P)`` bias).
        """
        if pool == "equal":
            return (self.log_weights.exp() / self.log_weights.shape[0]).flatten()
        if pool != "evidence":
            raise ValueError(f"pool must be 'evidence' or 'equal', got {pool!r}")
        return torch.softmax((self.log_weights + self.log_evidence[:, None]).flatten(), 0)


def greedy_estimate(process: Process, x: Tensor, p0: Tensor) -> Tensor:
    """The denoiser's most likely clean sequence: ``argmax p0`` where ``x`` is masked (absorbing) or everywhere."""
    best = p0.argmax(-1)
    return torch.where(x == process.mask_index, best, x) if process.absorbing else best


def _rewards(reward: Reward, x: Tensor, alpha: float) -> Tensor:
    r = reward(x)
    if not isinstance(r, Tensor) or r.shape != (x.shape[0],):
        raise ValueError(f"reward must return a tensor [N] = [{x.shape[0]}], got "
                         f"{tuple(r.shape) if isinstance(r, Tensor) else type(r).__name__}")
    return r.to(torch.float64) / alpha


def _group_generators(generator: GeneratorLike, groups: int, particles: int):
    """One resampling generator per group, independent of the particles' streams: seed ``s + g P + 2**40`` for an
    int seed ``s`` (so a group's draws do not depend on the other groups); shared / global otherwise."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, int) and not isinstance(generator, bool):
        return make_generators([generator + g * particles + 2**40 for g in range(groups)], groups)
    raise TypeError("generator: smc takes an int seed, one torch.Generator or None")


def smc(denoiser: Callable, process: Process | str, reward: Reward, *, length: int, steps: int, alpha: float,
        num_samples: int = 1, particles: int = 16, method: str = "unmask", potential: str = "difference",
        resampler: str = "ssp", ess_threshold: float = 0.5, num_classes: int | None = None, cond: Tensor | None = None,
        guidance=None, generator: GeneratorLike = None, device=None, callback: Callable | None = None,
        dist: DistContext | None = None, time_power: float = 1.0, **options) -> DiscreteSteerResult:
    """FK steering of a discrete sampler toward ``p(x) exp(r(x) / alpha)`` (see the module docstring).

    Args:
        denoiser, process, steps, method, cond, guidance, num_classes, device, time_power, options: as
            :func:`steerdiff.discrete.sample` (``cond [num_samples]`` is repeated over the particles).
        reward: ``r(x [N, L] long) -> [N]``; evaluated on ``x0_hat`` at every step and on the final particles.
        length: ``L``, the sequence length.
        alpha: the tilt temperature (> 0).
        num_samples: ``G``, independent groups (outputs); particles: ``P`` per group.
        potential: a registered FK potential (``difference``, ``max``, ``sum``).
        resampler: a registered resampler (``ssp``, ``systematic``, ``stratified``, ``multinomial``, ``residual``).
        ess_threshold: resample a group when its ESS falls below ``ess_threshold * P`` (1: always).
        generator: an int seed (particle ``j`` of the run gets ``seed + j``; group ``g``'s resampling
            ``seed + g P + 2**40``), one generator or None.
        callback: after each step, ``{"i", "t", "x", "log_weights", "ess"}``.
        dist: a :class:`~steerdiff.distributed.DistContext` (None: the current one): whole groups per rank (the world
            size must divide ``num_samples``); groups are independent, so nothing travels during the run and the
            results are gathered at the end. With an int seed every draw is keyed by the
            global particle and group index, so the gathered result equals the one-process run bit for bit.
    """
    ctx = resolve(dist)
    if ctx.distributed:
        if num_samples % ctx.world:
            raise ValueError(f"num_samples ({num_samples}) must be a multiple of the world size ({ctx.world}): whole "
                             "groups per rank")
        if not (generator is None or isinstance(generator, int) and not isinstance(generator, bool)):
            raise TypeError("generator: a sharded smc takes an int seed (keyed by global particle) or None")
        g_loc = num_samples // ctx.world
        first = ctx.rank * g_loc
        local = smc(denoiser, process, reward, length=length, steps=steps, alpha=alpha, num_samples=g_loc,
                    particles=particles, method=method, potential=potential, resampler=resampler,
                    ess_threshold=ess_threshold, num_classes=num_classes,
                    cond=None if cond is None else cond[first:first + g_loc], guidance=guidance,
                    generator=None if generator is None else generator + first * particles, device=device,
                    callback=callback, dist=SINGLE, time_power=time_power, **options)

        def cat(t: Tensor, dim: int = 0) -> Tensor:
            return torch.cat(all_gather(ctx, t), dim)

        return DiscreteSteerResult(cat(local.samples), cat(local.log_weights), cat(local.rewards),
                                   cat(local.ess, 1), local.nfe, cat(local.log_evidence))
    process = make_process(process, num_classes)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    check_smc_options(particles=particles, ess_threshold=ess_threshold, resampler=resampler, output="weighted")
    POTENTIALS.get(potential)
    g_, p_ = int(num_samples), int(particles)
    n = g_ * p_
    rand = RowRandom.make(generator, n)
    group_gens = _group_generators(generator, g_, p_)
    spec, x = prepare(process, num_classes, method, None, (n, length), rand, device)
    counter = RowCounter(denoiser)
    model = guidance.wrap(counter) if guidance is not None else counter
    cond_rows = None if cond is None else cond.repeat_interleave(p_, 0)
    grid = plan(spec, process, length, steps, time_power)
    logw = torch.full((g_, p_), -math.log(p_), dtype=torch.float64, device=x.device)
    carried = initial_carried(potential, logw)
    total = torch.zeros_like(logw)
    log_z = torch.zeros(g_, dtype=torch.float64, device=x.device)
    ess_trace, ident = [], torch.arange(p_, device=x.device).expand(g_, p_)
    for i, st in enumerate(grid):
        p0 = checked_probs(model, x, st.t, cond_rows, i, process.num_classes)
        rho = _rewards(reward, greedy_estimate(process, x, p0), alpha).view(g_, p_)
        log_g, carried = potential_step(potential, rho, carried)
        total = total + log_g
        rw = reweight(logw, log_g)
        log_z = log_z + rw.log_norm
        ess_trace.append(rw.ess)
        do = select_groups(rw.ess, rw.killed, ess_threshold)[:, None]
        u = _uniforms(group_gens, g_, p_, x.device)
        anc = torch.where(do, resample(rw.log_weights.exp().nan_to_num(0.0), u, resampler), ident)
        rows = ancestor_rows(anc)
        x, p0 = x[rows], p0[rows]
        carried, total = carried.flatten()[rows].view(g_, p_), total.flatten()[rows].view(g_, p_)
        logw = torch.where(do, torch.full_like(logw, -math.log(p_)), rw.log_weights)
        x = spec.step(process, x, p0, st, rand, **options)
        if callback is not None:
            callback({"i": i, "t": st.t, "x": x, "log_weights": logw, "ess": rw.ess})
    r_final = _rewards(reward, x, alpha)
    rw = reweight(logw, r_final.view(g_, p_) - total)
    ess_trace.append(rw.ess)
    log_z = log_z + rw.log_norm
    if bool(rw.dead.any()):  # one read, after the loop
        raise FloatingPointError(f"every particle of group(s) {rw.dead.nonzero().flatten().tolist()} has weight 0 or "
                                 "a non-finite reward")
    return DiscreteSteerResult(x, rw.log_weights, r_final * alpha, torch.stack(ess_trace), counter.rows / g_,
                               log_z)


def _uniforms(gens, groups: int, particles: int, device) -> Tensor:
    if gens is None or isinstance(gens, torch.Generator):
        dev = device if gens is None else gens.device
        return torch.rand(groups, particles, generator=gens, dtype=torch.float64, device=dev).to(device)
    return torch.stack([torch.rand(particles, generator=g, dtype=torch.float64) for g in gens]).to(device)


def best_of_n(denoiser: Callable, process: Process | str, reward: Reward, *, length: int, steps: int, n: int,
              num_samples: int = 1, method: str = "ancestral", num_classes: int | None = None,
              cond: Tensor | None = None, guidance=None, generator: GeneratorLike = None, device=None,
              **options) -> DiscreteSteerResult:
    """Best-of-N: ``n`` independent samples per output, the one of highest reward kept (ties: the first).

    Costs ``n`` times the sampler's NFE per output. Arguments as :func:`smc`.
    """
    from .sampling import sample

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    cond_rows = None if cond is None else cond.repeat_interleave(n, 0)
    x, stats = sample(denoiser, process, steps, shape=(num_samples * n, length), method=method,
                      num_classes=num_classes, cond=cond_rows, guidance=guidance, generator=generator, device=device,
                      return_stats=True, **options)
    r = _rewards(reward, x, 1.0).view(num_samples, n)
    pick = r.argmax(1)
    rows = ancestor_rows(pick[:, None], n)
    SAMPLERS.get(method)
    return DiscreteSteerResult(x[rows], None, r.flatten()[rows], None, stats.nfe * n)
