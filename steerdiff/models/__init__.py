"""Denoisers and networks: the analytic Gaussian mixture, trained backbones (UNet, DiT, MLP, the sequence
transformer, the style-token DiT), the methods' networks (NAMM's input-convex maps, OCM's covariance heads, the
MotionDreamer motion tokeniser), adapters, and checkpoint I/O."""

from .classifier import ImageClassifier
from .diffusers_adapter import from_diffusers
from .dit import DiT
from .flow import FlowModel
from .frame_conv import FrameConv
from .frames import FrameContext, FrameMixer
from .gmm import BUILTIN_MIXTURES, GaussianMixture, builtin_mixture
from .icnn import ConvICNNMap, ICNNMap
from .io import MODEL_REGISTRY, CheckpointError, build_model, load, model_spec, register_model, save, shipped_models
from .mlp import MLP
from .motion_vq import MotionVQVAE
from .ocm_heads import InputHead, OCMHead, TrunkHead
from .precond import EDMPrecond, edm_scalings
from .sequence import SequenceTransformer
from .style_dit import StyleTokenDiT
from .unet import UNet

__all__ = [
    "BUILTIN_MIXTURES",
    "MLP",
    "MotionVQVAE",
    "MODEL_REGISTRY",
    "CheckpointError",
    "ConvICNNMap",
    "DiT",
    "EDMPrecond",
    "FlowModel",
    "FrameContext",
    "FrameConv",
    "FrameMixer",
    "GaussianMixture",
    "ICNNMap",
    "ImageClassifier",
    "InputHead",
    "OCMHead",
    "SequenceTransformer",
    "StyleTokenDiT",
    "TrunkHead",
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
