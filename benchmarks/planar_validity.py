"""Why prompted planar graphs are rarely valid (``docs/methods/lggm.md``, "Results": "Planar validity under
prompts").

The text-to-graph benchmark (``benchmarks/text_to_graph.py``) finds planar validity (planar and connected, SPECTRE's
definition) near 0.5 unprompted and near 0 under CFG. This script separates the candidate causes on the benchmark's
20 planar prompts (fresh graphs, seed 5000):

* the prompts and the check: the reference graphs meet their own prompts (node count, average degree, validity),
  every asked average degree is below the planar bound ``6 - 12 / n``, and the training graphs have the same
  density (edges / ``(3 n - 6)``);
* what the model samples at CFG ``w`` (``0``: unconditional, ``1``: conditional): planar, connected, valid, average
  degree, edges / ``(3 n - 6)``, and how far from planar a graph is: the edges a greedy planar subgraph leaves out
  (edges added in random order, each kept if the graph stays planar; best of 20 orders; an upper bound on the
  skewness, the fewest edges whose removal makes the graph planar);
* a baseline with no structure: uniform random graphs ``G(n, m)`` with each sample's node and edge count;
* whether the domain word moves the structure: the same prompts with ``erdos-renyi`` for ``planar`` (clustering and
  triangles against the planar prompts' and the data's).

    OMP_NUM_THREADS=1 python benchmarks/planar_validity.py [--model steerdiff/assets/graphs_lggm]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import networkx as nx
import numpy as np
import torch

from steerdiff.data.graphs import describe, from_networkx, generate, to_networkx
from steerdiff.discrete.graph_train import generate_graphs
from steerdiff.discrete.lggm import prompt, round_degree
from steerdiff.metrics.graphs import graph_conformity, is_valid
from steerdiff.models import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402


def edges_left_out(g: nx.Graph, rng: np.random.Generator, orders: int = 20) -> int:
    """The fewest edges a greedy planar subgraph of ``g`` leaves out over ``orders`` random edge orders (0 iff
    ``g`` is planar; an upper bound on its skewness)."""
    best = g.number_of_edges()
    for _ in range(orders):
        edges = list(g.edges)
        rng.shuffle(edges)
        h = nx.Graph()
        h.add_nodes_from(g)
        left = 0
        for u, v in edges:
            h.add_edge(u, v)
            if not nx.check_planarity(h)[0]:
                h.remove_edge(u, v)
                left += 1
        best = min(best, left)
    return best


def summary(graphs: list[nx.Graph], rng: np.random.Generator) -> dict:
    st = [describe(g) for g in graphs]
    return {"valid": float(np.mean([is_valid(g, "planar") for g in graphs])),
            "planar": float(np.mean([s["is_planar"] for s in st])),
            "connected": float(np.mean([s["connected"] for s in st])),
            "avg_degree": float(np.mean([s["avg_degree"] for s in st])),
            "fill": float(np.mean([s["edges"] / (3 * s["nodes"] - 6) for s in st])),
            "left_out": float(np.mean([edges_left_out(g, rng) for g in graphs])),
            "clustering": float(np.mean([s["clustering"] for s in st])),
            "triangles": float(np.mean([s["triangles"] for s in st]))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="graphs_lggm", help="a shipped model name or a saved model directory")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--scales", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=5000)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    c0 = time.process_time()
    rng = np.random.default_rng(0)
    test = generate("planar", args.count, args.seed)
    stats = [describe(g) for g in test]
    prompts = [prompt("planar", s["nodes"], s["avg_degree"]) for s in stats]
    asks = [{"nodes": s["nodes"], "avg_degree": round_degree(s["avg_degree"]), "domain": "planar"} for s in stats]
    counts = [s["nodes"] for s in stats]
    checks = {"reference meets its prompts": graph_conformity(from_networkx(test, max(counts)), asks)["all"],
              "asked degrees under 6 - 12/n": float(np.mean([a["avg_degree"] <= 6 - 12 / a["nodes"] for a in asks])),
              "training fill": float(np.mean([s["edges"] / (3 * s["nodes"] - 6)
                                              for s in map(describe, generate("planar", 200, 0))]))}
    rows = [{"source": "reference (fresh data)", **summary(test, rng)}]
    model = load(args.model).eval()
    for w in args.scales:
        gs = to_networkx(generate_graphs(model, counts, steps=args.steps, prompts=prompts, guidance_scale=w,
                                         generator=0))
        rows.append({"source": f"model, CFG {w:g}" + (" (unconditional)" if w == 0 else ""), **summary(gs, rng)})
        gnm = [nx.gnm_random_graph(g.number_of_nodes(), g.number_of_edges(), seed=int(rng.integers(2**31)))
               for g in gs]
        rows.append({"source": f"G(n, m) at CFG {w:g}'s n, m", **summary(gnm, rng)})
        print(rows[-2], rows[-1], flush=True)
    words = [prompt("erdos_renyi", s["nodes"], s["avg_degree"]) for s in stats]
    w = args.scales[-1]
    gs = to_networkx(generate_graphs(model, counts, steps=args.steps, prompts=words, guidance_scale=w, generator=0))
    rows.append({"source": f"model, CFG {w:g}, 'erdos-renyi' for 'planar'", **summary(gs, rng)})
    meta = provenance(argv, __file__)
    cpu = time.process_time() - c0
    text = [f"# Planar validity under prompts ({args.count} planar prompts, seed {args.seed})", "",
            provenance_line(meta), "",
            markdown_table(["check", "value"], [[k, f"{v:.2f}"] for k, v in checks.items()]), "",
            markdown_table(["graphs", "valid", "planar", "connected", "avg degree", "edges / (3n - 6)",
                            "edges left out (greedy)", "clustering", "triangles"],
                           [[r["source"], *(f"{r[k]:.2f}" for k in ("valid", "planar", "connected", "avg_degree",
                                                                     "fill", "left_out", "clustering",
                                                                     "triangles"))] for r in rows]), "",
            f"{cpu:.0f} CPU s."]
    d = results_dir("planar_validity")
    write_json(d / "results.json", {"meta": meta, "args": vars(args), "checks": checks, "rows": rows,
                                    "cpu_s": cpu})
    write_text(d / "README.md", "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
