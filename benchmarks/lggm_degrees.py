"""Where LGGM's zero-shot degree gap comes from (``docs/methods/lggm.md``, "A larger pre-training corpus and
network", "What is left, and why").

For each seed of a ``benchmarks/lggm.py`` run (the same flags; its checkpoints under ``--runs`` are loaded, or
trained if absent), the node-degree profile of the zero-shot samples (row (a), LGGM's protocol: the very samples the
benchmark scores, same network, node counts and generator) against the held-out reference graphs, and the profile
of each pre-training family at the same size for comparison: mean and standard deviation of the degree, and the
shares of nodes of degree 1 (leaves) and of degree >= ``HUB`` (hubs). The degree MMD compares exactly these
histograms; the profile says which way they differ.

    OMP_NUM_THREADS=1 python benchmarks/lggm_degrees.py --held-out planar --structure pairs --model shipped \\
        --pretrain-steps 3000 --pretrain-count 200 --runs <the benchmark's --runs> --tag _shipped_pairs3000_c200

writes ``benchmarks/results/lggm/degrees_<held-out><tag>.md`` and ``.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from steerdiff.data.graphs import from_networkx, generate, to_networkx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lggm  # noqa: E402
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

HUB = 8  # a node of degree >= 8: none in a grid, tree or regular graph, 1-2% in planar (Delaunay) graphs


def degree_profile(graphs) -> dict:
    """Mean and standard deviation of the node degrees of ``graphs`` (networkx, pooled over all nodes) and the shares
    of nodes of degree 1 and of degree >= :data:`HUB`."""
    if not graphs:
        raise ValueError("graphs must not be empty")
    deg = np.concatenate([np.fromiter((d for _, d in g.degree()), dtype=np.int64) for g in graphs])
    return {"mean": float(deg.mean()), "std": float(deg.std()), "leaves": float((deg == 1).mean()),
            "hubs": float((deg >= HUB).mean())}


def run_seed(args, seed: int) -> dict:
    """The profiles of one seed: ``reference``, ``zero_shot`` and every pre-training family (fresh graphs of the
    reference's size, seed ``seed + 5000``, their parameters varied as the corpus's with ``--pretrain-varied``)."""
    model = lggm.pretrained(args, seed)
    target_graphs, reference, _ = lggm.held_out_sets(args, seed)
    counts = [g.number_of_nodes() for g in reference]
    samples = to_networkx(lggm.zero_shot(args, seed, model, from_networkx(target_graphs, lggm.N_MAX), counts))
    out = {"reference": degree_profile(reference), "zero_shot": degree_profile(samples)}
    for family in lggm.pretrain_families(args):
        out[family] = degree_profile(generate(family, len(reference), seed + 5000, varied=args.pretrain_varied))
    return out


def main(argv=None) -> None:
    args = lggm.parser(__doc__.split("\n")[0]).parse_args(argv)
    torch.set_num_threads(1)
    meta = provenance(argv, __file__)
    per_seed = {seed: run_seed(args, seed) for seed in args.seeds}
    head = ["seed", "graphs", "mean degree", "std", "share of degree 1", f"share of degree >= {HUB}"]
    cells = [[str(seed), name, *(f"{p[k]:.3f}" for k in ("mean", "std", "leaves", "hubs"))]
             for seed, prof in per_seed.items() for name, p in prof.items() if name in ("reference", "zero_shot")]
    families = [[name, *(f"{p[k]:.3f}" for k in ("mean", "std", "leaves", "hubs"))]
                for name, p in per_seed[args.seeds[0]].items() if name not in ("reference", "zero_shot")]
    text = [f"# Degree profile of LGGM's zero-shot samples, held-out `{args.held_out}`", "", provenance_line(meta), "",
            "Zero-shot: row (a) of `benchmarks/lggm.py` (its samples, from the pre-trained network of the same flags),"
            f" {max(args.n_eval, args.n_eval_large)} graphs per seed, against "
            "the held-out reference graphs it is scored on.", "", markdown_table(head, cells), "",
            f"The pre-training families (seed {args.seeds[0]}; as many graphs as the reference, of each family's "
            f"sizes{'; parameters varied per graph, as the corpus' if args.pretrain_varied else ''}):", "",
            markdown_table(["family", *head[2:]], families)]
    d = results_dir("lggm")
    write_json(d / f"degrees_{args.held_out}{args.tag}.json", {"meta": meta, "args": vars(args),
                                                              "per_seed": {str(k): v for k, v in per_seed.items()}})
    write_text(d / f"degrees_{args.held_out}{args.tag}.md", "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
