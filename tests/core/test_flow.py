"""Flow models in the one convention, sampled from sigma = inf, against closed forms.

Independent truths: the exact Gaussian mixture (its denoiser, its samples); the mixture rewritten as a flow network
through the flow identities ``x_t = x / (1 + sigma)``, ``t = sigma / (1 + sigma)``, ``v = (x_t - E[x0 | x_t]) / t``;
the probability-flow ODE of a single Gaussian ``N(mu, S)`` started at pure noise, whose solution is
``x(sigma) = mu + (S + sigma^2 I)^(1/2) eps`` (the flow of a Gaussian is linear in ``x``).
"""

import math

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.core import FlowDenoiser, nfe_of
from steerdiff.metrics import mode_weight_error, sliced_wasserstein
from steerdiff.models import GaussianMixture, builtin_mixture

METHODS = ("euler", "heun", "ddim", "ddpm")
INF = math.inf


def _kw(method):
    """Sampler arguments: a seed for the stochastic ones, and a DDIM eta strictly inside (0, 1)."""
    return {"ddim": {"generator": 7, "eta": 0.5}, "ddpm": {"generator": 7}}.get(method, {})


def _exact_flow_net(mixture, prediction="velocity"):
    """The mixture as a flow network ``net(x_t, t) -> v | x0 | eps`` (t = 1: the denoiser at sigma = inf with the
    unit noise ``x = x_t``, i.e. the prior mean)."""
    def net(x_t, t, cond=None):
        tt = t.to(torch.float64)[:, None]
        one = tt == 1
        keep = torch.where(one, torch.ones_like(tt), 1 - tt)  # 1 - t, replaced by 1 at t = 1 (x = x_t there)
        sigma = torch.where(one, torch.full_like(tt, INF), tt / keep)
        d = mixture(x_t / keep, sigma[:, 0], cond)
        if prediction == "velocity":
            return (x_t - d) / tt
        if prediction == "x0":
            return d
        return (x_t - (1 - tt) * d) / tt  # eps = (x_t - (1 - t) x0) / t
    return net


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")


@pytest.mark.parametrize("prediction", ["velocity", "x0", "eps"])
def test_flow_denoiser_is_the_exact_denoiser_for_each_prediction(gmm2d, prediction):
    seen = []

    def net(x_t, t, cond=None):
        seen.append(t.clone())
        return _exact_flow_net(gmm2d, prediction)(x_t, t / 1000.0, cond)

    d = FlowDenoiser(net, prediction=prediction, t_scale=1000.0)
    x = sd.randn((6, 2), seeds=0, dtype=torch.float64) * 3
    sigma = torch.tensor([0.01, 0.3, 1.0, 4.0, 50.0, 1e4], dtype=torch.float64)
    torch.testing.assert_close(d(x, sigma), gmm2d(x, sigma), rtol=0, atol=1e-11)
    torch.testing.assert_close(seen[0], 1000 * sigma / (1 + sigma), rtol=1e-14, atol=0)  # t * t_scale
    if prediction != "eps":  # at sigma = inf: x is the unit noise, D the prior mean
        prior_mean = gmm2d.weights @ gmm2d.means
        out = d(x, torch.full((6,), INF, dtype=torch.float64))
        torch.testing.assert_close(out, prior_mean.expand(6, 2), rtol=0, atol=1e-12)
        assert seen[-1].eq(1000.0).all()


def test_exact_mixture_at_sigma_inf_is_the_prior_mean_under_a_condition(gmm2d):
    eps = sd.randn((3, 2), seeds=1, dtype=torch.float64)
    cond = torch.tensor([2, -1, 5])
    out = gmm2d(eps, torch.full((3,), INF, dtype=torch.float64), cond)
    torch.testing.assert_close(out[0], gmm2d.means[2])
    torch.testing.assert_close(out[1], gmm2d.weights @ gmm2d.means)
    torch.testing.assert_close(out[2], gmm2d.means[5])
    # the limit from below: sigma = 1e7 with x = 1e7 * eps is the prior mean up to O(1/sigma)
    near = gmm2d(1e7 * eps, torch.full((3,), 1e7, dtype=torch.float64), cond)
    torch.testing.assert_close(near, out, rtol=0, atol=1e-5)
    torch.testing.assert_close(gmm2d.posterior_cov(eps, torch.full((3,), INF, dtype=torch.float64))[0],
                               gmm2d.posterior_cov(1e7 * eps, torch.full((3,), 1e7, dtype=torch.float64))[0],
                               rtol=0, atol=1e-5)
    assert torch.isneginf(gmm2d.log_prob(eps, INF)).all()


