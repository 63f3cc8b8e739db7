"""AutoGuidance: Karras, Aittala, Kynkäänniemi, Lehtinen, Aila, Laine, "Guiding a Diffusion Model with a Bad Version
of Itself" (NeurIPS 2024), Sec. 3; docs/methods/guidance.md, "AutoGuidance".

Guidance by a weaker version of the same model instead of the unconditional one: with ``D_1`` the model and ``D_0`` a
smaller and / or shorter-trained model of the same task, both *conditional*,

    D = D_0 + w (D_1 - D_0).

The weak model's errors are, the paper argues, a degraded copy of the strong model's, so extrapolating away from
them corrects the strong model's without the diversity loss of CFG (which extrapolates away from a different task,
the unconditional one). ``w = 1`` is the model itself (one evaluation); the weak model costs its own evaluations,
counted in :attr:`AutoGuidance.weak_evaluations` (the weak network is smaller than the model: report both).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..core.denoiser import Denoiser
from ..core.guided import StructuredRows
from .base import Guider, check_cond, check_x_sigma, scale_is, scale_rows
from .registry import register_guider


@register_guider("autoguidance")
class AutoGuidance(Guider):
    """Guidance by a weak model: ``D_0 + w (D_1 - D_0)``, both conditional on the same ``cond``.

    Args:
        scale: ``w`` (>= 0; 1: the model alone, 0: the weak model alone); a 1-D tensor or list ``[B]`` gives one
            ``w`` per sample. The paper's scales are 2-3.
        weak: the weak denoiser ``D_0(x, sigma, cond)`` (a module or callable in the library's convention), or the
            name / directory of a model for :func:`steerdiff.models.load` (shipped: ``"digits_weak"`` for
            ``digits``, ``"shapes_weak"`` for ``shapes``). Moved to the state's device and dtype at the first call.
        start, stop, sigmas, enabled: as :class:`~steerdiff.guidance.CFG` (outside the window: the model alone).

    Attributes:
        weak_evaluations: weak-model evaluations per sample since the last :meth:`reset` (the sampler's NFE counts
            the model's only).
    """

    name = "autoguidance"

    def __init__(self, scale: float | Tensor | Sequence[float], weak: Denoiser | str | os.PathLike,
                 start: float = 0.0, stop: float = 1.0, sigmas: Tensor | None = None, enabled: bool = True):
        super().__init__(scale, start=start, stop=stop, sigmas=sigmas, enabled=enabled)
        if isinstance(weak, (str, os.PathLike)):
            from ..models.io import load

            self.weak_name: str | None = str(weak)
            weak = load(weak)
        elif callable(weak):
            self.weak_name = None
        else:
            raise TypeError(f"weak must be a denoiser D(x, sigma, cond) or a model name / directory, got "
                            f"{type(weak).__name__}")
        if isinstance(weak, nn.Module):
            weak.eval().requires_grad_(False)
        self.weak = weak
        self.weak_evaluations = 0

    @property
    def config(self) -> dict:
        return {**super().config, "weak": self.weak_name if self.weak_name is not None else type(self.weak).__name__}

    def reset(self) -> None:
        self.weak_evaluations = 0

    def _weak_on(self, x: Tensor) -> Denoiser:
        if isinstance(self.weak, nn.Module):
            p = next(self.weak.parameters(), None)
            if p is not None and (p.device != x.device or p.dtype != x.dtype):
                self.weak.to(device=x.device, dtype=x.dtype)
        return self.weak

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond, step: int | None = None) -> Tensor:
        who = type(self).__name__
        check_x_sigma(x, sigma, who)
        if isinstance(denoiser, StructuredRows):
            raise ValueError("AutoGuidance feeds the weak model the same condition as the model; a structured "
                             "condition (a pipeline's text) needs a weak model of the same pipeline: not supported")
        cond = check_cond(cond, x, who)
        active = self._active_rows(sigma)
        if active is False or scale_is(self.scale, 1.0):
            return denoiser(x, sigma, cond)
        d_model = denoiser(x, sigma, cond)
        d_weak = self._weak_on(x)(x, sigma, cond).to(d_model.dtype)
        self.weak_evaluations += 1
        out = torch.lerp(d_weak, d_model, scale_rows(self.scale, d_model))
        if active is True:
            return out
        return torch.where(active.to(out.device).reshape(-1, *([1] * (out.ndim - 1))), out, d_model)
