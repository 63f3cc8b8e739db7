"""Composition metrics of CoInD (docs/methods/coind.md, "Metrics"): conformity, implicit-posterior divergences,
label entropy."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy

from steerdiff.guidance.compose import Compose
from steerdiff.guidance.compose_expr import satisfies
from steerdiff.metrics.composition import (
    composition_divergence,
    conformity,
    ddpm_sigma,
    implicit_posteriors,
    label_entropy,
    posterior_divergence,
)
from steerdiff.models.gmm import GaussianMixture

ATTRS = {"shape": ["square", "disk", "triangle", "plus"], "colour": ["red", "green", "blue", "yellow"]}


def test_ddpm_sigmas_match_spec():
    want = [1.240, 1.801, 2.636, 3.957, 6.174]  # docs/methods/coind.md, "Metrics": EDM units of t = 300..600
    assert torch.allclose(ddpm_sigma([300, 375, 450, 525, 600]), torch.tensor(want, dtype=torch.float64), atol=6e-4)


@pytest.mark.parametrize(
    "expr", ["shape=disk & colour=red", "shape=disk & !colour=red", "2*shape=plus & !colour={red,blue}",
             "!shape=square & !colour=yellow"]
)
def test_conformity_agrees_with_the_logic_of_the_expression(expr):
    pred = torch.tensor([[s, c] for s in range(4) for c in range(4)]).repeat(3, 1)
    pred = pred[torch.randperm(pred.shape[0], generator=torch.Generator().manual_seed(0))[:40]]
    guider = Compose(expr, 3.0, ATTRS)
    want = float(satisfies(guider.tree, pred).float().mean())
    assert math.isclose(conformity(pred, guider.terms), want)


def test_conformity_joint_term_and_bad_input():
    pred = torch.tensor([[1, 0], [1, 1], [0, 0], [1, 0]])
    assert conformity(pred, Compose("shape=disk & colour=red", 2.0, ATTRS, mode="joint").terms) == 0.5
    with pytest.raises(ValueError, match="slots"):
        conformity(pred, [((1, 0, 0), 1.0)])
    with pytest.raises(ValueError, match=r"\[N, m\]"):
        conformity(pred[:, 0], [((1, 0), 1.0)])


def test_label_entropy_matches_scipy():
    labels = torch.tensor([0, 0, 1, 2, 2, 2, 3, 1, 1, 0])
    assert math.isclose(label_entropy(labels, 4), entropy(torch.bincount(labels).numpy(), base=2))
    assert label_entropy(torch.arange(4).repeat(5), 4) == 2.0
    assert label_entropy(torch.zeros(9, dtype=torch.long), 4) == 0.0


def test_posterior_divergence_matches_definitions():
    g = torch.Generator().manual_seed(0)
    joint = torch.softmax(torch.randn(5, 6, generator=g, dtype=torch.float64), -1)
    p1 = torch.softmax(torch.randn(5, 2, generator=g, dtype=torch.float64), -1)
    p2 = torch.softmax(torch.randn(5, 3, generator=g, dtype=torch.float64), -1)
    prod = (p1[:, :, None] * p2[:, None, :]).flatten(1)
    got = posterior_divergence(joint, [p1, p2])
    js = [jensenshannon(a.numpy(), b.numpy()) ** 2 for a, b in zip(joint, prod, strict=True)]  # scipy returns the sqrt
    assert math.isclose(got["jsd"], sum(js) / 5, rel_tol=1e-9)
    kl = lambda p, q: float((p * (p / q).log()).sum())  # noqa: E731
    code = [0.5 * (kl(b, a) + kl(a, b)) for a, b in zip(joint, prod, strict=True)]
    assert math.isclose(got["jsd_code"], sum(code) / 5, rel_tol=1e-9)
    same = posterior_divergence(prod, [p1, p2])
    assert same["jsd"] < 1e-15 and same["jsd_code"] < 1e-15


def grid(interaction: float) -> GaussianMixture:
    combos = [(a, b) for a in range(3) for b in range(3)]
    lv = (-2.0, 0.0, 2.0)
    means = [[lv[a] + interaction * (a == b), lv[b] + interaction * (a == b)] for a, b in combos]
    return GaussianMixture(torch.ones(9), means, 0.09, labels=combos)


def test_divergence_zero_for_factorised_mixture_positive_for_interacting():
    """Exact: a factorised mixture's eps-MSE is additive over slots, so the joint implicit posterior is the
    product of the marginal ones; an interaction term breaks it."""
    x0 = grid(0.0).sample(40, torch.Generator().manual_seed(1))
    fact = composition_divergence(grid(0.0), x0, [3, 3], torch.Generator().manual_seed(2))
    inter = composition_divergence(grid(1.0), x0, [3, 3], torch.Generator().manual_seed(2))
    assert fact["jsd"] < 1e-12 and fact["jsd_code"] < 1e-12
    assert inter["jsd"] > 1e-3
    p_joint, (pa, pb) = implicit_posteriors(grid(0.0), x0, [3, 3], torch.Generator().manual_seed(2))
    assert p_joint.shape == (40, 9) and pa.shape == (40, 3)
    assert torch.allclose(p_joint.sum(1), torch.ones(40, dtype=torch.float64))
