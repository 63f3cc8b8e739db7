"""Constraints: NAMM neural approximate mirror maps (Feng, Baptista, Bouman, ICLR 2025; docs/methods/namm.md).

    namm = sd.constrain.train_namm(x, sd.constrain.TotalBrightness(20.0), forward=..., inverse=..., config=...)
    mirror = sd.constrain.train_mirror_model(namm, model, x, train_config, out_dir)   # MDM on g(x)
    md = sd.constrain.MirrorDenoiser(mirror.model, namm)
    x = md.sample(noise, sigmas)                      # sampled in mirror space, decoded through f
    res = md.solve(Inpaint.center(), y, method="hr", noise_std=0.05)   # inverse problem in mirror space
"""

from ..models.icnn import ConvICNNMap, ICNNMap
from .distances import (
    HeatResidual,
    TotalBrightness,
    brightness_digits,
    check_distance,
    heat_data,
    unit_circle_data,
    unit_circle_distance,
)
from .inverse_net import ResidualMLP
from .losses import constraint_loss, cycle_loss, namm_loss, perturbation_levels, regularization
from .namm import NAMM, ConstraintWarning, NAMMConfig, check_data_constraint, train_namm

__all__ = [
    "NAMM",
    "ConstraintWarning",
    "ConvICNNMap",
    "HeatResidual",
    "ICNNMap",
    "NAMMConfig",
    "ResidualMLP",
    "TotalBrightness",
    "brightness_digits",
    "check_data_constraint",
    "check_distance",
    "constraint_loss",
    "cycle_loss",
    "heat_data",
    "namm_loss",
    "perturbation_levels",
    "regularization",
    "train_namm",
    "unit_circle_data",
    "unit_circle_distance",
]
