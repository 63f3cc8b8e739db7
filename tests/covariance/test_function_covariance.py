"""``covariance=`` takes a plain function ``c(x, sigma, cond)``: the exact mixture covariance given as a function
samples exactly as the built-in oracle source does."""

import pytest
import torch

import steerdiff as sd
from steerdiff.app.protocols.ocm import spec_mixture
from steerdiff.core.sigmas import vp_linear
from steerdiff.covariance.kernel import mixture_diag_cov


def test_a_covariance_function_equals_the_oracle_source():
    gmm = spec_mixture("gmm2d")
    noise = sd.randn((64, 2), seeds=0, dtype=torch.float64)
    sig = vp_linear(6)
    oracle = sd.sample(gmm, noise, sig, method="ocm-ddpm", covariance=gmm, generator=0)
    as_function = sd.sample(gmm, noise, sig, method="ocm-ddpm", generator=0,
                            covariance=lambda x, sigma, cond: mixture_diag_cov(gmm, x, sigma, cond))
    assert torch.equal(oracle, as_function)


def test_a_covariance_function_of_the_wrong_shape_is_named():
    gmm = spec_mixture("gmm2d")
    noise = sd.randn((4, 2), seeds=0, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"covariance function must return diag Cov\[x0 \| x\] of x's shape"):
        sd.sample(gmm, noise, vp_linear(3), method="ocm-ddpm", covariance=lambda x, s, c: x.sum(1))
