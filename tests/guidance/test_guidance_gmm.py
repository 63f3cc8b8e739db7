"""Guidance on the exact Gaussian-mixture denoiser: tests G1-G5 of docs/methods/guidance.md ("Exact Gaussian-mixture
test (G1-G5)").

Setup: d = 16, four classes with means ``mu_k = 2 e_k`` and std s = 0.5, uniform prior, class 0
requested; the conditional model is the mixture restricted to component 0 (exact), the null model the whole
mixture. EDM Euler, 64 steps, sigma 80 -> 0.002, rho 7; 4000 samples (noise seeds 0..3999, shared by every run).

Statistics: overshoot ``proj = mean <x, mu_c> / ||mu_c||^2`` (data 1.0), spread
``rms = sqrt(mean ||x - mu_c||^2 / d) / s`` (data 1.0), class accuracy (nearest mean).
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import APG, CFG
from steerdiff.models import GaussianMixture

D, S, N, STEPS = 16, 0.5, 4000, 64
SCALES = (1.0, 3.0, 5.0, 10.0, 15.0)


@pytest.fixture(scope="module")
def setup():
    means = 2.0 * torch.eye(4, D, dtype=torch.float64)
    gmm = GaussianMixture(torch.ones(4), means, S**2, labels=[0, 1, 2, 3])
    noise = sd.randn((N, D), seeds=0, dtype=torch.float64)
    return gmm, noise, sd.sigmas.karras(STEPS, 0.002, 80.0, rho=7.0)


def stats(x, gmm):
    mu = gmm.means[0]
    proj = float((x @ mu).mean() / (mu @ mu))
    rms = float(((x - mu) ** 2).sum(1).mean().div(D).sqrt()) / S
    acc = float((torch.cdist(x, gmm.means).argmin(1) == 0).double().mean())
    return proj, rms, acc


@pytest.fixture(scope="module")
def runs(setup):
    """proj / rms / acc for every guider and scale used below (one Euler run each, w = 1 shared: it is D_c)."""
    gmm, noise, sig = setup
    cond = torch.zeros(N, dtype=torch.long)
    guiders = {
        "cfg": lambda w: CFG(w),
        "apg": lambda w: APG(w, eta=0.0, norm_threshold=0.0, momentum=0.0),
        "apg_mom": lambda w: APG(w, eta=0.0, norm_threshold=0.0, momentum=-0.5),
        "apg_eps": lambda w: APG(w, eta=0.0, norm_threshold=0.0, momentum=0.0, space="eps"),
    }
    plan = {"cfg": (5.0, 10.0, 15.0), "apg": SCALES[1:], "apg_mom": SCALES[1:], "apg_eps": (10.0,)}
    out = {}
    base = stats(sd.sample(gmm, noise, sig, method="euler", cond=cond, guidance=CFG(1.0)), gmm)
    for name in guiders:
        out[(name, 1.0)] = base
    for name, scales in plan.items():
        for w in scales:
            x, st = sd.sample(gmm, noise, sig, method="euler", cond=cond, guidance=guiders[name](w), return_stats=True)
            assert st.nfe == 2 * STEPS
            out[(name, w)] = stats(x, gmm)
    return out


def test_w1_is_the_conditional_model(setup, runs):
    """All guiders at w = 1 are D_c; the samples then follow the data (proj 1, rms 1 up to Euler's error)."""
    proj, rms, acc = runs[("cfg", 1.0)]
    assert abs(proj - 1) < 0.02 and abs(rms - 1) < 0.06


def test_g1_cfg_overshoots(runs):
    for w in (5.0, 10.0, 15.0):
        assert runs[("cfg", w)][0] >= 1.3, (w, runs[("cfg", w)])


def test_g2_apg_does_not_overshoot(runs):
    for w in SCALES:
        for name in ("apg", "apg_mom"):
            assert abs(runs[(name, w)][0] - 1.0) <= 0.06, (name, w, runs[(name, w)])


def test_g3_apg_momentum_keeps_the_spread(runs):
    for w in SCALES:
        assert 0.85 <= runs[("apg_mom", w)][1] <= 1.10, (w, runs[("apg_mom", w)])


def test_g4_accuracy(runs):
    for key, (_, _, acc) in runs.items():
        assert acc >= 0.99, (key, acc)


def test_g5_eps_space_apg_differs(runs):
    """APG applied to eps (projection on the eps direction) is a different operator: it overshoots here."""
    proj_d, proj_eps = runs[("apg", 10.0)][0], runs[("apg_eps", 10.0)][0]
    assert abs(proj_eps - proj_d) >= 0.2, (proj_d, proj_eps)
    assert proj_eps >= 1.3


def test_table_cfg_overshoot_and_spread_grow_with_the_scale(runs):
    """The comparison table (the failure message): CFG's overshoot and spread both grow with w."""
    lines = ["w | CFG proj/rms | APG(eta=0,r=0,beta=0) | APG(beta=-0.5) | APG eps-space"]
    for w in SCALES:
        row = [runs.get((n, w)) for n in ("cfg", "apg", "apg_mom", "apg_eps")]
        lines.append(f"{w:g} | " + " | ".join("-" if r is None else f"{r[0]:.2f} / {r[1]:.2f}" for r in row))
    table = "\n".join(lines)
    cfg = [runs[("cfg", w)] for w in (5.0, 10.0, 15.0)]
    assert cfg[0][0] < cfg[1][0] < cfg[2][0], table
    assert cfg[0][1] < cfg[1][1] < cfg[2][1], table
