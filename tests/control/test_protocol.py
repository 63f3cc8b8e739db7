"""The RB-Modulation digits protocol (spec C.7) at full size: its pass criteria against the spec's thresholds.

Slow (about a minute): ``pytest -m slow tests/control/test_protocol.py``. The thresholds are the spec's, not numbers
of a run; the class-accuracy criterion is known to fail with the shipped generator (docs/methods/rb_modulation.md).
"""

from __future__ import annotations

import pytest

from steerdiff.app.protocols.rbmod import criteria, evaluate, load_task, reference_metrics, run_method

pytestmark = pytest.mark.slow
CLASS_ACC_GAP = ("measured 0.890 vs the spec's >= 0.917 (unguided - 4); the controller matches spec C.2 and the "
                 "official code, and 22 of 24 retrained generators fail too (benchmarks/rbmod.py --part seeds)")


@pytest.fixture(scope="module")
def outcome():
    task = load_task(n_per_class=30, seed=0)
    plain = evaluate(task, run_method(task, "plain")[0])
    x, cost = run_method(task, "rbmod", M=3, eta=0.2, lam_prox=1.0)
    rbmod = evaluate(task, x) | cost
    guidance = {w: evaluate(task, run_method(task, "guidance", w=w)[0]) for w in (0.25, 0.5, 1.0, 2.0, 4.0)}
    return criteria(plain, rbmod, guidance, reference_metrics(task)["ink"])


@pytest.mark.parametrize("name", ["thick_success", "cnn_style_dist_drop", "ink_gap_closed", "leakage",
                                  "denoiser_backward_passes", "vs_guidance",
                                  pytest.param("class_acc", marks=pytest.mark.xfail(
                                      strict=True, reason=CLASS_ACC_GAP))])
def test_criterion(outcome, name):
    assert outcome[name]["pass"], outcome[name]


@pytest.fixture(scope="module")
def afa_outcome():
    from steerdiff.app.protocols.rbmod import afa_runs

    task = load_task(n_per_class=30, seed=0)
    strong = {k: evaluate(task, x) for k, (x, _) in afa_runs(task).items()}
    weak = {k: evaluate(task, x) for k, (x, _) in afa_runs(task, {"M": 3, "eta": 0.05, "lam_prox": 1.0}).items()}
    return strong, weak


def _afa_criterion(runs):
    soc, both = runs["SOC alone"], runs["AFA + SOC"]
    return both["thick"] >= soc["thick"] and both["class_acc"] >= soc["class_acc"] - 0.02


@pytest.mark.xfail(strict=True, reason="measured: SOC alone is at 100% thick; AFA + SOC loses 6.7 points of accuracy")
def test_afa_d_at_the_c7_control(afa_outcome):
    assert _afa_criterion(afa_outcome[0])


def test_afa_d_with_a_weaker_control(afa_outcome):
    """With SOC at eta 0.05 (below its ceiling) AFA adds style at no accuracy cost (spec C.7 AFA (d) thresholds)."""
    assert _afa_criterion(afa_outcome[1])
