"""CFG-Zero*: Fan, Zheng, Zhang, Luo, Wu, Liu, Tian, "CFG-Zero*: Improved Classifier-Free Guidance for Flow Matching
Models" (arXiv 2503.18886, 2025), Sec. 4 ("optimized scale" and "zero-init"); docs/methods/guidance.md, "CFG-Zero*".

With ``c`` and ``u`` the conditional and null predictions in the chosen space (the paper: the flow velocity), per
sample over all non-batch dims:

1. ``s* = <c, u> / (||u||^2 + 1e-8)``: the scale that best explains ``c`` by ``u`` (least squares);
2. ``p = s* u + w (c - s* u)`` (CFG with the null prediction replaced by ``s* u``);
3. zero-init: the first ``zero_init_steps`` sampler steps return the zero prediction in that space (in ``v``: the
   flow state does not move; no network evaluation is made, so those steps cost 0 NFE).

Scale convention: ``w`` as every steerdiff guider (``w = 1`` is the conditional model); diffusers'
``ClassifierFreeZeroStarGuidance(guidance_scale=s)`` is ``w = s`` (``use_original_formulation=True``: ``w = s + 1``),
and equals this guider on the network's own predictions (``space="eps"`` for SD / SDXL, ``"v"`` for SD3 / FLUX;
tests/guidance/test_output_space_guiders.py). ComfyUI's ``CFGZeroStar`` node is a different operator: it takes ``s*``
from the noise predictions but applies it to the denoised ones, and has no zero-init.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.denoiser import Denoiser
from .base import check_x_sigma, sample_dims, scale_rows
from .registry import register_guider
from .spaces import SpaceGuider, zero_prediction

SCALE_FLOOR = 1e-8  # the paper's (and diffusers') epsilon in ||u||^2 + eps


def optimized_scale(c: Tensor, u: Tensor) -> Tensor:
    """``s* = <c, u> / (||u||^2 + 1e-8)`` per sample, ``[B, 1, ..., 1]``."""
    dims = sample_dims(c)
    return (c * u).sum(dim=dims, keepdim=True) / (u.pow(2).sum(dim=dims, keepdim=True) + SCALE_FLOOR)


@register_guider("cfg_zero_star", aliases=("cfg-zero-star",))
class CFGZeroStar(SpaceGuider):
    """CFG-Zero*: CFG against the optimally scaled null prediction, and zero-init of the first steps.

    Args:
        scale: ``w`` (>= 0) in ``s* u + w (c - s* u)``; a 1-D tensor or list ``[B]`` gives one ``w`` per sample.
        zero_init_steps: the first this many sampler steps return the zero prediction (paper and diffusers: 1;
            0 disables it). They cost no network evaluation.
        space: ``"v"`` (default: the flow velocity, the paper's), ``"eps"`` or ``"D"``
            (:mod:`steerdiff.guidance.spaces`).
        start, stop, sigmas, enabled: as :class:`~steerdiff.guidance.CFG` (zero-init applies whatever the window,
            as in diffusers; ``enabled=False`` turns both parts off).
    """

    name = "cfg_zero_star"
    default_space = "v"

    def __init__(self, scale: float | Tensor | Sequence[float], zero_init_steps: int = 1, space: str | None = None,
                 start: float = 0.0, stop: float = 1.0, sigmas: Tensor | None = None, enabled: bool = True):
        if isinstance(zero_init_steps, bool) or not isinstance(zero_init_steps, int) or zero_init_steps < 0:
            raise ValueError(f"zero_init_steps must be an integer >= 0, got {zero_init_steps!r}")
        self.zero_init_steps = zero_init_steps
        self._calls = 0
        super().__init__(scale, space=space, start=start, stop=stop, sigmas=sigmas, enabled=enabled)

    @property
    def config(self) -> dict:
        return {**super().config, "zero_init_steps": self.zero_init_steps}

    def reset(self) -> None:
        self._calls = 0

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor, step: int | None = None) -> Tensor:
        """As :meth:`Guider.guide`, with the zero prediction at steps ``< zero_init_steps`` (``step=None``: every
        call is a new step, counted since :meth:`reset`)."""
        if step is None:
            step, self._calls = self._calls, self._calls + 1
        if self.enabled and step < self.zero_init_steps:
            check_x_sigma(x, sigma, type(self).__name__)
            return zero_prediction(x, sigma, self.space, x.dtype if x.is_floating_point() else torch.float32)
        return super().guide(denoiser, x, sigma, cond, step=step)

    def combine_in_space(self, c: Tensor, u: Tensor) -> Tensor:
        u_star = optimized_scale(c, u) * u
        return u_star + scale_rows(self.scale, c) * (c - u_star)
