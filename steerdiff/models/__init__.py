"""Denoisers: the analytic Gaussian mixture, trained backbones, adapters, and checkpoint I/O."""

from .classifier import ImageClassifier
from .diffusers_adapter import from_diffusers
from .dit import DiT
from .flow import FlowModel
from .frame_conv import FrameConv
from .frames import FrameContext, FrameMixer
from .gmm import BUILTIN_MIXTURES, GaussianMixture, builtin_mixture
from .io import MODEL_REGISTRY, CheckpointError, build_model, load, model_spec, register_model, save, shipped_models
from .mlp import MLP
from .precond import EDMPrecond, edm_scalings
from .unet import UNet

__all__ = [
    "BUILTIN_MIXTURES",
    "MLP",
    "MODEL_REGISTRY",
    "CheckpointError",
    "DiT",
    "EDMPrecond",
    "FlowModel",
    "FrameContext",
    "FrameConv",
    "FrameMixer",
    "GaussianMixture",
    "ImageClassifier",
    "UNet",
    "build_model",
    "builtin_mixture",
    "edm_scalings",
    "from_diffusers",
    "load",
    "model_spec",
    "register_model",
    "save",
    "shipped_models",
]
