"""LGGM's comparison on a held-out graph domain (``docs/methods/lggm.md``, "The LGGM benchmark").

Wang et al., "Large Graph Generative Models" (ICLR 2025), Sec. 4.2: a DiGress model pre-trained on every domain but
one, evaluated on the held-out domain (a) zero-shot and (b) fine-tuned on it, against (c) a model trained on that
domain alone for as many steps as the fine-tuning. Per seed (pre-training data, initialisation, batches, samples):

* pre-training: ``--count`` graphs of each other domain, with partial text descriptions (condition dropout 0.1),
  ``--pretrain-steps``; the held-out domain's word never appears (``--pretrain-text none``: no text at all, the
  unconditional network LGGM's zero-shot rows use; row (a3), which needs a trained text encoder, is then not run);
* (a) **zero-shot** as LGGM evaluates it (the headline): the pre-trained network, null prompt, sampled under the
  held-out domain's process, i.e. its edge marginal (the starting noise and the reverse kernel) and its node counts.
  LGGM's code (DiGress's) builds the sampling model from the test domain's data module (node-count distribution and
  edge marginal) and loads only the pre-trained weights; nothing of the held-out graphs' structure beyond those two
  statistics is used, and no prompt;
* (a2) **zero-shot, pre-training marginal**: the same network under its own (pre-training) process, null prompt;
  and (a3) **zero-shot, prompted** with statistics only (``"a graph with <n> nodes and average degree <d>"``, ``d``
  the mean over the held-out training graphs; no domain word), CFG ``w = 2``, pre-training marginal;
* (b) **fine-tuned**: the pre-trained model trained ``--steps`` more on ``--count`` held-out graphs (null prompt),
  under its own process, or with ``--finetune-process held-out`` under the held-out graphs' (LGGM's code);
* (c) **single-domain**: the same architecture trained ``--steps`` on those graphs alone (its own edge marginal).

Every model's forward process is DiGress's marginal one (``--process uniform``: uniform transitions, the setting of
the run scripts released with LGGM-derived code, ``model.transition="uniform"``; then the held-out process of (a) and
(b) differs from the pre-training one only in its node counts, which every row is given anyway).

Each model samples ``--n-eval`` graphs (ancestral, ``--sample-steps``) with the node counts of ``--n-eval`` fresh
reference graphs of the domain; MMD^2 (Gaussian TV kernel, GRAN's bandwidths; :func:`steerdiff.metrics.graphs.
graph_mmd`) of degree, clustering and spectrum histograms to the reference, and validity. ``data`` is a fresh set of
real graphs against the reference (the floor). Every row is scored again on ``--n-eval-large`` samples against as
many reference graphs (the first ``--n-eval`` of each are the same graphs): the biased MMD² has a floor of about
``c / n``, which at 48 samples is most of a good model's score and pulls every ratio toward 1. Results in
``benchmarks/results/lggm/`` (``--tag`` suffixes the file names); model checkpoints and each seed's result
(resumable; seeds may run in parallel processes, ``--seeds 1``, and a last call gathers them) under ``--runs``.

``--pretrain-count`` gives the pre-training corpus more graphs per domain than the held-out domain's ``--count``
(LGGM's setting: a large corpus, a small target set), ``--pretrain-varied`` draws each pre-training graph's family
parameters over a range (a more varied corpus; :attr:`steerdiff.data.graphs.Domain.varied`), ``--pretrain-extra``
adds families that are not domains of the shipped model (:data:`steerdiff.data.graphs.CORPUS_FAMILIES`: a corpus of
more families), ``--model shipped`` the shipped graphs_lggm network's widths.

    OMP_NUM_THREADS=1 python benchmarks/lggm.py [--held-out sbm] [--seeds 0 1 2] [--pretrain-steps 3000 --tag _x]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from steerdiff.app.recipes.graphs_lggm import GRAPHS_LGGM_RECIPE
from steerdiff.data.graphs import CORPUS_FAMILIES, DOMAINS, describe, from_networkx, generate, to_networkx
from steerdiff.discrete.graph_train import (
    GraphTrainConfig,
    data_prior,
    generate_graphs,
    group_edge_marginals,
    train_graphs,
)
from steerdiff.discrete.lggm import domain_data, prompt, training_prompts, vocabulary
from steerdiff.metrics.graphs import graph_mmd, validity
from steerdiff.models import GraphTransformer
from steerdiff.models.graph_transformer import STRUCTURES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

N_MAX = 20
# the benchmark's network ("small", 19k parameters) and the shipped graphs_lggm recipe's widths ("shipped", 100k; its
# structural features are --structure's)
MODELS = {"small": {"hidden_x": 16, "hidden_e": 8, "hidden_y": 16, "layers": 2, "heads": 2, "ff": 32, "text_dim": 16},
          "shipped": {k: v for k, v in GRAPHS_LGGM_RECIPE["model"].items() if k != "structure"}}
STATS = ("degree", "clustering", "spectre")
ROWS = ("data", "zero_shot_lggm", "zero_shot", "zero_shot_prompted", "fine_tuned", "single_domain")
LABELS = {"data": "data (floor)", "zero_shot_lggm": "(a) zero-shot, held-out marginal (LGGM protocol)",
          "zero_shot": "(a2) zero-shot, pre-training marginal", "zero_shot_prompted": "(a3) zero-shot, prompted",
          "fine_tuned": "(b) fine-tuned", "single_domain": "(c) single-domain"}


def rows_of(args) -> tuple[str, ...]:
    """The rows a run makes: every one of :data:`ROWS`, but (a3) (a prompt) when pre-trained without text."""
    return tuple(r for r in ROWS if not (r == "zero_shot_prompted" and args.pretrain_text == "none"))


def seed_dir(args, seed: int) -> Path:
    """Where a seed's checkpoints and result live: ``<--runs>/<held-out>_seed<seed>``."""
    return Path(args.runs) / f"{args.held_out}_seed{seed}"


