"""Reward alignment at sampling time: DAS (tempered SMC) and its baselines, over one denoiser ``D(x, sigma, cond)``.

``das`` (Kim, Kim, Park, ICLR 2025), ``tds`` (Wu et al. 2023), ``best_of_n``, ``sir`` and ``reward_guidance`` share
one calling shape ``f(denoiser, reward, noise, sigmas, alpha=..., particles=..., ...)``, validated and set up by
:func:`.run.prepare`, call ``callback`` with one dict shape (:func:`.run.step_info`) and return an
:class:`AlignResult`. The SMC samplers are built from the state and step functions of :mod:`.smc`. A reward is any
callable ``r(x0) -> [B]`` (see :mod:`.rewards`). ``docs/methods/das.md`` explains the method and its checks.

Every aligner registers itself in :data:`ALIGNERS` (:func:`register_aligner`, :mod:`.registry`) with its options,
cost model and whether it runs on pipelines; :func:`run` dispatches by name (``sd.align.run("fk", denoiser, reward,
noise, sigmas, alpha=0.1)``) and ``steerdiff align --method`` offers every registered one. DAS tempering schedules,
resamplers and FK potentials are registries too (:data:`TEMPERING`, :data:`RESAMPLERS`, :data:`POTENTIALS`).
"""

from . import registry, rewards, run_setup, smc, verifiers
from .best_of_n import best_of_n, sir
from .das import das, default_gamma, tempering_schedule
from .fk import fk_steering
from .guidance import reward_guidance
from .noise_search import noise_search
from .online import LinUCBSurrogate, online_das
from .options import check_smc_options
from .registry import (
    ALIGNERS,
    POTENTIALS,
    RESAMPLERS,
    TEMPERING,
    AlignerSpec,
    register_aligner,
    register_potential,
    register_resampler,
    register_tempering,
    run,
)
from .result import AlignResult, particles_at_cost
from .tds import tds
from .tree_search import tree_search
from .verifiers import ParetoVerifier, Verifier, WeightedVerifier, as_verifier

__all__ = [
    "ALIGNERS",
    "POTENTIALS",
    "RESAMPLERS",
    "TEMPERING",
    "AlignResult",
    "AlignerSpec",
    "LinUCBSurrogate",
    "ParetoVerifier",
    "Verifier",
    "WeightedVerifier",
    "as_verifier",
    "best_of_n",
    "check_smc_options",
    "das",
    "default_gamma",
    "fk_steering",
    "noise_search",
    "online_das",
    "particles_at_cost",
    "register_aligner",
    "register_potential",
    "register_resampler",
    "register_tempering",
    "registry",
    "reward_guidance",
    "rewards",
    "run",
    "run_setup",
    "sir",
    "smc",
    "tds",
    "tempering_schedule",
    "tree_search",
    "verifiers",
]


def __getattr__(name: str):
    # ``steerdiff.align.sampler``, the former name of ``.run_setup``: imported on first use, so that only its users see
    # the DeprecationWarning.
    if name == "sampler":
        import importlib

        return importlib.import_module(".sampler", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
