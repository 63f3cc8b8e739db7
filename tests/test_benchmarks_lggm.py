"""benchmarks/lggm.py's flags reach the run (``--pretrain-count``: the pre-training corpus per domain, the held-out
set keeping ``--count``; ``--model``: the network's widths, the same for the pre-trained and the single-domain model,
docs/methods/lggm.md, "A larger pre-training corpus and network"; ``--lr-schedule`` and ``--ema-decay``: every
training run's; ``--pretrain-varied`` and ``--pretrain-extra``: the pre-training corpus only; ``--pretrain-text
none``: an unconditional pre-trained network, as LGGM's; ``--pretrain-noise domain``: each pre-training graph noised
toward its domain's edge marginal; ``--process uniform``: every model's transitions uniform) and its ratios are the
rows they name. A tiny run: a few training and sampling steps."""

import json

import pytest
import torch
from script_modules import load_script

from steerdiff.discrete.graph_train import data_prior, process_of


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/lggm.py")


def test_scale_flags_reach_the_run(bench, tmp_path, monkeypatch):
    counts, widths, schedules, held_out = [], [], [], []
    domain_data, model_class, train = bench.domain_data, bench.GraphTransformer, bench.train_graphs
    generate = bench.generate

    def spy_generate(domain, count, seed, **kw):
        held_out.append((domain, kw.get("varied", False)))
        return generate(domain, count, seed, **kw)

    def spy_data(domains, count, seed, n_max, varied):
        counts.append((len(domains), count, varied))
        return domain_data(domains, count, seed, n_max, varied=varied)

    def spy_model(**kw):
        widths.append((kw["hidden_x"], kw["layers"], kw["structure"]))
        return model_class(**kw)

    def spy_train(net, data, config, **kw):
        schedules.append((config.lr_schedule, config.steps, config.ema_decay))
        return train(net, data, config, **kw)

    monkeypatch.setattr(bench, "domain_data", spy_data)
    monkeypatch.setattr(bench, "generate", spy_generate)
    monkeypatch.setattr(bench, "train_graphs", spy_train)
    monkeypatch.setattr(bench, "GraphTransformer", spy_model)
    monkeypatch.setattr(bench, "results_dir", lambda name: tmp_path)
    bench.main(["--held-out", "tree", "--seeds", "0", "--count", "4", "--pretrain-count", "6", "--pretrain-steps", "2",
                "--pretrain-varied", "--steps", "3", "--lr-schedule", "cosine", "--ema-decay", "0.99", "--batch", "4",
                "--n-eval", "4", "--n-eval-large", "0", "--sample-steps", "2",
                "--model", "shipped", "--structure", "pairs", "--runs", str(tmp_path / "runs")])
    n_domains = len(bench.DOMAINS.names()) - 1
    # the pre-training corpus, varied; the held-out set is `generate(held, --count)`, never varied
    assert counts == [(n_domains, 6, True)] and held_out == [("tree", False)] * 3
    shipped = bench.MODELS["shipped"]
    assert widths == [(shipped["hidden_x"], shipped["layers"], "pairs")] * 2  # pre-trained and single-domain
    # every training run (pre-training, fine-tuning, single-domain) under the asked schedule and weight average
    assert schedules == [("cosine", 2, 0.99), ("cosine", 3, 0.99), ("cosine", 3, 0.99)]
    out = json.loads((tmp_path / "results_tree.json").read_text())
    rows = out["per_seed"][0]["rows"]
    assert out["summary"]["zero_shot_over_single"] == [rows["zero_shot_lggm"]["mean"] / rows["single_domain"]["mean"]]
    assert out["summary"]["fine_tuned_over_single"] == [rows["fine_tuned"]["mean"] / rows["single_domain"]["mean"]]
    readme = (tmp_path / "README_tree.md").read_text()
    assert "Network `shipped`" in readme and f"{n_domains} domains x 6 graphs" in readme
    assert "4 `tree` graphs" in readme and "(cosine), EMA of the weights (decay 0.99)" in readme
    assert "6 graphs (family parameters varied per graph)" in readme


