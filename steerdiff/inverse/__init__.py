"""Inverse problems: measurement operators, DPS (Chung et al., ICLR 2023), DR = RED-diff (Mardani et al., ICLR
2024), CR and HR (Dou et al., ICLR 2025), DDNM (Wang et al., ICLR 2023), PiGDM (Song et al., ICLR 2023), DDRM
(Kawar et al., NeurIPS 2022), DiffPIR (Zhu et al., CVPRW 2023), DAPS (Zhang et al., 2024) and MCGDiff (Cardoso et
al., ICLR 2024, the SMC sampler); see
docs/methods/inverse.md.

    import steerdiff as sd
    from steerdiff.inverse import Inpaint, measure, solve

    D = sd.models.load("digits")
    op = Inpaint.center((1, 8, 8))
    y = measure(op, x0, noise_std=0.05, generator=0)
    res = solve(D, op, y, method="hr", noise_std=0.05, chains=8)
"""

from .metrics import chain_diversity, posterior_metrics, psnr, ssim
from .noise import GaussianNoise, PoissonNoise, measure
from .operators import (
    HDR,
    AvgPoolSR,
    Blur,
    Downsample,
    FunctionOperator,
    GaussBlur,
    Inpaint,
    Matrix,
    NoAdjointError,
    NoPinvError,
    Operator,
    as_operator,
    gaussian_kernel,
)
from .reference import ImageMixture, digits_surrogate, exact_posterior
from .registry import SOLVERS, SolveContext, Solver, register_solver
from .result import InverseResult
from .solve import solve
from .tasks import TASKS, register_task, task_operator

__all__ = [
    "HDR",
    "SOLVERS",
    "SolveContext",
    "Solver",
    "TASKS",
    "AvgPoolSR",
    "Blur",
    "Downsample",
    "FunctionOperator",
    "GaussBlur",
    "GaussianNoise",
    "ImageMixture",
    "Inpaint",
    "InverseResult",
    "Matrix",
    "NoAdjointError",
    "NoPinvError",
    "Operator",
    "PoissonNoise",
    "chain_diversity",
    "digits_surrogate",
    "exact_posterior",
    "gaussian_kernel",
    "measure",
    "posterior_metrics",
    "as_operator",
    "psnr",
    "register_solver",
    "register_task",
    "solve",
    "ssim",
    "task_operator",
]