def prior_of(args, graphs) -> dict:
    """The process metadata of a model trained on (or sampled for) ``graphs``: ``--process``'s kind, with their
    edge marginal and node counts (:func:`steerdiff.discrete.graph_train.data_prior`; the uniform process's
    transitions do not depend on the marginal)."""
    return data_prior(graphs, kind=args.process)


def train_run(args, seed: int, name: str, net: GraphTransformer, data, steps: int, **kw) -> dict:
    """One of a seed's training runs (``name``: pretrain, finetune or single), resumed from (or, finished, loaded
    from) its checkpoint under :func:`seed_dir`; :func:`steerdiff.discrete.graph_train.train_graphs`' result."""
    cfg = GraphTrainConfig(steps=steps, batch=args.batch, lr=args.lr, lr_schedule=args.lr_schedule, seed=seed,
                           checkpoint_every=500, ema_decay=args.ema_decay)
    return train_graphs(net, data, cfg, out_dir=seed_dir(args, seed) / name, **kw)


def pretrain_families(args) -> list[str]:
    """The pre-training corpus's families: every domain but ``--held-out``, then the ``--pretrain-extra`` corpus
    families."""
    return [d for d in DOMAINS.names() if d != args.held_out] + list(args.pretrain_extra)


def extra_families(text: str) -> list[str]:
    """``--pretrain-extra``'s value: comma-separated corpus family names (``all``: every one; empty: none)."""
    if text.strip() == "all":
        return CORPUS_FAMILIES.names()
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in CORPUS_FAMILIES]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--pretrain-extra takes distinct names of {CORPUS_FAMILIES.names()} or "
                                         f"'all', got {text!r}")
    return names


