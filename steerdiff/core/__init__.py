"""Conventions, schedules, per-sample noise, samplers and their registry: the base every method stands on."""

# ancestral, dpm_solver, lms and unipc register their samplers on import
from . import ancestral, dpm_solver, lms, sigmas, unipc  # noqa: F401
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
from .flow import FlowDenoiser
from .guided import GuidedDenoiser, cond_and_null
from .noise import SampleNoise, make_generators, randn
from .registry import SAMPLERS, SamplerSpec, register_sampler
from .sampling import (
    SampleStats,
    X0Corrector,
    check_sample_inputs,
    correct_x0,
    denoise_checked,
    denoise_step,
    nfe_of,
    sample,
    step_range,
)
from .vp import VPDenoiser

__all__ = [
    "NULL",
    "SAMPLERS",
    "Denoiser",
    "FlowDenoiser",
    "GuidedDenoiser",
    "NFECounter",
    "SampleNoise",
    "SampleStats",
    "SamplerSpec",
    "VPDenoiser",
    "X0Corrector",
    "append_dims",
    "as_sigma_batch",
    "check_sample_inputs",
    "cond_and_null",
    "correct_x0",
    "denoise_checked",
    "denoise_step",
    "denoised_from_eps",
    "eps_from_denoised",
    "make_generators",
    "nfe_of",
    "null_cond_like",
    "randn",
    "register_sampler",
    "sample",
    "score_from_denoised",
    "sigmas",
    "step_range",
]
