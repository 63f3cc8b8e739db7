"""Classifier-free guidance and CFG-rescale (docs/methods/guidance.md, "CFG" and "CFG-rescale").

* CFG, Ho & Salimans 2022: ``D_cfg = D_u + w (D_c - D_u) = D_c + (w - 1)(D_c - D_u)``.
* CFG-rescale, Lin et al. 2023 ("Common Diffusion Noise Schedules and Sample Steps are Flawed", Sec. 3.4):
  ``P_rs = P_cfg * std(P_c) / std(P_cfg)``, ``P_out = phi P_rs + (1 - phi) P_cfg``, with ``P`` the denoised
  prediction ``D`` (default) or the eps-prediction ``(x - D) / sigma`` (``space="eps"``, diffusers' choice).

Scale convention (every guider here): ``w`` as above, so ``w = 1`` is the conditional model and ``w = 0`` the
unconditional one. diffusers' / k-diffusion's ``guidance_scale`` is the same number; Ho & Salimans' ``omega`` is
``w - 1``; see :mod:`steerdiff.guidance.conventions`. CFG is affine in the prediction, so it gives the same
result in D, eps or score space; CFG-rescale is not (its std ratio depends on the space), hence ``space``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.denoiser import denoised_from_eps, eps_from_denoised, host_level
from .base import Guider, check_real, check_space, sample_dims, scale_is, scale_rows
from .registry import register_guider


@register_guider("cfg")
class CFG(Guider):
    """Classifier-free guidance ``D_u + w (D_c - D_u)`` on one doubled batch.

    ``w = 1`` calls the denoiser once on the condition only; ``w = 0`` once on the null condition only (for a
    per-sample scale: when every row is 1, or every row 0).

    Args:
        scale: ``w`` (>= 0, finite) in the convention ``D_u + w (D_c - D_u)``; diffusers' ``guidance_scale``
            ``s`` is ``w = s``, Ho & Salimans' ``omega`` is ``w = 1 + omega``. A 1-D tensor or list ``[B]`` gives
            one ``w`` per sample.
        start, stop: fractions of the schedule outside of which the guider returns ``D_c`` at the cost of one
            evaluation (see :class:`~steerdiff.guidance.base.Guider`); they need ``sigmas``.
        sigmas: the sampling schedule, for ``start``/``stop``.
        enabled: ``False`` gives the plain conditional model.
    """

    name = "cfg"
    _fixed_branches = True  # from the scale alone

    def _branches(self) -> str:
        if scale_is(self.scale, 1.0):
            return "cond"
        return "null" if scale_is(self.scale, 0.0) else "both"

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor, step: int | None = None) -> Tensor:
        # lerp is exact at both ends: w = 0 gives D_u and w = 1 gives D_c bit for bit (per row, too).
        return torch.lerp(d_null, d_cond, scale_rows(self.scale, d_cond))

    def direct_combiner(self):
        """:meth:`Guider.direct_combiner`: for CFG itself (not a subclass with its own ``combine``), the ``lerp`` of
        :meth:`combine` with the scalar weight taken now, one call with no helper, which reads neither ``x`` nor
        ``sigma`` (``uses_sigma = False``: the sampler need not make a sigma batch for it; ``lerp_weight = w``:
        the sampler may call the ``lerp`` itself)."""
        combine = super().direct_combiner()
        if combine is None or type(self).combine is not CFG.combine:
            return combine
        w = self.scale  # a float: direct_combiner refuses per-sample weights

        def cfg_lerp(d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor | None, step: int | None = None):
            return torch.lerp(d_null, d_cond, w)

        cfg_lerp.uses_sigma = False
        cfg_lerp.lerp_weight = w  # SampleModel calls the lerp itself (no frame per step)
        return cfg_lerp


def bessel_std(t: Tensor) -> Tensor:
    """Per-sample standard deviation over all non-batch dims, Bessel-corrected, ``[B, 1, ..., 1]``.

    A sample with a single element has no Bessel-corrected std; its std is taken as 0 (no rescale) instead of
    NaN.
    """
    n = t[0].numel() if t.shape[0] else 0
    return t.std(dim=sample_dims(t), keepdim=True, correction=1 if n > 1 else 0)


def rescale_factor(std_ref: Tensor, std_cfg: Tensor) -> Tensor:
    """``std_ref / std_cfg``, and 1 (leave the prediction as it is) where ``std_cfg == 0``: never NaN or inf.

    A constant guided prediction cannot be given the reference's spread by scaling; diffusers' unguarded
    division makes NaN here (reported upstream as huggingface/diffusers#13425).
    """
    ok = std_cfg > 0
    return torch.where(ok, std_ref / torch.where(ok, std_cfg, torch.ones_like(std_cfg)), torch.ones_like(std_cfg))


@register_guider("cfg_rescale", aliases=("cfg-rescale",))
class CFGRescale(Guider):
    """CFG followed by Lin et al.'s std rescale, ``phi P_cfg std(P_c)/std(P_cfg) + (1 - phi) P_cfg``.

    The std is per sample over all non-batch dims, Bessel-corrected (as diffusers' ``rescale_noise_cfg``), and
    computed in float64. A zero std of the guided prediction leaves it unrescaled (never NaN).

    Args:
        scale: ``w`` in the convention ``D_u + w (D_c - D_u)`` (diffusers' ``guidance_scale``); a 1-D tensor or
            list ``[B]`` gives one ``w`` per sample.
        phi: rescale mix in [0, 1] (paper default 0.7; diffusers' ``guidance_rescale``); 0 is plain CFG.
        space: ``"D"`` (default: rescale the denoised prediction) or ``"eps"`` (rescale the eps-prediction, as
            diffusers does for eps-models). Report which one was used: the results differ.
        start, stop, sigmas, enabled: as for :class:`CFG`.
    """

    name = "cfg_rescale"

    def __init__(
        self,
        scale: float | Tensor | Sequence[float],
        phi: float = 0.7,
        space: str = "D",
        start: float = 0.0,
        stop: float = 1.0,
        sigmas: Tensor | None = None,
        enabled: bool = True,
    ):
        super().__init__(scale, start=start, stop=stop, sigmas=sigmas, enabled=enabled)
        self.phi = check_real(phi, "phi", 0.0, 1.0)
        self.space = check_space(space)

    @property
    def config(self) -> dict:
        return {**super().config, "phi": self.phi, "space": self.space}

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor, step: int | None = None) -> Tensor:
        p_cond, p_null = d_cond.double(), d_null.double()
        if self.space == "eps":
            x64, s64 = x.double(), _positive_sigma(sigma, "CFGRescale(space='eps')")
            p_cond, p_null = eps_from_denoised(x64, s64, p_cond), eps_from_denoised(x64, s64, p_null)
        p_cfg = torch.lerp(p_null, p_cond, scale_rows(self.scale, p_cond))
        factor = rescale_factor(bessel_std(p_cond), bessel_std(p_cfg))
        out = p_cfg * (self.phi * factor + (1.0 - self.phi))
        if self.space == "eps":
            out = denoised_from_eps(x64, s64, out)
        return out.to(d_cond.dtype)


def _positive_sigma(sigma: Tensor, who: str) -> Tensor:
    s = sigma.double()
    level = host_level(sigma)
    if level is not None and 0 < level < math.inf:  # a sampler's batch: checked on its host level, no read
        return s
    if not bool((s > 0).all()):
        raise ValueError(f"{who} converts D to eps = (x - D) / sigma and needs sigma > 0, got min {float(s.min())}")
    if bool(torch.isinf(s).any()):  # eps -> x there, and D = x - sigma * eps_guided is inf - inf
        raise ValueError(f"{who} converts D to eps = (x - D) / sigma, which cannot be inverted at sigma = inf (a flow "
                         "schedule's first level): use space='D' or start the schedule at a finite sigma")
    return s
