"""DDNM, PiGDM, DDRM, DiffPIR and DAPS on flow priors (docs/methods/inverse.md, "Flow priors and latent pipelines").

Independent truth: (1) the limit: DDNM, DDRM and DiffPIR from ``sigma = inf`` (state ``z``, the noise direction
``eps = z``) approach the same solver from a huge finite ``s_0`` as ``O(1/s_0)``, on a flow whose ``D`` at ``inf``
depends on the noise; (2) PiGDM and DAPS, which have no limit at ``inf``, run exactly as from the documented finite
start ``max(1e3, 10 sigmas[1])``; (3) the exact posterior: each solver on the exact mixture wrapped as a flow model
(velocity network), on a flow schedule from ``inf``, meets the same exact-sample bounds as on the EDM mixture
(tests/inverse/test_inverse_new_solvers.py), on a one-mode and a two-mode problem.
"""

import math

import pytest
import torch
from exact_refs import EXACT_CASES, exact_band, exact_case, mixture_as_flow

import steerdiff as sd
from steerdiff.app.protocols import inverse as V
from steerdiff.inverse import solve
from steerdiff.inverse.metrics import posterior_metrics
from steerdiff.models import builtin_mixture

A = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
Y = torch.tensor([[1.5], [-2.0]], dtype=torch.float64)
N = 400
METHODS = ("ddnm", "pigdm", "ddrm", "diffpir", "daps")
# bias allowance per method (mean_err, |diversity - 1|, sw2): the EDM test's (test_inverse_new_solvers.TOL)
TOL = {
    "gauss": {"ddnm": (0.03, 0.06, 0.03), "pigdm": (0.04, 0.06, 0.03), "ddrm": (0.1, 0.25, 0.08),
              "diffpir": (0.35, 0.45, 0.35), "daps": (0.3, 0.45, 0.3)},
    "g1": {"ddnm": (0.08, 0.15, 0.1), "pigdm": (0.25, 0.15, 0.3), "ddrm": (0.1, 0.15, 0.1),
           "diffpir": (0.2, 0.15, 0.15), "daps": (0.3, 0.15, 0.3)},
}


@pytest.mark.parametrize(("method", "noise_std"), [("ddnm", 0.0), ("ddnm", 0.1), ("ddrm", 0.1), ("ddrm", 0.0),
                                                   ("diffpir", 0.1), ("diffpir", 0.0)])
def test_inf_start_is_the_limit_of_a_huge_finite_start(method, noise_std):
    flow = mixture_as_flow(builtin_mixture("gmm2d"), amp=0.3)
    levels = sd.sigmas.flow(20, shift=3.0)[:-1]
    finite = levels.clone()
    finite[0] = 1e7
    # eta = 0 (DDIM): the state's direction is kept to the end, so the start shows in the samples
    kw = {"noise_std": noise_std, "chains": 4, "generator": 3, **({"eta": 0.0} if method != "diffpir" else {})}
    seen = []
    at_inf = solve(flow, A, Y, method, sigmas=levels, callback=seen.append, **kw)
    near = solve(flow, A, Y, method, sigmas=finite, **kw)
    assert math.isinf(seen[0]["sigma"]) and at_inf.nfe == near.nfe == 20
    assert torch.isfinite(at_inf.samples).all()
    torch.testing.assert_close(at_inf.samples, near.samples, rtol=0, atol=1e3 / 1e7)
    # the start matters: a moderate finite first level gives a visibly different run
    moderate = levels.clone()
    moderate[0] = 2 * levels[1]
    assert (solve(flow, A, Y, method, sigmas=moderate, **kw).samples - at_inf.samples).abs().max() > 1e-3


@pytest.mark.parametrize("method", ["pigdm", "daps"])
def test_methods_without_a_limit_at_inf_start_at_the_documented_finite_level(method):
    flow = mixture_as_flow(builtin_mixture("gmm2d"), amp=0.3)
    levels = sd.sigmas.flow(10, shift=3.0)[:-1]
    start = max(1e3, 10 * float(levels[1]))
    finite = levels.clone()
    finite[0] = start
    kw = {"noise_std": 0.1, "chains": 4, "generator": 3, **({"langevin_steps": 5} if method == "daps" else {})}
    seen = []
    at_inf = solve(flow, A, Y, method, sigmas=levels, callback=seen.append, **kw)
    ref = solve(flow, A, Y, method, sigmas=finite, **kw)
    assert seen[0]["sigma"] == start
    assert torch.isfinite(at_inf.samples).all()
    torch.testing.assert_close(at_inf.samples, ref.samples, rtol=0, atol=0)
    assert at_inf.nfe == ref.nfe == (10 * 5 if method == "daps" else 10)


@pytest.fixture(scope="module", params=EXACT_CASES)
def case(request):
    return exact_case(request.param, N)


