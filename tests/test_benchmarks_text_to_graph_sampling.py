"""benchmarks/text_to_graph_sampling.py's guiders against the library's logit CFG (independent truth: the identities
each variant reduces to: a schedule covering all times is constant CFG, a schedule's outside scale 1 is the
conditional model, a zero end temperature is the argmax of the guided probabilities, the composed guider with the
domain scale equal to the statistics scale telescopes to CFG at that scale)."""

from pathlib import Path

import pytest
import torch
from script_modules import load_script

from steerdiff.discrete import CFG

ROOT = Path(__file__).resolve().parents[1]
B, L, K = 6, 5, 3


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/text_to_graph_sampling.py")


def _denoiser():
    g = torch.Generator().manual_seed(0)
    base, shift = torch.randn(L, K, generator=g), torch.randn(L, K, generator=g)

    def den(x, t, cond):
        c = cond.clamp_min(0).sum(1).float()  # the null prompt (-1) and other prompts differ
        return torch.softmax(base[None] + (c + t)[:, None, None] * shift[None] / 10, -1)

    return den


def _inputs():
    x = torch.zeros(B, L, dtype=torch.long)
    t = torch.linspace(0.05, 0.95, B)
    cond = torch.tensor([[1, 4, 2]] * B)
    return x, t, cond


def test_full_interval_is_constant_cfg_and_outside_is_conditional(bench):
    den, (x, t, cond) = _denoiser(), _inputs()
    want = CFG(2.5).wrap(den)(x, t, cond)
    torch.testing.assert_close(bench.ScheduledCFG(2.5).wrap(den)(x, t, cond), want)
    got = bench.ScheduledCFG(2.5, lo=0.5, hi=1.0, w_out=1.0).wrap(den)(x, t, cond)
    late = t < 0.5
    torch.testing.assert_close(got[~late], want[~late])
    torch.testing.assert_close(got[late], den(x, t, cond)[late])


def test_zero_end_temperature_is_the_argmax(bench):
    den, (x, t, cond) = _denoiser(), _inputs()
    p = CFG(2.0).wrap(den)(x, t, cond)
    got = bench.ScheduledCFG(2.0, t_end=0.5, temp_end=0).wrap(den)(x, t, cond)
    end = t <= 0.5
    torch.testing.assert_close(got[end], torch.nn.functional.one_hot(p[end].argmax(-1), K).float())
    torch.testing.assert_close(got[~end], p[~end])


def test_composed_guidance_telescopes_to_cfg(bench):
    den, (x, t, cond) = _denoiser(), _inputs()
    stats = torch.tensor([[1, 2, -1]] * B)
    torch.testing.assert_close(bench.ComposedCFG(3.0, 3.0, stats).wrap(den)(x, t, cond),
                               CFG(3.0).wrap(den)(x, t, cond))
    # w = 0, w_dom = 1: the model conditioned on the full prompt, divided by the statistics-only one, times the null
    pf, ps, pu = den(x, t, cond), den(x, t, stats), den(x, t, torch.full_like(cond, -1))
    want = pu * pf / ps
    torch.testing.assert_close(bench.ComposedCFG(0.0, 1.0, stats).wrap(den)(x, t, cond),
                               want / want.sum(-1, keepdim=True))


@pytest.mark.parametrize("config", [{"w": 2, "corr": 1, "steps": 5}, {"w": 2, "corr": 2, "corr_lo": 0.3, "steps": 6},
                                    {"w": 2, "steps": 4}])
def test_corrector_costs_what_nfe_says_and_keeps_padded_slots(bench, config):
    from steerdiff.discrete.graph import graph_process

    process = graph_process("marginal", 5, edge_marginal=[0.7, 0.3])
    rows = []

    def den(nodes, edges, mask, t, cond):  # an edge is likelier where both ends already have one (any valid law)
        rows.append(len(t))
        deg = (edges > 0).sum(-1).float()
        logit = 0.3 * (deg[:, :, None] + deg[:, None, :]) - 1.0 + 0.1 * cond.clamp_min(0).sum(1)[:, None, None]
        pe = torch.stack([torch.sigmoid(-logit), torch.sigmoid(logit)], -1)
        return torch.ones(*nodes.shape, 1), pe

    counts = torch.tensor([5, 3, 4, 2])
    cond = torch.tensor([[1, 2]] * 4)
    c = dict(config)
    steps = c.pop("steps")
    graphs = bench.corrected(den, process, steps, counts, cond, bench.ScheduledCFG(c.pop("w")), c.get("corr", 0),
                             c.get("corr_lo", 0.0), c.get("corr_hi", 1.0))
    assert sum(rows) == bench.nfe(config) * len(counts)
    assert graphs.mask.sum(1).tolist() == counts.tolist()
    assert not bool(graphs.edges[~(graphs.mask[:, :, None] & graphs.mask[:, None, :])].any())


