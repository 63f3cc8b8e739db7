"""The options check every SMC aligner shares (DAS and TDS through ``SMCOptions``, FK steering through ``FKOptions``).

The particle count, the resampling threshold (a fraction of the particles: resample a group when
``ESS < ess_threshold * P``), the resampling scheme and the output rule mean the same in every SMC sampler of
:mod:`steerdiff.align` (``docs/methods/das.md``, "Resampling" and "Output rules"; DAS: Kim, Kim, Park, ICLR 2025,
Algorithm 1; FK steering: Singhal et al. 2025, ``docs/methods/fk_steering.md``), so they are checked here, once.
The resamplers are read from :data:`steerdiff.align.registry.RESAMPLERS`.
"""

from __future__ import annotations

from .registry import RESAMPLERS
from .smc import OUTPUTS


def check_smc_options(particles: int, ess_threshold: float, resampler: str, output: str) -> None:
    """Validate the options every SMC aligner takes, in this order: ``particles >= 2``, ``ess_threshold`` in (0, 1],
    a registered ``resampler``, a known ``output`` rule.

    Raises:
        ValueError: naming the first bad argument (the resampler and output messages list the choices).
    """
    if particles < 2:
        raise ValueError(f"particles must be >= 2 for SMC (got {particles}); use reward_guidance for single chains")
    t = ess_threshold
    if isinstance(t, bool) or not (isinstance(t, (int, float)) and 0 < t <= 1):
        raise ValueError(f"ess_threshold must lie in (0, 1] (a fraction of the particles), got {t!r}")
    if resampler not in RESAMPLERS:
        raise ValueError(f"resampler must be one of {RESAMPLERS.names()}, got {resampler!r}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
