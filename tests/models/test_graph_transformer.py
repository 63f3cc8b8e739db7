"""The graph transformer (DiGress, Vignac et al. 2023, App. B.1): permutation equivariance, symmetric edge output,
padded nodes ignored, the text condition's null."""

import networkx as nx
import pytest
import torch

from steerdiff.models import GraphTransformer, build_model, model_spec


def _batch(graphs, n):
    b = len(graphs)
    nodes = torch.zeros(b, n, dtype=torch.long)
    edges = torch.zeros(b, n, n, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.bool)
    for i, g in enumerate(graphs):
        g = nx.convert_node_labels_to_integers(g)
        mask[i, : g.number_of_nodes()] = True
        for u, v in g.edges():
            edges[i, u, v] = edges[i, v, u] = 1
    return nodes, edges, mask


def _model(**kw):
    torch.manual_seed(0)
    return GraphTransformer(n_max=12, vocab=["planar", "tree", "graph", "nodes", "8", "10"], **kw).double()


def test_permutation_equivariant_and_symmetric():
    graphs = [nx.cycle_graph(7), nx.random_labeled_tree(9, seed=1), nx.erdos_renyi_graph(10, 0.4, seed=2)]
    nodes, edges, mask = _batch(graphs, 10)
    model = _model()
    t = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    cond = model.tokenize(["a planar graph", "", "tree with 10 nodes"])
    lx, le = model(nodes, edges, mask, t, cond)
    assert torch.equal(le, le.transpose(1, 2))  # symmetric by construction
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    # a permutation that keeps padded nodes padded would be too weak: permute the real nodes into any slots
    lx_p, le_p = model(nodes[:, perm], edges[:, perm][:, :, perm], mask[:, perm], t, cond)
    torch.testing.assert_close(lx_p, lx[:, perm], atol=1e-10, rtol=0)
    pair = mask[:, :, None] & mask[:, None, :]
    torch.testing.assert_close(le_p[pair[:, perm][:, :, perm]], le[:, perm][:, :, perm][pair[:, perm][:, :, perm]],
                               atol=1e-10, rtol=0)


def test_padded_nodes_ignored():
    g = nx.erdos_renyi_graph(8, 0.4, seed=5)
    model = _model()
    t = torch.tensor([0.3], dtype=torch.float64)
    small = _batch([g], 8)
    big_nodes, big_edges, big_mask = _batch([g], 12)
    # junk in the padding (types and edges touching padded nodes) must not change the real nodes' outputs
    big_edges[0, 9, 10] = big_edges[0, 10, 9] = 1
    big_edges[0, 2, 11] = big_edges[0, 11, 2] = 1
    lx_s, le_s = model(*small, t)
    lx_b, le_b = model(big_nodes, big_edges, big_mask, t)
    torch.testing.assert_close(lx_b[:, :8], lx_s, atol=1e-10, rtol=0)
    torch.testing.assert_close(le_b[:, :8, :8], le_s, atol=1e-10, rtol=0)
    px, pe = model.probs(big_nodes, big_edges, big_mask, t)
    assert torch.all(pe[0, 8:, :, 0] == 1) and torch.all(pe[0, :, 8:, 0] == 1)
    assert torch.all(pe[0].diagonal(dim1=0, dim2=1)[0] == 1)
    torch.testing.assert_close(pe.sum(-1), torch.ones(1, 12, 12, dtype=pe.dtype))


def test_text_condition_null_and_roundtrip():
    model = _model()
    ids = model.tokenize(["a planar graph", "", "an unknownword"])
    assert ids[1].eq(-1).all() and ids[2, 1] == 0  # the empty prompt is the null; unknown words map to <unk>
    nodes, edges, mask = _batch([nx.path_graph(5)] * 3, 6)
    t = torch.full((3,), 0.5, dtype=torch.float64)
    lx_null, le_null = model(nodes, edges, mask, t, torch.full_like(ids, -1))
    lx_none, le_none = model(nodes, edges, mask, t, None)
    torch.testing.assert_close(le_null, le_none)
    assert not torch.allclose(model(nodes, edges, mask, t, ids)[1][0], le_none[0])
    clone = build_model(model_spec(model)).double()
    clone.load_state_dict(model.state_dict())
    assert torch.equal(clone.tokenize(["tree with 8 nodes"]), model.tokenize(["tree with 8 nodes"]))
    torch.testing.assert_close(clone(nodes, edges, mask, t, ids)[1], model(nodes, edges, mask, t, ids)[1])
    with pytest.raises(ValueError, match="no text encoder"):
        GraphTransformer().tokenize(["x"])