def test_rows_of_another_model_name_it_and_match_the_default_model(bench):
    """A row of a model given by another path than the default says which model (``"model"``), and the same model
    under either path gives the same row (the label changes nothing else)."""
    asset = str(ROOT / "steerdiff" / "assets" / "graphs_lggm")
    args = ["--per-domain", "1", "--domains", "grid", "tree", "--configs", '{"w":2,"steps":3}', "--seed", "5000"]
    (default,) = bench.main(args)
    (named,) = bench.main([*args, "--model", asset])
    assert "model" not in default and named.pop("model") == asset
    assert {k: v for k, v in named.items() if k != "cpu"} == {k: v for k, v in default.items() if k != "cpu"}


def test_corrector_and_remasking_rows_cost_what_nfe_says_and_remasking_needs_an_absorbing_model(bench):
    from steerdiff.discrete.corrector import correct
    from steerdiff.discrete.graph import flat_denoiser, graph_process
    from steerdiff.discrete.remask import remask_decode

    rows = []

    def den(nodes, edges, mask, t, cond):
        rows.append(len(t))
        logit = 0.2 * (edges == 1).sum(-1).float()[:, :, None] - 1.0 + 0.1 * cond.clamp_min(0).sum(1)[:, None, None]
        pe = torch.stack([torch.sigmoid(-logit), torch.sigmoid(logit)], -1).expand(-1, -1, edges.shape[2], -1)
        return torch.ones(*nodes.shape, 1), pe

    counts, cond = torch.tensor([5, 3, 4, 2]), torch.tensor([[1, 2]] * 4)
    guider = bench.ScheduledCFG(2.0)
    absorbing = graph_process("absorbing", 5, schedule="cosine")
    start = absorbing.pad(torch.full((4, absorbing.length), absorbing.mask_index), counts)
    out = remask_decode(flat_denoiser(den, absorbing), absorbing, start, 6, eta=0.5, loop=3, cond=cond,
                        guidance=guider, generator=0)
    assert sum(rows) == bench.nfe({"w": 2, "steps": 6, "decode": "remask", "eta": 0.5, "loop": 3}) * len(counts)
    assert absorbing.unflatten(out).mask.sum(1).tolist() == counts.tolist()
    rows.clear()
    marginal = graph_process("marginal", 5, edge_marginal=[0.7, 0.3])
    x = marginal.pad(torch.zeros(4, marginal.length, dtype=torch.long), counts)
    correct(flat_denoiser(den, marginal), marginal, x, sweeps=4, cond=cond, guidance=guider)
    assert sum(rows) == (bench.nfe({"w": 2, "steps": 3, "fix": 4}) - bench.nfe({"w": 2, "steps": 3})) * len(counts)
    with pytest.raises(ValueError, match="absorbing"):
        bench.main(["--per-domain", "1", "--domains", "tree", "--configs", '{"w":2,"steps":2,"decode":"remask"}'])


def _edge_den(rows):
    def den(nodes, edges, mask, t, cond):  # an edge is likelier where both ends already have one (any valid law)
        rows.append(len(t))
        deg = (edges > 0).sum(-1).float()
        logit = 0.3 * (deg[:, :, None] + deg[:, None, :]) - 1.0 + 0.1 * cond.clamp_min(0).sum(1)[:, None, None]
        return torch.ones(*nodes.shape, 1), torch.stack([torch.sigmoid(-logit), torch.sigmoid(logit)], -1)

    return den


