"""Graph diffusion on the discrete core: the flattened layout round-trips, padded nodes stay untouched, the forward
noise is what it says, and the graph samplers reproduce exact tables over all graphs of 4 nodes (2^6 = 64)."""

import networkx as nx
import pytest
import torch

import steerdiff.discrete as dd
from steerdiff.data.graphs import check_batch, from_networkx, generate_batch, to_networkx
from steerdiff.discrete.graph import (
    GraphProcess,
    flat_denoiser,
    graph_process,
    sample_graphs,
    table_denoiser,
    triangles,
)

N4, E4 = 4, 6
TABLE = dd.random_table(E4, 2, seed=3)  # a law over the 64 graphs on 4 labelled nodes


def _typed_batch(seed=0):
    b = generate_batch("barabasi_albert", 6, seed, n_max=20)
    g = torch.Generator().manual_seed(seed)
    b.nodes = torch.where(b.mask, torch.randint(0, 3, b.nodes.shape, generator=g), 0)
    return b


@pytest.mark.parametrize("kind", ["absorbing", "uniform"])
@pytest.mark.parametrize("node_classes", [1, 3])
def test_flatten_split_join_round_trip(kind, node_classes):
    gp = graph_process(kind, 20, node_classes=node_classes)
    b = _typed_batch() if node_classes > 1 else generate_batch("tree", 6, 0)
    x = gp.flatten(b)
    assert x.shape == (6, gp.length) and gp.length == (20 if node_classes > 1 else 0) + 190
    back = gp.unflatten(x)
    check_batch(back)
    assert torch.equal(back.nodes, b.nodes) and torch.equal(back.edges, b.edges) and torch.equal(back.mask, b.mask)
    assert torch.equal(gp.join(*gp.split(x)), x)
    # The pad state is where the padding is: node slots beyond the count, and every pair touching one.
    assert int((x == gp.pad_index).sum()) == sum(
        (20 - k) * (node_classes > 1) + 190 - k * (k - 1) // 2 for k in b.num_nodes.tolist())


def test_corrupt_keeps_padding_and_symmetry_and_survives_at_rate_alpha():
    gp = graph_process("absorbing", 20, node_classes=3, schedule="linear")
    b = _typed_batch(1)
    t = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 0.5])
    noisy = gp.corrupt(b, t, torch.Generator().manual_seed(0))
    assert torch.equal(noisy.mask, b.mask) and torch.equal(noisy.edges, noisy.edges.transpose(1, 2))
    assert torch.equal(noisy.nodes[0], b.nodes[0]) and torch.equal(noisy.edges[0], b.edges[0])  # t = 0: clean
    real = b.mask[:, :, None] & b.mask[:, None, :] & ~torch.eye(20, dtype=torch.bool)
    masked_e = (noisy.edges == gp.ke) & real
    assert bool((noisy.edges[~real] == 0).all()) and bool((noisy.nodes[~b.mask] == 0).all())
    assert bool(masked_e[4][real[4]].all()) and bool((noisy.nodes[4][b.mask[4]] == gp.kx).all())  # t = 1: all mask
    pairs = real.sum((1, 2)) // 2
    frac = masked_e.sum((1, 2)) // 2 / pairs
    # Binomial(pairs, t): within 4 standard deviations of t.
    sd = (t * (1 - t) / pairs).sqrt()
    assert bool(((frac - t).abs() <= 4 * sd + 1e-9).all()), (frac, t)


def test_padded_nodes_untouched_and_the_denoiser_sees_the_mask():
    gp = graph_process("uniform", 7, node_classes=2)
    counts = torch.tensor([2, 4, 7, 5, 3])
    seen = []

    def uniform_denoiser(nodes, edges, mask, t, cond=None):
        seen.append(mask.sum(1))
        assert torch.equal(edges, edges.transpose(1, 2)) and nodes.shape == mask.shape
        b = nodes.shape[0]
        return torch.full((b, 7, 2), 0.5), torch.full((b, 7, 7, 2), 0.5)

    g, stats = sample_graphs(uniform_denoiser, gp, 5, num_nodes=counts, generator=0, return_stats=True)
    check_batch(g)
    assert stats.nfe == 5 and all(torch.equal(s, counts) for s in seen)
    assert torch.equal(g.num_nodes, counts)
    assert [h.number_of_nodes() for h in to_networkx(g)] == counts.tolist()
    gm = graph_process("absorbing", 7, node_classes=2)
    for method in ("maskgit", "unmask"):
        g, stats = sample_graphs(uniform_denoiser, gm, 4, num_nodes=counts, method=method, generator=1,
                                 return_stats=True)
        check_batch(g)  # every mask filled (types < K), padding kept
        assert torch.equal(g.num_nodes, counts) and stats.nfe == 4 and bool((g.nodes < 2).all())


