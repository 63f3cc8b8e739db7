"""Is the digits diversity claim of ``benchmarks/das.py`` a property of the metric? (``docs/methods/das.md``,
"Validation problems and pass criteria")

``das.py`` measures diversity as the mean pairwise Euclidean distance of classifier features, and finds reward
guidance more diverse than DAS. This diagnostic re-measures the same outputs (DAS, best-of-N and reward guidance at
rho = 1, equal cost per output, ``das.py``'s settings) and the exact tilted law (importance weights on a pool of
plain samples, as ``das.py``'s reference) under three pairwise distances:

* ``feature L2``: ``das.py``'s (penultimate features of the shipped digits classifier);
* ``feature cosine``: one minus the cosine similarity of the same features (the official evaluation's definition,
  with CLIP embeddings, in the DAS paper's evaluation notebook);
* ``pixel L2``: Euclidean distance of the clamped images.

For the exact law each distance is ``E|f_i - f_j|`` over two distinct weighted draws.

    python benchmarks/das_diversity.py --seeds 3

Writes ``benchmarks/results/das_diversity/das_diversity.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import steerdiff as sd
from steerdiff.metrics.images import classifier_features

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402
from das import digit_rewards, plain_pool, run_digits_method  # noqa: E402

METRICS = ("feature L2", "feature cosine", "pixel L2")
METHODS = (("das", 1.0), ("bon", 1.0), ("guidance", 1.0))


def pairwise_distances(clf, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{metric: [N, N] distance matrix}`` of the clamped images ``x``."""
    x = x.float().clamp(-1, 1)
    f = classifier_features(clf, x)
    unit = torch.nn.functional.normalize(f, dim=1)
    pixels = x.reshape(x.shape[0], -1).double()
    return {"feature L2": torch.cdist(f, f), "feature cosine": (1 - unit @ unit.T).clamp_min(0),
            "pixel L2": torch.cdist(pixels, pixels)}


def mean_pairwise(dist: torch.Tensor, weights: torch.Tensor | None = None) -> float:
    """Mean distance over distinct pairs; with ``weights``, over two distinct draws from the weighted set."""
    n = dist.shape[0]
    if weights is None:
        return float((dist.sum() - dist.diagonal().sum()) / (n * (n - 1)))
    return float(weights @ dist @ weights / (1 - (weights**2).sum()))


def exact_rows(model, clf, rewards: dict, steps: int, pool: int) -> dict[str, dict[str, float]]:
    x = plain_pool(model, steps, pool)
    dists = pairwise_distances(clf, x)
    out = {}
    for name, (reward, alpha) in rewards.items():
        with torch.no_grad():
            w = torch.softmax(reward(x).double() / alpha, 0)
        out[name] = {m: mean_pairwise(d, w) for m, d in dists.items()} | {"ess": float(1 / (w**2).sum())}
    return out


def markdown(res: dict) -> str:
    """The tables of a ``das_diversity.json``."""
    cfg = res["config"]
    rows = []
    for name, by_label in res["methods"].items():
        rows += [(name, label, *(f"{row[m]:.3f}" for m in METRICS)) for label, row in by_label.items()]
        ex = res["exact"][name]
        rows.append((name, f"exact target (ESS {ex['ess']:.0f})", *(f"{ex[m]:.3f}" for m in METRICS)))
    verdicts = [(name, *("yes" if by_label["das"][m] > by_label["guidance(rho=1)"][m] else "NO" for m in METRICS))
                for name, by_label in res["methods"].items()]
    return "\n".join([
        "# DAS digits diversity under three distances", "",
        *([provenance_line(res["meta"]), ""] if "meta" in res else []),
        f"{cfg['seeds']} seeds x {cfg['groups']} outputs, DAS P={cfg['particles']}, {cfg['steps']} steps, equal cost "
        f"per output (c_b = {cfg['c_b']:g}); exact = importance-weighted pool of {cfg['pool']} plain samples.", "",
        markdown_table(["reward", "method", *METRICS], rows), "",
        "DAS more diverse than reward guidance (rho = 1)?", "",
        markdown_table(["reward", *METRICS], verdicts)]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--particles", type=int, default=8)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--c-b", type=float, default=2.0)
    ap.add_argument("--pool", type=int, default=1536)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, clf = sd.models.load("digits"), sd.models.load("digits_classifier")
    rewards = digit_rewards(clf)
    res = {"config": vars(args), "exact": exact_rows(model, clf, rewards, args.steps, args.pool), "methods": {}}
    for name, (reward, alpha) in rewards.items():
        for method, scale in METHODS:
            label = method if method != "guidance" else f"guidance(rho={scale:g})"
            per_seed = []
            for seed in range(args.seeds):
                out = run_digits_method(method, model, reward, alpha, args.groups, args.particles, args.steps, seed,
                                        args.c_b, scale)
                x = out.samples if method != "guidance" else out.samples[::args.particles]
                per_seed.append({m: mean_pairwise(d) for m, d in pairwise_distances(clf, x).items()})
            row = {m: float(np.mean([s[m] for s in per_seed])) for m in METRICS}
            res["methods"].setdefault(name, {})[label] = row | {"per_seed": per_seed}
            print(f"{name:>9} {label:>16}: " + ", ".join(f"{m} {row[m]:.3f}" for m in METRICS), flush=True)
    res["meta"] = provenance()
    out = results_dir("das_diversity")
    write_json(out / "das_diversity.json", res)
    text = markdown(res)
    write_text(out / "das_diversity.md", text)
    print(text)


if __name__ == "__main__":
    main()
