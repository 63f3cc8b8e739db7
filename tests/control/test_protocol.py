"""The RB-Modulation digits protocol (spec C.7) at full size: its pass criteria against the spec's thresholds.

Slow (a few minutes): ``pytest -m slow tests/control/test_protocol.py``. The thresholds are the spec's, not numbers
of a run. C.7's criteria apply to the default controller (the consistent re-entry, AMENDMENTS 8); the official
re-entry keeps its own run. The class-accuracy criterion fails with the shipped generator at noise seed 0 for both
(docs/methods/rb_modulation.md, "Re-entry").
"""

from __future__ import annotations

import pytest

from steerdiff.app.protocols.rbmod import criteria, evaluate, load_task, reference_metrics, run_method

pytestmark = pytest.mark.slow
CLASS_ACC_GAP = ("measured 0.913 vs the spec's >= 0.917 (unguided - 4) on the shipped generator at noise seed 0, "
                 "one sample of 300 short; over 24 retrained generators x noise seeds the default passes in 20 "
                 "(benchmarks/rbmod.py --part seeds)")
CLASS_ACC_GAP_OFFICIAL = ("measured 0.893 vs the spec's >= 0.917; the official re-entry (spec C.2, the official code) "
                          "passes in 2 of 24 retrained generators x noise seeds (benchmarks/rbmod.py --part seeds)")
CRITERIA = ["thick_success", "cnn_style_dist_drop", "ink_gap_closed", "leakage", "denoiser_backward_passes",
            "vs_guidance"]


def _outcome(seed: int = 0, **params):
    task = load_task(n_per_class=30, seed=seed)
    plain = evaluate(task, run_method(task, "plain")[0])
    x, cost = run_method(task, "rbmod", M=3, eta=0.2, lam_prox=1.0, **params)
    rbmod = evaluate(task, x) | cost
    guidance = {w: evaluate(task, run_method(task, "guidance", w=w)[0]) for w in (0.25, 0.5, 1.0, 2.0, 4.0)}
    return criteria(plain, rbmod, guidance, reference_metrics(task)["ink"])


@pytest.fixture(scope="module")
def outcome():
    return _outcome()


@pytest.fixture(scope="module")
def official_outcome():
    return _outcome(reentry="official")


@pytest.mark.parametrize("name", [*CRITERIA, pytest.param("class_acc", marks=pytest.mark.xfail(
    strict=True, reason=CLASS_ACC_GAP))])
def test_criterion(outcome, name):
    assert outcome[name]["pass"], outcome[name]


@pytest.fixture(scope="module")
def seed1_outcome():
    return _outcome(seed=1)


@pytest.mark.parametrize("name", [*CRITERIA, "class_acc"])
def test_criterion_seed1(seed1_outcome, name):
    """The default controller at noise seed 1 (disjoint noise rows): every C.7 criterion, class accuracy included."""
    assert seed1_outcome[name]["pass"], seed1_outcome[name]


@pytest.mark.parametrize("name", [*CRITERIA, pytest.param("class_acc", marks=pytest.mark.xfail(
    strict=True, reason=CLASS_ACC_GAP_OFFICIAL))])
def test_criterion_official_reentry(official_outcome, name):
    assert official_outcome[name]["pass"], official_outcome[name]


@pytest.fixture(scope="module")
def afa_outcome():
    from steerdiff.app.protocols.rbmod import afa_runs

    task = load_task(n_per_class=30, seed=0)
    runs = {}
    for key, soc in (("default", None), ("weak", {"M": 3, "eta": 0.05, "lam_prox": 1.0}),
                     ("official", {"M": 3, "eta": 0.2, "lam_prox": 1.0, "reentry": "official"})):
        runs[key] = {k: evaluate(task, x) for k, (x, _) in afa_runs(task, soc).items()}
    return runs


def _afa_criterion(runs):
    soc, both = runs["SOC alone"], runs["AFA + SOC"]
    return both["thick"] >= soc["thick"] and both["class_acc"] >= soc["class_acc"] - 0.02


def test_afa_d_at_the_c7_control(afa_outcome):
    """Spec C.7 AFA (d) with the default controller (consistent re-entry)."""
    assert _afa_criterion(afa_outcome["default"])


@pytest.mark.xfail(strict=True, reason="measured with the official re-entry: SOC alone is at 100% thick; AFA + SOC "
                                       "loses 6.3 points of accuracy (0.860 vs 0.923)")
def test_afa_d_at_the_c7_control_official_reentry(afa_outcome):
    assert _afa_criterion(afa_outcome["official"])


def test_afa_d_with_a_weaker_control(afa_outcome):
    """With SOC at eta 0.05 (below its ceiling) AFA adds style at no accuracy cost (spec C.7 AFA (d) thresholds)."""
    assert _afa_criterion(afa_outcome["weak"])
