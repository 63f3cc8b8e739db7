"""Learned diagonal covariances for few-step sampling: OCM (Ou et al., ICLR 2025, "Improving Probabilistic
Diffusion Models With Optimal Diagonal Covariance Matching") and its baselines (fixed DDPM variances, DDIM,
Analytic-DPM, NPR-DPM, a Monte Carlo Jacobian).

Method, defaults and checks: docs/methods/ocm.md. Modules: :mod:`.kernel` (the moment-matched Gaussian reverse
kernel and the baselines on one code path; "Reverse kernel", "Baselines"), :mod:`.target` (the OCM target; "OCM
objective"), :mod:`.train` (``train_ocm``), :mod:`.likelihood` (NELBO; "Likelihood"), :mod:`.store` (save/load with
the denoiser's fingerprint). The heads are networks, in :mod:`steerdiff.models.ocm_heads` ("Heads"). The shipped
digits head's recipe is :mod:`steerdiff.app.recipes.ocm_digits`. The sampling grid is
:func:`steerdiff.core.sigmas.vp_linear`; the evaluation on the exact mixtures is :mod:`steerdiff.app.protocols.ocm`.

Sampling through the core API: ``sd.sample(denoiser, noise, sigmas, method="ocm-ddim", covariance=head)``.
"""

from ..models.ocm_heads import PARAMS, InputHead, OCMHead, TrunkHead, cov_to_output, output_to_cov, unet_trunk_head
from .kernel import (
    AnalyticDPM,
    CovarianceSource,
    FixedCovariance,
    GaussianSampleResult,
    HeadCovariance,
    MonteCarloCovariance,
    OracleCovariance,
    as_covariance,
    clamp_covariance,
    clamp_covariance_counted,
    kernel_coefficients,
    reverse_variance,
    sample_gaussian,
)
from .likelihood import NELBOResult, nelbo
from .store import denoiser_fingerprint, load_head, load_head_for, save_head
from .target import hutchinson_diag, ocm_target
from .train import OCMTrainResult, default_head, draw_training_sigmas, train_ocm

__all__ = [
    "PARAMS",
    "AnalyticDPM",
    "CovarianceSource",
    "FixedCovariance",
    "GaussianSampleResult",
    "HeadCovariance",
    "InputHead",
    "MonteCarloCovariance",
    "NELBOResult",
    "OCMHead",
    "OCMTrainResult",
    "OracleCovariance",
    "TrunkHead",
    "as_covariance",
    "clamp_covariance",
    "clamp_covariance_counted",
    "cov_to_output",
    "default_head",
    "denoiser_fingerprint",
    "draw_training_sigmas",
    "hutchinson_diag",
    "kernel_coefficients",
    "load_head",
    "load_head_for",
    "nelbo",
    "ocm_target",
    "output_to_cov",
    "reverse_variance",
    "sample_gaussian",
    "save_head",
    "train_ocm",
    "unet_trunk_head",
]
