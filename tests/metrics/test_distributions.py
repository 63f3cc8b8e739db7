"""Metrics against libraries and direct computations on shared cases."""

import numpy as np
import ot
import pytest
import torch
from sklearn.metrics.pairwise import rbf_kernel

from steerdiff.metrics import mmd_rbf, mode_weight_error, sliced_wasserstein
from steerdiff.metrics.distributions import random_projections
from steerdiff.models import GaussianMixture


def test_sliced_w2_equals_pot_on_same_projections():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(400, 5)), rng.normal(size=(400, 5)) + 0.3
    ref = ot.sliced_wasserstein_distance(a, b, p=2, projections=random_projections(5, 256, 7))
    assert sliced_wasserstein(a, b, n_projections=256, seed=7) == pytest.approx(ref, rel=1e-10)
    # Unequal sizes go through POT.
    assert sliced_wasserstein(a, b[:300], n_projections=256, seed=7) > 0


def test_sliced_w2_is_exact_w2_in_one_dimension():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(1000, 1))
    assert sliced_wasserstein(a, a + 0.7) == pytest.approx(0.7, rel=1e-10)
    assert sliced_wasserstein(a, a[::-1].copy()) == pytest.approx(0.0, abs=1e-12)


def test_mmd_matches_direct_kernel_sums():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(60, 3)), rng.normal(size=(80, 3)) + 0.5
    h = 1.3
    g = 1 / (2 * h**2)
    kxx, kyy, kxy = rbf_kernel(a, a, gamma=g), rbf_kernel(b, b, gamma=g), rbf_kernel(a, b, gamma=g)
    ref = (kxx.sum() - np.trace(kxx)) / (60 * 59) + (kyy.sum() - np.trace(kyy)) / (80 * 79) - 2 * kxy.mean()
    assert mmd_rbf(a, b, bandwidth=h) == pytest.approx(ref, rel=1e-10)
    same = mmd_rbf(rng.normal(size=(500, 3)), rng.normal(size=(500, 3)))
    assert abs(same) < 0.01 < mmd_rbf(a, b)


def test_mode_weight_error_exact_counts():
    m = GaussianMixture([0.5, 0.25, 0.25], [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], 0.1)
    x = torch.cat([m.means[0].expand(60, 2), m.means[1].expand(20, 2), m.means[2].expand(20, 2)])
    assert mode_weight_error(x, m) == pytest.approx(0.1)  # fractions (.6, .2, .2) vs (.5, .25, .25)


def test_metric_errors():
    with pytest.raises(ValueError, match="same dimension"):
        sliced_wasserstein(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        mmd_rbf(np.full((3, 2), np.nan), np.zeros((3, 2)))