def test_graph_process_refuses_mismatched_parts():
    with pytest.raises(ValueError, match="both be absorbing"):
        GraphProcess(dd.make_process("absorbing", 2), 4, dd.make_process("uniform", 3))
    with pytest.raises(ValueError, match="share their schedule"):
        GraphProcess(dd.make_process("uniform", 2, schedule="cosine"), 4,
                     dd.make_process("uniform", 3, schedule="linear"))
    with pytest.raises(ValueError, match="num_nodes"):
        sample_graphs(lambda *a: None, graph_process("absorbing", 4), 3, num_nodes=[5])
    with pytest.raises(ValueError, match="p_nodes"):
        flat_denoiser(lambda n, e, m, t, c: (torch.ones(1, 4, 2), torch.ones(1, 4, 4, 2)),
                      graph_process("absorbing", 4))(torch.full((1, 6), 2), torch.ones(1))


# ------------------------------------------------------------------------------------------------ exact tables
def _graph_tv(kind, method, steps, n=4000, seed=0, schedule=None):
    gp = graph_process(kind, N4, schedule=schedule, edge_marginal=[0.6, 0.4])
    model = dd.TableModel(TABLE, E4, gp.edge_process)  # the edge tokens' coding is the edge process's
    g = sample_graphs(table_denoiser(model, gp), gp, steps, num_nodes=[N4] * n, method=method, generator=seed)
    return dd.total_variation(dd.empirical(gp.flatten(g), 2), TABLE)


FLOOR = dd.tv_floor(TABLE, 4000, quantile=0.999)


def test_one_edge_per_step_unmasking_reproduces_the_graph_table():
    assert _graph_tv("absorbing", "unmask", E4) < FLOOR
    assert _graph_tv("absorbing", "unmask", 1) > 3 * FLOOR  # all edges at once: factorised, wrong (a control)


@pytest.mark.parametrize("kind", ["uniform", "marginal"])
def test_many_step_ancestral_reproduces_the_graph_table(kind):
    assert _graph_tv(kind, "ancestral", 32, n=2000) < dd.tv_floor(TABLE, 2000, quantile=0.999)


def test_node_and_edge_tokens_together_reproduce_a_typed_table():
    # 2 nodes of 2 types and one pair of 3 edge types: 12 typed graphs, embedded in the 5^3 flat sequences (the
    # rest probability 0); the types are dependent under the table.
    gp = graph_process("absorbing", 2, edge_classes=3, node_classes=2, schedule="linear")
    seqs = dd.all_sequences(gp.length, gp.num_classes)
    valid = (seqs[:, :2] < 2).all(1) & (seqs[:, 2:] >= 2).all(1)
    table = torch.zeros(len(seqs), dtype=torch.float64)
    table[valid] = dd.random_table(1, 12, seed=5)  # 12 = 2 x 2 x 3
    model = dd.TableModel(table, gp.length, gp)
    g = sample_graphs(table_denoiser(model, gp), gp, gp.length, num_nodes=[2] * 3000, method="unmask", generator=1)
    got = dd.empirical(gp.flatten(g), gp.num_classes)
    assert dd.total_variation(got, table) < dd.tv_floor(table[valid], 3000, quantile=0.999)


def test_cfg_scale_one_on_a_labelled_graph_table_is_the_conditional():
    tables = dd.random_table(E4, 2, labels=2, seed=7)
    gp = graph_process("absorbing", N4, schedule="linear")
    model = dd.TableModel(tables, E4, gp.edge_process)
    g = sample_graphs(table_denoiser(model, gp), gp, E4, num_nodes=[N4] * 3000, method="unmask",
                      cond=torch.ones(3000, dtype=torch.long), guidance=dd.CFG(1.0), generator=2)
    assert dd.total_variation(dd.empirical(gp.flatten(g), 2), tables[1]) < dd.tv_floor(tables[1], 3000, 0.999)


def test_triangles_match_networkx():
    b = generate_batch("planar", 8, 0)
    assert triangles(b).tolist() == [sum(nx.triangles(h).values()) / 3 for h in to_networkx(b)]
    assert triangles(from_networkx([nx.complete_graph(4)])).tolist() == [4.0]


