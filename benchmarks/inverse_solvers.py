"""The inverse solvers against exact mixture posteriors at equal NFE (docs/methods/inverse.md, "DDNM" ... "DAPS"):
DDNM(+), PiGDM, DDRM, DiffPIR and DAPS at their defaults beside DPS (best of s in {0.2, 0.6, 2.0} per problem set,
and each grid value), at 100 and 400 NFE.

Problems (``steerdiff.app.protocols.inverse``): ``gauss`` (one mode, 4-D, ``V.gauss_problem``), G1 (six ``y``,
bimodal 2-D), the ring (``gmm2d`` through ``A = [1, 1]`` at ``y = 0``: two posterior modes) and G2 seeds 0-2 (8-D,
four components). Metrics per problem set: the mean over its problems of the posterior-mean error, the spread ratio
(``tr Cov(samples) / tr Cov(posterior)``) and sliced W2 to 2000 exact posterior samples; ``exact`` is the same for
exact posterior samples of the same size (the Monte Carlo floor). NFE budget: ``steps = NFE`` levels for the
one-NFE-per-level solvers, ``NFE / 5`` levels x 5 ODE steps for DAPS. float64, common random numbers per problem.

    OMP_NUM_THREADS=1 python benchmarks/inverse_solvers.py              # ~5 min CPU
    python benchmarks/inverse_solvers.py --nfe 100 --chains 200          # a quick look
    python benchmarks/inverse_solvers.py --sweep --nfe 100               # default step rules vs other values

``--sweep`` runs, instead of the defaults, each solver's step-size / weight knob around its default rule (DiffPIR
``lam``, DAPS ``lr_scale``, PiGDM ``scale``, DDRM ``eta``, DDNM ``eta``) to compare the rule with the best value.

Writes ``benchmarks/results/inverse/solvers.json`` and ``solvers.md`` (``solvers_sweep.*`` with ``--sweep``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from steerdiff.app.protocols import inverse as V
from steerdiff.inverse import solve
from steerdiff.inverse.metrics import posterior_metrics
from steerdiff.io import atomic_write_text, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir  # noqa: E402

SOLVERS = ("ddnm", "pigdm", "ddrm", "diffpir", "daps")
DPS_GRID = (0.2, 0.6, 2.0)
KEYS = ("mean_err", "diversity", "sw2")
SWEEP = {**{f"diffpir lam={v:g}": ("diffpir", {"lam": v}) for v in (1.0, 7.0, 50.0)},
         **{f"daps lr_scale={v:g}": ("daps", {"lr_scale": v}) for v in (0.03, 0.1, 0.3)},
         **{f"pigdm scale={v:g}": ("pigdm", {"scale": v}) for v in (0.5, 1.0, 2.0)},
         **{f"ddrm eta={v:g}": ("ddrm", {"eta": v}) for v in (0.5, 0.85, 1.0)},
         **{f"ddnm eta={v:g}": ("ddnm", {"eta": v}) for v in (0.5, 0.85, 1.0)}}


def problem_sets(chains: int) -> dict[str, list[V.Problem]]:
    return {"gauss": [V.gauss_problem(chains)], "G1": V.g1_problems(chains), "ring": [V.ring_problem(chains)],
            "G2": [V.g2_problem(s, chains=chains) for s in range(3)]}


def run_one(p: V.Problem, method: str, nfe: int, seed: int, **options) -> tuple[dict, float]:
    steps = nfe // 5 if method == "daps" else nfe
    t = time.process_time()
    res = solve(p.prior, p.operator, p.y, method, noise_std=p.noise_std, chains=p.chains, steps=steps,
                generator=seed, **options)
    cpu = time.process_time() - t
    assert res.nfe == nfe, (method, res.nfe)
    return posterior_metrics(res.samples[0], p.posterior, seed=seed), cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nfe", default="100,400")
    ap.add_argument("--chains", type=int, default=1000)
    ap.add_argument("--sweep", action="store_true", help="each solver's knob around its default rule")
    args = ap.parse_args()
    nfes = [int(v) for v in args.nfe.split(",")]
    sets = problem_sets(args.chains)
    configs = {m: (m, {}) for m in SOLVERS} | {f"dps s={s:g}": ("dps", {"scale": s}) for s in DPS_GRID}
    if args.sweep:
        configs = SWEEP
    out: dict = {"meta": provenance(), "nfe": nfes, "chains": args.chains, "rows": {}}
    for set_name, problems in sets.items():
        exact = [posterior_metrics(p.posterior.sample(p.chains, generator=torch.Generator().manual_seed(77)),
                                   p.posterior, seed=1000 * j) for j, p in enumerate(problems)]
        out["rows"][f"{set_name} | exact"] = {k: float(np.mean([r[k] for r in exact])) for k in KEYS}
        for nfe in nfes:
            for label, (method, options) in configs.items():
                rows, cpu = [], 0.0
                for j, p in enumerate(problems):
                    r, c = run_one(p, method, nfe, 1000 * j, **options)
                    rows.append(r)
                    cpu += c
                mean = {k: float(np.mean([r[k] for r in rows])) for k in KEYS} | {"cpu_s": cpu}
                out["rows"][f"{set_name} | {nfe} | {label}"] = mean
                print(set_name, nfe, label, {k: round(v, 3) for k, v in mean.items()}, flush=True)
            if not args.sweep:
                dps = [out["rows"][f"{set_name} | {nfe} | dps s={s:g}"] for s in DPS_GRID]
                out["rows"][f"{set_name} | {nfe} | dps best"] = dict(min(dps, key=lambda r: r["mean_err"]))
    path = results_dir("inverse")
    stem = "solvers_sweep" if args.sweep else "solvers"
    write_json(path / f"{stem}.json", out)
    lines = ["# Inverse solvers against exact posteriors at equal NFE", "", provenance_line(out["meta"]), "",
             f"{args.chains} chains per problem; mean over each set's problems; spread = tr Cov(samples) / tr Cov"
             "(posterior) (1 is exact); `exact` = exact posterior samples of the same size (Monte Carlo floor); "
             "`dps best` = the DPS grid value with the lowest mean error on that set.", ""]
    for set_name in sets:
        rows = [["exact", "-", *(f"{out['rows'][f'{set_name} | exact'][k]:.3f}" for k in KEYS), "-"]]
        for nfe in nfes:
            order = list(SWEEP) if args.sweep else [*SOLVERS, "dps best", *(f"dps s={s:g}" for s in DPS_GRID)]
            for label in order:
                r = out["rows"][f"{set_name} | {nfe} | {label}"]
                rows.append([label, nfe, *(f"{r[k]:.3f}" for k in KEYS), f"{r['cpu_s']:.1f}"])
        lines += [f"## {set_name}", "", markdown_table(["solver", "NFE", "mean err", "spread", "SW2", "CPU s"], rows,
                                                        "lrrrrr"), ""]
    atomic_write_text(path / f"{stem}.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
