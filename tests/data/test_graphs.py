"""Tests for steerdiff.data.graphs: the families' defining properties, seeding, round trips, statistics, errors."""

import networkx as nx
import pytest
import torch

from steerdiff.data.graphs import (
    CORPUS_FAMILIES,
    DOMAINS,
    GraphBatch,
    check_batch,
    describe,
    family,
    from_networkx,
    generate,
    generate_batch,
    to_networkx,
    type_marginals,
)

NAMES = DOMAINS.names()


def _same(a, b):
    return list(a.nodes) == list(b.nodes) and sorted(map(sorted, a.edges)) == sorted(map(sorted, b.edges))


@pytest.mark.parametrize("name", NAMES)
def test_seeded_prefix_stable_and_in_range(name):
    gs = generate(name, 12, seed=3)
    assert all(_same(a, b) for a, b in zip(gs[:5], generate(name, 5, seed=3), strict=True))
    assert not all(_same(a, b) for a, b in zip(gs, generate(name, 12, seed=4), strict=True))
    lo, hi = DOMAINS.get(name).n_range
    for g in gs:
        assert lo - 1 <= g.number_of_nodes() <= hi  # 'regular' rounds odd n down
        assert nx.number_of_selfloops(g) == 0


# The property each family is defined by (checked by networkx, independently of how it was generated).
PROPERTY = {
    "tree": nx.is_tree,
    "planar": lambda g: nx.check_planarity(g)[0] and nx.is_connected(g),
    "grid": lambda g: nx.check_planarity(g)[0] and max(d for _, d in g.degree) <= 4 and nx.is_bipartite(g),
    "regular": lambda g: {d for _, d in g.degree} == {3},
    "watts_strogatz": nx.is_connected,
    "ego": nx.is_connected,
    "sbm": nx.is_connected,
    "barabasi_albert": lambda g: nx.is_connected(g) and g.number_of_edges() == 2 * (g.number_of_nodes() - 2),
}


@pytest.mark.parametrize("name", sorted(PROPERTY))
def test_family_property(name):
    assert all(PROPERTY[name](g) for g in generate(name, 10, seed=0))


