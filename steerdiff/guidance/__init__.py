"""Guidance at sampling time: CFG, CFG-rescale, APG, CFG-Zero*, TCFG, MAMBO-G, FDG, logical composition (Compose) and
reward-gradient guidance (RewardGuidance) as denoiser wrappers.

Papers: Ho & Salimans 2022 (CFG); Lin et al. 2023, Sec. 3.4 (CFG-rescale); Sadat, Hilliges, Weber, ICLR 2025,
Algorithm 1 (APG); Fan et al. 2025 (CFG-Zero*); Kwon et al., CVPR 2025 (TCFG); arXiv 2508.03442 (MAMBO-G); Sadat
et al. 2025 (FDG); Liu et al. 2022 and Gaudi, Sreekumar, Boddeti, ICLR 2025 (composition, CoInD); Humayun et al.
2025, "What Secrets Do Your Manifolds Hold?" (geometry-reward guidance). The method pages are
docs/methods/guidance.md, docs/methods/coind.md and docs/methods/geometry.md.

Each guider is an object with ``guide(denoiser, x, sigma, cond) -> D`` and ``reset()``; pass it to
:func:`steerdiff.sample` as ``guidance=`` together with ``cond=``. Conditional and null predictions are computed
as one doubled batch; ``w = 1`` (and steps outside a ``start``/``stop`` window) cost one evaluation.

Scale convention everywhere: ``w`` in ``D_u + w (D_c - D_u)`` (diffusers' ``guidance_scale``; the APG paper's
``w``). Converters for other conventions: :mod:`steerdiff.guidance.conventions`.

A model without a null condition declares ``has_null = False``; guiders then raise instead of guessing.
"""

from . import conventions
from .apg import APG
from .autoguidance import AutoGuidance
from .base import Guider
from .cfg import CFG, CFGRescale
from .cfg_zero_star import CFGZeroStar
from .coind_objective import ci_labels, ci_loss, ci_residual, coind_loss
from .composable import load_composable
from .compose import Compose
from .compose_expr import parse
from .compose_oracle import compose_oracle
from .compose_prompts import PromptCompose
from .conventions import (
    comfyui_apg_from_w,
    diffusers_from_w,
    from_w,
    omega_from_w,
    to_w,
    w_from_comfyui_apg,
    w_from_diffusers,
    w_from_omega,
)
from .fdg import FDG
from .mambo import MAMBOG
from .nag import NAG
from .perturbed import PAG, SEG, SLG
from .registry import GUIDERS, build_guider, register_guider
from .reward import RewardGuidance, ScaledRewardGuidance, reward_gradient
from .spaces import SPACES
from .tcfg import TCFG

__all__ = [
    "APG",
    "AutoGuidance",
    "CFG",
    "CFGRescale",
    "CFGZeroStar",
    "FDG",
    "MAMBOG",
    "NAG",
    "PAG",
    "SEG",
    "SLG",
    "SPACES",
    "TCFG",
    "Compose",
    "GUIDERS",
    "Guider",
    "PromptCompose",
    "RewardGuidance",
    "ScaledRewardGuidance",
    "ci_labels",
    "ci_loss",
    "ci_residual",
    "coind_loss",
    "build_guider",
    "comfyui_apg_from_w",
    "compose_oracle",
    "conventions",
    "diffusers_from_w",
    "from_w",
    "load_composable",
    "omega_from_w",
    "parse",
    "register_guider",
    "reward_gradient",
    "to_w",
    "w_from_comfyui_apg",
    "w_from_diffusers",
    "w_from_omega",
]
