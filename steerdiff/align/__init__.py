"""Reward alignment at sampling time: DAS (tempered SMC) and its baselines, over one denoiser ``D(x, sigma, cond)``.

``das`` (Kim, Kim, Park, ICLR 2025; das.md), ``tds`` (Wu et al. 2023), ``best_of_n``, ``sir`` and
``reward_guidance`` share one calling shape ``f(denoiser, reward, noise, sigmas, alpha=..., particles=..., ...)`` and
return an :class:`AlignResult`. A reward is any callable ``r(x0) -> [B]`` (see :mod:`.rewards`).
"""

from . import rewards, smc
from .best_of_n import best_of_n, sir
from .das import das, default_gamma, tempering_schedule
from .guidance import reward_guidance
from .online import LinUCBSurrogate, online_das
from .result import AlignResult
from .tds import tds

__all__ = [
    "AlignResult",
    "LinUCBSurrogate",
    "best_of_n",
    "das",
    "default_gamma",
    "online_das",
    "reward_guidance",
    "rewards",
    "sir",
    "smc",
    "tds",
    "tempering_schedule",
]