def test_pretrain_extra_adds_corpus_families_to_pre_training_only(bench, tmp_path):
    args = bench.parser().parse_args(["--held-out", "planar", "--pretrain-extra", "caveman,waxman", "--count", "2",
                                      "--model", "small", "--runs", str(tmp_path)])
    families = bench.pretrain_families(args)
    assert families == [d for d in bench.DOMAINS.names() if d != "planar"] + ["caveman", "waxman"]
    seen = []
    model = bench.pretrained(args, 0, fit=lambda name, net, data, steps, cond: seen.append((len(data), cond)))
    (n_graphs, cond), = seen
    assert n_graphs == 2 * len(families) and not (cond == 0).any()  # every word known, the families' too
    assert {"caveman", "waxman"} <= set(model.vocab)
    assert bench.parser().parse_args(["--pretrain-extra", "all"]).pretrain_extra == bench.CORPUS_FAMILIES.names()
    assert bench.parser().parse_args([]).pretrain_extra == []
    for bad in ("planar", "caveman,caveman", "nope"):
        with pytest.raises(SystemExit):
            bench.parser().parse_args(["--pretrain-extra", bad])


def test_pretrain_text_none_pretrains_unconditionally_and_drops_the_prompted_row(bench, tmp_path, monkeypatch):
    args = bench.parser().parse_args(["--held-out", "tree", "--count", "2", "--runs", str(tmp_path / "unused")])
    assert args.pretrain_text == "partial"
    seen = []
    fit = lambda name, net, data, steps, cond: seen.append(cond)  # noqa: E731
    bench.pretrained(args, 0, fit=fit)
    bench.pretrained(bench.parser().parse_args(["--held-out", "tree", "--count", "2", "--pretrain-text", "none"]), 0,
                     fit=fit)
    # partial text: a prompt per pre-training graph, some of them null; none: no condition at all
    assert seen[0] is not None and seen[0].shape[0] == 2 * (len(bench.DOMAINS.names()) - 1) and seen[1] is None
    assert "zero_shot_prompted" in bench.rows_of(args)
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["--pretrain-text", "full"])
    monkeypatch.setattr(bench, "results_dir", lambda name: tmp_path)
    bench.main(["--held-out", "tree", "--seeds", "0", "--count", "4", "--pretrain-steps", "2", "--steps", "2",
                "--batch", "4", "--n-eval", "4", "--n-eval-large", "0", "--sample-steps", "2", "--pretrain-text",
                "none", "--runs", str(tmp_path / "runs"), "--tag", "_nt"])
    out = json.loads((tmp_path / "results_tree_nt.json").read_text())
    assert set(out["per_seed"][0]["rows"]) == set(bench.ROWS) - {"zero_shot_prompted"}
    assert out["summary"]["zero_shot_prompted_over_single"] is None
    readme = (tmp_path / "README_tree_nt.md").read_text()
    assert "without text (unconditional)" in readme and "(a3) zero-shot, prompted / single-domain: not run" in readme
    assert "(a3) zero-shot, prompted |" not in readme  # no table row for it


def test_pretrain_noise_domain_gives_each_graph_its_domains_edge_marginal(bench, tmp_path):
    seen = []
    fit = lambda name, net, data, steps, cond, **kw: seen.append((data, kw))  # noqa: E731
    for flags in ([], ["--pretrain-noise", "domain"]):
        bench.pretrained(bench.parser().parse_args(["--held-out", "tree", "--count", "3", *flags]), 0, fit=fit)
    (_, plain), (data, kw) = seen
    assert plain == {}
    m = kw["edge_marginals"]
    domains = [d for d in bench.DOMAINS.names() if d != "tree"]
    assert m.shape == (3 * len(domains), 2)
    for k, d in enumerate(domains):  # graphs come in domain order, 3 each: one row per domain, its own density
        rows = m[3 * k:3 * k + 3]
        torch.testing.assert_close(rows, rows[:1].expand(3, -1))
        gs = bench.generate(d, 3, 0)
        density = sum(g.number_of_edges() for g in gs) / sum(g.number_of_nodes() * (g.number_of_nodes() - 1) / 2
                                                             for g in gs)
        assert float(rows[0, 1]) == pytest.approx(max(density, 1e-3), abs=2e-3), d


