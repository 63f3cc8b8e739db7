"""Where a digits sweep's CPU time goes (issue 38's 0.3x target, ``docs/methods/tree_search.md`` "What was
measured"): ``sweep14`` (K = 14 chains resampled by the look-ahead at sigma <= 5, 350 NFE per output) against
best-of-48 (1200 NFE), the same settings as ``benchmarks/tree_search.py --part digits``, one thread.

Each run's CPU seconds are split into the denoiser's forward calls (``model``), the verifier's (the ``class:3``
classifier: ``verifier``) and everything else (``rest``: the sampler's bookkeeping, resampling, tree building and
output), and divided by the rows each network saw. ``--repeats`` alternates the two methods (the machine may be
loaded: CPU seconds still vary by a few percent between runs).

    OMP_NUM_THREADS=1 python benchmarks/tree_search_profile.py [--repeats 2] [--tag main]
    OMP_NUM_THREADS=1 python benchmarks/tree_search_profile.py --variant sweep4w40n6 --repeats 3  # profile_sweep4w40n6

``--variant``: another sweep of ``tree_search.py``'s ``DIGITS_VARIANTS`` (its first budget) in place of ``sweep14``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.align import best_of_n
from steerdiff.align.rewards import ClassLogProb
from steerdiff.align.tree_search import tree_search

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import results_dir, write_json  # noqa: E402


class _Timed:
    """A module's forward with its CPU seconds and rows added up."""

    def __init__(self, module: torch.nn.Module):
        self.seconds, self.rows, self._forward = 0.0, 0, module.forward
        module.forward = self

    def __call__(self, x, *args, **kwargs):
        start = time.process_time()
        out = self._forward(x, *args, **kwargs)
        self.seconds += time.process_time() - start
        self.rows += x.shape[0]
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--tag", default="", help="suffix of the output file (profile[_tag].json)")
    ap.add_argument("--variant", default="sweep14", help="a DIGITS_VARIANTS name of tree_search.py (sweep14)")
    args = ap.parse_args()
    from tree_search import DIGITS_VARIANTS

    vkw, budgets = DIGITS_VARIANTS[args.variant]
    vkw = dict(vkw)
    vp, budget = vkw.pop("particles"), budgets[0]
    vname = f"{args.variant}_{budget}"
    torch.set_num_threads(1)
    model, clf = sd.models.load("digits"), sd.models.load("digits_classifier")
    unet, verifier = _Timed(model), _Timed(clf)
    reward, alpha, g = ClassLogProb(clf, 3), 0.1, args.groups
    sig = sd.sigmas.karras(26, 0.002, 80.0)[:-1]
    kw = dict(generator=5 * 10**5, batch_size=256)
    methods = {
        vname: lambda: tree_search(model, reward, sd.randn((g * vp, 1, 8, 8), seeds=0), sig, alpha=alpha,
                                   nfe=budget, particles=vp, **vkw, **kw),
        "bon_K48": lambda: best_of_n(model, reward, sd.randn((g * 48, 1, 8, 8), seeds=0), sig, particles=48, **kw),
    }
    methods[vname]()  # warm-up
    out: dict = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, run in methods.items():
            for t in (unet, verifier):
                t.seconds, t.rows = 0.0, 0
            start, wall = time.process_time(), time.perf_counter()
            res = run()
            cpu, wall = time.process_time() - start, time.perf_counter() - wall
            row = {"cpu_s": cpu, "wall_s": wall, "model_s": unet.seconds, "verifier_s": verifier.seconds,
                   "rest_s": cpu - unet.seconds - verifier.seconds, "model_rows": unet.rows,
                   "verifier_rows": verifier.rows, "model_ms_per_row": 1e3 * unet.seconds / unet.rows,
                   "verifier_ms_per_row": 1e3 * verifier.seconds / max(verifier.rows, 1), "nfe": res.nfe}
            out[name].append(row)
            print(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()), flush=True)
    for k in ("cpu_s", "wall_s", "model_s", "verifier_s", "rest_s"):
        ratio = [s[k] / b["wall_s" if k == "wall_s" else "cpu_s"] for s, b in zip(out[vname], out["bon_K48"],
                                                                                   strict=True)]
        unit = "wall" if k == "wall_s" else "CPU"
        print(f"{args.variant} {k} / best-of-48 {unit} s: " + " ".join(f"{r:.4f}" for r in ratio), flush=True)
    tag = args.tag or ("" if args.variant == "sweep14" else args.variant)
    name = "profile" + (f"_{tag}" if tag else "")
    write_json(results_dir("tree_search") / f"{name}.json", {"groups": g, "repeats": args.repeats, **out})


if __name__ == "__main__":
    main()
