"""The graph transformer (DiGress, Vignac et al. 2023, App. B.1): permutation equivariance, symmetric edge output,
padded nodes ignored, the text condition's null; its structural features (App. B.2) against networkx and scipy."""

import networkx as nx
import numpy as np
import pytest
import scipy.linalg
import torch

from steerdiff.models import GraphTransformer, build_model, model_spec
from steerdiff.models.graph_transformer import cycle_counts, pair_features, spectral_features, with_pair_features


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


@pytest.mark.parametrize("structure", ["pairs", "full", "basic", "none"])
def test_permutation_equivariant_and_symmetric(structure):
    # the cycle, the grid and the tree have repeated Laplacian eigenvalues: eigenvector features would break this
    graphs = [nx.cycle_graph(7), nx.random_labeled_tree(9, seed=1), nx.erdos_renyi_graph(10, 0.4, seed=2),
              nx.grid_2d_graph(3, 3)]
    nodes, edges, mask = _batch(graphs, 10)
    model = _model(structure=structure)
    t = torch.tensor([0.1, 0.5, 0.9, 0.7], dtype=torch.float64)
    cond = model.tokenize(["a planar graph", "", "tree with 10 nodes", "a graph"])
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


SMALL_GRAPHS = [nx.erdos_renyi_graph(9, 0.5, seed=0), nx.erdos_renyi_graph(8, 0.7, seed=1), nx.grid_2d_graph(3, 3),
                nx.petersen_graph(), nx.complete_graph(6), nx.cycle_graph(6), nx.random_labeled_tree(7, seed=2),
                nx.disjoint_union(nx.cycle_graph(5), nx.complete_graph(4)), nx.empty_graph(3)]


def _adjacency(graphs, n):
    _, edges, mask = _batch(graphs, n)
    return edges.double(), mask


def test_cycle_counts_match_enumeration():
    adj, mask = _adjacency(SMALL_GRAPHS, 11)  # padded: real nodes first, zeros after
    node, graph = cycle_counts(adj)
    for b, g in enumerate(SMALL_GRAPHS):
        g = nx.convert_node_labels_to_integers(g)
        cycles = list(nx.simple_cycles(g, length_bound=6))  # each cycle once, by enumeration
        want_graph = [sum(len(c) == k for c in cycles) for k in (3, 4, 5, 6)]
        want_node = [[sum(len(c) == k and v in c for c in cycles) for k in (3, 4, 5)] for v in range(len(g))]
        assert graph[b].tolist() == want_graph, (b, graph[b].tolist(), want_graph)
        assert node[b, : len(g)].tolist() == want_node
        assert node[b, len(g):].eq(0).all()


def test_spectral_features_match_networkx_and_scipy():
    adj, mask = _adjacency(SMALL_GRAPHS, 11)
    f = spectral_features(adj, mask, k=5, scales=(0.5, 2.0))
    for b, g in enumerate(SMALL_GRAPHS):
        g = nx.convert_node_labels_to_integers(g)
        n = len(g)
        comps = list(nx.connected_components(g))
        assert f["components"][b].item() == pytest.approx(len(comps))
        size = [len(next(c for c in comps if v in c)) for v in range(n)]
        assert f["component_size"][b, :n].tolist() == size
        assert f["in_largest"][b, :n].tolist() == [float(s == max(size)) for s in size]
        lap = nx.laplacian_matrix(g, nodelist=range(n)).toarray().astype(float)
        ev = np.linalg.eigvalsh(lap)[len(comps):][:5]
        want = np.zeros(5)
        want[: len(ev)] = ev
        np.testing.assert_allclose(f["eigenvalues"][b].numpy(), want, atol=1e-9)
        for j, s in enumerate((0.5, 2.0)):
            np.testing.assert_allclose(f["heat"][b, :n, j].numpy(), np.diag(scipy.linalg.expm(-s * lap)), atol=1e-9)
        assert f["heat"][b, n:].eq(0).all() and f["in_largest"][b, n:].eq(0).all()


def test_old_configs_keep_their_features_and_low_precision_runs():
    model = _model()
    spec = model_spec(model)
    assert spec["config"]["structure"] == "full"
    spec["config"]["structure"] = True  # what configs said before "full" existed: the degree and triangle features
    old = build_model(spec)
    assert old.structure == "basic" and old.in_x[0].in_features == 1 + 2
    with pytest.raises(ValueError, match="structure"):
        GraphTransformer(structure="cycles")
    nodes, edges, mask = _batch([nx.grid_2d_graph(3, 4), nx.path_graph(5)], 12)
    t = torch.tensor([0.2, 0.8])
    ref = model.float()(nodes, edges, mask, t)[1]
    low = model.to(torch.bfloat16)(nodes, edges, mask, t)[1]  # features in float32, cast to the model's dtype
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    assert (low.float() - ref).abs().max() < 0.1 * ref.abs().max()


def test_pair_features_count_paths_as_networkx():
    """``(A^2)_ij`` and ``(A^3)_ij`` against networkx's enumeration of simple and non-simple walks: common neighbours
    and the walks of length 3 (``sum_{k, l} A_ik A_kl A_lj``) counted pair by pair; zero on padding and diagonal."""
    graphs = [nx.grid_2d_graph(3, 3), nx.erdos_renyi_graph(8, 0.5, seed=4), nx.cycle_graph(5)]
    _, edges, mask = _batch(graphs, 10)
    feats = pair_features(edges.double(), mask)
    for b, g in enumerate(graphs):
        g = nx.convert_node_labels_to_integers(g)
        n = g.number_of_nodes()
        for i in range(10):
            for j in range(10):
                if i >= n or j >= n or i == j:
                    assert feats[b, i, j].abs().sum() == 0
                    continue
                common = len(list(nx.common_neighbors(g, i, j)))
                walks3 = sum(1 for k in g[i] for m in g[k] if g.has_edge(m, j))
                assert feats[b, i, j, 0].item() == pytest.approx(np.log1p(common) / 4)
                assert feats[b, i, j, 1].item() == pytest.approx(np.log1p(walks3) / 4)


def test_with_pair_features_starts_as_the_same_function():
    """The widened ``"pairs"`` model computes exactly what the ``"full"`` one does until it is trained, and takes the
    pair counts as inputs (its first edge layer has two more input columns)."""
    graphs = [nx.cycle_graph(7), nx.grid_2d_graph(3, 3)]
    nodes, edges, mask = _batch(graphs, 10)
    model = _model(structure="full")
    wide = with_pair_features(model)
    assert wide.structure == "pairs" and wide.in_e[0].in_features == model.in_e[0].in_features + 2
    t = torch.tensor([0.3, 0.8], dtype=torch.float64)
    cond = model.tokenize(["a planar graph", ""])
    for a, b in zip(model(nodes, edges, mask, t, cond), wide(nodes, edges, mask, t, cond), strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="full"):
        with_pair_features(_model(structure="basic"))
