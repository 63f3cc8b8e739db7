"""Graph models under the absorbing (masked) process (docs/methods/lggm.md, "A confidence corrector and an
absorbing-process model"): a masked pair is unknown, not an edge, in the structural features; the loss is the
cross-entropy on masked pairs only; the recipe's ``process`` key builds such a model."""

import copy

import networkx as nx
import torch

from steerdiff.data.graphs import from_networkx
from steerdiff.discrete.graph_train import data_prior, digress_loss, process_of
from steerdiff.models import GraphTransformer

TINY = {"hidden_x": 8, "hidden_e": 4, "hidden_y": 8, "layers": 1, "heads": 2, "ff": 8, "text_dim": 4}


def _batch():
    graphs = [nx.cycle_graph(6), nx.path_graph(5), nx.star_graph(4)]
    return from_networkx(graphs, 7)


def test_a_masked_pair_is_not_an_edge_in_the_structural_features():
    torch.manual_seed(0)
    batch = _batch()
    model = GraphTransformer(n_max=7, edge_states=3, structure="pairs", process=data_prior(batch, "absorbing"),
                             **{k: v for k, v in TINY.items() if k != "text_dim"}).double()
    with torch.no_grad():  # the one-hot input no longer tells the three states apart: only the features can
        w = model.in_e[0].weight
        w[:, 1] = w[:, 0]
        w[:, 2] = w[:, 0]
    t = torch.full((3,), 0.5, dtype=torch.float64)
    edges = batch.edges.clone()
    edges[0, 0, 1] = edges[0, 1, 0] = 2  # mask the cycle's edge (0, 1)
    absent, edge = edges.clone(), edges.clone()
    absent[0, 0, 1] = absent[0, 1, 0] = 0
    edge[0, 0, 1] = edge[0, 1, 0] = 1
    out_mask = model(batch.nodes, edges, batch.mask, t)[1]
    out_absent = model(batch.nodes, absent, batch.mask, t)[1]
    out_edge = model(batch.nodes, edge, batch.mask, t)[1]
    assert torch.allclose(out_mask, out_absent, atol=1e-12)
    assert not torch.allclose(out_mask, out_edge, atol=1e-6)  # a 6-cycle and a 6-path differ in their features


def test_absorbing_loss_is_the_cross_entropy_on_masked_pairs_only():
    torch.manual_seed(1)
    batch = _batch()
    model = GraphTransformer(n_max=7, edge_states=3, process=data_prior(batch, "absorbing"),
                             **{k: v for k, v in TINY.items() if k != "text_dim"})
    process = process_of(model, 7)
    assert process.absorbing
    t = torch.tensor([0.3, 0.6, 0.9])
    g = torch.Generator().manual_seed(7)
    loss = digress_loss(model, process, batch, t, None, generator=copy.deepcopy(g), edge_weight=5.0)
    noisy = process.corrupt(batch, t, copy.deepcopy(g))  # the same noise, drawn again
    le = model(noisy.nodes, noisy.edges, noisy.mask, t)[1]
    terms = []
    for b in range(3):
        for i in range(7):
            for j in range(i + 1, 7):
                if batch.mask[b, i] and batch.mask[b, j] and noisy.edges[b, i, j] == 2:
                    terms.append(-torch.log_softmax(le[b, i, j].float(), -1)[batch.edges[b, i, j]])
    assert len(terms) > 0
    assert torch.allclose(loss, 5.0 * torch.stack(terms).mean(), atol=1e-6)
    # nothing masked (t = 0): no signal, a zero loss that still back-propagates
    zero = digress_loss(model, process, batch, torch.zeros(3), None, generator=torch.Generator().manual_seed(0))
    assert float(zero.detach()) == 0.0 and zero.requires_grad


def test_the_recipes_process_key_builds_an_absorbing_model():
    from steerdiff.app.recipes.graphs_lggm import GRAPHS_LGGM_RECIPE, build

    recipe = copy.deepcopy(GRAPHS_LGGM_RECIPE)
    recipe["data"]["count"] = 2
    recipe["process"] = "absorbing"
    model, _, _ = build(recipe)
    assert model.config["edge_states"] == 3 and model.config["process"]["kind"] == "absorbing"
    assert process_of(model).absorbing
    del recipe["process"]
    model, _, _ = build(recipe)
    assert model.config["edge_states"] == 2 and model.config["process"]["kind"] == "marginal"
