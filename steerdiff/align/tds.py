"""TDS: twisted diffusion sampler (Wu, Trippe, Naesseth, Blei, Cunningham, "Practical and Asymptotically Exact
Conditional Sampling in Diffusion Models", NeurIPS 2023; code ``blt2114/twisted_diffusion_sampler``), the SMC
baseline of DAS (``docs/methods/das.md``, "Baselines").

TDS is DAS without tempering: the twist ``exp(r(D(x, sigma_i)) / alpha)`` from the first step (initial weight
``psi_0``), the same gradient-shifted proposal, resampling at every step (``ess_threshold: null`` in their configs),
systematic resampling, and the final weight ``r(x_N) / alpha - log psi_{N-1}`` (plus the proposal term when the
last step is stochastic). Twist values and proposal inputs are reindexed with the particles. It runs the same SMC
loop as DAS (:func:`steerdiff.align.das.run_smc`) with those options fixed.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..core.flow_sde import FlowSDE
from ..core.noise import GeneratorLike
from ..distributed import DistContext
from .das import SMCOptions, smc_sample
from .registry import register_aligner
from .result import AlignResult
from .run_setup import Callback, Reward


def _tds_cost(steps: int, particles: int, **_) -> dict:
    """Nominal cost per output: one denoiser call and one VJP per particle and step (``docs/methods/das.md``, "Cost
    in NFE")."""
    return {"nfe": particles * steps, "nfe_grad": particles * steps}


@register_aligner("tds", cost=_tds_cost, options_class=SMCOptions,
                  note="twisted diffusion sampler (Wu et al., NeurIPS 2023): DAS without tempering")
def tds(
    denoiser: Callable, reward: Reward, noise: Tensor, sigmas: Tensor, *, alpha: float, particles: int = 16,
    cond: Tensor | None = None, ess_threshold: float = 1.0, resampler: str = "systematic",
    output: str = "sample_one", eta: float = 1.0, batch_size: int | None = 512, generator: GeneratorLike = None,
    progress: bool = False, callback: Callback | None = None, dist: DistContext | None = None,
    shard_by: str = "auto", sde: str | FlowSDE | None = None,
) -> AlignResult:
    """TDS with the calling shape of :func:`steerdiff.align.das` (``ess_threshold=1`` resamples every step);
    ``dist`` and ``shard_by`` spread the particles over processes as there, ``sde`` picks a flow SDE's moves as
    there.

    Returns:
        :class:`AlignResult` (``method="tds"``), outputs as in :func:`~steerdiff.align.das`.
    """
    opts = SMCOptions(tempering="constant", ess_threshold=ess_threshold, resampler=resampler, output=output)
    return smc_sample("tds", denoiser, reward, noise, sigmas, opts, alpha=alpha, particles=particles, cond=cond,
                      eta=eta, batch_size=batch_size, generator=generator, progress=progress, callback=callback,
                      dist=dist, shard_by=shard_by, sde=sde)