def test_in_chain_corrector_costs_what_nfe_says_and_changes_nothing_when_nothing_is_doubted(bench):
    """The in-chain corrector (``fix_at``) adds one guided evaluation per time and sweep (``nfe``); with a threshold
    no pair falls below it re-decides nothing, so the chain is the uncorrected run bit for bit (the sampler's own
    randomness is untouched: rows pair exactly with the default up to the first move); with threshold 1 it does
    change the graphs and keeps padded slots."""
    from steerdiff.discrete.graph import flat_denoiser, graph_process, sample_graphs

    process = graph_process("marginal", 5, edge_marginal=[0.7, 0.3])
    rows = []
    den = _edge_den(rows)
    counts, cond = torch.tensor([5, 3, 4, 2]), torch.tensor([[1, 2]] * 4)
    guider = bench.ScheduledCFG(2.0)
    plain = sample_graphs(den, process, 8, num_nodes=counts, cond=cond, guidance=guider, generator=3)
    for thr, same in ((1e-9, True), (1.0, False)):
        rows.clear()
        hook = bench.in_chain_corrector(flat_denoiser(den, process), process, 8, [0.5, 0.25], 2, cond, guider,
                                        threshold=thr, per_sweep=3)
        out = sample_graphs(den, process, 8, num_nodes=counts, cond=cond, guidance=guider, generator=3,
                            callback=hook)
        assert sum(rows) == bench.nfe({"w": 2, "steps": 8, "fix_at": [0.5, 0.25], "fix_at_n": 2}) * len(counts)
        assert torch.equal(out.edges, plain.edges) == same
        assert out.mask.sum(1).tolist() == counts.tolist()
        assert not bool(out.edges[~(out.mask[:, :, None] & out.mask[:, None, :])].any())


@pytest.mark.parametrize("times", [[], [0.0, 0.5], [1.0], [0.45, 0.41]])
def test_in_chain_corrector_refusals(bench, times):
    from steerdiff.discrete.graph import graph_process

    process = graph_process("marginal", 4, edge_marginal=[0.7, 0.3])
    with pytest.raises(ValueError, match="fix_at"):
        bench.in_chain_corrector(None, process, 10, times, 1, None, None)


@pytest.mark.parametrize("low", [0.2, 0.9])
def test_planar_detail_counts_the_doubted_edges_that_break_planarity(low, capsys):
    """``text_to_graph_doubt.py --planar`` on K5 (non-planar; K5 minus any edge is planar): with one edge doubted
    (probability 0.2) removing it alone makes the graph planar, so the last edge removed is that one, below 0.5;
    with no edge doubted, one confident edge (0.9) must go."""
    module = load_script("benchmarks/text_to_graph_doubt.py")
    from steerdiff.data.graphs import to_networkx
    from steerdiff.discrete.graph import graph_process

    process = graph_process("marginal", 5, edge_marginal=[0.7, 0.3])
    flat = torch.full((1, process.length), process.offset + 1)  # every pair an edge: K5
    conf = torch.full((1, process.length), 0.9)
    conf[0, process.node_slots + 3] = low
    probs = torch.stack([1 - conf, conf], -1)
    module.planar_detail(process, flat, lambda x, t, c: probs, None, [{"domain": "planar", "nodes": 5}],
                         to_networkx(process.unflatten(flat)), 0.02)
    out = capsys.readouterr().out
    assert f"| 0 | 5 | 10 | {int(low < 0.5)} | 1 | {low:.2f} |" in out
    assert f"{int(low >= 0.5)} need an edge of probability >= 0.5 removed" in out


def test_corrector_scale_equal_to_the_sampling_scale_is_the_plain_corrector_row(bench):
    """``fix_w`` (another CFG scale for the end sweeps) at the sampling scale gives the row without it."""
    args = ["--per-domain", "1", "--domains", "grid", "planar", "--seed", "5000", "--configs",
            '{"w":2,"steps":3,"fix":2,"fix_thr":1.0}', '{"w":2,"steps":3,"fix":2,"fix_thr":1.0,"fix_w":2}']
    plain, same = bench.main(args)
    assert {k: v for k, v in plain.items() if k not in ("cpu", "cfg")} == \
        {k: v for k, v in same.items() if k not in ("cpu", "cfg")}


def test_tp_rows_sample_on_the_time_power_grid_and_are_refused_with_other_chains(bench, monkeypatch):
    """``"tp"``: the ancestral rows (and rows with the end corrector) sample with ``time_power=tp``; with the
    forward-backward corrector or remasking it is refused."""
    seen = []
    original = bench.sample_graphs

    def recording(*args, **kwargs):
        seen.append(kwargs.get("time_power"))
        return original(*args, **kwargs)

    monkeypatch.setattr(bench, "sample_graphs", recording)
    args = ["--per-domain", "1", "--domains", "tree", "--seed", "5000", "--configs"]
    bench.main([*args, '{"w":2,"steps":3,"tp":3}', '{"w":2,"steps":3}', '{"w":2,"steps":3,"tp":2,"fix":1}'])
    assert seen == [3, 1.0, 2]
    assert bench.nfe({"w": 2, "steps": 3, "tp": 3}) == 6
    with pytest.raises(ValueError, match="tp"):
        bench.main([*args, '{"w":2,"steps":3,"tp":2,"corr":1}'])
