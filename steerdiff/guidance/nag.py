"""Normalized Attention Guidance (Chen et al., "Normalized Attention Guidance: Universal Negative Guidance for
Diffusion Models", arXiv 2505.21179; docs/methods/guidance.md, "NAG"): negative prompting for guidance-distilled
models (FLUX-schnell / -dev, SD 3.5 Large Turbo), where CFG does not apply, by extrapolating attention features away
from the negative prompt's (:mod:`steerdiff.models.nag`: FLUX, SD3, UNets) within one network evaluation per step.

On a pipeline the negative prompt is the null of its text condition (``negative_prompt=``). Cost per sample: one
network row per step (the text stream carries both texts, the image stream runs once) and, once per trajectory, one
call of the denoiser on the null condition that is stopped at the network's input (it reads the negative text; the
NFE counter counts it as one row, so ``nfe = steps + 1``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..core.denoiser import NULL, Denoiser
from ..models.nag import capture_text, nag_attention, select_nag_layers
from .base import check_denoiser_has_null, check_real, check_x_sigma, scale_is, scale_rows
from .perturbed import NetworkGuider
from .registry import register_guider


@register_guider("nag")
class NAG(NetworkGuider):
    """NAG with the negative prompt.

    Args:
        scale: ``phi``, the official code's ``nag_scale`` (>= 1; ``phi = 1 + s`` with the paper's extrapolation
            weight ``s``: ``Z = Z+ + s (Z+ - Z-)``); 1 is the plain conditional model. A 1-D tensor or list ``[B]``
            gives one per sample. The official FLUX default is 5.
        nag_tau: the clip ``tau`` >= 1 of the L1-norm ratio ``|Z|_1 / |Z+|_1`` (default 2.5, the official code's).
        nag_alpha: the blend ``alpha`` in [0, 1] of the normalised ``Z`` with ``Z+`` (default 0.25, the official
            code's).
        layers: attention layer ids (regular expressions over module names, or one comma-separated string, e.g.
            ``"single_transformer_blocks"``); None: every attention layer (the official code's FLUX setting).
        network: the FLUX or SD3 transformer or the UNet; None: found inside the denoiser.
        start, stop, sigmas, enabled: as :class:`~steerdiff.guidance.CFG` (outside the window: the conditional
            model).
    """

    name = "nag"

    def __init__(self, scale: float | Tensor | Sequence[float] = 5.0, nag_tau: float = 2.5, nag_alpha: float = 0.25,
                 layers: Sequence[str] | str | None = None, network: nn.Module | None = None, start: float = 0.0,
                 stop: float = 1.0, sigmas: Tensor | None = None, enabled: bool = True):
        super().__init__(scale, start=start, stop=stop, sigmas=sigmas, enabled=enabled)
        low = self.scale.min() if isinstance(self.scale, Tensor) else self.scale
        if low < 1.0:
            raise ValueError(f"scale (NAG's phi = 1 + s) must be >= 1 (1: no guidance), got {scale!r}")
        self.nag_tau = check_real(nag_tau, "nag_tau", 1.0)
        self.nag_alpha = check_real(nag_alpha, "nag_alpha", 0.0, 1.0)
        if isinstance(layers, str):  # the CLI's comma-separated form
            layers = [part.strip() for part in layers.split(",") if part.strip()]
        if layers is not None and (not isinstance(layers, Sequence) or not layers or
                                   not all(isinstance(x, str) and x for x in layers)):
            raise ValueError(f"layers must be None (every attention layer) or layer ids (a list of regular "
                             f"expressions over module names, or one comma-separated string), got {layers!r}")
        self.layers = None if layers is None else tuple(layers)
        self._bind_network(network, lambda net: select_nag_layers(net, self.layers),
                           "the FLUX / SD3 transformer or UNet")
        self._negative: Tensor | None = None  # the negative text, read once per trajectory

    @property
    def config(self) -> dict:
        return {**super().config, "nag_tau": self.nag_tau, "nag_alpha": self.nag_alpha,
                "layers": None if self.layers is None else list(self.layers)}

    def reset(self) -> None:
        self._negative = None

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond, step: int | None = None) -> Tensor:
        who = type(self).__name__
        check_x_sigma(x, sigma, who)
        phi = scale_rows(self.scale, x)
        active = self._active_rows(sigma)
        if active is False or scale_is(self.scale, 1.0):
            return denoiser(x, sigma, cond)
        if not isinstance(cond, Tensor) or cond.shape != (x.shape[0],):
            raise ValueError(f"{who} needs one condition label per sample (a pipeline's text condition), got "
                             f"{type(cond).__name__}")
        if isinstance(phi, Tensor):
            phi = phi.reshape(-1)
        if active is not True:  # rows outside the window: phi = 1
            phi = torch.where(active.to(x.device), torch.as_tensor(phi, dtype=x.dtype, device=x.device), 1.0)
        network = self._network(denoiser)
        negative = self._negative
        if negative is None or negative.shape[0] != x.shape[0]:
            check_denoiser_has_null(denoiser, who)
            null = torch.full_like(cond, NULL)
            negative = capture_text(network, lambda: denoiser(x, sigma, null))
            self._negative = negative
        with nag_attention(network, negative, phi, self.nag_tau, self.nag_alpha, self.layers):
            return denoiser(x, sigma, cond)

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor, step: int | None = None) -> Tensor:
        raise NotImplementedError("NAG guides inside the network: it has no rule on two predictions")
