"""Evaluation protocols users may call: the exact validation problems, testbeds and scoring of each method.

One module per method, each the measurement protocol described on the method's page under ``docs/methods/``,
shared by ``tests/`` and ``benchmarks/``:

* :mod:`.das`: the exact-mixture problems P1-P4 and MO for reward alignment (DAS and its baselines);
* :mod:`.inverse`: the exact-posterior checks G1, G2 and the chi-square check for inverse solvers, the digits
  problems, the noise-feedback gain;
* :mod:`.ocm`: the few-step mixtures and gates of OCM;
* :mod:`.namm`: NAMM against the plain model on a recipe's data;
* :mod:`.coind`: the 2-D quadrant experiment of CoInD;
* :mod:`.quality`: samples of a class-conditional image model scored by accuracy, feature FID, precision/recall;
* :mod:`.forecast`: DyDiff forecasters of the advection fields scored by ensemble-mean MSE and fair CRPS;
* :mod:`.geometry`: the measurements of the local-geometry claims on digits (volume vs spread, memorisation,
  detail, out-of-distribution latents, guidance quality);
* :mod:`.rbmod`: RB-Modulation's three-style digits protocol and its AFA test.
"""

from . import coind, das, forecast, geometry, inverse, namm, ocm, quality, rbmod

__all__ = ["coind", "das", "forecast", "geometry", "inverse", "namm", "ocm", "quality", "rbmod"]