def pretrained(args, seed: int, fit=None) -> GraphTransformer:
    """The network pre-trained on every domain but ``--held-out`` (``--pretrain-count`` graphs each, their family
    parameters drawn per graph with ``--pretrain-varied``, partial text descriptions, ``--pretrain-steps``).
    ``fit(name, net, data, steps, cond=...)`` trains it (default :func:`train_run`: a finished checkpoint is loaded
    as it is)."""
    torch.manual_seed(seed)
    pre, names, stats = domain_data(pretrain_families(args), args.pretrain_count or args.count, seed, N_MAX,
                                    varied=args.pretrain_varied)
    model = GraphTransformer(n_max=N_MAX, vocab=vocabulary(N_MAX, extra_domains=args.pretrain_extra),
                             process=prior_of(args, pre), structure=args.structure, **MODELS[args.model])
    # without text the network is trained on the null prompt only: LGGM's pre-trained model is unconditional (its
    # text-to-graph model is a separate one), so its zero-shot rows never see a prompt in training either
    cond = None if args.pretrain_text == "none" else model.tokenize(training_prompts(names, stats, seed=seed))
    # per domain: each graph noised toward its own domain's edge marginal, so the noise densities the network learns
    # to denoise span the domains' (the held-out marginal LGGM samples under is one more such density)
    kw = {"edge_marginals": group_edge_marginals(pre, names)} if args.pretrain_noise == "domain" else {}
    (fit or partial(train_run, args, seed))("pretrain", model, pre, args.pretrain_steps, cond=cond, **kw)
    return model


def held_out_sets(args, seed: int) -> tuple[list, list, list]:
    """The held-out domain's graphs of a seed: the ``--count`` training graphs, the reference the samples are scored
    against and a fresh set (the data floor), the last two ``max(--n-eval, --n-eval-large)`` each (the first
    ``--n-eval`` of each are the ``--n-eval`` evaluation's)."""
    n_all = max(args.n_eval, args.n_eval_large)
    held = args.held_out
    return generate(held, args.count, seed), generate(held, n_all, seed + 1000), generate(held, n_all, seed + 2000)


def sample_generator(seed: int) -> int:
    """The sampling seed every row of a seed's models draws with (the same noise for every model)."""
    return seed * 100_000


def zero_shot(args, seed: int, model: GraphTransformer, target, counts):
    """Row (a): the pre-trained ``model`` sampled with null prompt under the held-out graphs' (``target``) process,
    with node counts ``counts`` (LGGM's zero-shot protocol)."""
    return generate_graphs(model, counts, steps=args.sample_steps, generator=sample_generator(seed),
                           prior=prior_of(args, target), time_power=args.time_power)


def run_seed(args, seed: int) -> dict:
    held = args.held_out
    runs = seed_dir(args, seed)
    done = runs / "result.json"
    if done.is_file():  # a seed finished earlier (or by another process: seeds may run in parallel)
        saved = json.loads(done.read_text())
        if saved.get("args") == _seed_args(args) and all(r in saved["rows"] for r in rows_of(args)):
            return saved
    c0 = time.process_time()
    train_cpu = {}  # CPU seconds of each training run, summed over its resumed parts (its checkpoints keep them)

    def fit(name: str, net: GraphTransformer, data, steps: int, **kw) -> None:
        t0 = time.process_time()
        res = train_run(args, seed, name, net, data, steps, **kw)
        train_cpu[name] = (res["cpu_seconds"], time.process_time() - t0)

    model = pretrained(args, seed, fit)
    target_graphs, reference, fresh = held_out_sets(args, seed)
    target = from_networkx(target_graphs, N_MAX)
    counts = [g.number_of_nodes() for g in reference]
    mean_degree = float(np.mean([describe(g)["avg_degree"] for g in target_graphs]))

    fine = copy.deepcopy(model)
    if args.finetune_process == "held-out":
        # LGGM's fine-tuning (DiGress's code, 'train_from_pretrained'): the model is built from the held-out data set
        # (its edge marginal and node counts) and only the weights come from the pre-trained checkpoint, so it is
        # trained and sampled under the held-out domain's process, as the single-domain model is
        fine.config["process"] = prior_of(args, target)
    fit("finetune" if args.finetune_process == "pretraining" else "finetune_held_out", fine, target, args.steps)
    torch.manual_seed(seed)
    single = GraphTransformer(n_max=N_MAX, vocab=vocabulary(N_MAX), process=prior_of(args, target),
                              structure=args.structure, **MODELS[args.model])
    fit("single", single, target, args.steps)

    gen = sample_generator(seed)
    tp = args.time_power
    samples = {
        "data": fresh,
        "zero_shot_lggm": zero_shot(args, seed, model, target, counts),
        "zero_shot": generate_graphs(model, counts, steps=args.sample_steps, generator=gen, time_power=tp),
        **({"zero_shot_prompted": generate_graphs(model, counts, steps=args.sample_steps, generator=gen,
                                                  prompts=[prompt(None, n, mean_degree) for n in counts],
                                                  guidance_scale=2.0, time_power=tp)}
           if "zero_shot_prompted" in rows_of(args) else {}),
        "fine_tuned": generate_graphs(fine, counts, steps=args.sample_steps, generator=gen, time_power=tp),
        "single_domain": generate_graphs(single, counts, steps=args.sample_steps, generator=gen, time_power=tp),
    }
    out = {"seed": seed, "cpu_s": None, "rows": {}, "rows_large": {}}
    for name, graphs in samples.items():
        graphs = graphs if isinstance(graphs, list) else to_networkx(graphs)
        sizes = [("rows", args.n_eval)] + ([("rows_large", len(reference))] if args.n_eval_large else [])
        for key, size in sizes:
            mmd = graph_mmd(reference[:size], graphs[:size], STATS)
            out[key][name] = {**mmd, "mean": float(np.mean(list(mmd.values()))),
                              "valid": validity(graphs[:size], held)}
    # this call's CPU, with the training parts done by earlier (interrupted or cached) calls added back
    out["cpu_s"] = time.process_time() - c0 + sum(total - here for total, here in train_cpu.values())
    out["args"] = _seed_args(args)
    write_json(done, out)
    print(f"seed {seed}: " + ", ".join(f"{k} {v['mean']:.4f}" for k, v in out["rows"].items()), flush=True)
    return out