# ``varied=True`` (a more varied pre-training corpus): each family's parameters drawn per graph, and the parameter is
# read back from the graph by the family's defining identity, independently of how it was drawn.
VARIED_PARAMETER = {
    "barabasi_albert": (lambda g: next(m for m in range(1, 5)  # networkx's BA: m (n - m) edges, a star seed of m + 1
                                       if g.number_of_edges() == m * (g.number_of_nodes() - m)), {1, 2, 3, 4}),
    "regular": (lambda g: {d for _, d in g.degree}.pop(), {2, 3, 4, 5}),
    "watts_strogatz": (lambda g: 2 * g.number_of_edges() // g.number_of_nodes(), {2, 4, 6}),  # rewiring keeps n k / 2
}


@pytest.mark.parametrize("name", sorted(VARIED_PARAMETER))
def test_varied_draws_the_family_parameter_over_its_range(name):
    read, values = VARIED_PARAMETER[name]
    gs = generate(name, 60, seed=2, varied=True)
    assert {read(g) for g in gs} == values
    assert {read(g) for g in generate(name, 60, seed=2)} == {read(generate(name, 1, seed=2)[0])}  # fixed: one value
    if name == "regular":
        assert all(len({d for _, d in g.degree}) == 1 for g in gs)  # still regular
    else:
        assert all(nx.is_connected(g) for g in gs)


def test_varied_erdos_renyi_density_is_the_uniform_mixture():
    # p ~ U(0.1, 0.45): the mean density is 0.275, the density's variance at least Var(p) = 0.35^2 / 12 (fixed p
    # = 0.25: only the binomial variance, p (1 - p) / pairs <= 0.0068 at 8 nodes)
    dens = torch.tensor([nx.density(g) for g in generate("erdos_renyi", 400, seed=5, varied=True)])
    assert abs(dens.mean().item() - 0.275) < 4 * dens.std().item() / 400 ** 0.5
    assert dens.var().item() > 0.35 ** 2 / 12
    fixed = torch.tensor([nx.density(g) for g in generate("erdos_renyi", 400, seed=5)])
    assert fixed.var().item() < 0.25 * 0.75 / 28


@pytest.mark.parametrize("name", NAMES)
def test_varied_is_seeded_and_falls_back_to_the_fixed_family(name):
    spec = DOMAINS.get(name)
    gs = generate(name, 8, seed=1, varied=True)
    assert all(_same(a, b) for a, b in zip(gs[:3], generate(name, 3, seed=1, varied=True), strict=True))
    fixed = generate(name, 8, seed=1)
    assert all(_same(a, b) for a, b in zip(fixed, generate(name, 8, seed=1, varied=False), strict=True))
    if spec.varied is None:  # no parameter to vary: the fixed family itself
        assert all(_same(a, b) for a, b in zip(gs, fixed, strict=True)) and not spec.varied_note
    else:
        assert spec.varied_note and not all(_same(a, b) for a, b in zip(gs, fixed, strict=True))
    lo, hi = spec.n_range
    assert all(lo - 1 <= g.number_of_nodes() <= hi for g in gs)


def test_varied_must_be_a_bool():
    with pytest.raises(TypeError, match="varied"):
        generate("tree", 2, varied="yes")


def test_lobster_is_caterpillar_after_removing_leaves():
    # A lobster: removing the leaves leaves a caterpillar (removing its leaves leaves a path).
    for g in generate("lobster", 10, seed=1):
        h = g.subgraph([v for v in g if g.degree[v] > 1]).copy()
        h = h.subgraph([v for v in h if h.degree[v] > 1]).copy() if h.number_of_nodes() > 2 else h
        assert h.number_of_nodes() == 0 or (nx.is_tree(h) and max(d for _, d in h.degree) <= 2)


def test_round_trip_and_padding():
    gs = generate("barabasi_albert", 6, seed=0) + generate("tree", 6, seed=0)
    b = from_networkx(gs, 24)
    check_batch(b)
    assert b.n == 24 and b.edges.shape == (12, 24, 24) and b.mask.sum(1).tolist() == [g.number_of_nodes() for g in gs]
    assert torch.equal(b.edges, b.edges.transpose(1, 2)) and not b.edges.diagonal(dim1=1, dim2=2).any()
    back = to_networkx(b)
    assert all(_same(a, c) for a, c in zip(gs, back, strict=True))
    assert (b.edges > 0).sum((1, 2)).tolist() == [2 * g.number_of_edges() for g in gs]
    assert generate_batch("grid", 3, 0).n == DOMAINS.get("grid").n_range[1]


def test_types_round_trip():
    g = nx.Graph()
    g.add_node(0, type=2)
    g.add_node(1)
    g.add_node(2, type=1)
    g.add_edge(0, 1, type=3)
    g.add_edge(1, 2)
    b = from_networkx([g], 4)
    assert b.nodes.tolist() == [[2, 0, 1, 0]] and b.edges[0, 0, 1] == 3 and b.edges[0, 2, 1] == 1
    h = to_networkx(b)[0]
    assert h.nodes[0]["type"] == 2 and h.edges[0, 1]["type"] == 3


# The corpus families (a larger LGGM pre-training corpus only): exactly n nodes, seeded like the domains, and each
# family's defining property, checked independently of how the graph was drawn.
def _within_radius(g):
    """random_geometric: the edges are exactly the pairs closer than the radius pi r^2 (n - 1) = 6 sets."""
    n, pos = g.number_of_nodes(), nx.get_node_attributes(g, "pos")
    r = (6.0 / (torch.pi * (n - 1))) ** 0.5
    close = {(u, v) for u in range(n) for v in range(u + 1, n)
             if sum((a - b) ** 2 for a, b in zip(pos[u], pos[v], strict=True)) <= r * r}
    return close == {tuple(sorted(e)) for e in g.edges}


CORPUS_PROPERTY = {
    "random_geometric": _within_radius,
    "waxman": lambda g: all(0 <= x <= 1 for p in nx.get_node_attributes(g, "pos").values() for x in p),
    # Holme-Kim grows from m = 2 isolated nodes, each new node bringing m edges
    "powerlaw_cluster": lambda g: g.number_of_edges() == 2 * (g.number_of_nodes() - 2),
    # every node in a clique of >= 3 (so in a triangle), the cliques joined in a ring
    "caveman": lambda g: nx.is_connected(g) and min(nx.triangles(g).values()) >= 1,
    "duplication_divergence": nx.is_connected,
}


@pytest.mark.parametrize("name", CORPUS_FAMILIES.names())
def test_corpus_families(name):
    assert name in CORPUS_PROPERTY and name not in DOMAINS and family(name).name == name
    gs = generate(name, 12, seed=3)
    assert all(_same(a, b) for a, b in zip(gs[:5], generate(name, 5, seed=3), strict=True))
    rng_n = [g.number_of_nodes() for g in gs]
    assert all(8 <= n <= 20 for n in rng_n) and len(set(rng_n)) > 1
    assert all(CORPUS_PROPERTY[name](g) and nx.number_of_selfloops(g) == 0 for g in gs)
    assert _same(generate(name, 1, seed=3, varied=True)[0], gs[0])  # no varied form: the fixed one
    assert generate_batch(name, 2, seed=3).n == 20  # padded to the family's largest node count


def test_describe_against_known_graphs():
    k4 = describe(nx.complete_graph(4))
    assert (k4["nodes"], k4["edges"], k4["triangles"], k4["avg_degree"], k4["clustering"]) == (4, 6, 4, 3.0, 1.0)
    assert k4["is_planar"] and not k4["is_tree"] and k4["connected"]
    k5 = describe(nx.complete_graph(5))
    assert not k5["is_planar"] and k5["triangles"] == 10
    star = describe(nx.star_graph(5))
    assert star["is_tree"] and star["max_degree"] == 5 and star["clustering"] == 0.0
    two = describe(nx.disjoint_union(nx.path_graph(3), nx.path_graph(2)))
    assert not two["connected"] and two["components"] == 2 and not two["is_tree"]
    assert describe(from_networkx([nx.cycle_graph(5)], 7)) == describe(nx.cycle_graph(5))


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="domain must be one of"):
        generate("nope", 3)
    with pytest.raises(ValueError, match=r"or a corpus family \['caveman'"):
        family("nope")
    with pytest.raises(ValueError, match="count"):
        generate("tree", -1)
    with pytest.raises(ValueError, match="n_max"):
        from_networkx([nx.path_graph(5)], 3)
    with pytest.raises(ValueError, match="self-loop"):
        from_networkx([nx.Graph([(0, 0), (0, 1)])])
    bad = GraphBatch(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[[0, 1, 0], [0, 0, 0], [0, 0, 0]]]),
                     torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="symmetric"):
        check_batch(bad)
    with pytest.raises(ValueError, match="GraphBatch needs"):
        GraphBatch(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, 4, dtype=torch.long),
                   torch.ones(2, 3, dtype=torch.bool))


def test_type_marginals_count_real_nodes_and_pairs():
    gs = [nx.path_graph(4), nx.complete_graph(3)]  # 6 real pairs + 3 real pairs, 3 + 3 edges
    node_pi, edge_pi = type_marginals(from_networkx(gs, 6))
    assert node_pi.tolist() == [1.0] and edge_pi.tolist() == [3 / 9, 6 / 9]
    with pytest.raises(ValueError, match="edge_classes"):
        type_marginals(from_networkx([nx.Graph([(0, 1, {"type": 2})])]), 1, 2)
