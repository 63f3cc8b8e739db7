"""HR's default step and its noise-share warning against exact posteriors (docs/methods/inverse.md, "Multimodal
posteriors"): the spread ratio tr Cov(chains) / tr Cov(exact posterior) of HR at its defaults on a one-mode and a
several-mode problem, and the noise share against its closed form on Gaussian components."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from steerdiff.app.protocols import inverse as V
from steerdiff.inverse import solve
from steerdiff.inverse.hybrid import HR_LR_CAP, NOISE_SHARE_WARN
from steerdiff.inverse.metrics import posterior_metrics
from steerdiff.inverse.reference import posterior_trace_cov


def hr(p: V.Problem, seed: int = 0, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = solve(p.prior, p.operator, p.y, "hr", noise_std=p.noise_std, chains=p.chains, generator=seed, **options)
    return res, posterior_metrics(res.samples[0], p.posterior, seed=seed), [str(w.message) for w in caught]


def test_hr_defaults_reach_the_spread_of_a_one_mode_posterior():
    """gauss (one Gaussian prior component, A 2x4): the default run's spread ratio is in [0.8, 1.25] and its mean
    error is a small fraction of the posterior's per-entry std; no warning."""
    p = V.gauss_problem(400)
    res, m, caught = hr(p)
    assert res.options["lr_cap"] == HR_LR_CAP and res.nfe == 100
    assert 0.8 <= m["diversity"] <= 1.25, m
    post_std = (posterior_trace_cov(p.posterior) / p.posterior.dim) ** 0.5
    assert m["mean_err"] < 0.25 * post_std and m["sw2"] < 0.5 * post_std, m
    assert caught == []


def test_hr_default_spread_on_several_mode_posteriors_stays_in_band_as_the_levels_grow():
    """G2 (8-D, four prior components, three problems; the step's former default gave 1.23 / 1.29 / 1.53 at 200 /
    400 / 800 levels, growing with the level count) and G1 (two posterior modes): HR at its defaults keeps the mean
    spread ratio in [0.8, 1.25] at 200 and 800 levels on G2 and at the default 100 on G1, which the former fixed step
    exceeds on G2 at 800 levels."""
    g2 = [V.g2_problem(s, chains=300) for s in range(3)]
    for steps in (200, 800):
        spread = np.mean([hr(p, seed=j, steps=steps)[1]["diversity"] for j, p in enumerate(g2)])
        assert 0.8 <= spread <= 1.25, (steps, spread)
    fixed = np.mean([hr(p, seed=j, steps=800, lr_cap=None)[1]["diversity"] for j, p in enumerate(g2)])
    assert fixed > 1.25  # the bug the cap fixes: a width set by Adam's step, growing with the levels
    g1 = V.g1_problems(400)[:3]
    spread = np.mean([hr(p, seed=j)[1]["diversity"] for j, p in enumerate(g1)])
    assert 0.8 <= spread <= 1.25, spread


def test_noise_share_matches_its_closed_form_and_warns_only_where_the_noise_sets_the_posterior():
    """On Gaussian components of variance c seen through A = [1, 0] the noise share is sigma_y^2 / (c + sigma_y^2):
    three modes (c = 0.09, sigma_y = 0.5): 0.735, above the warning's 0.7, so HR warns that its chains are not
    posterior samples (there the spread ratio is far from 1 at any level count); G1 (c = 0.3, sigma_y = 0.2): 0.118,
    silent."""
    three, g1 = V.three_mode_problem(100), V.g1_problems(100)[0]
    res, m, caught = hr(three)
    assert res.extras["noise_share"] == pytest.approx(0.25 / 0.34, abs=0.02)
    assert res.extras["noise_share"] > NOISE_SHARE_WARN and res.nfe == 100
    assert sum("not posterior samples" in w for w in caught) == 1
    assert not 0.8 <= m["diversity"] <= 1.25  # what the warning is about
    res, _, caught = hr(g1)
    assert res.extras["noise_share"] == pytest.approx(0.04 / 0.34, abs=0.02)
    assert not any("measurement noise" in w for w in caught)


def test_lr_cap_is_validated():
    p = V.gauss_problem(2)
    with pytest.raises(ValueError, match="lr_cap must be a positive number"):
        solve(p.prior, p.operator, p.y, "hr", noise_std=0.1, chains=2, steps=5, lr_cap=-1.0)
    res = solve(p.prior, p.operator, p.y, "dr", noise_std=0.1, chains=2, steps=5)
    assert res.options["lr_cap"] is None and torch.isfinite(res.samples).all()
