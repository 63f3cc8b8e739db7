"""steerdiff: steering diffusion models at sampling time over one denoiser interface ``D(x, sigma, cond)``.

Importing the package imports every subpackage, so each registers its plug-ins (samplers, guiders, solvers,
checkpoint formats, model classes) before any is looked up.
"""

from . import (
    align,
    constrain,
    control,
    core,
    covariance,
    data,
    discrete,
    distributed,
    geometry,
    guidance,
    inverse,
    io,
    metrics,
    models,
    motion,
    pipelines,
    quant,
    segment,
    temporal,
)
from .core import FlowDenoiser, NFECounter, SampleStats, randn, sample, sigmas
from .io.version import __version__

__all__ = [
    "FlowDenoiser",
    "NFECounter",
    "SampleStats",
    "align",
    "constrain",
    "control",
    "core",
    "covariance",
    "data",
    "discrete",
    "distributed",
    "geometry",
    "guidance",
    "inverse",
    "io",
    "metrics",
    "models",
    "motion",
    "pipelines",
    "quant",
    "randn",
    "sample",
    "segment",
    "sigmas",
    "temporal",
    "__version__",
]