@pytest.mark.parametrize("name", ["gmm2d", "gmm16d"])
@pytest.mark.parametrize("method", METHODS)
def test_mixture_as_a_velocity_network_samples_like_the_mixture(name, method):
    mixture = builtin_mixture(name)
    flow = FlowDenoiser(_exact_flow_net(mixture), t_scale=1.0)
    sig = sd.sigmas.flow(12, shift=3.0)
    assert math.isinf(sig[0])
    noise = sd.randn((64, mixture.dim), seeds=0, dtype=torch.float64)
    a, sa = sd.sample(flow, noise, sig, method=method, return_stats=True, **_kw(method))
    b, sb = sd.sample(mixture, noise, sig, method=method, return_stats=True, **_kw(method))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert sa.nfe == sb.nfe == nfe_of(method, 12)


@pytest.mark.parametrize("method", METHODS)
def test_sampling_from_sigma_inf_reproduces_the_mixture_at_50_steps(gmm2d, method):
    n = 5000
    noise = sd.randn((n, 2), seeds=0, dtype=torch.float64)
    x = sd.sample(gmm2d, noise, sd.sigmas.flow(50, shift=3.0), method=method, **_kw(method))
    exact = [gmm2d.sample(n, torch.Generator().manual_seed(100 + i)) for i in range(4)]
    floor = max(sliced_wasserstein(exact[i], exact[j]) for i in range(4) for j in range(i + 1, 4))
    ours = np.mean([sliced_wasserstein(x, e) for e in exact])
    assert ours <= floor, (method, ours, floor)
    assert mode_weight_error(x, gmm2d) < 0.02


@pytest.mark.parametrize("method", ["euler", "ddim", "ddpm"])
def test_the_inf_start_is_the_limit_of_a_huge_finite_start(gmm2d, method):
    # From a finite sigma_0 the first step sees x = sigma_0 eps; its denoised value is the prior mean plus
    # O(|S eps| / sigma_0) and its update keeps O(sigma_1 / sigma_0) of x - D, so every sample moves by C / sigma_0
    # with C of the order of the data's scale times sigma_1 (~50 here) and the flow's Lipschitz factor: a bound
    # 1e3 / sigma_0 holds, and halving 1/sigma_0 halves the gap (first order in 1/sigma_0).
    sig = sd.sigmas.flow(20, shift=3.0)
    noise = sd.randn((256, 2), seeds=1, dtype=torch.float64)
    at_inf = sd.sample(gmm2d, noise, sig, method=method, **_kw(method))
    gaps = {}
    for s0 in (1e5, 1e8):
        finite = sig.clone()
        finite[0] = s0
        gaps[s0] = (sd.sample(gmm2d, noise, finite, method=method, **_kw(method)) - at_inf).abs().max().item()
        assert gaps[s0] <= 1e3 / s0, (s0, gaps[s0])
    assert 1e3 / 3 <= gaps[1e5] / gaps[1e8] <= 3e3, gaps  # O(1/sigma_0): the gap shrinks by the ratio 1e3


def _gaussian():
    cov = torch.tensor([[0.5, 0.2], [0.2, 0.1]], dtype=torch.float64)
    mu = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    evals, evecs = torch.linalg.eigh(cov)
    return GaussianMixture([1.0], mu, cov[None]), lambda eps, s: mu + eps @ (evecs * (evals + s**2).sqrt()) @ evecs.T


