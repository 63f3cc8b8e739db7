"""``dpm_2``, ``dpm_2_ancestral``, ``dpmpp_2s_ancestral``, ``dpmpp_sde`` against k-diffusion's ``sample_*`` on the exact
float64 mixture (to 1e-10) with the same noise: ours draws per-sample noise from ``SampleNoise``; k-diffusion gets the
same draws, in the same order, through its ``noise_sampler(sigma, sigma_next)`` argument (for ``dpmpp_sde`` this
replaces its default Brownian tree: two draws per step)."""

from __future__ import annotations

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core import SAMPLERS, SampleNoise, make_generators
from steerdiff.models import builtin_mixture
from tests.core.test_samplers_vs_kdiffusion import _err, _kd_model, _load_kdiffusion_sampling


@pytest.fixture(scope="module")
def K():
    return _load_kdiffusion_sampling()


@pytest.fixture(scope="module")
def gmm16d():
    return builtin_mixture("gmm16d")


class _Count:
    def __init__(self, model):
        self.model, self.n = model, 0

    def __call__(self, x, sigma, **kw):
        self.n += 1
        return self.model(x, sigma, **kw)


@pytest.mark.parametrize("steps", [1, 2, 7])
def test_dpm_2_matches_kdiffusion(K, gmm16d, steps):
    noise = sd.randn((32, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    a, stats = sd.sample(gmm16d, noise, sigmas, method="dpm_2", return_stats=True)
    model = _Count(_kd_model(gmm16d))
    b = K.sample_dpm_2(model, noise * sigmas[0], sigmas, disable=True)
    assert _err(a, b) < 1e-10, _err(a, b)
    assert stats.nfe == model.n == SAMPLERS.get("dpm_2").nfe(steps) == 2 * steps - 1


STOCHASTIC = [("dpm_2_ancestral", {}, 1.0, 1), ("dpm_2_ancestral", {}, 0.5, 1),
              ("dpmpp_2s_ancestral", {}, 1.0, 1), ("dpmpp_2s_ancestral", {}, 0.4, 1),
              ("dpmpp_sde", {}, 1.0, 2), ("dpmpp_sde", {"r": 0.3}, 0.6, 2)]


@pytest.mark.parametrize("method,opts,eta,draws", STOCHASTIC)
def test_ancestral_second_order_samplers_match_kdiffusion_with_the_same_noise(K, gmm16d, method, opts, eta, draws):
    n, steps = 16, 8
    noise = sd.randn((n, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    a, stats = sd.sample(gmm16d, noise, sigmas, method=method, generator=100, eta=eta, return_stats=True, **opts)
    same = SampleNoise(make_generators(100, n))  # the generators sd.sample made: the same draws, in order
    calls = []

    def noise_sampler(sigma, sigma_next):
        calls.append(1)
        return same.randn((n, 16), torch.float64)

    model = _Count(_kd_model(gmm16d))
    b = getattr(K, f"sample_{method}")(model, noise * sigmas[0], sigmas, disable=True, eta=eta,
                                       noise_sampler=noise_sampler, **opts)
    assert len(calls) == draws * (steps - 1)  # no noise on the last step, to sigma = 0
    assert _err(a, b) < 1e-10, _err(a, b)
    assert stats.nfe == model.n == SAMPLERS.get(method).nfe(steps)
    c = sd.sample(gmm16d, noise, sigmas, method=method, generator=200, eta=eta, **opts)
    assert _err(c, b) > 1e-3  # the noise matters: the comparison above is not vacuous


@pytest.mark.parametrize("method", ["dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde"])
def test_eta_zero_is_deterministic_and_batch_invariant(gmm16d, method):
    noise = sd.randn((6, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(6, 0.002, 80.0)
    a = sd.sample(gmm16d, noise, sigmas, method=method, eta=0.0)
    b = sd.sample(gmm16d, noise, sigmas, method=method, eta=0.0)
    assert torch.equal(a, b)
    full = sd.sample(gmm16d, noise, sigmas, method=method, generator=[7, 8, 9, 10, 11, 12])
    part = sd.sample(gmm16d, noise[2:4], sigmas, method=method, generator=[9, 10])
    torch.testing.assert_close(part, full[2:4], rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["dpm_2", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde"])
def test_second_order_from_a_finite_start_converges_to_the_fine_solution(gmm16d, method):
    # eta = 0: all four are ODE solvers; a second-order method halves its error by about 4 per doubling.
    noise = sd.randn((8, 16), seeds=1, dtype=torch.float64)
    kw = {} if method == "dpm_2" else {"eta": 0.0}
    ref = sd.sample(gmm16d, noise, sd.sigmas.karras(400, 0.05, 20.0), method="heun")
    errs = [_err(sd.sample(gmm16d, noise, sd.sigmas.karras(n, 0.05, 20.0), method=method, **kw), ref)
            for n in (8, 16)]
    assert errs[1] < errs[0] / 2.5, errs


@pytest.mark.parametrize("method,eta,top", [("dpmpp_2s_ancestral", 1.0, 1e6), ("dpmpp_2s_ancestral", 0.5, 1e12)])
def test_flow_start_at_infinity_is_the_limit_of_finite_starts(method, eta, top):
    mix = builtin_mixture("gmm2d")
    noise = sd.randn((8, 2), seeds=0, dtype=torch.float64)
    kw = {} if eta is None else {"eta": eta}
    x, stats = sd.sample(mix, noise, sd.sigmas.flow(6), method=method, generator=3, return_stats=True, **kw)
    assert torch.isfinite(x).all() and stats.nfe == SAMPLERS.get(method).nfe(6)
    # The closed-form first step is the limit of the finite one: a large sigma_0 (the state noise * sigma_0) lands
    # within 1e-4 of it (the gap falls as 1/sqrt(sigma_0) below eta = 1), with the same noise. (At eta = 1 and
    # sigma_0 = 1e12, s_down = s'^2 / sigma_0 rounds to 0 in float64 and the finite step degenerates: 1e6 there.)
    tail = torch.tensor([2.0, 0.0], dtype=torch.float64)
    at_inf = sd.sample(mix, noise, torch.cat([torch.tensor([math.inf], dtype=torch.float64), tail]), method=method,
                       generator=3, **kw)
    gens = make_generators(3, 8)  # the generators sd.sample made
    model = lambda z, sb, step=None: mix(z, sb, None)  # noqa: E731
    finite = SAMPLERS.get(method).fn(model, noise * top, [top, 2.0, 0.0], noise=SampleNoise(gens), **kw)
    assert _err(at_inf, finite) < 1e-4, _err(at_inf, finite)


@pytest.mark.parametrize("method", ["dpm_2", "dpm_2_ancestral", "dpmpp_sde"])
def test_samplers_without_an_infinite_start_refuse_it(method):
    mix = builtin_mixture("gmm2d")
    with pytest.raises(ValueError, match="infinite first"):
        sd.sample(mix, sd.randn((2, 2), seeds=0, dtype=torch.float64), sd.sigmas.flow(4), method=method)


@pytest.mark.parametrize("method", ["dpm_2", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde"])
def test_guidance_runs_and_counts_two_evaluations_per_call(method):
    mix = builtin_mixture("gmm2d")
    noise = sd.randn((8, 2), seeds=0, dtype=torch.float64)
    x, stats = sd.sample(mix, noise, sd.sigmas.karras(5, 0.002, 80.0), method=method, cond=torch.arange(8) % 8,
                         guidance=sd.guidance.CFG(2.0), generator=1, return_stats=True)
    assert torch.isfinite(x).all() and stats.nfe == 2 * SAMPLERS.get(method).nfe(5)
