"""The validation protocol (P1-P4, MO; ``docs/methods/das.md``, "Validation problems and pass criteria") against
closed-form tilted mixtures.

The fast tier (CI) runs DAS alone on 1024 groups (512 in 16-D; MO at w = 0.5 only), one seed, every threshold
+ 0.05; the full tier (slow; also ``benchmarks/das.py``) runs every method and the comparisons at the protocol's
sizes, two seeds.
"""

import pytest
import torch

from steerdiff.align import das
from steerdiff.app.protocols.das import IsotropicMixture, evaluate, mo, p1, p3, validate, validation_sigmas


def _failed(report):
    return [c for c in report["checks"] if not c["passed"]]


@pytest.mark.parametrize("problem", ["P1", "P2", "P3", "P4"])
def test_fast_tier_das(problem):
    report = validate("fast", problems=(problem,), methods=("das",))
    assert len(report["checks"]) == 2 and not _failed(report), report["checks"]


def test_fast_tier_multi_objective():
    """MO with the rewards given as a list of (weight, reward) pairs (the weighted-sum API)."""
    report = validate("fast", problems=("MO",), methods=("das",))
    assert len(report["checks"]) == 3 and not _failed(report), _failed(report)


def test_weighted_sum_list_equals_the_combined_reward():
    prob = mo(0.5)
    sig, noise = validation_sigmas(20), torch.randn(16 * 8, 2, dtype=torch.float64)
    kw = dict(alpha=1.0, particles=8, generator=0, output="weighted", batch_size=None)
    den = IsotropicMixture(prob.mixture)
    a = das(den, prob.parts, noise, sig, **kw)
    b = das(den, prob.reward, noise, sig, **kw)
    torch.testing.assert_close(a.particles_final, b.particles_final)
    torch.testing.assert_close(a.log_weights, b.log_weights)


def test_evaluate_scores_exact_samples_near_zero():
    for prob in (p1(), p3()):
        x = prob.tilted.sample(20_000, torch.Generator().manual_seed(0))
        ev = evaluate(prob, x)
        assert ev["relerr"] < 0.02 and ev["mode_tv"] < 0.02


@pytest.mark.slow
def test_full_tier():
    report = validate("full")
    assert not _failed(report), _failed(report)
