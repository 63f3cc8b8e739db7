"""Feature-space image metrics against closed forms and brute-force computations."""

import itertools

import numpy as np
import pytest
import torch

from steerdiff.metrics.images import (
    class_accuracy,
    frechet_distance,
    frechet_from_stats,
    pairwise_diversity,
    precision_recall,
)
from steerdiff.models.classifier import ImageClassifier


def test_frechet_closed_form_diagonal():
    a, b = np.array([1.0, 4.0, 0.25]), np.array([2.0, 1.0, 1.0])
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    ref = ((mu1 - mu2) ** 2).sum() + ((np.sqrt(a) - np.sqrt(b)) ** 2).sum()
    assert frechet_from_stats(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(ref, rel=1e-10)


def test_frechet_of_samples_matches_symmetric_sqrt_formula():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 4)) @ rng.normal(size=(4, 4))
    y = rng.normal(size=(2500, 4)) @ rng.normal(size=(4, 4)) + 0.5
    s1, s2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    w, v = np.linalg.eigh(s1)
    r1 = v @ np.diag(np.sqrt(w)) @ v.T
    w2 = np.linalg.eigvalsh(r1 @ s2 @ r1)
    ref = ((x.mean(0) - y.mean(0)) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.sqrt(np.clip(w2, 0, None)).sum()
    assert frechet_distance(x, y) == pytest.approx(ref, rel=1e-8)
    assert frechet_distance(x, x) == pytest.approx(0.0, abs=1e-8)


def _brute_pr(real, gen, k):
    def radius(pts):
        return [sorted(np.linalg.norm(p - q) for q in pts)[k] for p in pts]

    rr, rg = radius(real), radius(gen)
    prec = np.mean([any(np.linalg.norm(g - r) <= rad for r, rad in zip(real, rr, strict=True)) for g in gen])
    rec = np.mean([any(np.linalg.norm(r - g) <= rad for g, rad in zip(gen, rg, strict=True)) for r in real])
    return prec, rec


def test_precision_recall_brute_force():
    rng = np.random.default_rng(1)
    real = rng.normal(size=(40, 3))
    gen = np.concatenate([rng.normal(size=(30, 3)) * 0.5, rng.normal(size=(10, 3)) + 4])  # partly off-manifold
    p, r = precision_recall(real, gen, k=3)
    bp, br = _brute_pr(real, gen, 3)
    assert (p, r) == pytest.approx((bp, br))
    assert p < 0.9 and r < 1.0


def test_diversity_brute_force():
    f = np.random.default_rng(2).normal(size=(12, 5))
    ref = np.mean([np.linalg.norm(a - b) for a, b in itertools.permutations(f, 2)])
    assert pairwise_diversity(f) == pytest.approx(ref, rel=1e-10)


def test_class_accuracy_counts_matches():
    torch.manual_seed(0)
    clf = ImageClassifier(in_channels=1, classes=[10], channels=[8, 16], feature_dim=16)
    x = torch.randn(50, 1, 8, 8)
    pred = clf.eval().predict(x)
    labels = pred.clone()
    labels[:10] = (labels[:10] + 1) % 10
    assert class_accuracy(clf, x, labels) == pytest.approx(0.8)
    two = ImageClassifier(in_channels=3, classes=[4, 4], channels=[8], feature_dim=8)
    y = torch.randn(20, 3, 12, 12)
    assert two.predict(y).shape == (20, 2)
    assert class_accuracy(two, y, two.predict(y)) == 1.0
    with pytest.raises(ValueError, match="labels must have shape"):
        class_accuracy(two, y, torch.zeros(20, dtype=torch.long))


def test_metric_input_errors():
    with pytest.raises(ValueError, match="feature widths differ"):
        frechet_distance(np.zeros((5, 2)), np.zeros((5, 3)))
    with pytest.raises(ValueError, match="k must be"):
        precision_recall(np.random.rand(5, 2), np.random.rand(5, 2), k=5)
