"""Does the shipped text-to-graph model see its own wrong edges? (``docs/methods/lggm.md``, "A confidence corrector
and an absorbing-process model").

Samples the prompts of ``benchmarks/text_to_graph_sampling.py`` (``--seed``; CFG 2, 50 ancestral steps, sampling
seed 0: the sweep's default row) for a few families, then asks the CFG-guided denoiser at a small time ``t_c`` for
``p(G_0 | G_t = G)`` on each *finished* graph ``G`` and counts, per graph, the pairs whose sampled type it gives a
probability below 0.5, and the lowest such probability, split by whether the graph meets its prompt.

    OMP_NUM_THREADS=1 python benchmarks/text_to_graph_doubt.py --seed 7000

``--after N`` counts after ``N`` corrector sweeps (what is left for a corrector to see); ``--planar`` prints, per
planar prompt whose graph is not planar, how many present edges must go (least probable first) before it is planar
and the probability of the last one: above 0.5 means removing every doubted edge is not enough.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import networkx as nx
import torch

from steerdiff.data.graphs import to_networkx
from steerdiff.discrete.corrector import correct
from steerdiff.discrete.graph import flat_denoiser, sample_graphs
from steerdiff.discrete.graph_train import process_of
from steerdiff.metrics.graphs import conforms
from steerdiff.models import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from text_to_graph_sampling import ScheduledCFG, prompts_of  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="steerdiff/assets/graphs_lggm")
    ap.add_argument("--seed", type=int, default=7000)
    ap.add_argument("--domains", nargs="*", default=["grid", "planar", "tree", "sbm"])
    ap.add_argument("--times", nargs="*", type=float, default=[0.02, 0.05, 0.1, 0.2])
    ap.add_argument("--planar", action="store_true", help="instead: per failed planar graph, how confident the "
                    "model is about the edges that break planarity (module docstring)")
    ap.add_argument("--after", type=int, default=0, help="first run this many confidence-corrector sweeps (argmax, "
                    "t_c 0.02: the best same-base corrector row) on the finished graphs, then count")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load(args.model).eval()
    prompts, asks = prompts_of(20, args.seed, args.domains)
    counts = torch.tensor([a["nodes"] for a in asks])
    cond = model.tokenize(prompts)
    process = process_of(model, int(counts.max()))
    guider = ScheduledCFG(2.0)
    with torch.no_grad():
        graphs = sample_graphs(model.probs, process, 50, num_nodes=counts, cond=cond, guidance=guider, generator=0)
        flat = process.flatten(graphs)
        den = guider.wrap(flat_denoiser(model.probs, process))
        if args.after:
            flat = correct(flat_denoiser(model.probs, process), process, flat, sweeps=args.after, t=0.02, cond=cond,
                           guidance=guider)
            graphs = process.unflatten(flat)
        ok = [all(conforms(g, a).values()) for g, a in zip(to_networkx(graphs), asks, strict=True)]
        if args.planar:
            planar_detail(process, flat, den, cond, asks, to_networkx(graphs), args.times[0])
            return
        print("| t_c | family | valid graphs | pairs below 0.5: valid / failed | lowest probability: valid / failed "
              "| failed with no pair below 0.5 |")
        print("|---|---|---|---|---|---|")
        for tc in args.times:
            p0 = den(flat, torch.full((len(counts),), tc), cond)
            real = flat != process.pad_index
            conf = p0.gather(-1, flat.clamp_max(process.num_classes - 1)[..., None])[..., 0]
            conf = torch.where(real, conf, torch.ones_like(conf))
            low, lowest = (conf < 0.5).sum(1).double(), conf.min(1).values.double()
            for d in args.domains:
                ix = [i for i, a in enumerate(asks) if a["domain"] == d]
                good, bad = [i for i in ix if ok[i]], [i for i in ix if not ok[i]]

                def mean(v, s):
                    return f"{float(v[s].mean()):.2f}" if s else "-"

                print(f"| {tc} | {d} | {len(good)} / {len(ix)} | {mean(low, good)} / {mean(low, bad)} | "
                      f"{mean(lowest, good)} / {mean(lowest, bad)} | {sum(int(low[i]) == 0 for i in bad)} |")


def planar_detail(process, flat, den, cond, asks, nets, tc: float) -> None:
    """Per planar prompt whose graph is not planar: the guided denoiser's probability (at ``tc``) of each present
    edge; the edges removed one at a time, least probable first, until the graph is planar; how many that takes
    and the probability of the last one removed (above 0.5: an edge the model is confident about had to go)."""
    n0, rows, cols = process.node_slots, process.rows, process.cols
    p0 = den(flat, torch.full((len(flat),), tc), cond)
    conf = p0.gather(-1, flat.clamp_max(process.num_classes - 1)[..., None])[..., 0]
    print(f"| prompt | nodes | edges | pairs below 0.5 | edges removed to planar (least probable first) | "
          f"probability of the last removed (t_c {tc}) |")
    print("|---|---|---|---|---|---|")
    needed, confident, nodoubt, failed = [], 0, 0, 0
    for i, (a, g) in enumerate(zip(asks, nets, strict=True)):
        if a["domain"] != "planar" or nx.check_planarity(g)[0]:
            continue
        failed += 1
        real = flat[i] != process.pad_index
        low = int(((conf[i] < 0.5) & real).sum())
        nodoubt += low == 0
        edge_pos = [j for j in range(n0, flat.shape[1]) if real[j] and int(flat[i, j]) > process.offset]
        order = sorted(edge_pos, key=lambda j: float(conf[i, j]))
        h, k, last = g.copy(), 0, float("nan")
        for j in order:
            e = int(rows[j - n0]), int(cols[j - n0])
            h.remove_edge(*e)
            k, last = k + 1, float(conf[i, j])
            if nx.check_planarity(h)[0]:
                break
        needed.append(k)
        confident += last >= 0.5
        print(f"| {i} | {a['nodes']} | {g.number_of_edges()} | {low} | {k} | {last:.2f} |")
    print(f"\n{failed} non-planar graphs of {sum(a['domain'] == 'planar' for a in asks)} planar prompts; "
          f"{nodoubt} with no pair below 0.5; {confident} need an edge of probability >= 0.5 removed; "
          f"edges removed (median) {sorted(needed)[len(needed) // 2] if needed else '-'}")


if __name__ == "__main__":
    main()
