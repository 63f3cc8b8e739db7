"""Saturation statistics (the APG image test's; docs/methods/guidance.md, "Image test (A1-A5)") against hand-made images
and matplotlib's RGB->HSV conversion."""

import numpy as np
import pytest
import torch

from steerdiff.metrics.saturation import (
    clip_fraction,
    hsv_saturation,
    mean_saturation,
    per_image_range,
    saturation_offset,
    saturation_report,
    to_unit,
)


def _solid(rgb, n=2, size=4):
    """Images in [-1, 1] of one colour given in [0, 1]."""
    return (2 * torch.tensor(rgb, dtype=torch.float64) - 1).reshape(1, 3, 1, 1).expand(n, 3, size, size).clone()


def test_known_colours():
    assert mean_saturation(_solid([1.0, 0.0, 0.0])) == pytest.approx(1.0)
    assert mean_saturation(_solid([0.5, 0.5, 0.5])) == 0.0
    assert mean_saturation(_solid([0.8, 0.4, 0.4])) == pytest.approx(0.5)
    black = _solid([0.0, 0.0, 0.0])
    s = hsv_saturation(black)
    assert torch.isfinite(s).all() and (s == 0).all()  # max_c = 0: saturation 0, not NaN


def test_matches_matplotlib_hsv():
    colors = pytest.importorskip("matplotlib.colors")
    g = torch.Generator().manual_seed(0)
    x = torch.rand(5, 3, 6, 7, generator=g, dtype=torch.float64) * 2.6 - 1.3  # partly outside [-1, 1]
    x[0, :, 0, 0] = -1.0  # a black pixel
    unit = to_unit(x).permute(0, 2, 3, 1).numpy()
    ref = colors.rgb_to_hsv(unit)[..., 1]
    np.testing.assert_allclose(hsv_saturation(x).numpy(), ref, rtol=1e-12, atol=1e-12)


def test_offset_clip_and_range():
    data = _solid([0.8, 0.4, 0.4])  # S = 0.5
    gen = _solid([1.0, 0.0, 0.0])  # S = 1
    assert saturation_offset(gen, data) == pytest.approx(0.5)
    raw = torch.zeros(2, 1, 2, 2, dtype=torch.float64)
    raw[0, 0, 0, 0], raw[0, 0, 0, 1], raw[1, 0, 1, 1] = 1.5, -1.0, -3.0  # two values outside [-1, 1]
    assert clip_fraction(raw) == pytest.approx(2 / 8)
    # Per image in [0, 1] after clamping: image 0 spans 0..1 (1.5 clamps to 1), image 1 spans 0..0.5.
    assert per_image_range(raw) == pytest.approx((1.0 + 0.5) / 2)
    assert clip_fraction(raw, value_range=(-4, 4)) == 0.0


def test_report_grayscale_and_rgb():
    gray = torch.linspace(-1.2, 1.0, 2 * 64, dtype=torch.float64).reshape(2, 1, 8, 8)
    rep = saturation_report(gray, gray)
    assert set(rep) == {"clip_fraction", "range", "data_range"}
    rgb = saturation_report(_solid([1.0, 0.0, 0.0]), _solid([0.8, 0.4, 0.4]))
    assert rgb["saturation_offset"] == pytest.approx(0.5)
    assert rgb["clip_fraction"] == 0.0


def test_bad_input():
    with pytest.raises(ValueError, match="RGB"):
        mean_saturation(torch.zeros(2, 1, 4, 4))
    with pytest.raises(ValueError, match="non-finite"):
        clip_fraction(torch.full((1, 1, 2, 2), float("nan")))
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        per_image_range(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="lo < hi"):
        clip_fraction(torch.zeros(1, 1, 2, 2), value_range=(1, -1))
