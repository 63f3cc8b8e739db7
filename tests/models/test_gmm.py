"""The analytic mixture against independent truths: direct formulas, autograd, Monte Carlo."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from steerdiff.models import GaussianMixture, builtin_mixture


@pytest.fixture(scope="module", params=["gmm2d", "gmm16d"])
def mixture(request):
    return builtin_mixture(request.param)


def test_single_gaussian_denoiser_matches_direct_formula():
    g = torch.Generator().manual_seed(0)
    L = torch.randn(3, 3, generator=g, dtype=torch.float64)
    S = L @ L.T + 0.1 * torch.eye(3, dtype=torch.float64)
    mu = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    m = GaussianMixture([1.0], mu[None], S[None])
    x = torch.randn(10, 3, generator=g, dtype=torch.float64)
    for s in (0.1, 1.0, 7.0):
        ref = mu + torch.linalg.solve(S + s**2 * torch.eye(3, dtype=torch.float64), (x - mu).T).T @ S
        torch.testing.assert_close(m(x, torch.full((10,), s, dtype=torch.float64)), ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(m(x, torch.zeros(10)), x, rtol=1e-12, atol=1e-12)


def test_log_prob_matches_scipy(mixture):
    x = mixture.sample(50, torch.Generator().manual_seed(1))
    for s in (0.0, 0.7):
        eye = torch.eye(mixture.dim, dtype=torch.float64)
        ref = np.log(sum(
            float(w) * multivariate_normal(mu.numpy(), (c + s**2 * eye).numpy()).pdf(x.numpy())
            for w, mu, c in zip(mixture.weights, mixture.means, mixture.covs, strict=True)
        ))
        np.testing.assert_allclose(mixture.log_prob(x, s).numpy(), ref, rtol=1e-9)


def test_posterior_cov_is_sigma2_times_jacobian(mixture):
    x = mixture.sample(4, torch.Generator().manual_seed(2)) + 0.3
    for s in (0.05, 0.8, 4.0):
        cov = mixture.posterior_cov(x, torch.full((4,), s))
        for b in range(4):
            jac = torch.autograd.functional.jacobian(lambda v, s=s: mixture(v[None], torch.tensor([s]))[0], x[b])
            torch.testing.assert_close(cov[b], s**2 * jac, rtol=1e-7, atol=1e-9)
            assert torch.linalg.eigvalsh(cov[b]).min() > -1e-10


def test_sample_moments(mixture):
    x = mixture.sample(200_000, torch.Generator().manual_seed(3))
    mean = mixture.weights @ mixture.means
    d = mixture.means - mean
    cov = (mixture.weights[:, None, None] * (mixture.covs + d[:, :, None] * d[:, None, :])).sum(0)
    se = (cov.diagonal() / x.shape[0]).sqrt()
    assert ((x.mean(0) - mean).abs() < 5 * se).all()
    torch.testing.assert_close(torch.cov(x.T), cov, rtol=0.05, atol=0.05)


def _snis(mixture, logw, n=400_000, seed=4):
    """Self-normalised importance sampling from the mixture: mean, SE and per-component weights."""
    x, comp = mixture.sample(n, torch.Generator().manual_seed(seed), return_components=True)
    w = torch.softmax(logw(x), 0)
    mean = (w[:, None] * x).sum(0)
    ess = 1 / (w**2).sum()
    se = (((w[:, None] * (x - mean) ** 2).sum(0)) / ess).sqrt()
    comp_w = torch.zeros(mixture.n_components, dtype=torch.float64).index_add_(0, comp, w)
    return mean, se, comp_w, ess


def test_tilt_linear_agrees_with_importance_sampling():
    m = builtin_mixture("gmm2d")
    a, alpha = torch.tensor([1.0, 0.5], dtype=torch.float64), 2.0
    tilted = m.tilt_linear(a, alpha)
    mean, se, comp_w, ess = _snis(m, lambda x: x @ a / alpha)
    exact_mean = tilted.weights @ tilted.means
    assert ((mean - exact_mean).abs() < 5 * se).all(), (mean, exact_mean, se)
    assert (comp_w - tilted.weights).abs().max() < 5 / math.sqrt(float(ess))
    # The tilt moves mass toward +a: the weight of the mode most aligned with a grows.
    k = int((m.means @ a).argmax())
    assert tilted.weights[k] > m.weights[k]


def test_posterior_linear_agrees_with_importance_sampling():
    m = builtin_mixture("gmm2d")
    A = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    y, noise_std = torch.tensor([1.5], dtype=torch.float64), 0.5
    post = m.posterior_linear(A, y, noise_std)
    mean, se, comp_w, ess = _snis(m, lambda x: -0.5 * ((x @ A.T - y) ** 2).sum(1) / noise_std**2)
    assert ((mean - post.weights @ post.means).abs() < 5 * se).all()
    assert (comp_w - post.weights).abs().max() < 5 / math.sqrt(float(ess))


def test_conditioning_restricts_components():
    m = builtin_mixture("gmm2d")
    x = torch.randn(6, 2, dtype=torch.float64)
    sigma = torch.full((6,), 1.5)
    cond = torch.tensor([2, 2, 2, 5, 5, 5])
    d = m(x, sigma, cond)
    torch.testing.assert_close(d[:3], m.restrict(torch.tensor(2))(x[:3], sigma[:3]), rtol=1e-12, atol=1e-12)
    # A single Gaussian component: the restricted denoiser is that component's linear formula.
    torch.testing.assert_close(m(x, sigma, torch.full((6,), -1)), m(x, sigma), rtol=0, atol=0)
    with pytest.raises(ValueError, match="matches no component"):
        m(x[:1], sigma[:1], torch.tensor([42]))
