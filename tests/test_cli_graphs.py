"""``steerdiff sample --model <graph model> --prompt ...`` (docs/methods/lggm.md, "CLI"), on a tiny untrained graph
model saved here: node counts from the prompt, the JSON edge list, the drawing, and refused options."""

import json

import networkx as nx
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
    from steerdiff.discrete.graph_train import steer_graphs
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
                       particles=3, alpha=0.2, prompts=rows, guidance_scale=2.0, generator=7)
    graphs = json.loads((out / "graphs.json").read_text())
    for g, h in zip(graphs, to_networkx(ref), strict=True):
        assert g["nodes"] == h.number_of_nodes() and sorted(map(tuple, g["edges"])) == sorted(h.edges())
    plain = CliRunner().invoke(main, ["sample", "--model", str(path), "--prompt", prompts[0], "--n", "1", "--steps",
                                      "3", "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0 and "6 NFE per graph" in plain.output, plain.output


def test_steering_options_are_refused_where_they_do_not_apply(tmp_path):
    path = _tiny(tmp_path)
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--particles", "2", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--particles" in res.output and "--prompt" in res.output
    res = CliRunner().invoke(main, ["sample", "--model", str(path), "--prompt", "a graph", "--smc-alpha", "0.1",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--smc-alpha" in res.output and "--particles" in res.output
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--particles", "2", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--particles" in res.output and "graph model" in res.output