def test_finetune_process_held_out_fine_tunes_under_the_held_out_marginal(bench, tmp_path, monkeypatch):
    """LGGM's fine-tuning builds the model from the held-out data set: ``--finetune-process held-out`` trains and
    samples row (b) under the held-out graphs' edge marginal (the single-domain model's), in its own checkpoint
    directory; the default keeps the pre-trained network's."""
    seen = {}
    train_run = bench.train_run

    def spy(args, seed, name, net, data, steps, **kw):
        seen[(args.finetune_process, name)] = (net.config["process"]["edge_marginal"], data_prior(data))
        return train_run(args, seed, name, net, data, steps, **kw)

    monkeypatch.setattr(bench, "train_run", spy)
    monkeypatch.setattr(bench, "results_dir", lambda name: tmp_path)
    for how in ("pretraining", "held-out"):
        bench.main(["--held-out", "tree", "--seeds", "0", "--count", "4", "--pretrain-steps", "2", "--steps", "2",
                    "--batch", "4", "--n-eval", "4", "--n-eval-large", "0", "--sample-steps", "2",
                    "--finetune-process", how, "--runs", str(tmp_path / "runs"), "--tag", f"_{how}"])
    pre_m = seen[("pretraining", "pretrain")][0]
    single_m = seen[("pretraining", "single")][0]
    assert single_m == seen[("pretraining", "single")][1]["edge_marginal"] != pre_m  # trees: sparser than the corpus
    assert seen[("pretraining", "finetune")][0] == pre_m
    assert seen[("held-out", "finetune_held_out")][0] == single_m
    assert "under the held-out graphs process" in (tmp_path / "README_tree_held-out.md").read_text()


def test_process_uniform_gives_every_model_and_row_uniform_transitions(bench, tmp_path, monkeypatch):
    """``--process uniform`` (LGGM's released run scripts): pre-training, fine-tuning, single-domain training and the
    zero-shot row's held-out process are all uniform, whose noise is density 1/2 whatever the graphs; per-domain
    noise, which only a marginal process uses, is refused by name."""
    kinds, priors = {}, []
    train_run, generate_graphs = bench.train_run, bench.generate_graphs

    def spy_train(args, seed, name, net, data, steps, **kw):
        kinds[name] = net.config["process"]["kind"]
        torch.testing.assert_close(process_of(net, 4).edge_process.m.double(), torch.tensor([0.5, 0.5]).double())
        return train_run(args, seed, name, net, data, steps, **kw)

    def spy_generate(model, counts, **kw):
        priors.append(None if kw.get("prior") is None else kw["prior"]["kind"])
        return generate_graphs(model, counts, **kw)

    monkeypatch.setattr(bench, "train_run", spy_train)
    monkeypatch.setattr(bench, "generate_graphs", spy_generate)
    monkeypatch.setattr(bench, "results_dir", lambda name: tmp_path)
    for how in ("pretraining", "held-out"):
        bench.main(["--held-out", "tree", "--seeds", "0", "--count", "4", "--pretrain-steps", "2", "--steps", "2",
                    "--batch", "4", "--n-eval", "4", "--n-eval-large", "0", "--sample-steps", "2", "--process",
                    "uniform", "--finetune-process", how, "--runs", str(tmp_path / "runs"), "--tag", f"_u_{how}"])
    assert kinds == {"pretrain": "uniform", "finetune": "uniform", "finetune_held_out": "uniform", "single": "uniform"}
    assert "uniform" in priors and set(priors) <= {"uniform", None}  # row (a) under the held-out uniform process
    assert "uniform transitions" in (tmp_path / "README_tree_u_held-out.md").read_text()
    with pytest.raises(SystemExit):
        bench.main(["--process", "uniform", "--pretrain-noise", "domain"])