def test_smc_on_a_triangle_reward_reaches_the_exact_tilt_and_beats_best_of_n():
    # p_lambda(G) ∝ p(G) exp(lambda * triangles(G)), by enumeration of the 64 graphs; equal NFE for both methods.
    from steerdiff.discrete.graph import best_of_n_graphs, smc_graphs

    gp = graph_process("absorbing", N4, schedule="linear")
    den = table_denoiser(dd.TableModel(TABLE, E4, gp.edge_process), gp)
    tri = triangles(gp.unflatten(dd.all_sequences(E4, 2))).double()
    tilt = TABLE * tri.exp()
    tilt /= tilt.sum()
    res = smc_graphs(den, gp, triangles, steps=E4, alpha=1.0, num_samples=128, particles=16, method="unmask",
                     generator=0)
    w = res.weights()
    tv_smc = dd.total_variation(dd.empirical(res.samples, 2, w), tilt)
    kish = int(1 / float((w**2).sum()))
    assert tv_smc < 1.5 * dd.tv_floor(tilt, kish, 0.99)
    bon = best_of_n_graphs(den, gp, triangles, steps=E4, n=16, num_samples=128, method="unmask", generator=10**6)
    assert bon.nfe == res.nfe == 16 * E4
    assert dd.total_variation(dd.empirical(bon.samples, 2), tilt) > 2 * tv_smc


@pytest.mark.parametrize("kind, method, dtype", [("absorbing", "unmask", torch.bfloat16),
                                                 ("uniform", "ancestral", torch.float16)])
def test_no_host_reads_per_step_and_low_precision_probabilities(kind, method, dtype):
    # A torch-only denoiser in half precision: the loop's host reads must not grow with the steps.
    from tests.host_sync import count_host_reads

    gp = graph_process(kind, 6, node_classes=2)

    def den(nodes, edges, mask, t, cond=None):
        deg = (edges == 1).sum(-1, keepdim=True).to(dtype)
        p_nodes = torch.softmax(torch.cat([deg, -deg], -1).float(), -1).to(dtype)
        p_edges = torch.softmax(torch.stack([t[:, None, None].expand_as(edges), 1 - t[:, None, None]
                                             .expand_as(edges)], -1).float(), -1).to(dtype)
        return p_nodes, p_edges

    counts = torch.tensor([6, 4, 5])
    reads = []
    for steps in (3, 9):
        g, n = count_host_reads(sample_graphs, den, gp, steps, num_nodes=counts, method=method, generator=0)
        check_batch(g)
        assert torch.equal(g.num_nodes, counts)
        reads.append(n)
    assert reads[0] == reads[1], reads


@pytest.mark.slow
@pytest.mark.parametrize("lam", [0.5, 1.0, 2.0])
def test_smc_single_draws_beat_best_of_n_on_every_seed(lam):
    # benchmarks/graph_smc.py's claim, at P = N = 16 (96 NFE per output), 512 outputs, 3 seeds: FK steering's output
    # (one particle per group from its weights) is closer to the enumerated tilt than best-of-N.
    from script_modules import load_script

    bench = load_script("benchmarks/graph_smc.py")
    priors, run = bench.priors, bench.run
    for table in priors().values():
        for seed in range(3):
            r = run(table, lam, 16, 512, seed)
            assert r["smc_draw"] < r["best_of_n"] and r["smc_pooled"] < r["best_of_n"], r


def test_corrupt_with_an_edge_marginal_per_graph():
    """``edge_marginal [B, Ke]``: each graph's corrupted pairs drawn from its own limit. The process's own ``m`` per
    row gives bit-identical noise (the same uniforms); at ``t = 1`` (nothing survives) a graph's edge frequency is
    its row's edge probability, within Monte Carlo error."""
    m = [0.7, 0.3]
    gp = graph_process("marginal", 20, schedule="linear", edge_marginal=m)
    graphs = [nx.path_graph(20)] * 4
    b = from_networkx(graphs, 20)
    t = torch.tensor([0.3, 0.6, 1.0, 1.0])
    same = gp.corrupt(b, t, torch.Generator().manual_seed(0), torch.tensor([m] * 4))
    plain = gp.corrupt(b, t, torch.Generator().manual_seed(0))
    assert torch.equal(same.edges, plain.edges)
    rows = torch.tensor([m, m, [0.9, 0.1], [0.2, 0.8]])
    noisy = gp.corrupt(b, t, torch.Generator().manual_seed(1), rows)
    assert torch.equal(noisy.edges, noisy.edges.transpose(1, 2)) and torch.equal(noisy.mask, b.mask)
    pairs = 190
    for i, p in ((2, 0.1), (3, 0.8)):
        freq = float(torch.triu(noisy.edges[i], 1).sum()) / pairs
        assert abs(freq - p) <= 4 * (p * (1 - p) / pairs) ** 0.5, (i, freq, p)
    with pytest.raises(ValueError, match="edge_marginal"):
        gp.corrupt(b, t, None, torch.tensor([m] * 3))
    with pytest.raises(ValueError, match="edge_marginal"):
        graph_process("absorbing", 20).corrupt(b, t, None, torch.tensor([m] * 4))
