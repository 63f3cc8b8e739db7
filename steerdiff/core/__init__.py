"""Conventions, schedules, per-sample noise, samplers and their registry: the base every method stands on."""

# ancestral, deis, dpm_solver, er_sde, ipndm, lms, res_multistep, singlestep and unipc register their samplers on import
from . import ancestral, deis, dpm_solver, er_sde, ipndm, lms, res_multistep, sigmas, singlestep, unipc  # noqa: F401
from .ancestral import euler_ancestral_step
from .calls import FINITE_CHECK_MODES, ModelCall, checked_call, finite_check, sigma_batch, trajectory_check
from .denoiser import (
    NULL,
    Denoiser,
    NFECounter,
    append_dims,
    as_sigma_batch,
    denoised_from_eps,
    eps_from_denoised,
    host_level,
    null_cond_like,
    score_from_denoised,
    tag_host_level,
)
from .dpm_solver import dpmpp_2m_sde_step, dpmpp_2m_step
from .flow import FlowDenoiser
from .guided import GuidedDenoiser, cond_and_null
from .noise import SampleNoise, make_generators, randn
from .registry import SAMPLERS, SamplerSpec, register_sampler
from .sampling import (
    SampleStats,
    X0Corrector,
    ancestral_mean,
    ancestral_split,
    apply_x0_corrector,
    check_sample_inputs,
    correct_x0,
    ddim_step,
    ddpm_step,
    denoise_checked,
    denoise_step,
    euler_step,
    heun_step,
    nfe_of,
    sample,
    step_range,
)
from .vp import VPDenoiser

__all__ = [
    "FINITE_CHECK_MODES",
    "NULL",
    "SAMPLERS",
    "Denoiser",
    "FlowDenoiser",
    "GuidedDenoiser",
    "ModelCall",
    "NFECounter",
    "SampleNoise",
    "SampleStats",
    "SamplerSpec",
    "VPDenoiser",
    "X0Corrector",
    "ancestral_mean",
    "ancestral_split",
    "append_dims",
    "apply_x0_corrector",
    "as_sigma_batch",
    "check_sample_inputs",
    "checked_call",
    "cond_and_null",
    "correct_x0",
    "ddim_step",
    "ddpm_step",
    "dpmpp_2m_sde_step",
    "dpmpp_2m_step",
    "denoise_checked",
    "denoise_step",
    "denoised_from_eps",
    "eps_from_denoised",
    "finite_check",
    "host_level",
    "euler_ancestral_step",
    "euler_step",
    "heun_step",
    "make_generators",
    "nfe_of",
    "null_cond_like",
    "randn",
    "register_sampler",
    "sample",
    "score_from_denoised",
    "sigma_batch",
    "sigmas",
    "step_range",
    "tag_host_level",
    "trajectory_check",
]
