"""Classifier-free guidance on a discrete denoiser's logits (``docs/methods/discrete.md``, "Guidance").

A discrete denoiser returns probabilities; guidance combines their logarithms (logits up to a per-position constant),

    log p_w(x_0 | x_t, c) = log p(x_0 | x_t) + w (log p(x_0 | x_t, c) - log p(x_0 | x_t)) + const,

then renormalises per position. ``w`` has the continuous guiders' convention (:mod:`steerdiff.guidance.cfg`; Ho &
Salimans 2022 with ``w = 1 + omega``; diffusers' ``guidance_scale``): ``w = 1`` is the conditional model, ``w = 0``
the unconditional one. This is the logit-space CFG of masked token models (Chang et al. 2023, "Muse"):
a per-position tilt, so the sequence law it samples is *not* ``p_c^w p^{1-w}`` in general; for one position it is
(``docs/methods/discrete.md``, "Guidance"). Guidance exact on the sequence, through the rates of the continuous-time
chain (Nisonoff et al. 2024, "Unlocking Guidance for Discrete State-Space Diffusion and Flow Models"), is not
implemented here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .registry import GUIDERS


def null_like(cond: Tensor) -> Tensor:
    """The all-null condition: ``-1`` in every slot (``docs/methods/conventions.md``)."""
    return torch.full_like(cond, -1)


@GUIDERS.register("cfg")
class CFG:
    """``softmax(log p_u + w (log p_c - log p_u))`` per position, conditional and null passes in one doubled batch.

    Args:
        scale: ``w >= 0`` (finite). ``w = 1`` evaluates only the condition, ``w = 0`` only the null one.
    """

    def __init__(self, scale: float):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 0:
            raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
        self.scale = float(scale)

    def combine(self, p_cond: Tensor, p_uncond: Tensor) -> Tensor:
        """The guided probabilities from the two passes (pure)."""
        dtype = torch.promote_types(p_cond.dtype, torch.float32)
        tiny = torch.finfo(dtype).tiny
        lc, lu = p_cond.to(dtype).clamp_min(tiny).log(), p_uncond.to(dtype).clamp_min(tiny).log()
        return torch.softmax(lu + self.scale * (lc - lu), -1)

    def wrap(self, denoiser: Callable) -> Callable:
        """The guided denoiser ``(x, t, cond) -> p_w``; ``cond=None`` (all null) returns the unconditional model."""

        def guided(x: Tensor, t: Tensor, cond=None) -> Tensor:
            if cond is None or self.scale == 0.0:
                return denoiser(x, t, None if cond is None else null_like(cond))
            if self.scale == 1.0:
                return denoiser(x, t, cond)
            both = denoiser(torch.cat([x, x]), torch.cat([t, t]), torch.cat([cond, null_like(cond)]))
            p_c, p_u = both.chunk(2)
            return self.combine(p_c, p_u)

        return guided
