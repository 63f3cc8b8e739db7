"""The flow ODE -> SDE conversion (``steerdiff.core.flow_sde``, docs/methods/flow_sde.md) against independent truth.

* the closed forms of ``I = int g^2 / sigma^2 dsigma`` against numerical quadrature of each registered ``g^2``;
* ``"edm"`` at ``c = 1`` is the ancestral ``eta = 1`` split exactly (DDPM's posterior), ``"ode"`` DDIM's ``eta = 0``;
* the Euler split is RBF's Euler-Maruyama step computed in flow coordinates (``x_t``, ``v``, ``score``) by hand;
* exact and Euler splits agree as the step shrinks (same SDE);
* marginals: on an exact Gaussian mixture wrapped as a velocity network, the SDE's state at every level ``sigma_i``
  has the law of the mixture convolved with ``N(0, sigma_i^2 I)`` (mean, covariance, mean exact log-density).
"""

import math

import pytest
import torch
from exact_refs import mixture_as_flow
from scipy.integrate import quad

import steerdiff as sd
from steerdiff.core.flow_sde import FLOW_SDES, FlowSDE, as_flow_sde, vp_r, vp_sigma, vp_sigmas
from steerdiff.core.sampling import ancestral_mean, ancestral_split
from steerdiff.models import GaussianMixture

LEVELS = [(50.0, 20.0), (3.0, 2.5), (1.0, 0.3), (0.2, 0.01), (400.0, 1e-3)]


@pytest.mark.parametrize("name", sorted(set(FLOW_SDES.names()) - {"ode"}))
def test_closed_form_integrals_match_quadrature(name):
    spec = FLOW_SDES.get(name)
    for s, s1 in LEVELS:
        # substitute sigma = e^u: the integrand g^2 / sigma^2 dsigma = g^2 / sigma du is smooth on a log scale
        ref, err = quad(lambda u: spec.g2(math.exp(u)) / math.exp(u), math.log(s1), math.log(s), epsrel=1e-11)
        assert spec.integral(s1, s) == pytest.approx(ref, rel=1e-8, abs=1e-12), (s, s1)


def test_edm_is_the_ancestral_eta_1_step_and_ode_is_ddim():
    for s, s1 in LEVELS + [(math.inf, 5.0), (math.inf, 0.1), (2.0, 0.0)]:
        d, u = FlowSDE("edm").split(s, s1)
        rd, ru = ancestral_split(s, s1, 1.0)
        # abs: the reference's sqrt(s'^2 - s_up^2) cancels when s_down << s' (about 1e-16 s'^2 / s_down)
        tol = 1e-10 * s1
        assert d == pytest.approx(rd, rel=1e-12, abs=tol) and u == pytest.approx(ru, rel=1e-12, abs=tol)
        assert FlowSDE("ode").split(s, s1) == ancestral_split(s, s1, 0.0)
        assert FlowSDE("edm", scale=0.0).split(s, s1) == ancestral_split(s, s1, 0.0)


def test_exact_split_keeps_the_marginal_variance_of_a_point():
    # x = x0 + s eps -> D + s_down eps + s_up z has variance s_down^2 + s_up^2 = s'^2 for every coefficient
    for name in FLOW_SDES.names():
        for scale in (0.5, 1.0, 3.0):
            for s, s1 in LEVELS + [(math.inf, 2.0)]:
                d, u = FlowSDE(name, scale).split(s, s1)
                assert d * d + u * u == pytest.approx(s1 * s1, rel=1e-12)


@pytest.mark.parametrize("name,scale", [("rbf", 1.0), ("rbf", 3.0), ("square", 2.0), ("constant", 0.7)])
def test_euler_split_is_the_euler_maruyama_step_in_flow_time(name, scale):
    sde = FlowSDE(name, scale, step="euler")
    g = torch.Generator().manual_seed(0)
    x0, eps, z = (torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(3))
    d = x0 + 0.1 * torch.randn(5, 3, generator=g, dtype=torch.float64)  # any denoised value
    for s, s1 in [(math.inf, 3.0), (3.0, 2.0), (1.0, 0.25)]:
        t, t1 = (1.0 if math.isinf(s) else s / (1 + s)), s1 / (1 + s1)
        x = eps if math.isinf(s) else x0 + s * eps  # the samplers' state (the unit noise at inf)
        x_t = eps if math.isinf(s) else x / (1 + s)
        v = (x_t - d) / t
        score = -(x_t - (1 - t) * d) / t**2
        gt = scale * {"rbf": t, "square": t**2, "constant": 1.0}[name]
        x_t1 = x_t + (t1 - t) * (v - gt**2 / 2 * score) + gt * math.sqrt(t - t1) * z
        mean, tau = ancestral_mean(x, d, s, s1, sde)
        torch.testing.assert_close(mean + tau * z, x_t1 / (1 - t1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["rbf", "square", "constant", "edm", "vp"])
def test_exact_and_euler_splits_agree_as_the_step_shrinks(name):
    exact, euler = FlowSDE(name, 2.0), FlowSDE(name, 2.0, step="euler")
    for s in (0.3, 2.0, 10.0):
        errs = []
        for h in (1e-2, 1e-3):
            s1 = s * (1 - h)
            (a, b), (c, e) = exact.split(s, s1), euler.split(s, s1)
            errs.append((abs(a - c), abs(b * b - e * e) / (b * b)))
        assert errs[1][0] < errs[0][0] / 50 and errs[1][1] < errs[0][1] / 5  # O(h^2) means, O(h) relative variance


def test_vp_time_round_trip_and_grid():
    for r in (1e-3, 0.2, 0.7, 1.0):
        assert vp_r(vp_sigma(r)) == pytest.approx(r, rel=1e-12)
    sig = vp_sigmas(10)
    assert math.isinf(sig[0]) and sig[-1] == 0 and (sig[1:].diff() < 0).all()
    assert float(sig[5]) == pytest.approx(vp_sigma(0.5))


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="sde must be one of"):
        FlowSDE("nope")
    with pytest.raises(ValueError, match="scale"):
        FlowSDE("rbf", scale=-1.0)
    with pytest.raises(ValueError, match="step must be one of"):
        FlowSDE("rbf", step="heun")
    with pytest.raises(ValueError, match="sde must be one of"):
        as_flow_sde(3)
    with pytest.raises(ValueError, match="no finite g"):
        FlowSDE("edm", step="euler").split(math.inf, 2.0)