@pytest.mark.parametrize("method", METHODS)
def test_solver_on_a_flow_prior_from_inf_matches_the_exact_posterior(case, method):
    name, p, post, band = case
    steps = 20 if method == "daps" else 100  # 100 NFE each
    res = solve(mixture_as_flow(p.prior), p.operator, p.y, method, noise_std=p.noise_std, chains=N, generator=0,
                sigmas=sd.sigmas.flow(steps, shift=3.0)[:-1])
    assert res.nfe == 100
    got = posterior_metrics(res.samples[0], post, seed=0)
    t_mean, t_div, t_sw = TOL[name][method]
    assert got["nonfinite"] == 0
    assert got["mean_err"] <= band["mean_err"][0] + 5 * band["mean_err"][1] + t_mean, got
    assert abs(got["diversity"] - 1) <= abs(band["diversity"][0] - 1) + 5 * band["diversity"][1] + t_div, got
    assert got["sw2"] <= band["sw2"][0] + 5 * band["sw2"][1] + t_sw, got


def test_mcgdiff_inf_start_is_the_limit_of_a_huge_finite_start():
    """MCGDiff from ``sigma = inf``: no start weight (``g_inf = 1``) and the first kernel ``N(V^T D(z, inf), s_1^2)``,
    the limits of the start weight (cancelled by the first level's ``- log g_{s0}``) and of the DDPM kernel's mean
    ``c0 + (s_1^2 / s_0^2)(c - c0)`` as ``s_0 -> inf``: the run approaches the one from a huge finite ``s_0`` (same
    noise and resampling uniforms) as ``O(1 / s_0)``, and a moderate start differs."""
    flow = mixture_as_flow(builtin_mixture("gmm2d"), amp=0.3)
    levels = sd.sigmas.flow(20, shift=3.0)[:-1]
    kw = {"noise_std": 0.1, "chains": 8, "generator": 3}
    seen = []
    at_inf = solve(flow, A, Y, "mcgdiff", sigmas=levels, callback=seen.append, **kw)
    assert math.isinf(seen[0]["sigma"]) and at_inf.nfe == 20 and torch.isfinite(at_inf.samples).all()
    gaps = []
    for s0 in (1e6, 1e8):
        finite = levels.clone()
        finite[0] = s0
        gaps.append(float((solve(flow, A, Y, "mcgdiff", sigmas=finite, **kw).samples - at_inf.samples).abs().max()))
    assert gaps[1] < 1e-5 and gaps[1] < gaps[0] / 10, gaps
    moderate = levels.clone()
    moderate[0] = 2 * levels[1]
    assert (solve(flow, A, Y, "mcgdiff", sigmas=moderate, **kw).samples - at_inf.samples).abs().max() > 1e-2


# MCGDiff's allowances over its exact-sample band (tests/inverse/test_inverse_mcgdiff.py's TOL), for the mean over
# four seeds of 1600 particles, 200 levels from inf. Measured over eight seeds (mean err / spread / SW2): gauss
# 0.057 / 0.98 / 0.081 (EDM mixture on VP levels: 0.027 / 0.91 / 0.072), G1 0.058 / 1.00 / 0.151 (0.052 / 1.00 / 0.150)
MCG_TOL = {"gauss": (0.03, 0.12, 0.06), "g1": (0.06, 0.08, 0.08)}


@pytest.mark.parametrize("name", list(MCG_TOL))
def test_mcgdiff_on_a_flow_prior_from_inf_matches_the_exact_posterior(name):
    p = {"gauss": lambda: V.gauss_problem(1600), "g1": lambda: V.g1_problems(chains=1600)[3]}[name]()
    post = p.posterior
    band = exact_band(post, 1600)
    runs = [solve(mixture_as_flow(p.prior), p.operator, p.y, "mcgdiff", noise_std=p.noise_std, chains=1600,
                  generator=seed, sigmas=sd.sigmas.flow(200, shift=3.0)[:-1]) for seed in range(0, 40000, 10000)]
    assert all(r.nfe == 200 for r in runs)
    ms = [posterior_metrics(r.samples[0], post, seed=0) for r in runs]
    got = {k: sum(m[k] for m in ms) / len(ms) for k in ("mean_err", "diversity", "sw2", "nonfinite")}
    t_mean, t_div, t_sw = MCG_TOL[name]
    assert got["nonfinite"] == 0
    assert got["mean_err"] <= band["mean_err"][0] + 5 * band["mean_err"][1] + t_mean, (got, band)
    assert abs(got["diversity"] - 1) <= abs(band["diversity"][0] - 1) + 5 * band["diversity"][1] + t_div, (got, band)
    assert got["sw2"] <= band["sw2"][0] + 5 * band["sw2"][1] + t_sw, (got, band)
