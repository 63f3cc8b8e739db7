"""Graph metrics: MMD against hand-computed values and its separations, kernel positive-definiteness, validity on known
graphs, V.U.N. under relabelling, conformity."""

import math

import networkx as nx
import numpy as np
import pytest

from steerdiff.data.graphs import from_networkx, generate
from steerdiff.metrics.graphs import (
    KERNELS,
    STATISTICS,
    graph_conformity,
    graph_mmd,
    is_grid,
    is_lobster,
    is_valid,
    mmd2,
    spectrum_histogram,
    validity,
    vun,
)

TREES0, TREES1 = generate("tree", 30, 0), generate("tree", 30, 1)
PLANAR = generate("planar", 30, 0)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_mmd_of_a_set_with_itself_is_zero(kernel):
    assert all(abs(v) < 1e-12 for v in graph_mmd(PLANAR, PLANAR, kernel=kernel).values())


def test_mmd_by_hand_on_one_graph_each():
    # degree histograms: P3 (0, 2, 1)/3, K3 (0, 0, 3)/3: TV = 2/3, EMD = |CDF diff| sum = 2/3.
    p3, k3 = [nx.path_graph(3)], [nx.complete_graph(3)]
    want = 2 - 2 * math.exp(-((2 / 3) ** 2) / 2)
    assert graph_mmd(p3, k3, ["degree"])["degree"] == pytest.approx(want, abs=1e-12)
    assert graph_mmd(p3, k3, ["degree"], kernel="gaussian_emd")["degree"] == pytest.approx(want, abs=1e-12)
    assert graph_mmd(p3, k3, ["degree"], kernel="laplacian_tv")["degree"] == pytest.approx(
        2 - 2 * math.exp(-2 / 3), abs=1e-12)
    # normalised Laplacian spectra: K3 {0, 3/2, 3/2}, P3 {0, 1, 2}
    edges = np.linspace(-1e-5, 2, 201)
    for g, eig in ((nx.complete_graph(3), [0, 1.5, 1.5]), (nx.path_graph(3), [0, 1, 2])):
        assert np.array_equal(spectrum_histogram(g), np.histogram(eig, bins=edges)[0])


@pytest.mark.parametrize("stat", ["degree", "spectre"])
def test_different_families_are_farther_than_two_seeds_of_one(stat):
    same = graph_mmd(TREES0, TREES1, [stat])[stat]
    other = graph_mmd(TREES0, PLANAR, [stat])[stat]
    assert other > 0.05 and other > 5 * abs(same)


def test_clustering_separates_triangle_free_from_triangulated():
    assert graph_mmd(TREES0, TREES1, ["clustering"])["clustering"] == 0.0  # trees: every coefficient 0
    assert graph_mmd(TREES0, PLANAR, ["clustering"])["clustering"] > 0.5


@pytest.mark.parametrize("kernel", ["rbf", "laplacian_tv"])
def test_positive_definite_kernels_give_psd_grams_and_nonnegative_mmd(kernel):
    rng = np.random.default_rng(0)
    h = rng.dirichlet(np.ones(12) * 0.3, size=60)
    gram = KERNELS[kernel](h, h, 0.3, 1.0)
    assert np.allclose(gram, gram.T) and np.linalg.eigvalsh(gram).min() > -1e-10
    fam = [generate(d, 15, 2) for d in ("tree", "planar", "ego", "regular")]
    for a in fam:
        for b in fam:
            assert min(graph_mmd(a, b, kernel=kernel).values()) > -1e-12


def test_mmd_inputs():
    with pytest.raises(ValueError, match="kernel must be one of"):
        mmd2([np.ones(2)], [np.ones(2)], kernel="cosine")
    with pytest.raises(ValueError, match="statistics must be among"):
        graph_mmd(TREES0, TREES1, ["orbit"])
    with pytest.raises(ValueError, match="non-empty"):
        mmd2([], [np.ones(2)])
    assert sorted(STATISTICS) == ["clustering", "degree", "spectre"]
    # a GraphBatch is accepted and gives the same numbers
    assert graph_mmd(from_networkx(TREES0[:8]), PLANAR[:8]) == graph_mmd(TREES0[:8], PLANAR[:8])


def test_validity_on_known_graphs():
    assert is_lobster(nx.star_graph(6)) and is_lobster(nx.path_graph(9))
    spider = nx.Graph([(0, 1), (1, 2), (2, 3), (0, 4), (4, 5), (5, 6), (0, 7), (7, 8), (8, 9)])  # legs of 3
    assert nx.is_tree(spider) and not is_lobster(spider)
    grid = nx.convert_node_labels_to_integers(nx.grid_2d_graph(3, 4))
    shuffled = nx.relabel_nodes(grid, dict(zip(range(12), np.random.default_rng(0).permutation(12).tolist(),
                                               strict=True)))
    assert is_grid(shuffled)
    broken = shuffled.copy()
    broken.remove_edge(*next(iter(broken.edges)))
    assert not is_grid(broken) and not is_grid(nx.cycle_graph(12))
    assert not is_valid(nx.complete_graph(5), "planar") and is_valid(nx.complete_graph(4), "planar")
    assert not is_valid(nx.disjoint_union(nx.path_graph(3), nx.path_graph(3)), "tree")
    assert validity(generate("planar", 10, 0), "tree") == 0.0
    with pytest.raises(ValueError, match="domain must be one of"):
        is_valid(nx.path_graph(3), "nope")


def test_generated_domains_are_valid_and_the_others_mostly_not():
    for domain in ("tree", "lobster", "planar", "grid", "regular"):
        assert validity(generate(domain, 12, 3), domain) == 1.0
    assert validity(generate("erdos_renyi", 12, 3), "tree") < 0.5
    assert validity(generate("planar", 12, 3), "grid") < 0.5


def test_vun_sees_through_relabelling_and_duplicates():
    train = generate("tree", 20, 0)
    relabelled = [nx.relabel_nodes(g, {v: (v * 7 + 3) % g.number_of_nodes() for v in g}) for g in train[:3]]
    fresh = [nx.star_graph(25), nx.star_graph(25), nx.cycle_graph(9)]
    out = vun(relabelled + fresh, train, "tree")
    assert out["novel"] == pytest.approx(3 / 6) and out["unique"] == pytest.approx(5 / 6)
    assert out["valid"] == pytest.approx(5 / 6) and out["vun"] == pytest.approx(1 / 6)  # only the first star


def test_conformity_counts_what_was_asked():
    gs = [nx.path_graph(10), nx.cycle_graph(10), nx.star_graph(11)]
    out = graph_conformity(gs, {"nodes": 10, "domain": "tree"})
    assert out == {"domain": pytest.approx(2 / 3), "nodes": pytest.approx(2 / 3), "all": pytest.approx(1 / 3)}
    per = graph_conformity(gs, [{"avg_degree": 1.8}, {"avg_degree": 2.4}, {"is_tree": True, "triangles": 0}])
    assert per["avg_degree"] == 1.0 and per["is_tree"] == 1.0 and per["all"] == 1.0
    assert graph_conformity(gs[:2], {"avg_degree": 2.4}, tolerance={"avg_degree": 0.1})["avg_degree"] == 0.0
    with pytest.raises(ValueError, match="asked statistic"):
        graph_conformity(gs, {"colour": 3})
