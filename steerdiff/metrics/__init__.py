"""Metrics: distribution distances, composition (conformity, JSD, diversity), mixture mode weights, and image
statistics (saturation, clipping, range)."""

from .composition import composition_divergence, conformity, label_entropy
from .distributions import mmd_rbf, mode_weight_error, sliced_wasserstein
from .saturation import clip_fraction, mean_saturation, per_image_range, saturation_offset, saturation_report

__all__ = [
    "clip_fraction",
    "composition_divergence",
    "conformity",
    "label_entropy",
    "mean_saturation",
    "mmd_rbf",
    "mode_weight_error",
    "per_image_range",
    "saturation_offset",
    "saturation_report",
    "sliced_wasserstein",
]
