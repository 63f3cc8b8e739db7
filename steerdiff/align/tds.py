"""TDS: twisted diffusion sampler (Wu et al. 2023, "Practical and Asymptotically Exact Conditional Sampling in
Diffusion Models", code ``blt2114/twisted_diffusion_sampler``) as the SMC baseline of DAS; das.md section 7.

TDS is DAS without tempering: the twist ``exp(r(D(x, sigma_i)) / alpha)`` from the first step (initial weight
``psi_0``), the same gradient-shifted proposal, resampling at every step (``ess_threshold: null`` in their configs),
systematic resampling, and the final weight ``r(x_N) / alpha - log psi_{N-1}`` (plus the proposal term when the
last step is stochastic). Twist values and proposal inputs are reindexed with the particles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from ..core.noise import GeneratorLike
from .das import run_smc
from .result import AlignResult


def tds(
    denoiser: Callable,
    reward: Callable | Sequence,
    noise: Tensor,
    sigmas: Tensor,
    *,
    alpha: float,
    particles: int = 16,
    cond: Tensor | None = None,
    ess_threshold: float = 1.0,
    resampler: str = "systematic",
    output: str = "sample_one",
    eta: float = 1.0,
    batch_size: int | None = 512,
    generator: GeneratorLike = None,
    progress: bool = False,
    callback: Callable[[dict], None] | None = None,
) -> AlignResult:
    """TDS with the calling shape of :func:`steerdiff.align.das` (``ess_threshold=1`` resamples every step).

    Returns:
        :class:`AlignResult` (``method="tds"``), outputs as in :func:`~steerdiff.align.das`.
    """
    return run_smc(denoiser, reward, noise, sigmas, alpha=alpha, particles=particles, cond=cond,
                   tempering="constant", gamma=None, tempering_start=0.0, ess_threshold=ess_threshold,
                   resampler=resampler, output=output, gradient=True, eta=eta, vp_compat=False,
                   batch_size=batch_size, generator=generator, progress=progress, callback=callback, method="tds")
