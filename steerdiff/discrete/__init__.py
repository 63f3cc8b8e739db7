"""Discrete diffusion over categorical tokens: forward processes, samplers, exact tables, guidance and steering.

The convention (``docs/methods/conventions.md``, "Discrete diffusion"): a state is a long tensor ``x [B, L]`` of
tokens in ``0..K-1`` (``K`` = the mask for the absorbing process), time ``t`` in [0, 1] (``t = 0`` clean), and a
denoiser ``D(x, t [B], cond) -> [B, L, K]`` returns, per position, the probabilities of the clean token given the
noisy state. Graphs (:mod:`.graph`) are flattened into such sequences. The methods are in
``docs/methods/discrete.md``.
"""

from . import graph
from .corrector import correct
from .graph import GraphProcess, flat_denoiser, graph_process, sample_graphs
from .guidance import CFG
from .process import PROCESSES, SCHEDULES, Process, categorical, make_process, make_schedule
from .registry import GUIDERS, SAMPLERS, register_sampler
from .remask import remask_decode
from .sampling import DiscreteStats, RowRandom, Step, from_logits, nfe_of, sample
from .steer import DiscreteSteerResult, best_of_n, smc
from .table import (
    TableModel,
    all_sequences,
    ancestral_law,
    empirical,
    random_table,
    sequence_index,
    total_variation,
    tv_floor,
)

__all__ = [
    "GraphProcess", "flat_denoiser", "graph", "graph_process", "sample_graphs",
    "CFG", "GUIDERS", "PROCESSES", "SAMPLERS", "SCHEDULES", "DiscreteStats", "DiscreteSteerResult", "Process",
    "RowRandom", "Step", "TableModel", "all_sequences", "ancestral_law", "best_of_n", "categorical", "empirical",
    "correct", "from_logits", "make_process", "make_schedule", "nfe_of", "random_table", "register_sampler",
    "remask_decode", "sample",
    "sequence_index", "smc", "total_variation", "tv_floor",
]
