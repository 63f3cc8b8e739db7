"""Metrics: distribution distances, composition (conformity, JSD, diversity), mixture mode weights, image
statistics (saturation, clipping, range), ensemble forecast scores (fair CRPS, ensemble-mean MSE), and graph metrics
(MMD of degree / clustering / spectrum, validity, V.U.N., conformity: :mod:`.graphs`)."""

from . import graphs
from .composition import composition_divergence, conformity, label_entropy
from .distributions import mmd_rbf, mode_weight_error, sliced_wasserstein
from .forecast import crps_fair, ensemble_mse, member_rmse
from .graphs import graph_conformity, graph_mmd, vun
from .saturation import clip_fraction, mean_saturation, per_image_range, saturation_offset, saturation_report

__all__ = [
    "clip_fraction",
    "composition_divergence",
    "crps_fair",
    "ensemble_mse",
    "graph_conformity",
    "graph_mmd",
    "graphs",
    "conformity",
    "label_entropy",
    "mean_saturation",
    "member_rmse",
    "mmd_rbf",
    "mode_weight_error",
    "per_image_range",
    "saturation_offset",
    "saturation_report",
    "sliced_wasserstein",
    "vun",
]