# ------------------------------------------------------------------------------------------------ marginals
MIX = GaussianMixture([0.3, 0.7], torch.tensor([[-1.5, 0.5], [1.0, -0.5]], dtype=torch.float64),
                      torch.tensor([[[0.2, 0.05], [0.05, 0.1]], [[0.3, 0.0], [0.0, 0.15]]], dtype=torch.float64))


def convolved(mixture, sigma):
    eye = torch.eye(mixture.means.shape[1], dtype=torch.float64)
    return GaussianMixture(mixture.weights, mixture.means, mixture.covs + sigma**2 * eye)


@pytest.mark.parametrize("sde", [FlowSDE("ode"), FlowSDE("rbf", 2.0), FlowSDE("vp"), FlowSDE("square", 3.0),
                                 FlowSDE("edm"), FlowSDE("rbf", 2.0, step="euler")])
def test_sde_marginals_are_the_odes_at_every_level(sde):
    """200 steps: the first-order discretisation bias of the mean log-density stays below about 0.05 for every
    coefficient here (the ODE's included), within the 4 standard errors + 0.02 allowed."""
    n = 4000
    sig = sd.sigmas.flow(200, shift=3.0)
    seen = {}
    probe = {20, 60, 120, 180, 198}

    def keep(info):
        if info["i"] in probe:
            seen[info["i"]] = (info["sigma"], info["x"].clone())

    x = sd.sample(mixture_as_flow(MIX), sd.randn((n, 2), seeds=1, dtype=torch.float64), sig, method="flow_sde", sde=sde,
                  generator=list(range(10**6, 10**6 + n)), callback=keep)
    seen[200] = (0.0, x)
    for i, (s, xs) in sorted(seen.items()):
        target = convolved(MIX, float(s))
        ref = target.sample(n, torch.Generator().manual_seed(i))
        mean, cov = (target.weights[:, None] * target.means).sum(0), None
        centred = target.means - mean
        cov = (target.weights[:, None, None] * (target.covs + centred[:, :, None] * centred[:, None, :])).sum(0)
        scale = cov.diagonal().sqrt()
        # mean within 4 standard errors, covariance entries within 10% of the scale, log-density as an exact draw
        assert ((xs.mean(0) - mean).abs() / scale <= 4 / math.sqrt(n)).all(), (i, xs.mean(0), mean)
        assert ((xs.T.cov() - cov).abs() / (scale[:, None] * scale[None, :]) <= 0.1).all(), (i, xs.T.cov(), cov)
        lp, lp_ref = target.log_prob(xs), target.log_prob(ref)
        se = math.sqrt((lp.var() + lp_ref.var()) / n)
        assert abs(float(lp.mean() - lp_ref.mean())) <= 4 * se + 0.02, (i, float(lp.mean()), float(lp_ref.mean()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sampler_keeps_the_models_dtype(dtype):
    def mix(x, sigma, cond=None):  # the exact denoiser evaluated in float64, answering in the state's dtype
        assert x.dtype == dtype
        return MIX(x.double(), sigma.double()).to(dtype)

    noise = sd.randn((2048, 2), seeds=0, dtype=dtype)
    x = sd.sample(mix, noise, sd.sigmas.flow(20, shift=3.0), method="flow_sde", sde=FlowSDE("rbf", 2.0), generator=0)
    assert x.dtype == dtype and torch.isfinite(x).all()
    exact = (MIX.weights[:, None] * MIX.means).sum(0)  # the mixture's mean, within 4 s.e. (std <= 1.3) + rounding
    assert ((x.double().mean(0) - exact).abs() <= 4 * 1.3 / math.sqrt(2048) + 0.02).all(), (x.double().mean(0), exact)
    with pytest.raises(ValueError, match="sde must be one of"):
        sd.sample(mix, noise, sd.sigmas.flow(5), method="flow_sde", sde="nope")
