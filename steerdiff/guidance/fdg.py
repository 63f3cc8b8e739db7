"""Frequency-decoupled guidance (FDG): Sadat, Vontobel, Salehi, Weber, "Guidance in the Frequency Domain Enables
High-Fidelity Sampling at Low CFG Scales" (arXiv 2506.19713, 2025), Sec. 3 and Algorithm 2; docs/methods/guidance.md,
"FDG".

The conditional and null predictions (in the chosen space, images ``[B, C, H, W]``) are split into ``L`` bands by a
Laplacian pyramid (Burt & Adelson 1983): Gaussian levels ``g_0 = p``, ``g_{k+1} = down(blur(g_k))``; bands
``b_k = g_k - blur(up(g_{k+1}))`` for ``k < L - 1`` and ``b_{L-1} = g_{L-1}``; ``p`` is recovered exactly by
``g_k = b_k + blur(up(g_{k+1}))``. Each band is guided with its own weight,

    b_k = u_k + w_k Delta_k,   Delta_k = (c_k - u_k)  [optionally  rho P_par(Delta_k; c_k) + P_orth(Delta_k; c_k)],

from the highest frequency (``k = 0``, weight ``scale``) to the lowest (``k = L - 1``, weight ``low_scale``;
levels between: linear in ``k``), and the guided pyramid is collapsed back. The paper's recommendation is a low
weight for the low band (colour and composition, where CFG oversaturates and loses diversity) and a high one for
the high band (detail): e.g. ``w_high = 10, w_low = 5`` on SDXL. Equal weights give CFG exactly (the pyramid is
linear and exactly invertible).

The pyramid follows kornia's ``build_laplacian_pyramid`` / ``pyrup`` (which diffusers' guider uses): the 5 x 5
binomial kernel ``[1, 4, 6, 4, 1]^T [1, 4, 6, 4, 1] / 256`` with reflect padding, bilinear resizing by 2
(``align_corners=False``). Sides must be divisible by ``2^(L-1)`` with every level at least 3 pixels (kornia pads
other sizes to a power of two, and diffusers then returns the padded size; here they are refused).

Scale convention: ``w`` as every steerdiff guider; diffusers' ``FrequencyDecoupledGuidance(guidance_scales=[s_0, ...,
s_{L-1}])`` (high to low) is ``scale = s_0``, ``low_scale = s_{L-1}`` (``use_original_formulation=True``: each
``+ 1``), and equals this guider on the network's own predictions (tests/guidance/test_output_space_guiders.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .apg import project
from .base import check_real, check_scale
from .registry import register_guider
from .spaces import SpaceGuider

_BINOMIAL = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0], dtype=torch.float64) / 16.0


def _blur(img: Tensor) -> Tensor:
    """The 5 x 5 binomial blur per channel with reflect padding."""
    k1 = _BINOMIAL.to(device=img.device, dtype=img.dtype)
    kernel = (k1[:, None] * k1[None, :]).expand(img.shape[1], 1, 5, 5)
    return F.conv2d(F.pad(img, (2, 2, 2, 2), mode="reflect"), kernel, groups=img.shape[1])


def _down(img: Tensor) -> Tensor:
    return F.interpolate(_blur(img), size=(img.shape[2] // 2, img.shape[3] // 2), mode="bilinear",
                         align_corners=False)


def _up(img: Tensor) -> Tensor:
    return _blur(F.interpolate(img, size=(img.shape[2] * 2, img.shape[3] * 2), mode="bilinear", align_corners=False))


def check_pyramid_shape(shape: tuple[int, ...], levels: int, who: str = "FDG") -> None:
    """Refuse a prediction shape the ``levels``-band pyramid cannot split (naming the requirement)."""
    if len(shape) != 4:
        raise ValueError(f"{who} splits images [B, C, H, W] into frequency bands, got predictions of shape "
                         f"{tuple(shape)} (packed or flat latents have no image grid)")
    stride = 1 << (levels - 1)
    h, w = shape[2], shape[3]
    if h % stride or w % stride or h // stride < 3 or w // stride < 3:
        raise ValueError(f"{who} with levels={levels} needs H and W divisible by {stride} with at least 3 pixels at "
                         f"the coarsest level, got {h}x{w}: use fewer levels")


def laplacian_pyramid(img: Tensor, levels: int) -> list[Tensor]:
    """The ``levels`` bands of ``img [B, C, H, W]``, highest frequency first (the last is the Gaussian residual)."""
    gauss = [img]
    for _ in range(levels - 1):
        gauss.append(_down(gauss[-1]))
    return [g - _up(g_next) for g, g_next in zip(gauss[:-1], gauss[1:], strict=True)] + [gauss[-1]]


def collapse_pyramid(bands: list[Tensor]) -> Tensor:
    """The image whose :func:`laplacian_pyramid` is ``bands`` (exact inverse)."""
    img = bands[-1]
    for band in reversed(bands[:-1]):
        img = band + _up(img)
    return img


@register_guider("fdg")
class FDG(SpaceGuider):
    """Frequency-decoupled guidance: CFG per Laplacian-pyramid band, ``scale`` on the highest frequencies and
    ``low_scale`` on the lowest.

    Args:
        scale: ``w`` of the highest-frequency band (>= 0; one number: the bands are per image, not per sample).
        low_scale: ``w`` of the lowest band (default ``scale``: then FDG is CFG); bands between are linear in the
            band index.
        levels: number of bands ``L >= 2``.
        parallel_weight: ``rho`` in [0, 1]: weight of each band's update component parallel to the band of the
            conditional prediction (1, the default: plain CFG per band; the paper's APG-style variant below 1).
        space: ``"eps"`` (default), ``"v"`` or ``"D"``.
        start, stop, sigmas, enabled: as :class:`~steerdiff.guidance.CFG` (one window for every band).
    """

    name = "fdg"
    default_space = "eps"

    def __init__(self, scale: float, low_scale: float | None = None, levels: int = 2, parallel_weight: float = 1.0,
                 space: str | None = None, start: float = 0.0, stop: float = 1.0, sigmas: Tensor | None = None,
                 enabled: bool = True):
        scale = check_scale(scale, "scale")
        self.low_scale = scale if low_scale is None else check_scale(low_scale, "low_scale")
        if isinstance(levels, bool) or not isinstance(levels, int) or levels < 2:
            raise ValueError(f"levels must be an integer >= 2 (1 band is CFG), got {levels!r}")
        self.levels = levels
        self.parallel_weight = check_real(parallel_weight, "parallel_weight", 0.0, 1.0)
        super().__init__(scale, space=space, start=start, stop=stop, sigmas=sigmas, enabled=enabled)

    @property
    def config(self) -> dict:
        return {**super().config, "low_scale": self.low_scale, "levels": self.levels,
                "parallel_weight": self.parallel_weight}

    def level_scales(self) -> list[float]:
        """Each band's ``w``, highest frequency first."""
        n = self.levels - 1
        return [self.scale + (self.low_scale - self.scale) * k / n for k in range(self.levels)]

    def _branches(self) -> str:
        return "cond" if all(w == 1.0 for w in self.level_scales()) else "both"

    def combine_in_space(self, c: Tensor, u: Tensor) -> Tensor:
        check_pyramid_shape(tuple(c.shape), self.levels)
        bands = []
        for w, cb, ub in zip(self.level_scales(), laplacian_pyramid(c, self.levels),
                             laplacian_pyramid(u, self.levels), strict=True):
            delta = cb - ub
            if self.parallel_weight != 1.0:
                par, orth = project(delta, cb)
                delta = self.parallel_weight * par + orth
            bands.append(ub + w * delta)
        return collapse_pyramid(bands)
