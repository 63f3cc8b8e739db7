"""Conventions, schedules, per-sample noise and samplers: the base every method stands on (DESIGN.md)."""

from . import sigmas
from .denoiser import (
    NULL,
    Denoiser,
    NFECounter,
    append_dims,
    as_sigma_batch,
    denoised_from_eps,
    eps_from_denoised,
    null_cond_like,
    score_from_denoised,
)
from .guided import GuidedDenoiser, cond_and_null
from .noise import SampleNoise, make_generators, randn
from .sampling import SAMPLERS, SampleStats, nfe_of, sample
from .vp import VPDenoiser

__all__ = [
    "NULL",
    "SAMPLERS",
    "Denoiser",
    "GuidedDenoiser",
    "NFECounter",
    "SampleNoise",
    "SampleStats",
    "VPDenoiser",
    "append_dims",
    "as_sigma_batch",
    "cond_and_null",
    "denoised_from_eps",
    "eps_from_denoised",
    "make_generators",
    "nfe_of",
    "null_cond_like",
    "randn",
    "sample",
    "score_from_denoised",
    "sigmas",
]
