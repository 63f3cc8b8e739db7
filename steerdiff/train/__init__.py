"""Training: EDM loss, EMA, condition dropout, atomic checkpoints with exact resume, JSON recipes."""

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .classifier import random_shift, train_classifier
from .coind import ci_labels, ci_loss, ci_residual, coind_loss
from .edm import edm_loss, edm_weight, sample_sigmas
from .ema import EMA
from .recipes import load_dataset, train_from_config
from .trainer import TrainConfig, TrainResult, drop_condition, train

__all__ = [
    "EMA",
    "TrainConfig",
    "TrainResult",
    "ci_labels",
    "ci_loss",
    "ci_residual",
    "coind_loss",
    "drop_condition",
    "edm_loss",
    "edm_weight",
    "latest_checkpoint",
    "load_checkpoint",
    "load_dataset",
    "sample_sigmas",
    "save_checkpoint",
    "train",
    "train_classifier",
    "train_from_config",
    "random_shift",
]
