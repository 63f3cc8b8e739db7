"""Logical composition (tests U6, U7 of docs/methods/coind.md): exact on a factorised mixture, provably wrong on an
interacting one; the parser; clear errors for bad expressions, rules with no score rule and unfit models."""

from __future__ import annotations

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core.denoiser import NFECounter, eps_from_denoised
from steerdiff.guidance import CFG, Compose
from steerdiff.guidance.compose_expr import And, Lit, Not, Or, parse, satisfies, score_terms
from steerdiff.guidance.compose_oracle import compose_oracle
from steerdiff.models.gmm import GaussianMixture

LEVELS = (-2.0, 0.0, 2.0)  # u_a, v_b (the U6 design)
ATTRS = {"a": ["m2", "z", "p2"], "b": ["m2", "z", "p2"]}
SIGMAS = torch.logspace(-2, 1.5, 8, dtype=torch.float64)  # 8 log-spaced sigma in [0.01, 31.6]


def mixture(interaction: float = 0.0, support=None) -> GaussianMixture:
    """Factorised grid mixture of U6: component (a, b) has mean (u_a, v_b), s = 0.3, uniform weights; an
    ``interaction`` is added to both coordinates when a == b (U7 i); ``support`` restricts the combos (U7 ii)."""
    combos = [(a, b) for a in range(3) for b in range(3) if support is None or support(a, b)]
    means = [[LEVELS[a] + interaction * (a == b), LEVELS[b] + interaction * (a == b)] for a, b in combos]
    return GaussianMixture(torch.ones(len(combos)), means, 0.3**2, labels=combos)


def probe_points(sigma: float, n: int = 500, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, dtype=torch.float64, generator=g) * math.sqrt(4 + sigma**2)


def and_error(denoiser, truth, target=(0, 2)) -> list[float]:
    """Per-sigma max |eps_AND - eps_true| of the unit-weight AND rule for ``target`` against ``truth``."""
    guider = Compose(f"a={target[0]} & b={target[1]}", 1.0, ATTRS)
    errs = []
    for s in SIGMAS.tolist():
        x = probe_points(s)
        sig = torch.full((x.shape[0],), s, dtype=torch.float64)
        d_and = guider.guide(denoiser, x, sig, guider.cond(x.shape[0]))
        d_true = truth(x, sig, torch.tensor([target]).expand(x.shape[0], 2))
        errs.append(float((eps_from_denoised(x, sig, d_and) - eps_from_denoised(x, sig, d_true)).abs().max()))
    return errs


def test_u6_and_is_exact_on_factorised_mixture():
    gmm = mixture()
    for target in [(0, 2), (1, 1), (2, 0)]:
        assert max(and_error(gmm, gmm, target)) < 1e-8


def test_u7_interaction_breaks_composition():
    gmm = mixture(interaction=1.0)
    assert max(and_error(gmm, gmm)) >= 1.0


def test_u7_partial_support_breaks_composition():
    partial = mixture(support=lambda a, b: (b - a) % 3 in (0, 1))  # (0, 2) held out
    assert not bool(((partial.labels == torch.tensor([0, 2])).all(1)).any())
    assert max(and_error(partial, mixture())) >= 1.0


