"""DAS, TDS, best-of-N and reward guidance on a flow schedule that starts at sigma = inf.

Independent truths: the law of the model chain of one Gaussian ``N(0, v0 I)`` (the chain from ``inf`` moves to
``D_0 + sigma_1 z = sigma_1 z`` first, so from there it is the chain started at ``sigma_1``, whose moments
``gaussian_chain_moments`` computes in closed form), tilted by a linear reward (U1 of docs/methods/das.md:
``N(v 1, v I)``); and the limit: a run from a huge finite ``sigma_0`` approaches the run from ``inf`` as
``O(1/sigma_0)``, with the same generators.
"""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.align import best_of_n, das, reward_guidance, tds
from steerdiff.align.rewards import Linear
from steerdiff.app.protocols.das import IsotropicMixture, gaussian_chain_moments
from steerdiff.models import GaussianMixture, builtin_mixture


def _noise(rows, d, seed=0):
    return sd.randn((rows, d), seeds=seed, dtype=torch.float64)


def test_u1_from_inf_tds_reaches_the_tilted_chain_law():
    sig = sd.sigmas.flow(60, shift=3.0)
    assert math.isinf(sig[0])
    mean, v = gaussian_chain_moments(0.5, sig[1:])  # the chain after its first (closed-form) step from inf
    assert abs(mean) < 1e-12
    den = IsotropicMixture(GaussianMixture([1.0], torch.zeros(1, 16, dtype=torch.float64), 0.5))
    res = tds(den, Linear(torch.ones(16)), _noise(256 * 16, 16), sig, alpha=1.0, particles=16, generator=1,
              batch_size=None)
    x = res.samples
    assert abs(float(x.mean()) - v) <= 0.03, (float(x.mean()), v)  # the tilt exp(1^T x) of N(0, v I): mean v
    assert abs(float(x.var(0).mean()) / v - 1) <= 0.10
    assert torch.isfinite(res.log_weights).all()


def test_isotropic_mixture_at_inf_is_the_exact_mixtures_limit():
    g = builtin_mixture("gmm16d")
    iso = IsotropicMixture(GaussianMixture(g.weights, g.means, 0.3))
    eps = _noise(4, 16)
    inf = torch.full((4,), math.inf, dtype=torch.float64)
    torch.testing.assert_close(iso(eps, inf), (iso.mixture.weights @ iso.mixture.means).expand(4, 16))
    torch.testing.assert_close(iso(eps, inf), iso.mixture(eps, inf))


RUNS = {
    "das": lambda g, n, s: das(g, Linear(torch.tensor([1.0, 0.5])), n, s, alpha=0.5, particles=8, generator=3),
    "das_eta": lambda g, n, s: das(g, Linear(torch.tensor([1.0, 0.5])), n, s, alpha=0.5, particles=8, eta=0.6,
                                   generator=3),
    "tds": lambda g, n, s: tds(g, Linear(torch.tensor([1.0, 0.5])), n, s, alpha=0.5, particles=8, generator=3),
    "best_of_n": lambda g, n, s: best_of_n(g, Linear(torch.tensor([1.0, 0.5])), n, s, particles=8, generator=3),
    "reward_guidance": lambda g, n, s: reward_guidance(g, Linear(torch.tensor([1.0, 0.5])), n, s, alpha=0.5,
                                                       generator=3),
}


def _perturbed_flow(mixture, amp=0.3):
    """The mixture as a velocity network plus ``amp t sin(x_t)``: D at t = 1 is ``mean - amp sin(eps)``, so the
    reward's gradient through D does not vanish at the inf step (it must be dropped: d/dx of D is 0 there)."""
    def velocity(x_t, t, cond=None):
        tt = t.to(torch.float64)[:, None]
        one = tt == 1
        keep = torch.where(one, torch.ones_like(tt), 1 - tt)
        sigma = torch.where(one, torch.full_like(tt, math.inf), tt / keep)
        return (x_t - mixture(x_t / keep, sigma[:, 0], cond)) / tt + amp * tt * torch.sin(x_t)
    return sd.FlowDenoiser(velocity, t_scale=1.0)


@pytest.mark.parametrize("model", ["mixture", "perturbed_flow"])
@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_inf_start_is_the_limit_of_a_huge_finite_start(name, model):
    g = builtin_mixture("gmm2d")
    g = g if model == "mixture" else _perturbed_flow(g)
    sig = sd.sigmas.flow(15, shift=3.0)
    noise = _noise(32, 2, seed=4)
    at_inf = RUNS[name](g, noise, sig)
    finite = sig.clone()
    finite[0] = 1e8
    near = RUNS[name](g, noise, finite)
    assert torch.isfinite(at_inf.samples).all()
    # first-step deviation (|S eps| + sigma_1 |D|) / sigma_0 times the chain's Lipschitz factor: below 1e3 / sigma_0
    torch.testing.assert_close(at_inf.samples, near.samples, rtol=0, atol=1e3 / 1e8)
    assert at_inf.nfe == near.nfe


def test_align_inf_start_on_a_flow_model_runs_with_a_gradient():
    g = builtin_mixture("gmm2d")

    def velocity(x_t, t, cond=None):
        tt = t.to(torch.float64)[:, None]
        one = tt == 1
        keep = torch.where(one, torch.ones_like(tt), 1 - tt)
        sigma = torch.where(one, torch.full_like(tt, math.inf), tt / keep)
        return (x_t - g(x_t / keep, sigma[:, 0], cond)) / tt

    flow = sd.FlowDenoiser(velocity, t_scale=1.0)
    sig = sd.sigmas.flow(12, shift=3.0)
    reward = Linear(torch.tensor([1.0, 0.5]))
    a = das(flow, reward, _noise(16, 2), sig, alpha=0.5, particles=8, generator=2)
    b = das(g, reward, _noise(16, 2), sig, alpha=0.5, particles=8, generator=2)
    torch.testing.assert_close(a.samples, b.samples, rtol=0, atol=1e-8)
