"""Ready-made rewards: digits classifier log-probability, ink, symmetry, parsing, weighted sums, quadratics."""

import math

import pytest
import torch

from steerdiff.align.rewards import (
    ClassLogProb,
    Quadratic,
    WeightedSum,
    as_reward,
    from_spec,
    heldout_digits_classifier,
    ink,
    multi_objective,
    symmetry,
)
from steerdiff.data.digits import load_digits
from steerdiff.models import GaussianMixture
from steerdiff.models.io import load, shipped_models

needs_clf = pytest.mark.skipif("digits_classifier" not in shipped_models(), reason="no shipped classifier")


@needs_clf
def test_class_log_prob_on_real_digits():
    clf = load("digits_classifier")
    x, y = load_digits("test")
    r3 = ClassLogProb(clf, 3)
    with torch.no_grad():
        v = r3(x)
    assert v.shape == (x.shape[0],) and (v <= 0).all()
    assert float(v[y == 3].mean()) > math.log(0.5) > float(v[y != 3].mean())
    xx = x[:4].clone().requires_grad_(True)
    (g,) = torch.autograd.grad(r3(xx).sum(), xx)
    assert torch.isfinite(g).all() and g.abs().sum() > 0
    assert r3(x[:2].double()).dtype == torch.float64  # follows the sample dtype
    with pytest.raises(ValueError, match="target class"):
        ClassLogProb(clf, 10)


def test_ink_and_symmetry():
    blank, full = -torch.ones(2, 1, 8, 8), torch.ones(2, 1, 8, 8)
    torch.testing.assert_close(ink(blank), torch.zeros(2))
    torch.testing.assert_close(ink(full), torch.ones(2))
    half = blank.clone()
    half[..., :4] = 1.0  # left half inked: maximally asymmetric
    assert float(symmetry(full)[0]) == 0.0 and float(symmetry(half)[0]) == -4.0
    mirror = torch.randn(3, 1, 8, 8)
    assert symmetry(mirror + mirror.flip(-1)).abs().max() < 1e-6
    x = torch.randn(3, 1, 8, 8, requires_grad=True)
    (g,) = torch.autograd.grad(symmetry(x).sum() + ink(x).sum(), x)
    assert torch.isfinite(g).all()


def test_from_spec_and_weighted_sums():
    x = torch.randn(5, 1, 8, 8)
    r = from_spec("0.5*ink+symmetry")
    assert isinstance(r, WeightedSum)
    torch.testing.assert_close(r(x), 0.5 * ink(x) + symmetry(x))
    torch.testing.assert_close(r.components(x), torch.stack([ink(x), symmetry(x)]))
    assert from_spec("ink") is ink
    lin = from_spec("linear:1,-2")
    torch.testing.assert_close(lin(torch.tensor([[1.0, 1.0]])), torch.tensor([-1.0]))
    for bad, match in [("nope", "unknown reward"), ("x*ink", "bad weight"), ("class:3", "needs a classifier")]:
        with pytest.raises(ValueError, match=match):
            from_spec(bad)
    mo = multi_objective(ink, symmetry, 0.25, scale2=20.0)
    torch.testing.assert_close(mo(x), 0.25 * ink(x) + 0.75 * 20 * symmetry(x))
    with pytest.raises(ValueError, match="w must"):
        multi_objective(ink, symmetry, 1.5)
    assert isinstance(as_reward([(1.0, ink), (2.0, symmetry)]), WeightedSum)
    with pytest.raises(TypeError, match="pairs"):
        as_reward([ink, symmetry])


def test_quadratic_reward_and_its_exact_tilt():
    q = Quadratic.around([1.0, 2.0], c=[1.0, -1.0], b=[0.5, 0.0])
    x = torch.randn(7, 2, dtype=torch.float64)
    ref = -0.5 * (((x - torch.tensor([1.0, -1.0])) ** 2) * torch.tensor([1.0, 2.0])).sum(1) + 0.5 * x[:, 0]
    torch.testing.assert_close(q(x), ref.double())
    combo = Quadratic.combine([(0.3, q), (0.7, Quadratic([0.0, 0.0], [1.0, 0.0]))])
    torch.testing.assert_close(combo(x), 0.3 * q(x) + 0.7 * x[:, 0])
    mix = GaussianMixture([0.5, 0.5], [[-1.0, 0.0], [1.0, 1.0]], 0.4)
    t = q.tilt(mix, 2.0)
    ref = mix.tilt_quadratic(q.A, q.h, 2.0)
    torch.testing.assert_close(t.weights, ref.weights)
    assert q.expected(t) == t.expected_quadratic(q.A, q.h, q.r0)


def test_heldout_digits_classifier_is_accurate_and_differentiable():
    logp, acc = heldout_digits_classifier()
    assert acc > 0.9
    x = load_digits("test")[0][:3].clone().requires_grad_(True)
    (g,) = torch.autograd.grad(logp(x)[:, 3].sum(), x)
    assert logp(x).shape == (3, 10) and torch.isfinite(g).all()
