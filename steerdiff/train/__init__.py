"""Training: EDM loss, EMA, condition dropout, atomic checkpoints with exact resume, JSON recipes, data parallel
(``torchrun``: :mod:`.ddp`)."""

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .classifier import random_shift, train_classifier
from .edm import edm_loss, edm_weight, sample_sigmas
from .ema import EMA
from .motion_vq import MotionVQConfig, MotionVQResult, train_motion_vq
from .objectives import OBJECTIVES, Objective, objective_for, register_objective
from .recipes import load_dataset, train_from_config
from .trainer import TrainConfig, TrainResult, drop_condition, train

__all__ = [
    "EMA",
    "MotionVQConfig",
    "MotionVQResult",
    "OBJECTIVES",
    "Objective",
    "TrainConfig",
    "TrainResult",
    "drop_condition",
    "edm_loss",
    "edm_weight",
    "latest_checkpoint",
    "load_checkpoint",
    "load_dataset",
    "objective_for",
    "register_objective",
    "sample_sigmas",
    "save_checkpoint",
    "train",
    "train_classifier",
    "train_from_config",
    "train_motion_vq",
    "random_shift",
]