def test_and_sampling_matches_oracle_trajectory():
    """Through sd.sample: AND on the factorised mixture follows the exact conditional's trajectory."""
    gmm = mixture()
    noise = torch.randn(64, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    sigmas = sd.sigmas.karras(16, 0.01, 20.0).double()
    guider = Compose("a=p2 & b=m2", 1.0, ATTRS)
    x = sd.sample(gmm, noise, sigmas, method="euler", cond=guider.cond(64), guidance=guider)
    oracle = compose_oracle(gmm, "a=p2 & b=m2", ATTRS)
    y = sd.sample(oracle, noise, sigmas, method="euler")
    assert torch.allclose(x, y, atol=1e-8)


def test_one_stacked_call_and_weights():
    gmm = mixture()
    counter = NFECounter(gmm)
    guider = Compose("2*a=z & !b={m2,p2}", 1.5, ATTRS)  # the official NOT query (+2w, -w, -w)
    assert sorted(w for _, w in guider.terms) == [-1.5, -1.5, 3.0]
    assert guider.rows_per_eval == 4 and math.isclose(guider.null_coef, 1.0)
    x = probe_points(1.0, 10)
    sig = torch.ones(10, dtype=torch.float64)
    out = guider.guide(counter, x, sig, guider.cond(10))
    assert counter.calls == 1 and counter.rows == 40
    null = torch.full((10, 2), -1)
    lab = lambda a, b: torch.tensor([[a, b]]).expand(10, 2)  # noqa: E731
    d_u = gmm(x, sig, null)
    want = d_u + 3.0 * (gmm(x, sig, lab(1, -1)) - d_u) - 1.5 * (gmm(x, sig, lab(-1, 0)) - d_u) \
        - 1.5 * (gmm(x, sig, lab(-1, 2)) - d_u)
    assert torch.allclose(out, want, atol=1e-12)


def test_null_branch_skipped_when_its_coefficient_vanishes():
    gmm = mixture()
    counter = NFECounter(gmm)
    guider = Compose("a=z", 1.0, ATTRS)  # D_u + 1 (D_a - D_u) = D_a: one row
    x = probe_points(0.5, 7)
    sig = torch.full((7,), 0.5, dtype=torch.float64)
    out = guider.guide(counter, x, sig, guider.cond(7))
    assert counter.rows == 7 and torch.allclose(out, gmm(x, sig, torch.tensor([[1, -1]]).expand(7, 2)))


def test_joint_mode_is_cfg():
    gmm = mixture()
    x = probe_points(2.0, 20)
    sig = torch.full((20,), 2.0, dtype=torch.float64)
    guider = Compose("b=p2 & a=m2", 3.0, ATTRS, mode="joint")
    cond = torch.tensor([[0, 2]]).expand(20, 2)
    assert torch.equal(guider.cond(20), cond)
    assert torch.allclose(guider.guide(gmm, x, sig, cond), CFG(3.0).guide(gmm, x, sig, cond), atol=1e-12)


def test_or_oracle_restricts_components():
    gmm = mixture()
    oracle = compose_oracle(gmm, "a=z | !(b!=p2)", ATTRS)  # a = 1 or b = 2
    keep = {tuple(r) for r in oracle.labels.tolist()}
    assert keep == {(a, b) for a in range(3) for b in range(3) if a == 1 or b == 2}
    assert torch.allclose(oracle.weights, torch.full((5,), 0.2, dtype=torch.float64))


def test_parser_tree_and_truth_table():
    tree = parse("a=z & !(b=m2 | b=p2)", ATTRS)
    assert tree == And((Lit(0, (1,)), Not(Or((Lit(1, (0,)), Lit(1, (2,)))))))
    labels = torch.tensor([[a, b] for a in range(3) for b in range(3)])
    got = satisfies(tree, labels)
    assert got.tolist() == [a == 1 and b == 1 for a in range(3) for b in range(3)]
    assert parse("a != 1", ATTRS) == Not(Lit(0, (1,)))
    assert parse("0.5*!b={z, m2}", ATTRS) == Not(Lit(1, (0, 1), 0.5))
    assert score_terms(parse("a=2 & !b=1", ATTRS), 2) == [((2, -1), 1.0), ((-1, 1), -1.0)]


@pytest.mark.parametrize(
    "expr, match",
    [
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("c=z", "unknown attribute 'c'"),
        ("a=q", "unknown value 'q' for attribute 'a'"),
        ("a=z &", "ends early"),
        ("a=z b=z", "unexpected 'b'"),
        ("(a=z", "ends early"),
        ("a z", "expected '=' or '!='"),
        ("a=z $ b=z", "unexpected character '\\$'"),
    ],
)
def test_bad_expressions_list_valid_names(expr, match):
    with pytest.raises(ValueError, match=match) as info:
        Compose(expr, 1.0, ATTRS)
    if "character" not in match:
        assert "Valid attributes: a in {m2, z, p2}; b in {m2, z, p2}" in str(info.value)


def test_rules_without_score_rule_are_refused():
    for expr in ("a=z | b=z", "!(a=z & b=z)", "a={z,p2}", "a=z & a=p2"):
        with pytest.raises(ValueError):
            Compose(expr, 1.0, ATTRS)
    with pytest.raises(ValueError, match="joint"):
        Compose("a=z & !b=z", 1.0, ATTRS, mode="joint")
    with pytest.raises(ValueError, match="mode"):
        Compose("a=z", 1.0, ATTRS, mode="or")
    with pytest.raises(ValueError, match="scale"):
        Compose("a=z", -1.0, ATTRS)


def test_model_without_null_tokens_is_refused():
    gmm = mixture()
    gmm.has_null = False
    guider = Compose("a=z & b=z", 2.0, ATTRS)
    x = probe_points(1.0, 4)
    with pytest.raises(ValueError, match="has_null = False"):
        guider.guide(gmm, x, torch.ones(4, dtype=torch.float64), guider.cond(4))


def test_slot_mismatch_and_bad_cond_are_refused():
    net = sd.models.EDMPrecond({"class": "MLP", "config": {"dim": 2, "hidden": [8], "num_classes": [3, 4]}})
    with pytest.raises(ValueError, match=r"unknown attribute 'a'.*a0 in \{0, 1, 2\}; a1 in \{0, 1, 2, 3\}"):
        Compose.for_model(net, "a=z & b=z")  # a model without names gets a0, a1 with values 0..K-1
    with pytest.raises(ValueError, match=r"\(3, 4\) values"):
        Compose("a0=1", 1.0, {"a0": 3, "a1": 3}).check_model(net)
    guider = Compose.for_model(net, "a0=1 & !a1=3")
    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match="compose.cond"):
        guider.guide(net, x, torch.ones(3), torch.tensor([[0, 0]] * 3))
    with torch.no_grad():
        assert guider.guide(net, x, torch.ones(3), guider.cond(3)).shape == (3, 2)


