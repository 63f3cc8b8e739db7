"""Ablation of the graph transformer's structural features on the cycle-defined domains (``docs/methods/lggm.md``,
"Structural features").

Grids, planar graphs and trees are defined by their cycles (none, or only 4-cycles, or a planar embedding), which a
graph transformer without DiGress's extra features (Vignac et al., ICLR 2023, Sec. 4 and App. B.2) cannot see. Per
feature set (``--structures``, :func:`steerdiff.models.graph_transformer.structural_features`) the same
text-to-graph model (the shipped recipe's architecture) is trained at equal steps, seed and data on ``--count``
graphs of each of ``--domains`` with partial prompts, then sampled from prompts describing fresh graphs (seed 5000)
as in ``benchmarks/text_to_graph.py``: unconditional (``w = 0``) and with CFG ``--scale``. Reported: the domain's
validity, the average degree within 0.5 and all three asked statistics met, per domain and overall, and the
training CPU seconds.

    OMP_NUM_THREADS=1 python benchmarks/graph_features.py [--steps 1500] [--structures basic full]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from steerdiff.app.recipes.graphs_lggm import GRAPHS_LGGM_RECIPE
from steerdiff.data.graphs import describe, generate
from steerdiff.discrete.graph_train import GraphTrainConfig, data_prior, generate_graphs, train_graphs
from steerdiff.discrete.lggm import domain_data, prompt, round_degree, training_prompts, vocabulary
from steerdiff.metrics.graphs import graph_conformity
from steerdiff.models import GraphTransformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

N_MAX = 20


def run(structure: str, args) -> dict:
    torch.manual_seed(args.seed)
    data, names, stats = domain_data(args.domains, args.count, args.seed, N_MAX)
    model = GraphTransformer(n_max=N_MAX, vocab=vocabulary(N_MAX), process=data_prior(data),
                             **{**GRAPHS_LGGM_RECIPE["model"], "structure": structure})
    cond = model.tokenize(training_prompts(names, stats, seed=args.seed))
    cfg = GraphTrainConfig(steps=args.steps, batch=32, lr=2e-3, seed=args.seed, checkpoint_every=500)
    out_dir = Path(args.runs) / f"{structure}_{args.steps}" if args.runs else None
    res = train_graphs(model, data, cfg, cond=cond, out_dir=out_dir)
    prompts, asks = [], []
    for d in args.domains:
        for g in generate(d, args.per_domain, 5000):
            st = describe(g)
            prompts.append(prompt(d, st["nodes"], st["avg_degree"]))
            asks.append({"nodes": st["nodes"], "avg_degree": round_degree(st["avg_degree"]), "domain": d})
    counts = [a["nodes"] for a in asks]
    out = {"structure": structure, "train_cpu_s": res["cpu_seconds"],
           "parameters": sum(p.numel() for p in model.parameters()), "scales": {}}
    for w in (0.0, args.scale):
        c0 = time.process_time()
        graphs = generate_graphs(model, counts, steps=args.sample_steps, prompts=prompts, guidance_scale=w,
                                 generator=0)
        per = {d: graph_conformity(graphs[[i for i, a in enumerate(asks) if a["domain"] == d]],
                                   [a for a in asks if a["domain"] == d]) for d in args.domains}
        out["scales"][w] = {"all_domains": graph_conformity(graphs, asks), "per_domain": per,
                            "sample_cpu_s": time.process_time() - c0}
        print(structure, w, out["scales"][w]["all_domains"], {d: per[d]["domain"] for d in per}, flush=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--domains", nargs="+", default=["grid", "tree", "planar"])
    ap.add_argument("--structures", nargs="+", default=["basic", "full"])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--per-domain", type=int, default=20)
    ap.add_argument("--scale", type=float, default=2.0)
    ap.add_argument("--sample-steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default=None, help="checkpoint directory (resumable); none: train in memory")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = [run(s, args) for s in args.structures]
    meta = provenance(argv, __file__)
    rows = []
    for r in results:
        for w, v in r["scales"].items():
            rows.append([r["structure"], "0 (unconditional)" if w == 0 else f"{w:g}",
                         *(f"{v['per_domain'][d]['domain']:.2f}" for d in args.domains),
                         f"{v['all_domains']['domain']:.2f}", f"{v['all_domains']['avg_degree']:.2f}",
                         f"{v['all_domains'].get('all', 0.0):.2f}", f"{r['train_cpu_s']:.0f}"])
    text = [f"# Structural features of the graph transformer: {', '.join(args.domains)} at {args.steps} steps", "",
            provenance_line(meta), "",
            f"{args.count} training graphs per domain, the shipped recipe's architecture, {args.per_domain} prompts "
            f"per domain (fresh graphs, seed 5000), {args.sample_steps} ancestral steps.", "",
            markdown_table(["features", "CFG w", *(f"valid {d}" for d in args.domains), "valid (all)",
                            "avg degree (±0.5)", "all three", "train CPU s"], rows)]
    d = results_dir("graph_features")
    write_json(d / f"results_{args.steps}.json", {"meta": meta, "args": vars(args), "results": results})
    write_text(d / f"README_{args.steps}.md", "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
