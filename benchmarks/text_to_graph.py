"""Text-to-graph conformity of a text-conditioned graph model (``docs/methods/lggm.md``, "Text-to-graph").

LGGM's text-to-graph (Wang et al., ICLR 2025, Sec. 3.3 and 4.3): a graph generated from a description should have
the described properties. Test prompts describe fresh graphs of every domain (seed 5000, never trained on):
``"a <domain> graph with <n> nodes and average degree <d>"`` (``d`` rounded to 0.5). Each prompt is sampled at CFG
scales ``w`` (``w = 0``: the unconditional model, the baseline rate; ``w = 1``: the conditional model), always with
the asked node count (the sampler takes ``n`` from the prompt, as DiGress takes ``n`` from the data). Met: node count
exact, average degree within 0.5 of the asked value, the domain's validity (:func:`steerdiff.metrics.graphs.
is_valid`: a tree, planar and connected, a lobster, a grid, 3-regular, connected, ...), and all three.

    OMP_NUM_THREADS=1 python benchmarks/text_to_graph.py [--model graphs_lggm] [--per-domain 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from steerdiff.data.graphs import DOMAINS, describe, generate
from steerdiff.discrete.graph_train import generate_graphs
from steerdiff.discrete.lggm import prompt, round_degree
from steerdiff.metrics.graphs import graph_conformity
from steerdiff.models import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

KEYS = ("nodes", "avg_degree", "domain", "all")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="graphs_lggm", help="a shipped model name or a saved model directory")
    ap.add_argument("--per-domain", type=int, default=20)
    ap.add_argument("--scales", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=5000)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load(args.model).eval()
    prompts, asks, domains = [], [], []
    for d in DOMAINS.names():
        for g in generate(d, args.per_domain, args.seed):
            st = describe(g)
            prompts.append(prompt(d, st["nodes"], st["avg_degree"]))
            asks.append({"nodes": st["nodes"], "avg_degree": round_degree(st["avg_degree"]), "domain": d})
            domains.append(d)
    counts = [a["nodes"] for a in asks]
    rows, per_domain = [], {}
    for w in args.scales:
        c0 = time.process_time()
        graphs = generate_graphs(model, counts, steps=args.steps, prompts=prompts, guidance_scale=w, generator=0)
        conf = graph_conformity(graphs, asks)
        conf["all"] = conf.get("all", 0.0)
        rows.append({"scale": w, **{k: conf[k] for k in KEYS}, "cpu_s": time.process_time() - c0})
        per_domain[w] = {d: graph_conformity(graphs[[i for i, x in enumerate(domains) if x == d]],
                                             [a for a in asks if a["domain"] == d]) for d in DOMAINS.names()}
        print(rows[-1], flush=True)
    meta = provenance(argv, __file__)
    best = max(rows, key=lambda r: r["all"])["scale"]
    text = [f"# Text-to-graph conformity ({len(prompts)} prompts, {args.per_domain} per domain)", "",
            provenance_line(meta), "",
            markdown_table(["CFG w", "nodes", "avg degree (±0.5)", "domain valid", "all three", "CPU s"],
                           [[("0 (unconditional)" if r["scale"] == 0 else f"{r['scale']:g}"),
                             *(f"{r[k]:.2f}" for k in KEYS), f"{r['cpu_s']:.0f}"] for r in rows]), "",
            f"Per domain at w = {best:g}:", "",
            markdown_table(["domain", "avg degree (±0.5)", "domain valid", "all three", "unconditional: all three"],
                           [[d, f"{per_domain[best][d]['avg_degree']:.2f}", f"{per_domain[best][d]['domain']:.2f}",
                             f"{per_domain[best][d]['all']:.2f}",
                             f"{per_domain[args.scales[0]][d]['all']:.2f}"] for d in DOMAINS.names()])]
    d = results_dir("text_to_graph")
    write_json(d / "results.json", {"meta": meta, "args": vars(args), "rows": rows, "per_domain": per_domain})
    write_text(d / "README.md", "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
