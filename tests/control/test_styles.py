"""The three-style digits and the thickness descriptor of the digits protocol (spec C.7), against numpy by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from steerdiff.control.descriptors import ThicknessDescriptor, thickness_features
from steerdiff.control.styles import STYLES, reference_image, styled_digits, stylize_images
from steerdiff.data.digits import load_digits


def _plus_filter(a: np.ndarray, op) -> np.ndarray:
    """max / min over the 3x3 plus footprint, scipy's default 'reflect' border = numpy's 'symmetric' padding."""
    p = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="symmetric")
    shifts = [p[..., 1:-1, 1:-1], p[..., :-2, 1:-1], p[..., 2:, 1:-1], p[..., 1:-1, :-2], p[..., 1:-1, 2:]]
    return op(np.stack(shifts), axis=0)


def test_styles_by_hand():
    x, _ = load_digits("test")
    x = torch.as_tensor(x[:50], dtype=torch.float32)
    a = x.numpy()
    np.testing.assert_array_equal(stylize_images(x, "thick").numpy(), _plus_filter(a, np.max))
    np.testing.assert_allclose(stylize_images(x, "thin").numpy(), 0.5 * (a + _plus_filter(a, np.min)), atol=1e-7)
    assert torch.equal(stylize_images(x, "normal"), x)
    with pytest.raises(ValueError, match="style must be one of"):
        stylize_images(x, "bold")


def test_styled_digits_layout_and_reference():
    x, y, s = styled_digits("all")
    n = 1797
    assert x.shape == (3 * n, 1, 8, 8) and torch.equal(s, torch.arange(3).repeat_interleave(n))
    assert torch.equal(y[:n], y[n:2 * n])
    ref = reference_image("thick", 0)
    images, labels = load_digits("all")
    assert labels[0] == 0
    assert torch.equal(ref, stylize_images(torch.as_tensor(images[:1], dtype=torch.float32), "thick"))
    assert len(STYLES) == 3


def test_thickness_features_by_hand():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(5, 1, 8, 8, generator=g) * 2 - 1
    a = x.numpy()[:, 0]
    ink = ((a + 1) / 2).mean((1, 2))
    soft = (1 / (1 + np.exp(-a / 0.1))).mean((1, 2))
    tv = np.abs(np.diff(a, axis=2)).mean((1, 2)) + np.abs(np.diff(a, axis=1)).mean((1, 2))
    np.testing.assert_allclose(thickness_features(x).numpy(), np.stack([ink, soft, tv], 1), rtol=1e-5)
    std = torch.tensor([0.5, 2.0, 4.0])
    torch.testing.assert_close(ThicknessDescriptor(std)(x), thickness_features(x) / std)
    # thick strokes carry more ink than normal ones, thin ones less (the descriptor separates the styles)
    xs, _, s = styled_digits("all")
    h = thickness_features(xs)[:, 0]
    assert h[s == 1].mean() > h[s == 0].mean() > h[s == 2].mean()