def test_heuns_first_step_from_inf_is_second_order_and_its_runs_converge():
    g, exact = _gaussian()
    eps = sd.randn((64, 2), seeds=3, dtype=torch.float64)
    local = {}
    for method in ("euler", "heun"):
        hs, errs = [0.4, 0.2, 0.1, 0.05], []
        for h in hs:  # one step from t = 1 to t = 1 - h; error in the flow state x_t = x / (1 + sigma)
            s1 = (1 - h) / h
            seen = []
            sd.sample(g, eps, torch.tensor([INF, s1, 0.0], dtype=torch.float64), method=method, callback=seen.append)
            errs.append(((seen[1]["x"] - exact(eps, s1)).norm(dim=1).mean() / (1 + s1)).item())
        local[method] = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    assert 1.7 < local["euler"] < 2.5, local  # local error O(h^2): first order
    assert local["heun"] > 2.8, local  # local error O(h^3): second order
    orders = {}
    for method in ("euler", "heun"):
        ks = [8, 16, 32, 64]
        errs = [(sd.sample(g, eps, sd.sigmas.flow(k, shift=3.0), method=method) - exact(eps, 0.0)).norm(dim=1)
                .mean().item() for k in ks]
        orders[method] = -np.polyfit(np.log(ks), np.log(errs), 1)[0]
    assert 0.8 < orders["euler"] < 1.3 and 1.8 < orders["heun"] < 2.5, orders


@pytest.mark.parametrize("method", METHODS)
def test_one_step_from_pure_noise_is_the_prior_mean_and_callbacks_see_the_unit_noise(gmm2d, method):
    noise = sd.randn((5, 2), seeds=2, dtype=torch.float64)
    seen = []
    x, stats = sd.sample(gmm2d, noise, sd.sigmas.flow(1), method=method, callback=seen.append, return_stats=True,
                         **_kw(method))
    torch.testing.assert_close(x, (gmm2d.weights @ gmm2d.means).expand(5, 2))
    assert stats.nfe == nfe_of(method, 1) == 1
    assert len(seen) == 1 and math.isinf(seen[0]["sigma"]) and seen[0]["x"] is noise


def test_a_flow_run_from_an_image_at_full_strength_is_a_run_from_noise(gmm2d):
    sig = sd.sigmas.flow(10, shift=3.0)
    noise = sd.randn((8, 2), seeds=4, dtype=torch.float64)
    image = torch.full((8, 2), 2.5, dtype=torch.float64)
    torch.testing.assert_close(sd.sample(gmm2d, noise, sig, method="euler", x_start=image),
                               sd.sample(gmm2d, noise, sig, method="euler"), rtol=0, atol=0)
    # a partial strength starts at a finite level: x_start + sigma * noise there, as for any schedule
    seen = []
    sd.sample(gmm2d, noise, sig, method="euler", x_start=image, strength=0.5, callback=seen.append)
    assert seen[0]["sigma"] == sig[5].item()
    torch.testing.assert_close(seen[0]["x"], image + sig[5].item() * noise, rtol=0, atol=0)


def test_flow_denoiser_forwards_shape_and_classes_and_holds_a_module():
    class Net(torch.nn.Module):
        sample_shape = (2,)
        num_classes = (8,)

        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x_t, t, cond=None):
            return self.lin(x_t) * t[:, None]

    net = Net()
    d = FlowDenoiser(net)
    assert d.sample_shape == (2,) and d.num_classes == (8,) and d.sigma_range == (0.0, INF)
    assert any(p is net.lin.weight for p in d.parameters())
    assert d.prediction == "velocity" and d.t_scale == 1000.0
    out = sd.sample(d, sd.randn((3, 2), seeds=0), sd.sigmas.flow(4), method="heun", cond=torch.tensor([0, 1, -1]))
    assert out.shape == (3, 2) and torch.isfinite(out).all()
    # a two-argument network is called without a condition
    calls = []
    d2 = FlowDenoiser(lambda x_t, t: calls.append(t) or torch.zeros_like(x_t), t_scale=1.0)
    sd.sample(d2, sd.randn((2, 2), seeds=0), sd.sigmas.flow(3), method="euler")
    assert len(calls) == 3 and calls[0].eq(1.0).all()
