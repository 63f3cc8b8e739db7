"""Is a text-to-graph model overfit? Its DiGress loss on training graphs against fresh ones (``docs/methods/lggm.md``,
"Full descriptions in training and a late-crowded grid").

Per domain, ``--count`` graphs of the training seed (0: the recipe's ``data.seed``, so the first graphs of its
training set) and of a fresh seed, each with its whole description, noised at fixed times ``t`` and scored by the
model's loss (:func:`steerdiff.discrete.graph_train.digress_loss`, the mean of ``--repeats`` noise draws). Equal
columns mean the model scores unseen graphs as it scores the ones it trained on (not overfit).

    OMP_NUM_THREADS=1 python benchmarks/text_to_graph_fit.py [--model steerdiff/assets/graphs_lggm]
"""

from __future__ import annotations

import argparse

import torch

from steerdiff.data.graphs import DOMAINS
from steerdiff.discrete.graph_train import digress_loss, process_of
from steerdiff.discrete.lggm import domain_data, prompt
from steerdiff.models import load

TIMES = (0.1, 0.3, 0.5, 0.7, 0.9)


def losses(model, seed: int, count: int, repeats: int) -> dict[str, list[float]]:
    """``{domain: [loss at each of TIMES]}`` on ``count`` graphs per domain of ``seed``, whole descriptions."""
    data, names, stats = domain_data(DOMAINS.names(), count, seed, model.n_max)
    cond = model.tokenize([prompt(n, s["nodes"], s["avg_degree"]) for n, s in zip(names, stats, strict=True)])
    process = process_of(model, data.n)
    gen = torch.Generator().manual_seed(1)
    out = {}
    with torch.no_grad():
        for d in DOMAINS.names():
            idx = torch.tensor([i for i, n in enumerate(names) if n == d])
            out[d] = [sum(float(digress_loss(model, process, data[idx], torch.full((len(idx),), t), cond[idx], gen))
                          for _ in range(repeats)) / repeats for t in TIMES]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="steerdiff/assets/graphs_lggm")
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--train-seed", type=int, default=0)
    ap.add_argument("--fresh-seed", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load(args.model).eval()
    train = losses(model, args.train_seed, args.count, args.repeats)
    fresh = losses(model, args.fresh_seed, args.count, args.repeats)
    print("| domain | " + " | ".join(f"t = {t}: train / fresh" for t in TIMES) + " |")
    print("|---|" + "---|" * len(TIMES))
    for d in DOMAINS.names():
        print(f"| {d} | " + " | ".join(f"{a:.3f} / {b:.3f}" for a, b in zip(train[d], fresh[d], strict=True)) + " |")
    diffs = [b - a for d in DOMAINS.names() for a, b in zip(train[d], fresh[d], strict=True)]
    print(f"\nfresh minus train: largest |difference| {max(map(abs, diffs)):.3f}; fresh lower in "
          f"{sum(x < 0 for x in diffs)} of {len(diffs)} cells")


if __name__ == "__main__":
    main()
