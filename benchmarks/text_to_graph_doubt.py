"""Does the shipped text-to-graph model see its own wrong edges? (``docs/methods/lggm.md``, "A confidence corrector
and an absorbing-process model").

Samples the prompts of ``benchmarks/text_to_graph_sampling.py`` (``--seed``; CFG 2, 50 ancestral steps, sampling
seed 0: the sweep's default row) for a few families, then asks the CFG-guided denoiser at a small time ``t_c`` for
``p(G_0 | G_t = G)`` on each *finished* graph ``G`` and counts, per graph, the pairs whose sampled type it gives a
probability below 0.5, and the lowest such probability, split by whether the graph meets its prompt.

    OMP_NUM_THREADS=1 python benchmarks/text_to_graph_doubt.py --seed 7000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from steerdiff.data.graphs import to_networkx
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
        ok = [all(conforms(g, a).values()) for g, a in zip(to_networkx(graphs), asks, strict=True)]
        print("| t_c | family | valid graphs | pairs below 0.5: valid / failed | lowest probability: valid / failed |")
        print("|---|---|---|---|---|")
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
                      f"{mean(lowest, good)} / {mean(lowest, bad)} |")


if __name__ == "__main__":
    main()
