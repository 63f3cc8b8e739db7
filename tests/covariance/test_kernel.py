"""Units and exactness of OCM's Gaussian reverse kernel (unit tests U1, U3, U4 of docs/methods/ocm.md; there also
"Second-order Tweedie" and "Reverse kernel")."""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.app.protocols.ocm import spec_gaussian, spec_mixture
from steerdiff.core.sigmas import vp_linear
from steerdiff.covariance import (
    FixedCovariance,
    kernel_coefficients,
    reverse_variance,
    sample_gaussian,
)
from steerdiff.covariance.kernel import clamp_covariance, mixture_diag_cov
from steerdiff.models import GaussianMixture


def _random_gmm3(seed=0):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(2, 3, generator=g, dtype=torch.float64)
    a = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
    covs = a @ a.mT * 0.3 + 0.1 * torch.eye(3, dtype=torch.float64)
    return GaussianMixture([0.4, 0.6], means, covs)


@pytest.mark.parametrize("sigma", [0.05, 0.7, 3.0])
def test_u1_second_order_tweedie(sigma):
    """U1: sigma^2 dD/dx and sigma^4 Hess log p + sigma^2 I both equal the closed-form Cov[x0|x] (full matrix)."""
    gmm = _random_gmm3()
    x0 = gmm.sample(5, generator=torch.Generator().manual_seed(1))
    xs = x0 + sigma * torch.randn(x0.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cov = gmm.posterior_cov(xs, torch.full((5,), sigma, dtype=torch.float64))
    for i in range(5):
        xi = xs[i : i + 1]
        s = torch.full((1,), sigma, dtype=torch.float64)
        jac = torch.autograd.functional.jacobian(lambda v, s=s: gmm(v, s)[0], xi)[:, 0, :]
        hess = torch.autograd.functional.hessian(lambda v, s=s: gmm.log_prob(v, s)[0], xi)[0, :, 0, :]
        assert (sigma**2 * jac - cov[i]).abs().max() < 1e-10
        assert (sigma**4 * hess + sigma**2 * torch.eye(3, dtype=torch.float64) - cov[i]).abs().max() < 1e-10


def test_mixture_diag_cov_matches_full_posterior_cov():
    gmm = _random_gmm3(3)
    x = gmm.sample(50, generator=torch.Generator().manual_seed(0)) + 0.8 * torch.randn(50, 3, dtype=torch.float64)
    s = torch.full((50,), 0.8, dtype=torch.float64)
    full = gmm.posterior_cov(x, s).diagonal(dim1=-2, dim2=-1)
    assert torch.allclose(mixture_diag_cov(gmm, x, s), full, atol=1e-12, rtol=0)


def _vp(sigma):
    abar = 1.0 / (1.0 + sigma**2)
    return abar, 1.0 - abar


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_u3_edm_variance_equals_vp_code_formula(eta):
    """U3: abar_s * Sigma_EDM equals the official code's VP formulas (core/diffusion/dtdpm.py) to 1e-10."""
    g = torch.Generator().manual_seed(7)
    for _ in range(50):
        t = float(torch.rand(1, generator=g) * 20 + 0.01)
        s = float(torch.rand(1, generator=g)) * t
        c = float(torch.rand(1, generator=g) * 2)
        abar_s, bbar_s = _vp(s)
        abar_t, bbar_t = _vp(t)
        beta_st = 1 - abar_t / abar_s
        tilde_beta = beta_st * bbar_s / bbar_t
        ddpm_vp = tilde_beta + abar_s * beta_st**2 / bbar_t**2 * c
        assert abs(abar_s * reverse_variance(c, t, s, "ddpm") - ddpm_vp) < 1e-10
        lam2_vp = eta**2 * tilde_beta
        ddim_vp = lam2_vp + (math.sqrt(abar_s) - math.sqrt((bbar_s - lam2_vp) * abar_t / bbar_t)) ** 2 * c
        assert abs(abar_s * reverse_variance(c, t, s, "ddim", eta) - ddim_vp) < 1e-10
        # Limits (2.3): c = 0 is beta-tilde; c = t^2/(1+t^2) is DDPM's "beta" choice.
        assert abs(abar_s * reverse_variance(0.0, t, s, "ddpm") - tilde_beta) < 1e-12
        beta_c = t**2 / (1 + t**2)
        assert abs(reverse_variance(beta_c, t, s, "ddpm") - (1 + s**2) * (t**2 - s**2) / (1 + t**2)) < 1e-10


def test_ddim_eta_one_is_ddpm_kernel():
    for t, s in [(3.0, 1.0), (0.5, 0.1)]:
        assert kernel_coefficients(t, s, "ddim", 1.0) == pytest.approx(kernel_coefficients(t, s, "ddpm"))


def test_zero_covariance_reproduces_core_ddpm_and_ddim():
    """One code path: c = 0 with the DDPM kernel is core's ``ddpm``; with the DDIM kernel (eta 0), core's ``ddim``."""
    gmm = spec_mixture("gmm2d")
    noise = sd.randn((64, 2), seeds=0, dtype=torch.float64)
    sig = vp_linear(8)
    ref = sd.sample(gmm, noise, sig, method="ddpm", generator=11)
    got = sample_gaussian(gmm, noise, sig, kind="ddpm", covariance="zero", generator=11)
    assert torch.allclose(got.samples, ref, atol=1e-10) and got.nfe == 8
    ref = sd.sample(gmm, noise, sig, method="ddim")
    got = sample_gaussian(gmm, noise, sig, kind="ddim", covariance=FixedCovariance("zero"), generator=11)
    assert torch.allclose(got.samples, ref, atol=1e-12)


def test_sd_sample_ocm_dispatch_is_sample_gaussian_and_batch_invariant():
    gmm = spec_mixture("gmm1d")
    noise = sd.randn((32, 1), seeds=0, dtype=torch.float64)
    sig = vp_linear(6)
    x, stats = sd.sample(gmm, noise, sig, method="ocm-ddim", covariance=gmm, generator=5, return_stats=True)
    ref = sample_gaussian(gmm, noise, sig, kind="ddim", covariance=gmm, generator=5)
    assert torch.equal(x, ref.samples) and stats.nfe == 6 and stats.clamped == 0
    # Row 7 alone (its own seed) gives the same sample: per-sample randomness.
    one = sd.sample(gmm, noise[7:8], sig, method="ocm-ddim", covariance=gmm, generator=[5 + 7])
    assert torch.allclose(one[0], x[7], atol=1e-12)


@pytest.mark.parametrize("kind", ["ddpm", "ddim"])
def test_u4_gaussian_exactness_and_baselines_fail(kind):
    """U4: with exact D and c the kernel is exact for Gaussian data at any step count; fixed variances are not."""
    gauss = spec_gaussian()
    mu, s2 = gauss.means[0], gauss.covs[0].diagonal()
    torch.manual_seed(0)  # global RNG (generator=None): 20,000 per-row generators would dominate the run time
    noise = torch.randn(20000, 16, dtype=torch.float64)
    for steps in (2, 3, 5):
        x = sample_gaussian(gauss, noise, vp_linear(steps), kind=kind, covariance=gauss).samples
        ratio = x.var(0) / s2
        assert ratio.min() >= 0.94 and ratio.max() <= 1.06, (steps, ratio.min(), ratio.max())
        assert (x.mean(0) - mu).abs().max() < 0.03
    baselines = [("ddpm", "zero"), ("ddpm", "beta")] if kind == "ddpm" else [("ddim", "zero")]
    for k, cov in baselines:
        x = sample_gaussian(gauss, noise, vp_linear(5), kind=k, covariance=cov).samples
        ratio = x.var(0) / s2
        assert ratio.min() < 0.94 or ratio.max() > 1.06, (k, cov, ratio.min(), ratio.max())


def test_clamp_counts_negative_and_nonfinite():
    c = torch.tensor([-1.0, 0.5, float("nan"), float("inf"), 3.0])
    out, neg, nan = clamp_covariance(c, 2.0)
    assert neg == 1 and nan == 2
    assert torch.equal(out, torch.tensor([0.0, 0.5, 2.0, 2.0, 2.0]))
    out, _, _ = clamp_covariance(c, math.inf)
    assert torch.isfinite(out).all() and (out >= 0).all()


@pytest.mark.parametrize("bad", [(1.0, 1.0), (1.0, 2.0), (1.0, -0.1)])
def test_kernel_rejects_bad_steps(bad):
    with pytest.raises(ValueError, match="s < t"):
        kernel_coefficients(*bad, "ddpm")
    with pytest.raises(ValueError, match="kind"):
        kernel_coefficients(2.0, 1.0, "euler")


def test_last_step_clip_bounds_only_the_last_stochastic_step():
    """The official code's last-step clip (``clip_sigma_idx = 1``): a no-op for DDIM and DDPM-beta-tilde at the digits
    bound (their last-step variance is 0 or s_1^2 (1 - s_1^2/t^2) < 1e-4), and a variance bound for OCM."""
    gmm = spec_mixture("gmm1d")
    noise = sd.randn((64, 1), seeds=0, dtype=torch.float64)
    sig = vp_linear(5)
    bound = (2 / 16 * math.sqrt(math.pi / 2)) ** 2
    for kind in ("ddpm", "ddim"):
        a = sample_gaussian(gmm, noise, sig, kind=kind, covariance="zero", generator=3).samples
        b = sample_gaussian(gmm, noise, sig, kind=kind, covariance="zero", generator=3, last_var_max=bound).samples
        assert torch.equal(a, b)
    a = sample_gaussian(gmm, noise, sig, kind="ddpm", covariance=gmm, generator=3).samples
    b = sample_gaussian(gmm, noise, sig, kind="ddpm", covariance=gmm, generator=3, last_var_max=bound).samples
    assert not torch.equal(a, b)
    # A vanishing bound makes the last stochastic step deterministic: with K = 2 (one stochastic step) OCM and
    # beta-tilde then give the same samples, whatever the generator.
    sig2 = vp_linear(2)
    a = sample_gaussian(gmm, noise, sig2, kind="ddpm", covariance=gmm, generator=3, last_var_max=1e-300).samples
    b = sample_gaussian(gmm, noise, sig2, kind="ddpm", covariance="zero", generator=9, last_var_max=1e-300).samples
    assert torch.allclose(a, b, atol=1e-12)
