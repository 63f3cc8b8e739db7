"""NAMM loss pieces against hand computations; constraint distances against closed forms (docs/methods/namm.md,
"Loss" and "Constraint distances")."""

import math

import pytest
import torch

from steerdiff.constrain import (
    HeatResidual,
    ICNNMap,
    ResidualMLP,
    TotalBrightness,
    brightness_digits,
    check_distance,
    constraint_loss,
    cycle_loss,
    heat_data,
    namm_loss,
    perturbation_levels,
    regularization,
    unit_circle_data,
    unit_circle_distance,
)


def test_cycle_loss_by_hand():
    x = torch.tensor([[1.0, 2.0]])
    xc = torch.tensor([[1.5, 1.0]])  # |.5|, |1| -> mean .75
    yt = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    yc = torch.tensor([[0.0, 2.0], [1.0, 0.0]])  # 0, 2, 0, 1 -> mean .75
    assert cycle_loss(x, xc, yt, yc).item() == pytest.approx(0.5 * 0.75 + 0.5 * 0.75)


def test_regularization_by_hand():
    x = torch.tensor([[1.0, -2.0]])
    xt = torch.tensor([[1.0, -1.0]])
    # sparse_icnn: |(1 - .9)/.1| = 1, |(-1 + 1.8)/.1| = 8 -> mean 4.5; fwdid: 0, 1 -> .5
    assert regularization(x, xt, 0.9, "sparse_icnn").item() == pytest.approx(4.5)
    assert regularization(x, xt, 0.9, "fwdid").item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="reg must be one of"):
        regularization(x, xt, 0.9, "l2")


def test_constraint_loss_and_levels():
    x = torch.tensor([[0.6, 0.8], [3.0, 4.0]])
    assert constraint_loss(unit_circle_distance, x).item() == pytest.approx((0 + 4) / 2)
    g = torch.Generator().manual_seed(0)
    lev = perturbation_levels(10000, 0.3, generator=g)
    assert lev.min() >= 0 and lev.max() <= 0.3 and abs(lev.mean().item() - 0.15) < 0.01
    assert torch.equal(perturbation_levels(4, 0.3, fixed=True), torch.full((4,), 0.3))


def test_namm_loss_with_identity_like_maps_by_hand():
    # g(x) = alpha x exactly when W^out = 0; f = identity at init (zero output layer).
    g_map = ICNNMap(dim=2, hidden=4, alpha=0.9)
    with torch.no_grad():
        g_map.wout.zero_()
    f_map = ResidualMLP(dim=2, hidden=4)
    x = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    sig = torch.tensor([0.1, 0.0])
    z = torch.tensor([[1.0, -1.0], [2.0, 2.0]])
    parts = namm_loss(g_map, f_map, unit_circle_distance, x, sig, z, lam_cyc=1.0, lam_con=2.0, lam_reg=0.5)
    xt = 0.9 * x
    yt = xt + sig[:, None] * z
    cyc = 0.5 * (xt - x).abs().mean() + 0.5 * (0.9 * yt - yt).abs().mean()
    con = (yt.norm(dim=1) - 1).abs().mean()
    assert parts["cycle"].item() == pytest.approx(cyc.item(), abs=1e-6)
    assert parts["constraint"].item() == pytest.approx(con.item(), abs=1e-6)
    assert parts["reg"].item() == pytest.approx(0.0, abs=1e-6)
    assert parts["loss"].item() == pytest.approx(cyc.item() + 2.0 * con.item(), abs=1e-6)
    # finetuning form: the perturbed points are centred on the given mirror samples instead of g(x)
    base = torch.tensor([[2.0, 0.0], [0.0, 0.5]])
    ft = namm_loss(g_map, f_map, unit_circle_distance, x, sig, z, mirror_base=base)
    assert ft["constraint"].item() == pytest.approx(((base + sig[:, None] * z).norm(dim=1) - 1).abs().mean().item(),
                                                    abs=1e-6)


def test_unit_circle_distance_closed_form():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.0, -1.0], [0.5, 0.0]])
    assert torch.allclose(unit_circle_distance(x), torch.tensor([4.0, 1.0, 0.0, 0.5]))
    data = unit_circle_data(1000, seed=3)
    assert unit_circle_distance(data).max() < 1e-6
    theta = torch.atan2(data[:, 1], data[:, 0])
    # half the points are N(1, 0.4^2) in angle: the fraction within one std of 1 exceeds 0.5 * 0.68 + 0.5 * 0.8 / (2 pi)
    frac = ((theta - 1).abs() < 0.4).double().mean().item()
    assert 0.30 < frac < 0.55


def test_total_brightness_closed_form_and_digits():
    d = TotalBrightness(20.0)
    x = torch.zeros(2, 1, 2, 2)
    x[0] = 5.0  # sum 20 -> 0
    x[1, 0, 0, 0] = 3.0  # sum 3 -> 17
    assert torch.allclose(d(x), torch.tensor([0.0, 17.0]))
    xb, y = brightness_digits("test")
    assert xb.shape == (359, 1, 8, 8) and y.shape == (359,)
    assert d(xb).max() < 1e-4 and xb.min() >= 0


def test_heat_residual_closed_form():
    h = HeatResidual(0.2)
    u = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    # Phi(u)_i = u_i + .2 (u_{i+1} - 2u_i + u_{i-1}) periodic -> [.2, .6, .2, 0]
    assert torch.allclose(h.step(u), torch.tensor([[0.2, 0.6, 0.2, 0.0]]))
    x = torch.stack([u, h.step(u)], 1)  # [1, 2, 4]: exact trajectory
    assert h(x).item() == pytest.approx(0.0)
    x2 = x.clone()
    x2[0, 1, 0] += 0.4
    assert h(x2).item() == pytest.approx(0.4 / 4)
    data = heat_data(8, steps=5, points=16)
    assert data.shape == (8, 1, 5, 16) and h(data).max() < 1e-6


def test_check_distance_errors():
    x = torch.randn(4, 2)
    with pytest.raises(ValueError, match=r"distance must return one value per sample, shape \[B\] = \[4\]"):
        check_distance(lambda v: v.norm(dim=1, keepdim=True), x)
    with pytest.raises(ValueError, match="distance returned NaN"):
        check_distance(lambda v: torch.full((4,), math.nan), x)
    with pytest.raises(ValueError, match="negative"):
        check_distance(lambda v: -v.norm(dim=1), x)
    with pytest.raises(TypeError, match="must return a tensor"):
        check_distance(lambda v: 1.0, x)
