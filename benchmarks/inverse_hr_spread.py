"""HR's spread ratio against the exact posterior as the level count and the step change, and the level count its lag
warning names (docs/methods/inverse.md, "Multimodal posteriors").

Three parts, 1000 chains per problem, spread ratio = tr Cov(samples) / tr Cov(exact posterior), means over each
set's problems:

- ``levels``: HR at its defaults on the ring, G2 (three problems), G1 and gauss at 100 / 200 / 400 / 800 levels, with
  the share of chains whose lag exceeds 3 (the warning's test) and whether it warned;
- ``lr``: HR at 200 levels with ``lr`` = 0.5 / 0.7 / 1 / 1.5 x its default (``hybrid.default_lr``);
- ``suggest``: DR / CR / HR on the ring at 50 and 100 levels; where the lag warning fires, the run at the level count
  it names (``result.extras["levels_suggested"]``), its spread, lagging share and whether it warns again.

    OMP_NUM_THREADS=1 python benchmarks/inverse_hr_spread.py        # ~150 CPU s

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
            "G1": V.g1_problems(CHAINS), "gauss": [V.gauss_problem(CHAINS)]}


def run(p: V.Problem, method: str, steps: int, seed: int, **options) -> tuple[float, float, bool, int | None]:
    """Spread ratio, lagging share, whether the lag warning fired, and the level count it named."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = solve(p.prior, p.operator, p.y, method, noise_std=p.noise_std, chains=p.chains, steps=steps,
                    generator=seed, **options)
    warned = any("prior puts no data" in str(w.message) for w in caught)
    spread = posterior_metrics(res.samples[0], p.posterior, seed=seed)["diversity"]
    return spread, float((res.extras["lag"] > LAG_WARN).float().mean()), warned, res.extras.get("levels_suggested")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="levels,lr,suggest")
    args = ap.parse_args()
    parts = args.parts.split(",")
    t0 = time.process_time()
    out = [f"# HR's spread, its step and the level count of its lag warning\n\n{provenance_line(provenance())}\n"]
    if "levels" in parts:
        rows = []
        for name, probs in sets().items():
            for n in (100, 200, 400, 800):
                r = [run(p, "hr", n, 1000 * j) for j, p in enumerate(probs)]
                rows.append([name, n, f"{np.mean([v[0] for v in r]):.3f}", " / ".join(f"{v[0]:.2f}" for v in r),
                             f"{np.mean([v[1] for v in r]):.3f}", sum(v[2] for v in r)])
        out.append("## HR at its defaults by level count\n\n" + markdown_table(
            ["set", "levels", "spread", "per problem", "lagging share", "warned"], rows, "lrrrrr"))
    if "lr" in parts:
        rows = []
        for f in (0.5, 0.7, 1.0, 1.5):
            for name, probs in sets().items():
                r = [run(p, "hr", 200, 1000 * j, lr=f * default_lr(p.prior))[0] for j, p in enumerate(probs)]
                rows.append([f"{f:g}", name, f"{np.mean(r):.3f}"])
        out.append("## HR at 200 levels by step (lr = factor x default)\n\n" + markdown_table(
            ["lr factor", "set", "spread"], rows, "rlr"))
    if "suggest" in parts:
        rows = []
        p = V.ring_problem(CHAINS)
        for method in ("dr", "cr", "hr"):
            for n in (50, 100):
                spread, share, warned, n_new = run(p, method, n, 0)
                again = run(p, method, n_new, 1) if n_new else None
                rows.append([method, n, f"{spread:.3f}", f"{share:.3f}", n_new or "(no warning)",
                             *(("-", "-", "-") if again is None else
                               (f"{again[0]:.3f}", f"{again[1]:.3f}", "yes" if again[2] else "no"))])
        out.append("## The ring: the level count the warning names, re-run\n\n" + markdown_table(
            ["method", "levels", "spread", "lagging share", "named", "spread at named", "lagging share",
             "warns again"], rows, "lrrrrrrl"))
    out.append(f"CPU {time.process_time() - t0:.0f} s.\n")
    write_text(results_dir("inverse") / "hr_spread.md", "\n\n".join(out))


if __name__ == "__main__":
    main()
