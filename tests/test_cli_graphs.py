"""``steerdiff sample --model <graph model> --prompt ...`` (docs/methods/lggm.md, "CLI"), on a tiny untrained graph
model saved here: node counts from the prompt, the JSON edge list, the drawing, and refused options."""

import json

import networkx as nx
import pytest
import torch
from click.testing import CliRunner

from steerdiff.app.cli import main
from steerdiff.data.graphs import from_networkx
from steerdiff.discrete.graph_train import data_prior
from steerdiff.discrete.lggm import vocabulary
from steerdiff.models import GraphTransformer, save


def _tiny(tmp_path):
    torch.manual_seed(0)
    data = from_networkx([nx.path_graph(5), nx.cycle_graph(7)], 8)
    model = GraphTransformer(n_max=8, vocab=vocabulary(8), process=data_prior(data), hidden_x=8, hidden_e=4,
                             hidden_y=8, layers=1, heads=2, ff=8, text_dim=4)
    return save(model, tmp_path / "tiny")


def test_sample_graph_model_writes_edge_lists(tmp_path):
    path = _tiny(tmp_path)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--prompt", "a tree graph with 6 nodes",
                                    "--prompt", "a graph", "--n", "2", "--steps", "3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    graphs = json.loads((out / "graphs.json").read_text())
    assert [g["prompt"] for g in graphs] == ["a tree graph with 6 nodes"] * 2 + ["a graph"] * 2
    assert graphs[0]["nodes"] == graphs[1]["nodes"] == 6  # the node count is the prompt's
    for g in graphs:
        h = nx.Graph()
        h.add_nodes_from(range(g["nodes"]))
        h.add_edges_from(g["edges"])
        assert h.number_of_nodes() == g["nodes"] and g["stats"]["edges"] == h.number_of_edges()
    assert (out / "graphs.png").stat().st_size > 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["per_prompt"]["a tree graph with 6 nodes"]["asked"] == {"domain": "tree", "nodes": 6}
    assert metrics["per_prompt"]["a tree graph with 6 nodes"]["met"]["nodes"] == 1.0


def test_sample_graph_model_refuses_continuous_options(tmp_path):
    path = _tiny(tmp_path)
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--method", "heun", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--method" in res.output and "graph model" in res.output
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--prompt", "a graph with 30 nodes",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "2..8" in res.output


def test_sample_graph_model_steered_is_fk_steering_toward_the_prompt(tmp_path):
    """``--particles P --smc-alpha a``: the graphs are FK steering's (``steer_graphs`` on the prompts' own
    ``prompt_reward``, seeded by ``--seed``), and the NFE reported is P particles x steps x 2 (both CFG branches)."""
    from steerdiff.data.graphs import to_networkx
    from steerdiff.discrete.graph_train import TEXT_TO_GRAPH_TIME_POWER, steer_graphs
    from steerdiff.discrete.lggm import asked_of, prompt_reward
    from steerdiff.models import load

    path = _tiny(tmp_path)
    out = tmp_path / "out"
    prompts = ["a tree graph with 6 nodes", "a graph with 5 nodes and average degree 2.0"]
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--prompt", prompts[0], "--prompt", prompts[1],
                                    "--n", "2", "--steps", "3", "--particles", "3", "--smc-alpha", "0.2", "--seed", "7",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nfe_per_graph"] == 3 * 3 * 2 and "18 NFE per graph" in res.output
    assert metrics["steering"]["particles"] == 3 and metrics["steering"]["alpha"] == 0.2
    rows = [p for p in prompts for _ in range(2)]
    ref = steer_graphs(load(path).eval(), [6, 6, 5, 5], prompt_reward([asked_of(p) for p in rows]), steps=3,
                       particles=3, alpha=0.2, prompts=rows, guidance_scale=2.0, generator=7,
                       time_power=TEXT_TO_GRAPH_TIME_POWER)
    graphs = json.loads((out / "graphs.json").read_text())
    for g, h in zip(graphs, to_networkx(ref), strict=True):
        assert g["nodes"] == h.number_of_nodes() and sorted(map(tuple, g["edges"])) == sorted(h.edges())
    plain = CliRunner().invoke(main, ["sample", "--model", str(path), "--prompt", prompts[0], "--n", "1", "--steps",
                                      "3", "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0 and "6 NFE per graph" in plain.output, plain.output


def test_time_power_is_the_grid_the_network_is_asked_at(tmp_path, monkeypatch):
    """``--time-power p``: the network is asked at ``(1 - i / steps) ** p``; by default the text-to-graph grid with a
    prompt and equal steps without (plain and steered); metrics.json records it."""
    from steerdiff.discrete.graph_train import TEXT_TO_GRAPH_TIME_POWER

    path = _tiny(tmp_path)
    asked = []
    probs = GraphTransformer.probs

    def recording(self, nodes, edges, mask, t, cond=None):
        asked.append(float(t[0]))  # a test-side read of the time each call is made at
        return probs(self, nodes, edges, mask, t, cond)

    monkeypatch.setattr(GraphTransformer, "probs", recording)
    cases = ((["--prompt", "a tree graph with 6 nodes", "--time-power", "3"], 3.0),
             (["--prompt", "a tree graph with 6 nodes"], TEXT_TO_GRAPH_TIME_POWER),
             (["--prompt", "a tree graph with 6 nodes", "--particles", "2"], TEXT_TO_GRAPH_TIME_POWER),
             ([], 1.0), (["--time-power", "0.5"], 0.5))
    for i, (args, power) in enumerate(cases):
        asked.clear()
        out = tmp_path / f"out{i}"
        res = CliRunner().invoke(main, ["sample", "--model", str(path), *args, "--n", "2", "--steps", "4",
                                        "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert json.loads((out / "metrics.json").read_text())["time_power"] == power
        assert asked == pytest.approx([(1 - j / 4) ** power for j in range(4)])  # one (doubled) call per step
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--time-power", "2", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--time-power" in res.output and "graph model" in res.output
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--time-power", "0", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--time-power" in res.output


def test_steering_options_are_refused_where_they_do_not_apply(tmp_path):
    path = _tiny(tmp_path)
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--particles", "2", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--particles" in res.output and "--prompt" in res.output
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--prompt", "a graph", "--smc-alpha", "0.1",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--smc-alpha" in res.output and "--particles" in res.output
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--particles", "2", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--particles" in res.output and "graph model" in res.output
