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
