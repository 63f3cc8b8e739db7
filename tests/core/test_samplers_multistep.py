"""DPM-Solver++ (2M, 2M SDE, 3M SDE), UniPC, Euler ancestral and LMS against the exact Gaussian mixture.

Independent truths: exact samples of the mixture (``GaussianMixture.sample``) for the distribution, a reference ODE
solution computed by another integrator (DPM-Solver++(3M) with eta = 0 at 4000 steps, itself checked against Heun at
2000 steps) for the convergence orders, identities between samplers, and the closed form of the first step from
sigma = inf.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.core.ancestral import sample_euler_ancestral
from steerdiff.core.dpm_solver import sample_dpmpp_2m, sample_dpmpp_2m_sde, sample_dpmpp_3m_sde
from steerdiff.core.lms import lms_coefficients, sample_lms
from steerdiff.core.unipc import sample_unipc
from steerdiff.metrics import mode_weight_error, sliced_wasserstein
from steerdiff.models import builtin_mixture

# (method, options, stochastic)
SAMPLERS = [
    ("dpmpp_2m", {}, False),
    ("dpmpp_2m_sde", {"solver_type": "midpoint"}, True),
    ("dpmpp_2m_sde", {"solver_type": "heun"}, True),
    ("dpmpp_3m_sde", {}, True),
    ("unipc", {"variant": "bh1", "order": 2}, False),
    ("unipc", {"variant": "bh2", "order": 3}, False),
    ("euler_ancestral", {}, True),
    ("lms", {}, False),
]
STOCHASTIC = [(m, o) for m, o, s in SAMPLERS if s]
N = 10_000  # samples for the distribution tests: exact draws of 5000 already have a mode-weight error of 0.012-0.019
IDS = [f"{m}-{'-'.join(map(str, o.values()))}" if o else m for m, o, _ in SAMPLERS]


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")


@pytest.fixture(scope="module")
def gmm16d():
    return builtin_mixture("gmm16d")


@pytest.fixture(scope="module")
def exact2d(gmm2d):
    """Four exact sample sets of N and the spread of the metric between them (the exact-sample floor)."""
    exact = [gmm2d.sample(N, torch.Generator().manual_seed(100 + i)) for i in range(4)]
    spread = max(sliced_wasserstein(exact[i], exact[j]) for i in range(4) for j in range(i + 1, 4))
    return exact, spread


# --- the mixture at 50 steps ----------------------------------------------------------------------------------


# DPM-Solver++(3M) SDE on the flow grid (shift 3) misses the floor: SW 0.208 against 0.162 (1.29x; k-diffusion's own
# code gives the same path). The grid's last positive step jumps from sigma 0.0717 to 0.0090 (h = 2.07 after steps
# of about 0.65), where the third-order extrapolation with the noise term is amplified: dropping that level gives
# 0.123, and a first-order (or 2M) last step 0.123 (0.120), 100 steps 0.134. Kept as a strict xfail, not loosened.
_SHORTFALL = pytest.mark.xfail(strict=True, reason="3M SDE's third-order last step on the flow grid (see above)")
DISTRIBUTION_CASES = [
    pytest.param(m, o, st, sched, id=f"{i}-{sched}",
                 marks=[_SHORTFALL] if (m, sched) == ("dpmpp_3m_sde", "flow") else [])
    for (m, o, st), i in zip(SAMPLERS, IDS, strict=True) for sched in ("karras", "flow")
]


@pytest.mark.parametrize("method,opts,stochastic,schedule", DISTRIBUTION_CASES)
def test_reproduces_the_mixture_at_50_steps(gmm2d, exact2d, method, opts, stochastic, schedule):
    exact, spread = exact2d
    sigmas = sd.sigmas.karras(50, 0.002, 80.0) if schedule == "karras" else sd.sigmas.flow(50, shift=3.0)
    noise = sd.randn((N, 2), seeds=0, dtype=torch.float64)
    x = sd.sample(gmm2d, noise, sigmas, method=method, generator=7000, **opts)
    ours = np.mean([sliced_wasserstein(x, e) for e in exact])
    # Deterministic samplers map the noise to the mixture: within the floor. A stochastic sampler's output is a
    # fresh draw with its own sampling error (the test of ddpm in test_sampling.py allows 1.2x the same floor).
    assert ours <= (1.2 if stochastic else 1.0) * spread, (ours, spread)
    assert mode_weight_error(x, gmm2d) < 0.02


def test_the_distribution_test_can_fail(gmm2d, exact2d):
    exact, spread = exact2d
    other = sd.models.GaussianMixture(gmm2d.weights, gmm2d.means * 1.1, gmm2d.covs)  # a 10% wider ring
    x = sd.sample(other, sd.randn((N, 2), seeds=0, dtype=torch.float64), sd.sigmas.karras(50, 0.002, 80.0),
                  method="dpmpp_2m")
    assert np.mean([sliced_wasserstein(x, e) for e in exact]) > 1.2 * spread


# --- convergence order ------------------------------------------------------------------------------------------


STEPS = [16, 32, 64, 128]


@pytest.fixture(scope="module")
def ode_reference(gmm16d):
    noise = sd.randn((256, 16), seeds=3, dtype=torch.float64)
    ref = sd.sample(gmm16d, noise, _order_sigmas(4000), method="dpmpp_3m_sde", eta=0.0)
    return noise, ref


def _order_sigmas(k: int) -> torch.Tensor:
    return sd.sigmas.karras(k, 0.01, 20.0)


def _error(gmm16d, noise, ref, method, steps, **kw) -> float:
    return (sd.sample(gmm16d, noise, _order_sigmas(steps), method=method, **kw) - ref).norm(dim=1).mean().item()


def _slope(errors) -> float:
    return float(np.polyfit(np.log(STEPS), np.log(errors), 1)[0])


def test_the_ode_reference_agrees_with_heun(gmm16d, ode_reference):
    noise, ref = ode_reference
    assert _error(gmm16d, noise, ref, "heun", 2000) < 1e-5  # two integrators, same solution


def test_dpmpp_2m_is_second_order(gmm16d, ode_reference):
    noise, ref = ode_reference
    errors = [_error(gmm16d, noise, ref, "dpmpp_2m", k) for k in STEPS]
    assert abs(_slope(errors) + 2) < 0.3, (_slope(errors), errors)


@pytest.mark.parametrize("variant", ["bh1", "bh2"])
def test_unipc_orders(gmm16d, ode_reference, variant):
    # UniP-p with UniC-p is of order p + 1 (Zhao et al. 2023, Theorem 3.1): p = 2 -> 3, p = 3 -> 4. Measured here
    # (16..128 steps, Karras grid, the warm-up and the lower-order final steps included): about 2.7-2.9 and 3.6.
    noise, ref = ode_reference
    slopes = {p: _slope([_error(gmm16d, noise, ref, "unipc", k, variant=variant, order=p) for k in STEPS])
              for p in (2, 3)}
    assert slopes[2] < -2.4 and slopes[3] < -3.2, slopes
    assert slopes[3] < slopes[2] - 0.5, slopes


def test_dpmpp_3m_beats_2m_and_lms_is_higher_order(gmm16d, ode_reference):
    noise, ref = ode_reference
    e3 = [_error(gmm16d, noise, ref, "dpmpp_3m_sde", k, eta=0.0) for k in STEPS]
    e2 = [_error(gmm16d, noise, ref, "dpmpp_2m", k) for k in STEPS]
    el = [_error(gmm16d, noise, ref, "lms", k) for k in STEPS]
    assert _slope(e3) < -2.15 and all(a < b for a, b in zip(e3, e2, strict=True)), (e3, e2)
    assert _slope(el) < -2.4, el


def test_dpmpp_2m_at_10_steps_beats_heun_at_equal_nfe(gmm16d, ode_reference):
    noise, ref = ode_reference
    dpm = _error(gmm16d, noise, ref, "dpmpp_2m", 10)  # 10 NFE
    assert sd.core.nfe_of("dpmpp_2m", 10) == 10 and sd.core.nfe_of("heun", 6) == 11
    assert dpm < _error(gmm16d, noise, ref, "heun", 6)  # Heun 6 steps = 11 NFE (one more than DPM-Solver++)
    assert dpm < _error(gmm16d, noise, ref, "heun", 5)  # Heun 5 steps = 9 NFE


# --- identities -------------------------------------------------------------------------------------------------


def _draw(mixture, method, steps=12, n=64, **kw):
    noise = sd.randn((n, mixture.dim), seeds=0, dtype=torch.float64)
    return sd.sample(mixture, noise, sd.sigmas.karras(steps, 0.002, 80.0), method=method, **kw)


def test_identities(gmm2d):
    same = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)  # noqa: E731
    same(_draw(gmm2d, "dpmpp_2m_sde", eta=0.0), _draw(gmm2d, "dpmpp_2m"))  # no noise, midpoint: DPM-Solver++(2M)
    same(_draw(gmm2d, "euler_ancestral", eta=0.0), _draw(gmm2d, "euler"))
    same(_draw(gmm2d, "euler_ancestral", eta=0.6, generator=3), _draw(gmm2d, "ddim", eta=0.6, generator=3))
    same(_draw(gmm2d, "lms", order=1), _draw(gmm2d, "euler"))
    same(_draw(gmm2d, "unipc", order=1, steps=1), _draw(gmm2d, "euler", steps=1))
    # An order above what the schedule allows is lowered: 2 steps are first order (warm-up, then the final step).
    same(_draw(gmm2d, "unipc", order=3, steps=2), _draw(gmm2d, "unipc", order=1, steps=2))
    same(_draw(gmm2d, "unipc", order=3, steps=3), _draw(gmm2d, "unipc", order=2, steps=3))
    same(_draw(gmm2d, "lms", order=4, steps=2), _draw(gmm2d, "lms", order=2, steps=2))


def test_lms_coefficients_integrate_polynomials_exactly():
    # The Lagrange weights integrate any polynomial of degree < len(nodes) exactly (independent: its antiderivative).
    nodes, a, b = [3.0, 5.0, 8.0, 12.0], 3.0, 1.5
    c = lms_coefficients(nodes, a, b)
    for poly in (np.poly1d([1.0]), np.poly1d([2.0, -1.0]), np.poly1d([0.3, -2.0, 1.0, 4.0])):
        antiderivative = poly.integ()
        assert math.isclose(sum(ci * poly(t) for ci, t in zip(c, nodes, strict=True)),
                            antiderivative(b) - antiderivative(a), rel_tol=1e-12)


# --- the first step from sigma = inf ----------------------------------------------------------------------------


FUNCTIONS = {
    "dpmpp_2m": sample_dpmpp_2m, "dpmpp_2m_sde": sample_dpmpp_2m_sde, "dpmpp_3m_sde": sample_dpmpp_3m_sde,
    "unipc": sample_unipc, "euler_ancestral": sample_euler_ancestral, "lms": sample_lms,
}


def _mixture_with_limit(gmm):
    """A plain function denoiser: the mixture, and at sigma = inf its limit E[x0] (the prior mean)."""
    mean = (gmm.weights[:, None] * gmm.means).sum(0)

    def denoiser(x, sigma, step=None):
        if torch.isinf(sigma).all():
            return mean.expand_as(x).clone()
        return gmm(x, sigma)

    return denoiser, mean


@pytest.mark.parametrize("method,opts,stochastic", SAMPLERS, ids=IDS)
def test_first_step_from_inf_is_the_closed_form_and_the_rest_is_a_fresh_run(gmm2d, method, opts, stochastic):
    denoiser, mean = _mixture_with_limit(gmm2d)
    eps = sd.randn((16, 2), seeds=0, dtype=torch.float64)
    finite = sd.sigmas.karras(8, 0.002, 80.0).tolist()
    seen = []
    fn = FUNCTIONS[method]
    x = fn(denoiser, eps.clone(), [math.inf] + finite, callback=seen.append,
           noise=sd.core.SampleNoise(sd.core.make_generators(5, 16)), **opts)
    assert torch.isfinite(x).all()
    assert seen[0]["sigma"] == math.inf and torch.equal(seen[0]["x"], eps)
    x1 = seen[1]["x"]
    z = sd.core.SampleNoise(sd.core.make_generators(5, 16)).randn((16, 2), torch.float64)
    expected = mean + finite[0] * (z if stochastic else eps)  # x_1 = D_0 + sigma_1 eps, or + sigma_1 z (eta = 1)
    torch.testing.assert_close(x1, expected, rtol=1e-12, atol=1e-12)
    # Then D_0 leaves the history: the rest is the same sampler started afresh at sigma_1 from x_1, with the same
    # noise stream after the first draw.
    noise = sd.core.SampleNoise(sd.core.make_generators(5, 16))
    if stochastic:
        noise.randn((16, 2), torch.float64)
    rest = fn(denoiser, x1.clone(), finite, noise=noise, **opts)
    torch.testing.assert_close(x, rest, rtol=1e-12, atol=1e-12)


def test_euler_ancestral_from_inf_is_the_limit_of_finite_starts(gmm2d):
    denoiser, _ = _mixture_with_limit(gmm2d)
    eps = sd.randn((16, 2), seeds=0, dtype=torch.float64)
    finite = sd.sigmas.karras(8, 0.002, 80.0).tolist()
    for eta in (1.0, 0.5):
        runs = [sample_euler_ancestral(denoiser, eps * s0 if s0 < math.inf else eps, [s0] + finite, eta=eta,
                                       noise=sd.core.SampleNoise(sd.core.make_generators(5, 16)))
                for s0 in (1e9, math.inf)]
        torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=1e-6)


def _velocity_net(mixture):
    """The exact mixture as a velocity network ``v(x_t, t) = (x_t - D(x_t / (1 - t), t / (1 - t))) / t`` (at t = 1
    the denoiser at sigma = inf sees the unit noise ``x_t``)."""
    def net(x_t, t, cond=None):
        tt = t.to(torch.float64)[:, None]
        one = tt == 1
        keep = torch.where(one, torch.ones_like(tt), 1 - tt)
        sigma = torch.where(one, torch.full_like(tt, math.inf), tt / keep)
        return (x_t - mixture(x_t / keep, sigma[:, 0], cond)) / tt
    return net


@pytest.mark.parametrize("method,opts,stochastic", SAMPLERS, ids=IDS)
def test_through_flow_denoiser_from_inf_equals_the_mixture_itself(gmm16d, method, opts, stochastic):
    flow = sd.core.FlowDenoiser(_velocity_net(gmm16d), t_scale=1.0)
    sig = sd.sigmas.flow(12, shift=3.0)
    noise = sd.randn((32, 16), seeds=0, dtype=torch.float64)
    a = sd.sample(flow, noise, sig, method=method, generator=9, **opts)
    b = sd.sample(gmm16d, noise, sig, method=method, generator=9, **opts)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


# --- the sd.sample contract: per-sample noise, NFE, callback, progress, guidance -------------------------------


@pytest.mark.parametrize("method,opts", STOCHASTIC)
def test_a_sample_does_not_change_with_its_batch(gmm2d, method, opts):
    sig = sd.sigmas.flow(10, shift=3.0)

    def run(n, gens):
        return sd.sample(gmm2d, sd.randn((n, 2), seeds=0, dtype=torch.float64), sig, method=method, generator=gens,
                         **opts)

    two = run(2, [10, 11])
    assert torch.equal(run(4, [10, 11, 12, 13])[:2], two)
    assert not torch.equal(run(2, [20, 21]), two)  # the generators drive the noise


@pytest.mark.parametrize("method,opts,stochastic", SAMPLERS, ids=IDS)
def test_nfe_callback_progress_and_guidance(gmm2d, method, opts, stochastic, capsys):
    seen = []
    x, stats = _draw(gmm2d, method, steps=9, n=8, callback=seen.append, return_stats=True, progress=True,
                     generator=1, **opts)
    assert stats.nfe == sd.core.nfe_of(method, 9) == 9
    assert [c["i"] for c in seen] == list(range(9)) and seen[-1]["sigma_next"] == 0
    assert set(seen[0]) == {"i", "sigma", "sigma_next", "x", "denoised"}
    assert method in capsys.readouterr().err
    # Guided: the identity combiner is conditional sampling, at twice the NFE (one doubled batch per step).
    cond = torch.tensor([0, 3, 5, 3, 1, 2, 7, 6])
    a, st = _draw(gmm2d, method, steps=9, n=8, cond=cond, guidance=lambda dc, du, x, s: dc, return_stats=True,
                  generator=1, **opts)
    b = _draw(gmm2d, method, steps=9, n=8, cond=cond, generator=1, **opts)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert st.nfe == 18
    if not stochastic:
        assert torch.equal(gmm2d.responsibilities(b).argmax(1), cond)


# --- bad input ---------------------------------------------------------------------------------------------------


def test_bad_options_are_refused(gmm2d):
    noise = sd.randn((2, 2), seeds=0, dtype=torch.float64)
    sig = sd.sigmas.karras(4, 0.01, 10.0)
    cases = [("dpmpp_2m_sde", {"solver_type": "rk4"}, "solver_type must be one of"),
             ("unipc", {"variant": "bh3"}, "variant must be one of"),
             ("unipc", {"order": 4}, "order must be one of"),
             ("unipc", {"order": 2.0}, "order must be one of"),
             ("lms", {"order": 0}, "order must be an integer in 1..4"),
             ("unipc", {"solver_type": "bh2"}, r"solver_type= applies to methods \['dpmpp_2m_sde', 'dpmpp_3m_sde'\]"),
             ("dpmpp_3m_sde", {"solver_type": "rk4"}, "solver_type must be one of"),
             ("dpmpp_3m_sde", {"lower_order_final": 1}, "lower_order_final must be True or False"),
             ("dpmpp_2m", {"eta": 0.5}, "eta applies to methods"),
             ("dpmpp_3m_sde", {"eta": 1.5}, r"eta must lie in \[0, 1\]")]
    for method, kw, match in cases:
        with pytest.raises(ValueError, match=match):
            sd.sample(gmm2d, noise, sig, method=method, **kw)
    with pytest.raises(ValueError, match="eta must be a number in"):
        sample_dpmpp_2m_sde(gmm2d, noise, sig.tolist(), eta=-1.0)
