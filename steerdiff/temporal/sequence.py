"""Deprecated path: ``steerdiff.temporal.sequence`` was split into rooms with one job each (issue 34): the condition
(:mod:`steerdiff.temporal.cond`), the banded attention (:mod:`steerdiff.models.sequence_attention`), the network
(:mod:`steerdiff.models.sequence`), its EDM preconditioning (:mod:`steerdiff.temporal.precond`) and the two
generators (:mod:`steerdiff.temporal.generate`); docs/methods/sequence.md, "The model". This module re-exports their
names for one release and warns on import."""

import warnings

from ..models.sequence import SequenceTransformer
from ..models.sequence_attention import (
    LOCAL_ATTENTION_FROM,
    MIN_ATTENTION_BLOCK,
    attention_block,
    band_attention,
    band_bias,
    blocked_attention,
    dense_band_attention,
    global_context_bias,
    local_band_attention,
    local_band_bias,
    relative_band,
    use_local_attention,
)
from .cond import SequenceCond
from .generate import generate_autoregressive, generate_sequence
from .precond import SequencePrecond, sequence_model

warnings.warn("steerdiff.temporal.sequence is deprecated: import SequenceCond, SequencePrecond, sequence_model, "
              "generate_sequence and generate_autoregressive from steerdiff.temporal, the network and its attention "
              "from steerdiff.models.sequence and steerdiff.models.sequence_attention", DeprecationWarning,
              stacklevel=2)

__all__ = [
    "LOCAL_ATTENTION_FROM",
    "MIN_ATTENTION_BLOCK",
    "SequenceCond",
    "SequencePrecond",
    "SequenceTransformer",
    "attention_block",
    "band_attention",
    "band_bias",
    "blocked_attention",
    "dense_band_attention",
    "generate_autoregressive",
    "generate_sequence",
    "global_context_bias",
    "local_band_attention",
    "local_band_bias",
    "relative_band",
    "sequence_model",
    "use_local_attention",
]
