"""The three-mode set's posterior-mean error over seeds, steerdiff's solvers beside deepinv's DPS, at ``y = 0`` (the
set of ``inverse_deepinv.py``, symmetric under ``x -> -x``) and ``y = 0.5`` (symmetry broken) (docs/methods/inverse.md,
"Against deepinv").

At ``y = 0`` every sampler whose noise is symmetric has expected mean ``0 = E[x | y]``, so its posterior-mean error is
Monte Carlo noise only, about ``sqrt(tr Cov(samples) / (N d))``: it grows with the sampler's spread, and a sampler
collapsed on the middle mode scores lower than exact posterior samples. This script measures that over seeds, and the
same comparison where the posterior mean is not a mode (``y = 0.5``: modes (0, 0) and (1, 3) of about equal weight).

Per ``y`` and seed: exact posterior samples, each steerdiff solver of ``inverse_solvers.py`` at its defaults,
steerdiff's DPS on a six-value scale grid, steerdiff's DPS in the score form (``step_form="score"``) at deepinv's
six weights converted to our units (``w / (2c)``), and deepinv's DPS on its weight grid, 1000 chains, 400 NFE,
independent chains per seed. ``best`` rows: the grid value with the lowest seed-mean error
(``deepinv dps best``), and the lowest among those whose seed-mean spread ratio is in [0.8, 1.25] (``... in band``).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD:DIR python benchmarks/inverse_three_mode_mean.py   # ~5 min CPU; DIR: deepinv

Writes ``benchmarks/results/inverse/three_mode_mean.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from steerdiff.app.protocols import inverse as V
from steerdiff.inverse.metrics import posterior_metrics
from steerdiff.inverse.reference import posterior_trace_cov

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _deepinv as DI  # noqa: E402
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402
from inverse_deepinv import DINV_DPS_GRID, run_deepinv  # noqa: E402
from inverse_solvers import SOLVERS, run_one  # noqa: E402

BAND = (0.8, 1.25)
DPS_GRID6 = (0.07, 0.2, 0.6, 2.0, 6.0, 20.0)  # steerdiff's DPS tuned on as many values as deepinv's, ~3x apart
SEED_STRIDE = 1_000_000  # chain r of seed k draws with seed k * SEED_STRIDE + r: no chain shared between seeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--chains", type=int, default=1000)
    ap.add_argument("--nfe", type=int, default=400)
    ap.add_argument("--ys", default="0,0.5")
    ap.add_argument("--dps-scales", default=",".join(f"{v:g}" for v in DPS_GRID6),
                    help="steerdiff's DPS scales (the table's `best` picks among deepinv's grid only)")
    ap.add_argument("--tag", default="", help="suffix of the output files (for a run with other scales)")
    ap.add_argument("--labels", default="", help="comma-separated row labels to run (default: every row), e.g. "
                    "'exact,ddrm,dps score w=10,deepinv dps w=300' for a run with many chains")
    args = ap.parse_args()
    dps_grid = [float(v) for v in args.dps_scales.split(",")]
    dinv = DI.load()
    t0 = time.process_time()
    labels = ["exact", *SOLVERS, "dps auto", *(f"dps s={s:g}" for s in dps_grid),
              *(f"dps score w={w:g}" for w in DINV_DPS_GRID), *(f"deepinv dps w={w:g}" for w in DINV_DPS_GRID)]
    if args.labels:
        keep = [v.strip() for v in args.labels.split(",")]
        unknown = [v for v in keep if v not in labels]
        if unknown:
            raise SystemExit(f"--labels: unknown {unknown}; choose from {labels}")
        labels = [v for v in labels if v in keep]
        if labels[0] != "exact":
            raise SystemExit("--labels must include 'exact' (the reference row)")
    out: dict = {"meta": provenance() | {"deepinv": dinv.__version__}, "chains": args.chains, "nfe": args.nfe,
                 "rows": {}}
    lines = ["# The three-mode set over seeds: posterior-mean error, steerdiff beside deepinv's DPS", "",
             provenance_line(out["meta"]) + f"; deepinv {dinv.__version__}", "",
             f"{args.chains} chains, {args.nfe} NFE, seeds 0-{args.seeds - 1}; mean (sd) over seeds of the "
             "posterior-mean error and the spread ratio. `floor` = sqrt(tr Cov(posterior) / (N d)), the rms error of "
             "N exact samples' mean. Command: `OMP_NUM_THREADS=1 PYTHONPATH=$PWD:DIR python "
             "benchmarks/inverse_three_mode_mean.py` (DIR: deepinv, see inverse_deepinv.py).", ""]
    for y in (float(v) for v in args.ys.split(",")):
        p = V.three_mode_problem(args.chains, y=y)
        # deepinv's weight w acts on ||r|| in its [0, 1] units (x01 = x / (2c) + 1/2): log p(y | x) ~ -w ||r|| / (2c)
        # in ours, so steerdiff's score-form weight for the same w is w / (2c)
        unit = 2 * DI.Adapter(p).c
        floor = (posterior_trace_cov(p.posterior) / (args.chains * 2)) ** 0.5
        res: dict[str, list[dict]] = {k: [] for k in labels}
        for seed in range(args.seeds):
            res["exact"].append(posterior_metrics(p.posterior.sample(args.chains, generator=torch.Generator()
                                                                     .manual_seed(77 + seed)), p.posterior, seed=seed))
            for label in labels[1:]:
                gen = seed * SEED_STRIDE
                if label.startswith("deepinv"):
                    r = run_deepinv(p, label, args.nfe, seed)[0]  # torch.manual_seed(seed): independent per seed
                elif label == "dps auto":
                    r = run_one(p, "dps", args.nfe, gen, scale="auto")[0]
                elif label.startswith("dps score w="):
                    r = run_one(p, "dps", args.nfe, gen, step_form="score",
                                scale=float(label.split("=")[1]) / unit)[0]
                elif label.startswith("dps s="):
                    r = run_one(p, "dps", args.nfe, gen, scale=float(label.split("=")[1]))[0]
                else:
                    r = run_one(p, label, args.nfe, gen)[0]
                res[label].append(r)
            print(y, seed, f"{time.process_time() - t0:.0f}s", flush=True)
        stats = {k: {m: (float(np.mean([r[m] for r in v])), float(np.std([r[m] for r in v])))
                     for m in ("mean_err", "diversity")} for k, v in res.items()}
        grid = [g for g in (f"deepinv dps w={w:g}" for w in DINV_DPS_GRID) if g in stats]
        best = min(grid, key=lambda g: stats[g]["mean_err"][0]) if grid else None  # a --labels run may have none
        in_band = [g for g in grid if BAND[0] <= stats[g]["diversity"][0] <= BAND[1]]
        best_band = min(in_band, key=lambda g: stats[g]["mean_err"][0]) if in_band else None
        ours = [k for k in [*SOLVERS, "dps auto", *(f"dps s={s:g}" for s in dps_grid),
                            *(f"dps score w={w:g}" for w in DINV_DPS_GRID)]
                if k in stats and BAND[0] <= stats[k]["diversity"][0] <= BAND[1]]
        ours_best = min(ours, key=lambda k: stats[k]["mean_err"][0]) if ours else None
        out["rows"][f"y={y:g}"] = {"stats": stats, "floor": floor, "deepinv_best": best, "deepinv_best_in_band":
                                   best_band, "steerdiff_best_in_band": ours_best,
                                   "per_seed": {k: [r["mean_err"] for r in v] for k, v in res.items()}}
        rows = [[k, *(f"{stats[k][m][0]:.4f} ({stats[k][m][1]:.4f})" for m in ("mean_err", "diversity"))]
                for k in labels]
        lines += [f"## y = {y:g}", "", f"floor {floor:.4f}; deepinv dps best (lowest mean error): `{best}`; best in "
                  f"band: `{best_band}`; steerdiff's best in band: `{ours_best}`.", "",
                  markdown_table(["sampler", "mean err", "spread"], rows, "lrr"), ""]
    lines.append(f"CPU {time.process_time() - t0:.0f} s.")
    path = results_dir("inverse")
    stem = "three_mode_mean" + (f"_{args.tag}" if args.tag else "")
    write_json(path / f"{stem}.json", out)
    write_text(path / f"{stem}.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
