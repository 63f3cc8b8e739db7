"""Tests for steerdiff.data.toy2d: shape, determinism, prefix stability, scale, geometry, errors."""

import math

import pytest
import torch

from steerdiff.data import TOY2D, checkerboard, load_toy, rings, two_moons

NAMES = sorted(TOY2D)


@pytest.mark.parametrize("name", NAMES)
def test_shape_dtype_finite(name):
    x = load_toy(name, 257, seed=1)
    assert x.shape == (257, 2) and x.dtype == torch.float32
    assert torch.isfinite(x).all()


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_seed_dependent(name):
    assert torch.equal(load_toy(name, 100, seed=3), load_toy(name, 100, seed=3))
    assert not torch.equal(load_toy(name, 100, seed=3), load_toy(name, 100, seed=4))


@pytest.mark.parametrize("name", NAMES)
def test_prefix_stable(name):
    # Point i must not depend on how many points were drawn.
    assert torch.equal(load_toy(name, 1000, seed=2)[:37], load_toy(name, 37, seed=2))


@pytest.mark.parametrize("name", NAMES)
def test_unit_scale(name):
    # Standardised for EDM with sigma_data in 0.5..1: centred, per-axis std within about 0.5..1.
    x = load_toy(name, 20000, seed=0)
    assert x.mean(0).abs().max() < 0.05
    std = x.std(0)
    assert ((std > 0.45) & (std < 1.05)).all(), std


@pytest.mark.parametrize("name", NAMES)
def test_empty(name):
    assert load_toy(name, 0).shape == (0, 2)


def test_does_not_touch_global_rng():
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    for name in NAMES:
        load_toy(name, 10)
    assert torch.equal(torch.rand(3), before)


def test_two_moons_noise_free_on_arcs():
    # Without noise every point lies on one of the two unit arcs (undo the fixed affine map first).
    x = two_moons(500, seed=0, noise=0.0).double() / 1.1 + torch.tensor([0.5, 0.25], dtype=torch.float64)
    upper = (x.norm(dim=1) - 1).abs() < 1e-5
    lower = ((x - torch.tensor([1.0, 0.5], dtype=torch.float64)).norm(dim=1) - 1).abs() < 1e-5
    assert (upper | lower).all()
    assert 0.4 < upper.double().mean() < 0.6
    assert (x[upper, 1] >= -1e-6).all() and (x[lower, 1] <= 0.5 + 1e-6).all()


def test_two_moons_rejects_negative_noise():
    with pytest.raises(ValueError, match="noise"):
        two_moons(10, noise=-0.1)


def test_rings_radii():
    r = rings(6000, seed=5).norm(dim=1)
    nearest = torch.stack([(r - c).abs() for c in (0.5, 1.0, 1.5)], dim=1).min(dim=1)
    assert (nearest.values < 0.2).all()
    # Ring weights are proportional to the radius: 1/6, 2/6, 3/6.
    share = torch.bincount(nearest.indices, minlength=3).double() / len(r)
    assert torch.allclose(share, torch.tensor([1 / 6, 2 / 6, 3 / 6], dtype=torch.float64), atol=0.03)


def test_checkerboard_dark_cells_only():
    x = checkerboard(4000, seed=7)
    assert (x >= -1).all() and (x <= 1).all()
    cell = ((x + 1) / 0.5).floor().long().clamp(0, 3)
    assert ((cell[:, 0] + cell[:, 1]) % 2 == 0).all()
    counts = torch.bincount(cell[:, 1] * 4 + cell[:, 0], minlength=16)
    assert (counts > 0).sum() == 8


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        load_toy("spirals", 10)
    for name in NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_seed_or_count(bad):
    with pytest.raises(ValueError):
        rings(10, seed=bad)
    with pytest.raises(ValueError):
        rings(bad)


def test_moons_scale_is_documented():
    std = two_moons(50000, seed=0).std(0)
    assert math.isclose(std[0].item(), 0.96, abs_tol=0.03) and math.isclose(std[1].item(), 0.56, abs_tol=0.03)
