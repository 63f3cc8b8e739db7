"""Exact quadratic tilts of the Gaussian mixture (the reward-tilted targets of DAS's validation problems;
docs/methods/das.md, "Validation problems and pass criteria") against independent truths."""

import math

import pytest
import torch

from steerdiff.models import GaussianMixture, builtin_mixture


def _snis(mixture, logw, n=400_000, seed=4):
    x, comp = mixture.sample(n, torch.Generator().manual_seed(seed), return_components=True)
    lw = logw(x)
    w = torch.softmax(lw, 0)
    mean = (w[:, None] * x).sum(0)
    ess = 1 / (w**2).sum()
    se = ((w[:, None] * (x - mean) ** 2).sum(0) / ess).sqrt()
    comp_w = torch.zeros(mixture.n_components, dtype=torch.float64).index_add_(0, comp, w)
    log_z = float(torch.logsumexp(lw, 0) - math.log(n))
    return mean, se, comp_w, ess, log_z


def _quad(A, h, r0=0.0):
    return lambda x: -0.5 * ((x @ A) * x).sum(1) + x @ h + r0


def test_quadratic_tilt_agrees_with_importance_sampling():
    m = builtin_mixture("gmm2d")  # anisotropic, unequal weights
    A = torch.tensor([[0.8, 0.3], [0.3, 0.4]], dtype=torch.float64)
    h, r0, alpha = torch.tensor([0.5, -1.0], dtype=torch.float64), 0.7, 2.0
    t = m.tilt_quadratic(A, h, alpha)
    r = _quad(A, h, r0)
    mean, se, comp_w, ess, log_z = _snis(m, lambda x: r(x) / alpha)
    assert ((mean - t.weights @ t.means).abs() < 5 * se).all()
    assert (comp_w - t.weights).abs().max() < 5 / math.sqrt(float(ess))
    assert abs(m.quadratic_log_normalizer(A, h, alpha, r0) - log_z) < 0.01
    # E_pi[r] by SNIS vs the closed form.
    x = m.sample(400_000, torch.Generator().manual_seed(5))
    w = torch.softmax(r(x) / alpha, 0)
    assert abs(float((w * r(x)).sum()) - t.expected_quadratic(A, h, r0)) < 0.01


def test_zero_curvature_is_the_linear_tilt():
    m = builtin_mixture("gmm16d")
    a = torch.linspace(-1, 1, 16, dtype=torch.float64)
    q, lin = m.tilt_quadratic(torch.zeros(16), a, 1.5), m.tilt_linear(a, 1.5)
    torch.testing.assert_close(q.weights, lin.weights, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(q.means, lin.means, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(q.covs, lin.covs, rtol=1e-9, atol=1e-10)


def test_single_gaussian_closed_form():
    S = torch.tensor([[0.5, 0.1], [0.1, 0.3]], dtype=torch.float64)
    mu = torch.tensor([1.0, -1.0], dtype=torch.float64)
    A, h = torch.diag(torch.tensor([2.0, 0.5], dtype=torch.float64)), torch.tensor([0.3, 0.2], dtype=torch.float64)
    t = GaussianMixture([1.0], mu[None], S[None]).tilt_quadratic(A, h, 1.0)
    cov = torch.linalg.inv(torch.linalg.inv(S) + A)
    torch.testing.assert_close(t.covs[0], cov)
    torch.testing.assert_close(t.means[0], cov @ (torch.linalg.solve(S, mu) + h))


def test_spec_problem_values():
    """The closed-form tilted targets of DAS's validation problems P1-P4 (docs/methods/das.md, "Validation problems
    and pass criteria")."""
    grid = [[a, b] for a in (-4.0, 0.0, 4.0) for b in (-4.0, 0.0, 4.0)]
    p1 = GaussianMixture([1.0] * 9, grid, 0.3)
    A1 = torch.tensor([0.02, 2.0])
    t = p1.tilt_quadratic(A1, None, 1.0)
    torch.testing.assert_close(t.weights[[1, 4, 7]], torch.tensor([0.3152, 0.3695, 0.3152], dtype=torch.float64),
                               atol=1e-4, rtol=0)
    torch.testing.assert_close(t.covs[0].diagonal(), torch.tensor([0.29821, 0.1875], dtype=torch.float64),
                               atol=1e-5, rtol=0)
    assert abs(t.means[7, 0] - 3.9761) < 1e-4
    assert abs(t.expected_quadratic(A1) - (-0.2907)) < 1e-4
    ang = torch.arange(8, dtype=torch.float64) * math.pi / 4
    p2 = GaussianMixture([1.0] * 8, 4 * torch.stack([ang.cos(), ang.sin()], 1), 0.3)
    A2, h2 = torch.tensor([2.0, 0.2]), torch.tensor([0.0, 0.2])
    t = p2.tilt_quadratic(A2, h2, 1.0)
    assert abs(t.weights[2] - 0.7987) < 1e-4 and abs(t.weights[6] - 0.1765) < 1e-4
    assert abs(t.expected_quadratic(A2, h2, -0.1) - (-1.3400)) < 1e-4
    p3 = GaussianMixture([1.0] * 8, 4 * torch.eye(16, dtype=torch.float64)[:8], 0.5)
    c = torch.zeros(16, dtype=torch.float64)
    c[:2] = 2
    t = p3.tilt_quadratic(4.0, 4 * c, 1.0)
    assert abs(t.weights[0] - 0.49997) < 1e-5 and abs(t.covs[0, 0, 0] - 1 / 6) < 1e-12
    assert abs(t.expected_quadratic(4.0, 4 * c, -2 * float(c @ c)) - (-7.1114)) < 1e-4
    t = p3.tilt_quadratic(0.0, torch.ones(16), 1.0)
    assert abs(t.expected_quadratic(0.0, torch.ones(16)) - 12.0) < 1e-10


def test_bad_arguments():
    m = builtin_mixture("gmm2d")
    with pytest.raises(ValueError, match="alpha"):
        m.tilt_quadratic(torch.eye(2), None, 0.0)
    with pytest.raises(ValueError, match="A must be"):
        m.tilt_quadratic(torch.ones(3, 3), None, 1.0)
    with pytest.raises(ValueError, match="h must"):
        m.tilt_quadratic(torch.eye(2), torch.ones(3), 1.0)
    with pytest.raises(ValueError, match="not normalisable"):
        m.tilt_quadratic(-1000 * torch.eye(2), None, 1.0)