def _seed_args(args) -> dict:
    """The settings a seed's result depends on (a cached result with other settings is recomputed)."""
    return {k: v for k, v in vars(args).items() if k not in ("seeds", "runs", "tag")}


def summarise(per_seed: list[dict], rows: str = "rows") -> dict:
    """Mean and std over seeds per row and statistic; the ratios the targets name, per seed (``rows``: the
    ``--n-eval`` evaluation, or ``"rows_large"``: the ``--n-eval-large`` one); a row some seed lacks (row (a3)
    without text) is left out."""
    present = [r for r in ROWS if all(r in s[rows] for s in per_seed)]
    summary = {}
    for row in present:
        summary[row] = {}
        for key in (*STATS, "mean", "valid"):
            vals = [s[rows][row][key] for s in per_seed]
            summary[row][key] = {"mean": float(np.mean(vals)), "std": float(np.std(vals))}

    def ratio(row: str) -> list[float]:
        return [s[rows][row]["mean"] / s[rows]["single_domain"]["mean"] for s in per_seed]

    ratio_zs, ratio_ft = ratio("zero_shot_lggm"), ratio("fine_tuned")
    return {"rows": summary, "zero_shot_over_single": ratio_zs, "fine_tuned_over_single": ratio_ft,
            "zero_shot_pretraining_marginal_over_single": ratio("zero_shot"),
            "zero_shot_prompted_over_single": ratio("zero_shot_prompted") if "zero_shot_prompted" in present else None,
            "target_zero_shot_within_1_5x": all(r <= 1.5 for r in ratio_zs),
            "target_fine_tuned_below_single": all(r < 1.0 for r in ratio_ft)}


