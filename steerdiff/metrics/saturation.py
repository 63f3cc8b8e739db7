"""Saturation statistics of generated images: the over-saturation that APG (Sadat et al., ICLR 2025) removes, as
measured by the APG image test (docs/methods/guidance.md, "Image test (A1-A5)").

Images arrive in the model's value range (``[-1, 1]`` for every shipped model) and are mapped to ``[0, 1]``:

* ``clip_fraction``: share of the *raw* (pre-clamp) values outside the value range;
* then, on images clamped to ``[0, 1]``:
  ``mean_saturation``: mean HSV saturation ``(max_c - min_c) / max_c`` over all pixels (0 where ``max_c = 0``),
  RGB images only; ``saturation_offset``: ``S_gen - S_data``, the image test's ``dS``;
  ``per_image_range``: mean over images of ``max - min`` over all pixels and channels.

Grayscale images (digits) have no saturation: use ``clip_fraction`` and ``per_image_range`` (as the image test does).
Everything is computed in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_RANGE = (-1.0, 1.0)


def _images(images: Tensor, name: str = "images", rgb: bool = False) -> Tensor:
    if not isinstance(images, Tensor) or images.ndim != 4 or images.shape[0] < 1:
        got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"{name} must be a tensor [N, C, H, W] with N >= 1, got {got}")
    if rgb and images.shape[1] != 3:
        raise ValueError(f"{name} must be RGB [N, 3, H, W] for saturation, got {images.shape[1]} channels")
    x = images.detach().to("cpu", torch.float64)
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains non-finite values")
    return x


def _check_range(value_range) -> tuple[float, float]:
    lo, hi = (float(v) for v in value_range)
    if not lo < hi:
        raise ValueError(f"value_range must be (lo, hi) with lo < hi, got {value_range}")
    return lo, hi


def to_unit(images: Tensor, value_range=DEFAULT_RANGE) -> Tensor:
    """Images mapped from ``value_range`` to ``[0, 1]`` and clamped there (float64)."""
    lo, hi = _check_range(value_range)
    return ((_images(images) - lo) / (hi - lo)).clamp(0.0, 1.0)


def hsv_saturation(images: Tensor, value_range=DEFAULT_RANGE) -> Tensor:
    """Per-pixel HSV saturation ``[N, H, W]`` of RGB images: ``(max_c - min_c) / max_c``, 0 where ``max_c = 0``."""
    _images(images, rgb=True)
    x = to_unit(images, value_range)
    hi, lo = x.amax(1), x.amin(1)
    black = hi == 0
    return torch.where(black, torch.zeros_like(hi), (hi - lo) / torch.where(black, torch.ones_like(hi), hi))


def mean_saturation(images: Tensor, value_range=DEFAULT_RANGE) -> float:
    """Mean HSV saturation over all pixels of all (clamped) RGB images."""
    return float(hsv_saturation(images, value_range).mean())


def saturation_offset(generated: Tensor, data: Tensor, value_range=DEFAULT_RANGE) -> float:
    """``dS = S_gen - S_data``: positive means over-saturated relative to the data."""
    return mean_saturation(generated, value_range) - mean_saturation(data, value_range)


def clip_fraction(images: Tensor, value_range=DEFAULT_RANGE) -> float:
    """Share of raw (pre-clamp) values outside ``value_range``."""
    lo, hi = _check_range(value_range)
    x = _images(images)
    return float(((x < lo) | (x > hi)).double().mean())


def per_image_range(images: Tensor, value_range=DEFAULT_RANGE) -> float:
    """Mean over images of ``max - min`` over pixels and channels, on images clamped and mapped to ``[0, 1]``."""
    x = to_unit(images, value_range).flatten(1)
    return float((x.amax(1) - x.amin(1)).mean())


def saturation_report(generated: Tensor, data: Tensor | None = None, value_range=DEFAULT_RANGE) -> dict:
    """All statistics of the APG image test for raw ``generated`` images (and ``data``, for the offsets), as floats.

    Keys: ``clip_fraction``, ``range`` and, with ``data``, ``data_range``; for RGB images also
    ``saturation`` and, with ``data``, ``data_saturation`` and ``saturation_offset``.
    """
    out = {"clip_fraction": clip_fraction(generated, value_range), "range": per_image_range(generated, value_range)}
    rgb = generated.shape[1] == 3
    if rgb:
        out["saturation"] = mean_saturation(generated, value_range)
    if data is not None:
        if data.shape[1:] != generated.shape[1:]:
            got, want = tuple(data.shape[1:]), tuple(generated.shape[1:])
            raise ValueError(f"data has shape {got} per image but generated images have {want}")
        out["data_range"] = per_image_range(data, value_range)
        if rgb:
            out["data_saturation"] = mean_saturation(data, value_range)
            out["saturation_offset"] = out["saturation"] - out["data_saturation"]
    return out
