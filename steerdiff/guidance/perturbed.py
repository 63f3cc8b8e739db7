"""Perturbation guiders: guidance away from a deliberately degraded pass of the same network (docs/methods/guidance.md,
"Perturbation guiders").

* PAG, Ahn et al., "Self-Rectifying Diffusion Sampling with Perturbed-Attention Guidance" (ECCV 2024), Sec. 3.2:
  the perturbed pass replaces the self-attention map of chosen layers by the identity
  (:func:`steerdiff.models.perturb.identity_self_attention`).

With ``D_c``, ``D_u`` the conditional and null predictions and ``D_p`` the perturbed conditional prediction:

    D = D_u + w (D_c - D_u) + s (D_c - D_p)        (w = 1: D_c + s (D_c - D_p), no null pass)

(affine, so the same in D, eps or v). Cost per sample per evaluation: 3 network rows with CFG (a doubled batch and
the perturbed pass), 2 without. diffusers' ``StableDiffusionPAGPipeline`` / ``StableDiffusionXLPAGPipeline``
(``guidance_scale`` = ``w``, ``pag_scale`` = ``s``, ``pag_applied_layers`` = ``layers``) compute the same
(tests/pipelines/test_pipeline_perturbed_guidance.py); their ``pag_adaptive_scale`` is not offered.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..core.denoiser import Denoiser
from ..core.guided import cond_and_null
from ..models.perturb import find_network, identity_self_attention, select_self_attention
from .base import (
    Guider,
    check_cond,
    check_denoiser_has_null,
    check_real,
    check_x_sigma,
    scale_is,
    scale_rows,
)
from .registry import register_guider


def _layer_list(layers) -> tuple[str, ...]:
    if isinstance(layers, str):  # the CLI's comma-separated form
        layers = [part.strip() for part in layers.split(",") if part.strip()]
    if not isinstance(layers, Sequence) or not layers or not all(isinstance(x, str) and x for x in layers):
        raise ValueError(f"layers must be layer ids (a list of regular expressions over module names, or one "
                         f"comma-separated string), got {layers!r}")
    return tuple(layers)


@register_guider("pag")
class PAG(Guider):
    """Perturbed-attention guidance, with CFG at ``scale`` on top (``scale = 1``: PAG alone).

    Args:
        scale: CFG's ``w`` (>= 0; 1: no null pass); a 1-D tensor or list ``[B]`` gives one ``w`` per sample.
        pag_scale: ``s`` >= 0, the weight of ``D_c - D_p`` (diffusers' ``pag_scale``, default 3).
        layers: layer ids selecting self-attention layers (diffusers' ``pag_applied_layers``; default ``("mid",)``):
            regular expressions over module names, or one comma-separated string.
        network: the UNet / transformer to perturb; None: found inside the denoiser
            (:func:`steerdiff.models.perturb.find_network`).
        start, stop, sigmas, enabled: as :class:`~steerdiff.guidance.CFG` (outside the window: the conditional
            model, one row).
    """

    name = "pag"

    def __init__(self, scale: float | Tensor | Sequence[float], pag_scale: float = 3.0,
                 layers: Sequence[str] | str = ("mid",), network: nn.Module | None = None, start: float = 0.0,
                 stop: float = 1.0, sigmas: Tensor | None = None, enabled: bool = True):
        super().__init__(scale, start=start, stop=stop, sigmas=sigmas, enabled=enabled)
        self.pag_scale = check_real(pag_scale, "pag_scale", 0.0)
        self.layers = _layer_list(layers)
        if network is not None and not isinstance(network, nn.Module):
            raise TypeError(f"network must be the torch module to perturb (a UNet or transformer), got "
                            f"{type(network).__name__}")
        self.network = network
        if network is not None:
            select_self_attention(network, self.layers)  # refuse layer ids that select nothing, up front
        self._found: tuple[int, nn.Module] | None = None

    @property
    def config(self) -> dict:
        return {**super().config, "pag_scale": self.pag_scale, "layers": list(self.layers)}

    def _network(self, denoiser: Denoiser) -> nn.Module:
        if self.network is not None:
            return self.network
        if self._found is None or self._found[0] != id(denoiser):
            self._found = (id(denoiser), find_network(denoiser))
        return self._found[1]

    def perturbed(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor) -> Tensor:
        """The perturbed conditional prediction ``D_p``."""
        with identity_self_attention(self._network(denoiser), self.layers):
            return denoiser(x, sigma, cond)

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond, step: int | None = None) -> Tensor:
        who = type(self).__name__
        check_x_sigma(x, sigma, who)
        if isinstance(cond, Tensor):
            cond = check_cond(cond, x, who)
        active = self._active_rows(sigma)
        if active is False or self.pag_scale == 0.0:
            return super().guide(denoiser, x, sigma, cond, step=step)
        if scale_is(self.scale, 1.0):
            d_cond = denoiser(x, sigma, cond)
            d_cfg = d_cond
        else:
            check_denoiser_has_null(denoiser, who)
            d_cond, d_null = cond_and_null(denoiser, x, sigma, cond)
            d_cfg = torch.lerp(d_null, d_cond, scale_rows(self.scale, d_cond))
        out = d_cfg + self.pag_scale * (d_cond - self.perturbed(denoiser, x, sigma, cond))
        if active is True:
            return out
        return torch.where(active.to(out.device).reshape(-1, *([1] * (out.ndim - 1))), out, d_cond)

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor, step: int | None = None) -> Tensor:
        """CFG alone (the perturbation off: ``pag_scale = 0``)."""
        return torch.lerp(d_null, d_cond, scale_rows(self.scale, d_cond))
