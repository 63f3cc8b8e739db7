"""``weighted_gaussian``: the feature Gaussian of an importance-weighted pool against unweighted references."""

import math

import numpy as np
import pytest
import torch

from steerdiff.metrics.images import weighted_gaussian


def test_equal_weights_give_the_sample_mean_and_covariance():
    f = torch.randn(200, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mu, cov, ess = weighted_gaussian(f, torch.zeros(200))
    np.testing.assert_allclose(mu, f.numpy().mean(0), atol=1e-12)
    np.testing.assert_allclose(cov, np.cov(f.numpy(), rowvar=False), atol=1e-12)
    assert ess == pytest.approx(200)


def test_weights_on_a_subset_give_that_subset_and_integer_weights_repeat_rows():
    f = torch.randn(60, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lw = torch.full((60,), -math.inf)
    lw[:20] = 0.0
    mu, cov, ess = weighted_gaussian(f, lw)
    np.testing.assert_allclose(mu, f[:20].numpy().mean(0), atol=1e-12)
    np.testing.assert_allclose(cov, np.cov(f[:20].numpy(), rowvar=False), atol=1e-12)
    assert ess == pytest.approx(20)
    # Weight 2 on a row is that row twice (the mean); log-weights shift-invariant.
    counts = torch.tensor([1.0, 2.0, 1.0, 3.0], dtype=torch.float64)
    mu2, _, _ = weighted_gaussian(f[:4], counts.log() + 7.0)
    np.testing.assert_allclose(mu2, f[:4].repeat_interleave(counts.long(), 0).numpy().mean(0), atol=1e-12)


def test_bad_weights_are_named():
    f = torch.randn(10, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="log_weights"):
        weighted_gaussian(f, torch.zeros(9))
    with pytest.raises(ValueError, match="ESS"):
        weighted_gaussian(f, torch.tensor([0.0] + [-math.inf] * 9))
