"""HR's spread ratio against the exact posterior as the level count and the step change, the level count its lag
warning names, and where its noise-share warning fires (docs/methods/inverse.md, "Multimodal posteriors").

Three parts, 1000 chains per problem, spread ratio = tr Cov(samples) / tr Cov(exact posterior), means over each
set's problems:

- ``levels``: HR at its defaults (Adam's step capped at the noise level, ``lr_cap = hybrid.HR_LR_CAP``) and with the
  former fixed step (``lr_cap=None``) on the ring, G2 (three problems), G1, gauss and the two three-mode problems
  (``3-mode``: ``V.three_mode_problem()``, outer modes 2 sigma_y off ``y``; ``3-mode aligned``: ``offset=0``, modes
  apart along the unobserved axis only) at 100 / 200 / 400 / 800 levels: spread, posterior-mean error, sliced W2, the
  share of chains whose lag exceeds 3 and whether each warning fired (``lag``: the level-count warning; ``noise``: the
  noise-share warning, with its median ``result.extras["noise_share"]``);
- ``lr``: HR at 200 levels with ``lr`` = 0.5 / 0.7 / 1 / 1.5 x its default (``hybrid.default_lr``), capped and fixed;
- ``cap``: HR at 200 and 800 levels with ``lr_cap`` = 0.5 / 1 / 2 / None (fixed), and DR / CR capped (1) and fixed,
  on the ring, G2, G1 (its first two problems) and gauss;
- ``suggest``: DR / CR / HR on the ring at 50 and 100 levels; where the lag warning fires, the run at the level count
  it names (``result.extras["levels_suggested"]``), its spread, lagging share and whether it warns again.

    OMP_NUM_THREADS=1 python benchmarks/inverse_hr_spread.py        # ~330 CPU s

Writes ``benchmarks/results/inverse/hr_spread.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from steerdiff.app.protocols import inverse as V
from steerdiff.inverse import solve
from steerdiff.inverse.hybrid import LAG_WARN, default_lr
from steerdiff.inverse.metrics import posterior_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_text  # noqa: E402

CHAINS = 1000


def sets() -> dict[str, list[V.Problem]]:
    return {"ring": [V.ring_problem(CHAINS)], "G2": [V.g2_problem(s, chains=CHAINS) for s in range(3)],
            "G1": V.g1_problems(CHAINS), "gauss": [V.gauss_problem(CHAINS)],
            "3-mode": [V.three_mode_problem(CHAINS)], "3-mode aligned": [V.three_mode_problem(CHAINS, offset=0.0)]}


STEPS = {"capped": {}, "fixed": {"lr_cap": None}}  # HR's default; the former fixed Adam step


def run(p: V.Problem, method: str, steps: int, seed: int, **options) -> dict:
    """Spread ratio, mean error, SW2, lagging share, whether each warning fired, the level count the lag warning
    named and the noise share."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = solve(p.prior, p.operator, p.y, method, noise_std=p.noise_std, chains=p.chains, steps=steps,
                    generator=seed, **options)
    m = posterior_metrics(res.samples[0], p.posterior, seed=seed)
    return {"spread": m["diversity"], "err": m["mean_err"], "sw2": m["sw2"],
            "lagging": float((res.extras["lag"] > LAG_WARN).float().mean()),
            "lag": any("prior puts no data" in str(w.message) for w in caught),
            "noise": any("measurement noise" in str(w.message) for w in caught),
            "named": res.extras.get("levels_suggested"), "share": res.extras.get("noise_share", float("nan"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="levels,lr,cap,suggest")
    args = ap.parse_args()
    parts = args.parts.split(",")
    t0 = time.process_time()
    out = [f"# HR's spread, its step and its warnings\n\n{provenance_line(provenance())}\n\n"
           "Command: `OMP_NUM_THREADS=1 python benchmarks/inverse_hr_spread.py`. 1000 chains per problem; spread = "
           "tr Cov(samples) / tr Cov(exact posterior), mean err = ||mean - E[x|y]|| / sqrt(d), SW2 = sliced W2 to 2000 "
           "exact samples, means over each set's problems. `capped`: HR's default, Adam's step min(lr, sigma) "
           "(`lr_cap=1`); `fixed`: the former default (`lr_cap=None`). Equal NFE within a row's level count.\n"]
    if "levels" in parts:
        rows = []
        for name, probs in sets().items():
            for step, opts in STEPS.items():
                for n in (100, 200, 400, 800):
                    r = [run(p, "hr", n, 1000 * j, **opts) for j, p in enumerate(probs)]
                    rows.append([name, step, n, f"{np.mean([v['spread'] for v in r]):.3f}",
                                 " / ".join(f"{v['spread']:.2f}" for v in r), f"{np.mean([v['err'] for v in r]):.3f}",
                                 f"{np.mean([v['sw2'] for v in r]):.3f}", f"{np.mean([v['lagging'] for v in r]):.3f}",
                                 sum(v["lag"] for v in r),
                                 f"{sum(v['noise'] for v in r)} ({np.median([v['share'] for v in r]):.2f})"])
        out.append("## HR by level count: its default (step capped at the noise level) and the former fixed step\n\n"
                   + markdown_table(["set", "step", "levels", "spread", "per problem", "mean err", "SW2",
                                     "lagging share", "lag warned", "noise warned (share)"], rows, "llrrrrrrrr"))
    if "lr" in parts:
        rows = []
        for f in (0.5, 0.7, 1.0, 1.5):
            for name, probs in sets().items():
                r = {step: [run(p, "hr", 200, 1000 * j, lr=f * default_lr(p.prior), **opts)["spread"]
                            for j, p in enumerate(probs)] for step, opts in STEPS.items()}
                rows.append([f"{f:g}", name, f"{np.mean(r['capped']):.3f}", f"{np.mean(r['fixed']):.3f}"])
        out.append("## HR at 200 levels by step (lr = factor x default)\n\n" + markdown_table(
            ["lr factor", "set", "spread, capped (default)", "spread, fixed"], rows, "rlrr"))
    if "cap" in parts:
        rows = []
        for name, probs in sets().items():
            if name.startswith("3-mode"):
                continue
            probs = probs[:2] if name == "G1" else probs  # G1: its first two problems (CPU)
            for method, caps in (("hr", (0.5, 1.0, 2.0, None)), ("dr", (1.0, None)), ("cr", (1.0, None))):
                for cap in caps:
                    r = [np.mean([run(p, method, n, 1000 * j, lr_cap=cap)["spread"] for j, p in enumerate(probs)])
                         for n in (200, 800)]
                    rows.append([name, method, "fixed" if cap is None else f"{cap:g}", *(f"{v:.3f}" for v in r)])
        out.append("## The cap's factor (`lr_cap`), and DR / CR with the cap\n\n" + markdown_table(
            ["set", "method", "lr_cap", "spread, 200 levels", "spread, 800 levels"], rows, "lllrr"))
    if "suggest" in parts:
        rows = []
        p = V.ring_problem(CHAINS)
        for method in ("dr", "cr", "hr"):
            for n in (50, 100):
                first = run(p, method, n, 0)
                n_new = first["named"]
                again = run(p, method, n_new, 1) if n_new else None
                rows.append([method, n, f"{first['spread']:.3f}", f"{first['lagging']:.3f}", n_new or "(no warning)",
                             *(("-", "-", "-") if again is None else
                               (f"{again['spread']:.3f}", f"{again['lagging']:.3f}", "yes" if again["lag"] else "no"))])
        out.append("## The ring: the level count the warning names, re-run\n\n" + markdown_table(
            ["method", "levels", "spread", "lagging share", "named", "spread at named", "lagging share",
             "warns again"], rows, "lrrrrrrl"))
    out.append(f"CPU {time.process_time() - t0:.0f} s.\n")
    write_text(results_dir("inverse") / "hr_spread.md", "\n\n".join(out))


if __name__ == "__main__":
    main()
