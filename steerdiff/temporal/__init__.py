"""Temporal generation: Dynamical Diffusion forecasting and all-at-once sequence generation.

Both act through the one denoiser convention ``D(x, sigma, cond)`` with ``x: [B, S, *frame]`` (frames on axis 1),
so every sampler of :mod:`steerdiff.core` runs on them unchanged.
"""

from __future__ import annotations

from ..models.sequence import SequenceTransformer
from . import objective as _objective  # noqa: F401 - registers the "dydiff" training objective
from .cond import SequenceCond
from .dydiff import DyDiffDenoiser, forecast, load_forecaster, mix, mixing_matrix, theta_bar, unmix
from .generate import generate_autoregressive, generate_sequence
from .objective import dydiff_loss
from .precond import SequencePrecond, sequence_model
from .sequence_train import SequenceTrainConfig, train_sequence

__all__: list[str] = [
    "DyDiffDenoiser",
    "SequenceCond",
    "SequencePrecond",
    "SequenceTrainConfig",
    "SequenceTransformer",
    "dydiff_loss",
    "forecast",
    "generate_autoregressive",
    "generate_sequence",
    "load_forecaster",
    "mix",
    "mixing_matrix",
    "sequence_model",
    "theta_bar",
    "train_sequence",
    "unmix",
]