def parser(description: str = __doc__.split("\n")[0]) -> argparse.ArgumentParser:
    """The benchmark's flags (also read by the scripts that load its runs, e.g. ``lggm_degrees.py``)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--held-out", default="sbm", choices=DOMAINS.names())
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--count", type=int, default=60, help="training graphs per domain")
    ap.add_argument("--pretrain-count", type=int, default=0,
                    help="pre-training graphs per domain (0: --count, as many as the held-out domain's)")
    ap.add_argument("--pretrain-varied", action="store_true",
                    help="draw each pre-training graph's family parameters over a range (Domain.varied: ER's p, "
                         "BA's m, WS's k and p, ...) instead of the family's fixed ones; the held-out domain's "
                         "graphs are never varied")
    ap.add_argument("--pretrain-extra", type=extra_families, default=[],
                    help="add these corpus families (steerdiff.data.graphs.CORPUS_FAMILIES, comma-separated, or "
                         "'all') to the pre-training corpus, as many graphs each as a domain: more families than "
                         "the shipped model's domains, never held out")
    ap.add_argument("--pretrain-text", default="partial", choices=("partial", "none"),
                    help="the pre-training prompts: partial text descriptions with condition dropout 0.1 (the "
                         "default), or none: an unconditional network, as LGGM's pre-trained model is (row (a3) "
                         "is then not run)")
    ap.add_argument("--pretrain-noise", default="corpus", choices=("corpus", "domain"),
                    help="the pre-training noise: the marginal transitions of the whole corpus's edge marginal "
                         "(corpus: DiGress's and LGGM's) or of each graph's own domain's (domain); the network's "
                         "process, which rows (a2), (a3) and (by default) (b) sample under, is the corpus's either "
                         "way")
    ap.add_argument("--finetune-process", default="pretraining", choices=("pretraining", "held-out"),
                    help="the process row (b) is fine-tuned and sampled under: the pre-trained network's own "
                         "(pretraining: the tables before this flag) or the held-out training graphs' edge marginal "
                         "and node counts (held-out: LGGM's code, which builds the fine-tuned model from the "
                         "held-out data set and loads only the weights)")
    ap.add_argument("--process", default="marginal", choices=("marginal", "uniform"),
                    help="every model's forward process: DiGress's marginal transitions (noise toward the training "
                         "graphs' edge density; zero-shot samples under the held-out graphs') or uniform ones "
                         "(toward density 1/2 whatever the data: the setting of the run scripts of LGGM-derived code, "
                         "'model.transition=uniform', so zero-shot uses only the held-out node counts)")
    ap.add_argument("--pretrain-steps", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=300, help="fine-tuning = single-domain training steps")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lr-schedule", default="constant", choices=("constant", "cosine"),
                    help="every training run's learning rate (pre-training, fine-tuning, single-domain): constant, "
                         "or cosine-annealed to 0 at the run's last step (GraphTrainConfig.lr_schedule)")
    ap.add_argument("--ema-decay", type=float, default=0.0,
                    help="> 0: every model (pre-trained, fine-tuned, single-domain) is the exponential moving average "
                         "of its weights (GraphTrainConfig.ema_decay, with its warm-up ramp); 0: the raw weights")
    ap.add_argument("--n-eval", type=int, default=48)
    ap.add_argument("--n-eval-large", type=int, default=200,
                    help="also evaluate every row on this many samples and reference graphs (0: not), the first "
                         "--n-eval of which are the --n-eval evaluation's: the MMD² estimate is biased by about "
                         "1/n (the data floor), which compresses the ratios at n = 48")
    ap.add_argument("--sample-steps", type=int, default=50)
    ap.add_argument("--time-power", type=float, default=1.0,
                    help="every model's ancestral grid: times (1 - i/steps)**p (1: equal steps; DeFoG's time "
                         "distortion for p > 1)")
    ap.add_argument("--structure", default="full", choices=list(STRUCTURES),
                    help="the graph transformer's structural features (basic: degrees and triangles, the results "
                         "before the cycle and spectral features; pairs: full and the 2- and 3-path counts per pair)")
    ap.add_argument("--model", default="small", choices=list(MODELS),
                    help="the network's size: small (the benchmark's, 19k parameters) or shipped (graphs_lggm's)")
    ap.add_argument("--runs", default="runs/lggm", help="checkpoint directory (resumable)")
    ap.add_argument("--tag", default="", help="suffix of the result files (README_<held-out><tag>.md)")
    return ap


def main(argv=None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if args.process == "uniform" and args.pretrain_noise == "domain":
        ap.error("--pretrain-noise domain noises toward each domain's edge marginal, which the uniform process does "
                 "not use: take --process marginal")
    torch.set_num_threads(1)
    meta = provenance(argv, __file__)
    per_seed = [run_seed(args, s) for s in args.seeds]
    summ = summarise(per_seed)
    sizes = [("rows", args.n_eval, summ)]
    if args.n_eval_large:
        summ_large = summarise(per_seed, "rows_large")
        sizes.append(("rows_large", max(args.n_eval, args.n_eval_large), summ_large))
    out = {"meta": meta, "args": vars(args), "per_seed": per_seed, "summary": summ,
           "summary_large": summ_large if args.n_eval_large else None}
    extra = (f" and {len(args.pretrain_extra)} corpus families ({', '.join(args.pretrain_extra)})"
             if args.pretrain_extra else "")
    text = [f"# LGGM on the held-out domain `{args.held_out}` ({len(args.seeds)} seeds)", "", provenance_line(meta), "",
            f"Network `{args.model}`{', uniform transitions' if args.process == 'uniform' else ''}; "
            f"pre-training {args.pretrain_steps} steps on {len(DOMAINS.names()) - 1} domains"
            f"{extra} x {args.pretrain_count or args.count} graphs"
            f"{' (family parameters varied per graph)' if args.pretrain_varied else ''}"
            f"{', without text (unconditional)' if args.pretrain_text == 'none' else ''}"
            f"{', each domain noised toward its own edge marginal' if args.pretrain_noise == 'domain' else ''}; "
            f"fine-tuning (under the {'held-out graphs' if args.finetune_process == 'held-out' else 'pre-trained'}"
            f" process) and single-domain training {args.steps} steps on {args.count} `{args.held_out}` graphs; "
            f"learning rate {args.lr:g} ({args.lr_schedule})"
            f"{f', EMA of the weights (decay {args.ema_decay:g})' if args.ema_decay else ''}; "
            f"{args.sample_steps} ancestral steps (time power "
            f"{args.time_power:g}); structural features `{args.structure}`; mean ± std over seeds; "
            f"CPU {sum(s['cpu_s'] for s in per_seed):.0f} s in all."]
    for _, size, sm in sizes:
        text += ["", f"## {size} samples per model against {size} reference graphs", "",
                 *_table(args, sm), ""] + _ratios(sm)
    d = results_dir("lggm")
    write_json(d / f"results_{args.held_out}{args.tag}.json", out)
    write_text(d / f"README_{args.held_out}{args.tag}.md", "\n".join(text) + "\n")
    print("\n".join(text))


def _table(args, summ: dict) -> list[str]:
    head = ["model", *(f"MMD² {s}" for s in STATS), "MMD² mean", f"valid ({args.held_out})"]
    cell = "{0[mean]:.4f} ± {0[std]:.4f}".format
    rows = [[LABELS[r], *(cell(summ["rows"][r][k]) for k in (*STATS, "mean")),
             f"{summ['rows'][r]['valid']['mean']:.2f}"] for r in ROWS if r in summ["rows"]]
    return [markdown_table(head, rows)]


def _ratios(summ: dict) -> list[str]:
    return ["(a) zero-shot (LGGM protocol) / single-domain (mean MMD², per seed): "
            + ", ".join(f"{r:.2f}" for r in summ["zero_shot_over_single"])
            + f" (target <= 1.5: {'met' if summ['target_zero_shot_within_1_5x'] else 'not met'})",
            "(a2) zero-shot, pre-training marginal / single-domain: "
            + ", ".join(f"{r:.2f}" for r in summ["zero_shot_pretraining_marginal_over_single"]),
            "(a3) zero-shot, prompted / single-domain: "
            + (", ".join(f"{r:.2f}" for r in summ["zero_shot_prompted_over_single"])
               if summ["zero_shot_prompted_over_single"] is not None else "not run (pre-trained without text)"),
            "fine-tuned / single-domain (per seed): " + ", ".join(f"{r:.2f}" for r in summ["fine_tuned_over_single"])
            + f" (target < 1: {'met' if summ['target_fine_tuned_below_single'] else 'not met'})"]


if __name__ == "__main__":
    main()