def test_cli_sample_expr(tmp_path):
    """``steerdiff sample --model DIR --expr ...`` on a tiny two-slot model with an attributes.json."""
    import json

    from click.testing import CliRunner

    from steerdiff.app.cli import main
    from steerdiff.models.io import save

    torch.manual_seed(0)
    net = sd.models.EDMPrecond({"class": "MLP", "config": {"dim": 2, "hidden": [8], "num_classes": [3, 3]}})
    save(net, tmp_path / "m")
    (tmp_path / "m" / "attributes.json").write_text(json.dumps({"attributes": ATTRS, "has_null": True}))
    run = CliRunner().invoke(main, ["sample", "--model", str(tmp_path / "m"), "--expr", "a=z & !b=p2", "--scale",
                                    "2", "--n", "8", "--steps", "3", "--method", "euler", "--no-progress",
                                    "--out", str(tmp_path / "out")])
    assert run.exit_code == 0, run.output
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["nfe"] == 9 and metrics["guidance"]["expr"] == "a=z & !b=p2"  # 3 steps x 3 stacked rows
    bad = CliRunner().invoke(main, ["sample", "--model", str(tmp_path / "m"), "--expr", "colour=red", "--n", "4",
                                    "--out", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "unknown attribute 'colour'" in bad.output and "a in {m2, z, p2}" in bad.output
    (tmp_path / "m" / "attributes.json").write_text(json.dumps({"attributes": ATTRS, "has_null": False}))
    nonull = CliRunner().invoke(main, ["sample", "--model", str(tmp_path / "m"), "--expr", "a=z", "--scale", "2",
                                       "--n", "4", "--out", str(tmp_path / "nn")])
    assert nonull.exit_code != 0 and "has_null = False" in nonull.output


def _held_out_and_cs(name: str, w: float, n: int) -> float:
    """Held-out AND conformity of a shipped band model (the P1-P4 protocol), Euler 24 steps, n per combo."""
    from steerdiff.data.shapes import COLOURS, SHAPES, split_combos
    from steerdiff.guidance.composable import load_composable
    from steerdiff.metrics.composition import conformity

    model, clf = load_composable(name), sd.models.load("shapes_classifier")
    scores = []
    for q, (s, c) in enumerate(split_combos("band", "test")):
        g = Compose.for_model(model, f"shape={SHAPES[s]} & colour={COLOURS[c]}", w)
        noise = torch.randn(n, 3, 12, 12, generator=torch.Generator().manual_seed(q))
        with torch.no_grad():
            x = sd.sample(model, noise, sd.sigmas.karras(24, 0.002, 80.0), method="euler", cond=g.cond(n), guidance=g)
        scores.append(conformity(clf.predict(x.clamp(-1, 1)), g.terms))
    return sum(scores) / len(scores)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="P1 missed: held-out AND CS at the validation-chosen w: CoInD 0.013 (lambda 1) / 0.053 (lambda 0.3) vs "
    "vanilla 0.144 (benchmarks/coind.py --part shapes --n 40 --n-val 16; 2500-step recipes, ci_fraction 0.125); "
    "an 8000-step pair gives 0.000 vs 0.016; CoInD's composed samples carry the colour, not the shape "
    "(benchmarks/coind.py --part attributes); the protocol's two-slot in-context DiT (8000 steps, not shipped) gives "
    "0.216 vs 0.166 but learns the shapes poorly (seen-pair CS ~0.6)",
)
def test_shipped_coind_p1_held_out_and_conformity():
    """P1 (docs/methods/coind.md, "The coloured-shapes test"): best-over-w held-out AND conformity, CoInD >=
    vanilla + 0.15 (band split)."""
    ws = (2.0, 3.5, 7.5)
    coind = max(_held_out_and_cs("shapes_coind", w, 16) for w in ws)
    vanilla = max(_held_out_and_cs("shapes_band", w, 16) for w in ws)
    assert coind >= vanilla + 0.15, (coind, vanilla)
