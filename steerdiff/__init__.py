"""steerdiff: steering diffusion models at sampling time over one denoiser interface ``D(x, sigma, cond)``."""

from . import align, constrain, core, covariance, data, guidance, inverse, metrics, models, quant
from .core import NFECounter, SampleStats, randn, sample, sigmas

__version__ = "0.1.0"

__all__ = [
    "NFECounter",
    "SampleStats",
    "align",
    "constrain",
    "core",
    "covariance",
    "data",
    "guidance",
    "inverse",
    "metrics",
    "models",
    "quant",
    "randn",
    "sample",
    "sigmas",
    "__version__",
]
