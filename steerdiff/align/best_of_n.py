"""Best-of-N and importance resampling (SIR) baselines for reward alignment (``docs/methods/das.md``, "Baselines").

Both run K plain ancestral chains per group (the same grid and kernel as DAS, no reward gradient) and score the
final samples once. Best-of-N returns ``argmax_k r(x^k)`` (it targets max r, not the tilted law); SIR returns
``x^k`` with probability ``∝ exp(r(x^k) / alpha)``, consistent for ``p exp(r / alpha)`` as K grows (DAS with
``lambda = 0`` and no gradient). At equal cost with DAS, ``K = P (1 + c_b)``. The chains are :func:`.smc.propose`
moves without a shift, and the pick is DAS's output rule (:func:`.smc.select_output`): ``argmax`` over the finite
rewards for best-of-N, ``sample_one`` for SIR.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..core.flow_sde import FlowSDE
from ..core.noise import GeneratorLike, SampleNoise
from ..distributed import DistContext
from .registry import register_aligner
from .result import AlignResult
from .run_setup import AlignRun, Callback, Reward, RewardCalls, prepare, step_info
from .smc import NOISE_BLOCK, propose, select_output, start_state, use_sde


def plain_chains(calls: RewardCalls, noise: Tensor, sig: list[float], cond, eta: float, gens, progress: bool,
                 callback, desc: str) -> Tensor:
    """The ancestral chain from ``noise * sigma_0`` over ``sig`` (last step ``x = D`` when the grid ends in 0).

    ``callback`` receives :func:`.run.step_info`'s dict (only ``i``, the sigmas, ``x`` and ``denoised`` set).
    """
    from tqdm.auto import tqdm

    sample_noise = SampleNoise(gens, block=NOISE_BLOCK)
    x = start_state(noise, sig[0])
    for i in tqdm(range(len(sig) - 1), disable=not progress, desc=desc, leave=False):
        d = calls.denoise(x, sig[i], cond, i)
        if callback is not None:
            callback(step_info(i, sig[i], sig[i + 1], x, d))
        x, _ = propose(x, d, sig[i], sig[i + 1], eta, sample_noise)
    return x


def _select(run: AlignRun, sde: str | FlowSDE | None = None) -> AlignResult:
    """Plain chains (the flow SDE ``sde``'s moves when given, :func:`.smc.use_sde`), one reward call on the final
    samples, then the pick (``run.method``: best_of_n or sir)."""
    run = use_sde(run, sde)
    groups, K, calls = run.groups, run.particles, run.calls
    x = plain_chains(calls, run.noise, run.sigmas, run.cond, run.eta, run.generators, run.progress, run.callback,
                     run.method)
    r = run.shard.per_particle(calls.rewards(x))
    finite = torch.isfinite(r)
    if not finite.any(1).all():
        g = int((~finite.any(1)).nonzero()[0])
        raise FloatingPointError(f"{run.method}: the reward is non-finite for every sample of group {g}")
    if run.method == "best_of_n":
        logw = None
        samples, rewards = select_output(x, r, torch.where(finite, r, torch.full_like(r, -math.inf)), "argmax",
                                         "multinomial", None, run.shard)
    else:
        # A plain logsumexp (not the max-shifted normalize of the SMC weights): these are SIR's weights as released.
        logw = torch.where(finite, r / run.alpha, torch.full_like(r, -math.inf))
        logw = logw - torch.logsumexp(logw, 1, keepdim=True)
        samples, rewards = select_output(x, r, logw, "sample_one", "multinomial", run.group_generators, run.shard)
    return AlignResult(samples=samples, rewards=rewards, method=run.method, groups=groups, particles=K,
                       log_weights=logw, particles_final=x, nonfinite=(~finite).sum(1)[None],
                       extras={"all_rewards": r}, **run.costs())


def _chains_cost(steps: int, particles: int, **_) -> dict:
    """One denoiser call per chain and step, no gradient (``docs/methods/das.md``, "Cost in NFE")."""
    return {"nfe": particles * steps, "nfe_grad": 0}


@register_aligner("best_of_n", aliases=("bon",), cost=_chains_cost,
                  note="the highest-reward of K plain chains (targets max r, not the tilted law)")
def best_of_n(
    denoiser: Callable, reward: Reward, noise: Tensor, sigmas: Tensor, *, particles: int = 32,
    cond: Tensor | None = None, eta: float = 1.0, batch_size: int | None = 512, generator: GeneratorLike = None,
    progress: bool = False, callback: Callback | None = None, dist: DistContext | None = None,
    shard_by: str = "auto", sde: str | FlowSDE | None = None,
) -> AlignResult:
    """Best-of-N: per group of ``particles`` plain chains, the sample of highest reward (``samples [G, *shape]``).

    ``sde``: the chains take a flow SDE's moves instead of ``eta``'s (``docs/methods/flow_sde.md``). A non-finite
    reward never wins; a group whose rewards are all non-finite raises ``FloatingPointError``.
    """
    return _select(prepare("best_of_n", denoiser, reward, noise, sigmas, particles=particles, alpha=None, cond=cond,
                           eta=eta, batch_size=batch_size, generator=generator, progress=progress, callback=callback,
                           dist=dist, shard_by=shard_by), sde)


@register_aligner("sir", cost=_chains_cost, note="one of K plain chains drawn ∝ exp(r / alpha)")
def sir(
    denoiser: Callable, reward: Reward, noise: Tensor, sigmas: Tensor, *, alpha: float, particles: int = 32,
    cond: Tensor | None = None, eta: float = 1.0, batch_size: int | None = 512, generator: GeneratorLike = None,
    progress: bool = False, callback: Callback | None = None, dist: DistContext | None = None,
    shard_by: str = "auto", sde: str | FlowSDE | None = None,
) -> AlignResult:
    """Importance resampling ("soft best-of-N"): one draw per group ``∝ exp(r / alpha)`` (``samples [G, *shape]``).

    ``sde`` as in :func:`best_of_n`. ``log_weights [G, K]`` holds the normalised weights of all chains
    (``particles_final``).
    """
    return _select(prepare("sir", denoiser, reward, noise, sigmas, particles=particles, alpha=alpha, cond=cond,
                           eta=eta, batch_size=batch_size, generator=generator, progress=progress, callback=callback,
                           dist=dist, shard_by=shard_by), sde)
