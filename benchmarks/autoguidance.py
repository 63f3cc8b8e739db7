"""AutoGuidance (Karras et al., NeurIPS 2024) beside CFG on the shipped digits model: class accuracy, FID-digits,
precision / recall of 1,000 samples (classes evenly spread, seeds 0..999), Heun 30 steps (karras 0.002..80), at
w in {1.5, 2, 3}; the weak model is the shipped ``digits_weak`` (docs/methods/guidance.md, "AutoGuidance").

    OMP_NUM_THREADS=1 python benchmarks/autoguidance.py [--n 1000]

Cost: CFG evaluates the model twice per call (a doubled batch, NFE 118); AutoGuidance once plus the weak model once
(NFE 59 + 59 weak evaluations of a network with 0.18x the parameters). Writes
``benchmarks/results/guidance/autoguidance.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.data.digits import load_digits
from steerdiff.guidance import CFG, AutoGuidance
from steerdiff.metrics.images import class_accuracy, classifier_features, feature_scores
from steerdiff.models.io import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--scales", type=float, nargs="+", default=[1.5, 2.0, 3.0])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    meta = provenance(argv)
    clf = load("digits_classifier")
    x_test, _ = load_digits("test")
    real_f = classifier_features(clf, x_test)
    model = load("digits")
    labels = torch.arange(args.n) % 10
    noise = sd.randn((args.n, 1, 8, 8), seeds=0)
    sig = sd.sigmas.karras(30, 0.002, 80.0)
    runs = [("plain", None)] + [(f"CFG w={w:g}", CFG(w)) for w in args.scales] + \
        [(f"AutoGuidance w={w:g}", AutoGuidance(w, weak="digits_weak")) for w in args.scales]
    rows = []
    for name, guider in runs:
        start = time.perf_counter()
        with torch.no_grad():
            x, stats = sd.sample(model, noise, sig, method="heun", cond=labels, guidance=guider, return_stats=True)
        wall = time.perf_counter() - start
        x = x.clamp(-1, 1)
        scores = feature_scores(real_f, classifier_features(clf, x))
        row = {"run": name, "class_accuracy": class_accuracy(clf, x, labels), "fid_digits": scores["fid"],
               "precision": scores["precision"], "recall": scores["recall"], "nfe": stats.nfe,
               "weak_nfe": getattr(guider, "weak_evaluations", 0), "wall_s": wall}
        print(row, flush=True)
        rows.append(row)
    folder = results_dir("guidance")
    write_json(folder / "autoguidance.json", {"meta": meta, "n": args.n, "sampler": "heun 30, karras(0.002, 80)",
                                              "rows": rows})
    table = markdown_table(["run", "class acc", "FID-digits", "precision", "recall", "NFE", "weak NFE", "wall s"],
                           [[r["run"], f"{r['class_accuracy']:.3f}", f"{r['fid_digits']:.3f}", f"{r['precision']:.3f}",
                             f"{r['recall']:.3f}", f"{r['nfe']:g}", r["weak_nfe"], f"{r['wall_s']:.0f}"] for r in rows])
    write_text(folder / "autoguidance.md", "\n".join([
        "# AutoGuidance vs CFG on digits\n", provenance_line(meta), "",
        f"{args.n} samples, Heun 30 steps; the weak model is `digits_weak`.", "", table]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
