"""The inverse solvers against exact mixture posteriors at equal NFE (docs/methods/inverse.md, "DDNM" ... "DAPS"):
DDNM(+), PiGDM, DDRM, DiffPIR, DAPS, MCGDiff (the SMC sampler; its chains are one particle population) and HR at
their defaults beside DPS (its step rule ``dps auto``, the best of s in {0.2, 0.6, 2.0} per problem set, and each grid
value), at 100 and 400 NFE.

Problems (``steerdiff.app.protocols.inverse``): ``gauss`` (one mode, 4-D, ``V.gauss_problem``), G1 (six ``y``,
bimodal 2-D), the ring (``gmm2d`` through ``A = [1, 1]`` at ``y = 0``: two posterior modes), G2 seeds 0-2 (8-D,
four components) and ``3-mode`` (three modes apart along the unobserved axis, ``V.three_mode_problem``). Metrics
per problem set: the mean over its problems of the posterior-mean error, the spread ratio
(``tr Cov(samples) / tr Cov(posterior)``) and sliced W2 to 2000 exact posterior samples; ``exact`` is the same for
exact posterior samples of the same size (the Monte Carlo floor). NFE budget: ``steps = NFE`` levels for the
one-NFE-per-level solvers, ``NFE / 5`` levels x 5 ODE steps for DAPS. float64, common random numbers per problem.

    OMP_NUM_THREADS=1 python benchmarks/inverse_solvers.py              # ~12 min CPU
    python benchmarks/inverse_solvers.py --nfe 100 --chains 200          # a quick look
    python benchmarks/inverse_solvers.py --sweep --nfe 100               # default step rules vs other values

``--sweep`` runs, instead of the defaults, each solver's step-size / weight knob around its default rule (DiffPIR
``lam``, DAPS ``lr_scale``, PiGDM ``scale``, DDRM ``eta``, DDNM ``eta``) to compare the rule with the best value.

Writes ``benchmarks/results/inverse/solvers.json`` and ``solvers.md`` (``solvers_sweep.*`` with ``--sweep``), and
without ``--sweep`` the ranking ``ranking.md``: per problem set and NFE, the solvers (``dps best`` for DPS) ranked by
sliced W2 to the exact posterior, with their mean error and spread, and the mean rank over the sets.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from steerdiff.app.protocols import inverse as V
from steerdiff.inverse import solve
from steerdiff.inverse.metrics import posterior_metrics
from steerdiff.io import atomic_write_text, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir  # noqa: E402

SOLVERS = ("ddnm", "pigdm", "ddrm", "diffpir", "daps", "mcgdiff", "hr")
DPS_GRID = (0.2, 0.6, 2.0)
KEYS = ("mean_err", "diversity", "sw2")
SWEEP = {**{f"diffpir lam={v:g}": ("diffpir", {"lam": v}) for v in (1.0, 7.0, 50.0)},
         **{f"daps lr_scale={v:g}": ("daps", {"lr_scale": v}) for v in (0.03, 0.1, 0.3)},
         **{f"pigdm scale={v:g}": ("pigdm", {"scale": v}) for v in (0.5, 1.0, 2.0)},
         **{f"ddrm eta={v:g}": ("ddrm", {"eta": v}) for v in (0.5, 0.85, 1.0)},
         **{f"ddnm eta={v:g}": ("ddnm", {"eta": v}) for v in (0.5, 0.85, 1.0)}}


def problem_sets(chains: int) -> dict[str, list[V.Problem]]:
    return {"gauss": [V.gauss_problem(chains)], "G1": V.g1_problems(chains), "ring": [V.ring_problem(chains)],
            "G2": [V.g2_problem(s, chains=chains) for s in range(3)], "3-mode": [V.three_mode_problem(chains)]}


def run_one(p: V.Problem, method: str, nfe: int, seed: int, **options) -> tuple[dict, float]:
    steps = nfe // 5 if method == "daps" else nfe
    t = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HR's lag warning on the multimodal sets: the table shows the spread
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
    ap.add_argument("--three-mode", action="store_true", help="HR's spread on the three-mode case (hr_three_mode.md)")
    args = ap.parse_args()
    if args.three_mode:
        three_mode()
        return
    nfes = [int(v) for v in args.nfe.split(",")]
    sets = problem_sets(args.chains)
    configs = ({m: (m, {}) for m in SOLVERS} | {"dps auto": ("dps", {"scale": "auto"})}
               | {f"dps s={s:g}": ("dps", {"scale": s}) for s in DPS_GRID})
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
             "`dps auto` = DPS at its step rule (the default for these `Matrix` operators); "
             "`dps best` = the DPS grid value with the lowest mean error on that set.", ""]
    for set_name in sets:
        rows = [["exact", "-", *(f"{out['rows'][f'{set_name} | exact'][k]:.3f}" for k in KEYS), "-"]]
        for nfe in nfes:
            order = list(SWEEP) if args.sweep else [*SOLVERS, "dps auto", "dps best",
                                                      *(f"dps s={s:g}" for s in DPS_GRID)]
            for label in order:
                r = out["rows"][f"{set_name} | {nfe} | {label}"]
                rows.append([label, nfe, *(f"{r[k]:.3f}" for k in KEYS), f"{r['cpu_s']:.1f}"])
        lines += [f"## {set_name}", "", markdown_table(["solver", "NFE", "mean err", "spread", "SW2", "CPU s"], rows,
                                                        "lrrrrr"), ""]
    atomic_write_text(path / f"{stem}.md", "\n".join(lines) + "\n")
    if not args.sweep:
        atomic_write_text(path / "ranking.md", ranking(out, list(sets), nfes))


def three_mode() -> None:
    """HR (and variants), DR and MCGDiff on ``V.three_mode_problem`` at 100 / 400 / 1000 levels, 400 chains,
    ``sigma_y`` 0.5 and 0.05 (``V.three_mode_table``)."""
    t = time.process_time()
    table = V.three_mode_table()
    out = {"meta": provenance(), "rows": table, "cpu_s": time.process_time() - t}
    path = results_dir("inverse")
    write_json(path / "hr_three_mode.json", out)
    rows = [[k, *(f"{r[m]:.3f}" for m in ("mean_err", "tv", "diversity", "sw2", "x1_std")), r.get("warned", "-")]
            for k, r in table.items()]
    lines = ["# HR on three modes apart along the unobserved axis", "", provenance_line(out["meta"]), "",
             "`V.three_mode_problem`: components at (-1, -3), (0, 0), (1, 3) (std 0.3, equal weights), `A = [1, 0]`, "
             "`y = 0`; 400 chains, seed 0; `spread` = tr Cov(samples) / tr Cov(posterior); `x1 std`: the std of the "
             "observed coordinate; `warned`: warnings raised by the run.", "",
             markdown_table(["run", "mean err", "TV", "spread", "SW2", "x1 std", "warned"], rows, "lrrrrrr"), ""]
    atomic_write_text(path / "hr_three_mode.md", "\n".join(lines) + "\n")


def ranking(out: dict, sets: list[str], nfes: list[int]) -> str:
    """Solvers x problem sets: each cell ``rank (SW2; mean err / spread)``, ranked by sliced W2 to the exact
    posterior per set and NFE (it sees the mean, the spread and the mode weights); the last column is the mean
    rank."""
    labels = [*SOLVERS, "dps auto", "dps best"]
    lines = ["# Inverse solvers ranked against exact posteriors", "", provenance_line(out["meta"]), "",
             "Each cell: rank by sliced W2 to exact posterior samples on that problem set (1 = best), then `SW2; "
             "mean err / spread` "
             "(spread = tr Cov(samples) / tr Cov(posterior), 1 is exact); `mean rank` averages the ranks over the "
             f"sets. {out['chains']} chains per problem; `dps auto` = DPS at its step rule (`dps_auto_scales`, its "
             "default for these `Matrix` operators); `dps best` = the best of DPS's scale grid per set (tuned on "
             "the exact answer, so an upper bound for DPS).", ""]
    for nfe in nfes:
        ranks: dict[str, list[int]] = {m: [] for m in labels}
        cells: dict[str, list[str]] = {m: [] for m in labels}
        for set_name in sets:
            rows = {m: out["rows"][f"{set_name} | {nfe} | {m}"] for m in labels}
            order = sorted(labels, key=lambda m: rows[m]["sw2"])
            for m in labels:
                r = order.index(m) + 1
                ranks[m].append(r)
                cells[m].append(f"{r} ({rows[m]['sw2']:.2f}; {rows[m]['mean_err']:.3f} / {rows[m]['diversity']:.2f})")
        table = [[m, *cells[m], f"{np.mean(ranks[m]):.1f}"] for m in sorted(labels, key=lambda m: np.mean(ranks[m]))]
        lines += [f"## {nfe} NFE", "", markdown_table(["solver", *sets, "mean rank"], table,
                                                      "l" + "r" * (len(sets) + 1)), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
