"""benchmarks/lggm_degrees.py: the degree profile is the pooled node-degree statistics (closed forms on a star and a
cycle), and its zero-shot row profiles the very graphs benchmarks/lggm.py scores as row (a) (the same checkpoint,
node counts and generator). A tiny run."""

import json

import networkx as nx
import pytest
import torch
from script_modules import load_script


@pytest.fixture(scope="module")
def scripts():
    return load_script("benchmarks/lggm.py", "lggm"), load_script("benchmarks/lggm_degrees.py")


def test_profile_closed_forms(scripts):
    _, deg = scripts
    star = nx.star_graph(9)  # one centre of degree 9, nine leaves
    p = deg.degree_profile([star])
    assert p["mean"] == pytest.approx(18 / 10) and p["leaves"] == pytest.approx(0.9) and p["hubs"] == pytest.approx(0.1)
    assert p["std"] == pytest.approx(((9 - 1.8) ** 2 / 10 + 9 * (1 - 1.8) ** 2 / 10) ** 0.5)
    q = deg.degree_profile([nx.cycle_graph(7), nx.cycle_graph(5)])
    assert q == {"mean": 2.0, "std": 0.0, "leaves": 0.0, "hubs": 0.0}
    with pytest.raises(ValueError, match="graphs"):
        deg.degree_profile([])


@pytest.mark.parametrize("varied", [False, True])
def test_zero_shot_row_profiles_the_benchmarks_samples(scripts, tmp_path, monkeypatch, varied):
    bench, deg = scripts
    seen = []
    zero_shot = bench.zero_shot

    def spy(*a, **kw):
        out = zero_shot(*a, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(bench, "zero_shot", spy)
    monkeypatch.setattr(bench, "results_dir", lambda name: tmp_path)
    monkeypatch.setattr(deg, "results_dir", lambda name: tmp_path)
    monkeypatch.setattr(deg, "lggm", bench)
    flags = ["--held-out", "tree", "--seeds", "0", "--count", "4", "--pretrain-steps", "2", "--steps", "2",
             "--batch", "4", "--n-eval", "6", "--n-eval-large", "0", "--sample-steps", "2",
             "--runs", str(tmp_path / "runs")] + (["--pretrain-varied"] if varied else [])
    bench.main(flags)
    deg.main(flags)  # loads the benchmark's finished pre-training checkpoint
    assert len(seen) == 2
    assert torch.equal(seen[0].edges, seen[1].edges) and torch.equal(seen[0].mask, seen[1].mask)
    out = json.loads((tmp_path / "degrees_tree.json").read_text())["per_seed"]["0"]
    assert out["zero_shot"] == deg.degree_profile(bench.to_networkx(seen[0]))
    _, reference, _ = bench.held_out_sets(bench.parser().parse_args(flags), 0)
    assert out["reference"] == deg.degree_profile(reference) and out["reference"]["leaves"] > 0  # trees have leaves
    assert "tree" not in out and set(out) - {"reference", "zero_shot"} == set(bench.DOMAINS.names()) - {"tree"}
    # the families are profiled as the corpus was drawn: varied with --pretrain-varied (regular: d in 2-5, not 3)
    family = bench.generate("regular", len(reference), 5000, varied=varied)
    assert out["regular"] == deg.degree_profile(family) and (out["regular"]["std"] > 0) == varied
