"""Dynamical Diffusion (Guo et al., ICLR 2025) vs the standard conditional diffusion baseline at equal budget: the
CPU validation protocol of section A.9 of shared/methods/temporal_geometry_control.md (docs/methods/dydiff.md).

Arms: ``(field, r, seed)``. Both arms of a seed share network, initial weights, steps, data stream and sampler; only
``r`` differs (0 = baseline, 0.5 = DyDiff). Each arm trains the recipe ``configs/advection_dydiff.json`` (1-D) or
``configs/advection2d_dydiff.json`` (2-D) with its ``r`` and seed, then forecasts the fixed test set (128 sequences,
seed 1234) with Heun, 12 steps, 8 members, and scores the 6 future frames: MSE of the ensemble mean and fair CRPS,
beside persistence and the exact oracle mean. Seed 0 of the 1-D ``r = 0 / 0.5`` arms trains in ``runs/advection_*``,
the run the shipped models come from (``scripts/make_assets.py``); other arms in ``runs/dydiff_bench/``.

Resumable: every arm checkpoints while it trains (``--resume`` of the trainer) and writes
``benchmarks/results/dydiff/arms/<arm>.json`` when scored; a rerun skips scored arms. ``dydiff.json`` and
``dydiff.md`` are rebuilt from the arm files after every arm.

    OMP_NUM_THREADS=1 python benchmarks/dydiff.py                      # everything below, in this order
    OMP_NUM_THREADS=1 python benchmarks/dydiff.py --part main          # 1-D, r in {0, 0.5}, seeds 0, 1, 2
    OMP_NUM_THREADS=1 python benchmarks/dydiff.py --part 2d            # 2-D, r in {0, 0.5}, seeds 0, 1, 2
    OMP_NUM_THREADS=1 python benchmarks/dydiff.py --part ablation [--ablation-seeds 0,1,2]   # 1-D, r in {0.1, 0.9}
    OMP_NUM_THREADS=1 python benchmarks/dydiff.py --part 2d-conv [--seeds 0 --ablation-seeds 0]
        # 2-D with the spatial backbone FrameConv (configs/advection2d_dydiff_conv.json): r in {0, 0.5} on --seeds,
        # then r in {0.1, 0.9} on --ablation-seeds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from steerdiff.app.protocols.forecast import evaluate_forecaster
from steerdiff.app.recipes.dydiff import read_recipe, train_forecaster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

RECIPES = {1: "advection_dydiff", 2: "advection2d_dydiff"}
CONV_RECIPE = "advection2d_dydiff_conv"  # --part 2d-conv: the spatial backbone FrameConv
CONV_WIDTH, CONV_STEPS = 32, 2000  # the conv recipe's channels and steps (rows are grouped by them)
SHIPPED_RUNS = {0.0: "runs/advection_baseline", 0.5: "runs/advection_dydiff"}  # 1-D, seed 0: the shipped models


def arm_name(dims: int, r: float, seed: int, width: int | None = None, steps: int | None = None,
             conv: bool = False, batch: int | None = None) -> str:
    tag = ("_conv" if conv else "") + ("" if width is None else f"_w{width}") + ("" if steps is None else f"_k{steps}")
    tag += "" if batch is None else f"_b{batch}"
    return f"{dims}d{tag}_r{r:g}_s{seed}"


def run_dir(dims: int, r: float, seed: int, width: int | None = None, steps: int | None = None,
            conv: bool = False, batch: int | None = None) -> Path:
    if dims == 1 and seed == 0 and r in SHIPPED_RUNS and width is None and steps is None and not conv and batch is None:
        return ROOT / SHIPPED_RUNS[r]
    return ROOT / "runs" / "dydiff_bench" / arm_name(dims, r, seed, width, steps, conv, batch)


def run_arm(dims: int, r: float, seed: int, out: Path, width: int | None = None, steps: int | None = None,
            conv: bool = False, batch: int | None = None) -> dict:
    """Train (resuming) and score one arm; cached in ``out/arms/<arm>.json``. ``width`` replaces the recipe's token
    width (the 2-D field's frames have 256 values, more than the recipe's 128-wide tokens), ``steps`` its training
    steps (the learning-rate decay stays on the last 30%); ``conv`` trains the 2-D recipe with the spatial backbone
    FrameConv (``configs/advection2d_dydiff_conv.json``; its own steps and batch, the same for both r); ``batch``
    replaces the recipe's batch size (the learning rate and schedule unchanged)."""
    name = arm_name(dims, r, seed, width, steps, conv, batch)
    path = out / "arms" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        return json.loads(path.read_text())
    t0 = time.perf_counter()
    recipe = read_recipe(ROOT / "configs" / f"{CONV_RECIPE if conv else RECIPES[dims]}.json", seed=seed, r=r)
    if width is not None:
        recipe["model"]["config"]["net"]["config"]["net"]["config"]["width"] = width
    if steps is not None:
        recipe["train"]["steps"] = steps
    if batch is not None:
        recipe["train"]["batch_size"] = batch
    result = train_forecaster(recipe, run_dir(dims, r, seed, width, steps, conv, batch))
    train_s = result.history[-1]["seconds"] if result.history else None
    scores = evaluate_forecaster(result.model)
    train = recipe["train"]
    net = recipe["model"]["config"]["net"]["config"]["net"]
    row = {"dims": dims, "r": r, "seed": seed, "backbone": "conv" if conv else "mlp",
           "width": net["config"]["channels"] if conv else width or 128, "train_steps": train["steps"],
           "batch_size": train["batch_size"], "train_seconds": train_s, "final_loss": result.history[-1]["loss"],
           **scores, "wall_seconds": round(time.perf_counter() - t0, 1)}
    write_json(path, row)
    print(f"{name}: mse {row['mse']:.4f} crps {row['crps']:.4f} (persistence "
          f"{row['persistence_mse']:.3f}, oracle {row['oracle_mse']:.3f}) train {train_s}s", flush=True)
    return row


def _mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def criteria(rows: list[dict], dims: int, seeds: list[int], width: int = 128, steps: int = 2500,
             backbone: str = "mlp", batch: int | None = None) -> dict:
    """A.9's pass criteria on the seeds where both arms are scored (means over seeds); rows of one backbone
    (``mlp``: FrameMixer, rows written before the conv backbone carry no key; ``conv``: FrameConv)."""
    by = {(r["r"], r["seed"]): r for r in rows
          if r["dims"] == dims and r.get("width", 128) == width and r.get("train_steps", 2500) == steps
          and r.get("backbone", "mlp") == backbone and (batch is None or r.get("batch_size") == batch)}
    done = [s for s in seeds if (0.0, s) in by and (0.5, s) in by]
    if not done:
        return {}
    base, dy = [by[(0.0, s)] for s in done], [by[(0.5, s)] for s in done]
    pers, orac = _mean(base, "persistence_mse"), _mean(base, "oracle_mse")
    out = {"seeds": done, "persistence_mse": pers, "oracle_mse": orac,
           "baseline_mse": _mean(base, "mse"), "baseline_crps": _mean(base, "crps"),
           "dydiff_mse": _mean(dy, "mse"), "dydiff_crps": _mean(dy, "crps")}
    checks = {}
    for arm, arm_rows in (("baseline", base), ("dydiff", dy)):
        m = _mean(arm_rows, "mse")
        checks[f"{arm}_beats_persistence_by_40pct"] = bool(m <= 0.6 * pers)
        checks[f"{arm}_within_1.6x_oracle"] = bool(m <= 1.6 * orac)
    checks["dydiff_crps_le_0.99_baseline"] = bool(out["dydiff_crps"] <= 0.99 * out["baseline_crps"])
    checks["dydiff_mse_le_baseline"] = bool(out["dydiff_mse"] <= out["baseline_mse"])
    wins = sum(by[(0.5, s)]["crps"] < by[(0.0, s)]["crps"] for s in done)
    checks["dydiff_wins_crps_on_2_of_3_seeds"] = bool(wins >= 2) if len(done) == 3 else None
    out.update(crps_wins=wins, crps_ratio=out["dydiff_crps"] / out["baseline_crps"],
               mse_ratio=out["dydiff_mse"] / out["baseline_mse"], checks=checks)
    return out


def report(out: Path, seeds: list[int]) -> None:
    rows = sorted((json.loads(p.read_text()) for p in (out / "arms").glob("*.json")),
                  key=lambda r: (r["dims"], r.get("backbone", "mlp"), r.get("width", 128), r.get("train_steps", 2500),
                                 r.get("batch_size", 64), r["r"], r["seed"]))
    summary = {"1d": criteria(rows, 1, seeds), "2d": criteria(rows, 2, seeds),
               "2d_w256": criteria(rows, 2, seeds, width=256), "2d_k10000": criteria(rows, 2, seeds, steps=10000),
               "2d_conv": criteria(rows, 2, seeds, width=CONV_WIDTH, steps=CONV_STEPS, backbone="conv", batch=16),
               "2d_conv_b32": criteria(rows, 2, seeds, width=CONV_WIDTH, steps=CONV_STEPS, backbone="conv",
                                       batch=32),
               "2d_conv_b64": criteria(rows, 2, seeds, width=CONV_WIDTH, steps=CONV_STEPS, backbone="conv",
                                       batch=64)}
    meta = provenance(script=__file__)
    write_json(out / "dydiff.json", {"meta": meta, "arms": rows, "criteria": summary})
    lines = ["# Dynamical Diffusion vs the conditional baseline (A.9 protocol)", "",
             provenance_line(meta), "",
             "Fixed test set of 128 sequences (seed 1234), future frames only; Heun 12 steps (23 NFE per member), "
             "8 members. MSE of the ensemble mean, fair CRPS. r = 0 is the baseline, r = 0.5 DyDiff; 0.1 and 0.9 "
             "are the ablation (no criterion).", ""]
    header = ["field", "backbone", "width", "steps", "batch", "r", "seed", "MSE", "CRPS", "persistence MSE",
              "oracle MSE", "train s", "final loss"]
    table = [[f"{r['dims']}-D", r.get("backbone", "mlp"), r.get("width", 128), r.get("train_steps", 2500),
              r.get("batch_size", 64), f"{r['r']:g}", r["seed"],
              f"{r['mse']:.4f}", f"{r['crps']:.4f}", f"{r['persistence_mse']:.3f}", f"{r['oracle_mse']:.3f}",
              r["train_seconds"], f"{r['final_loss']:.4f}"]
             for r in rows]
    lines += [markdown_table(header, table), ""]
    for key, s in summary.items():
        if not s:
            continue
        lines += [f"## {key}: means over seeds {s['seeds']}", "",
                  f"baseline MSE {s['baseline_mse']:.4f}, CRPS {s['baseline_crps']:.4f}; DyDiff MSE "
                  f"{s['dydiff_mse']:.4f}, CRPS {s['dydiff_crps']:.4f}; CRPS ratio {s['crps_ratio']:.4f}, MSE ratio "
                  f"{s['mse_ratio']:.4f}; DyDiff wins CRPS on {s['crps_wins']} of {len(s['seeds'])} seeds; "
                  f"persistence {s['persistence_mse']:.3f}, oracle {s['oracle_mse']:.3f}.", ""]
        lines += [markdown_table(["criterion", "pass"], [[k, {True: "PASS", False: "FAIL", None: "n/a"}[v]]
                                                         for k, v in s["checks"].items()]), ""]
    for backbone in ("mlp", "conv"):
        abl = [r for r in rows if r["r"] not in (0.0, 0.5) and r.get("backbone", "mlp") == backbone]
        if abl:
            lines += [f"Ablation r in {{0.1, 0.9}} ({backbone}, {abl[0]['dims']}-D): seeds "
                      + ", ".join(sorted({str(r["seed"]) for r in abl})) + ".", ""]
    write_text(out / "dydiff.md", "\n".join(lines))
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["all", "main", "2d", "ablation", "2d-wide", "2d-long", "2d-conv"],
                        default="all")
    parser.add_argument("--wide-seeds", default="0,1,2", help="--part 2d-wide / 2d-long: seeds of those 2-D arms")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ablation-seeds", default="0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--conv-batch", type=int, default=None,
                        help="--part 2d-conv: batch size replacing the conv recipe's 16 (its own arms and table)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    abl_seeds = [int(s) for s in args.ablation_seeds.split(",") if s]  # "" = none
    out = results_dir("dydiff")
    arms: list[tuple[int, float, int]] = []
    if args.part in ("all", "main"):
        arms += [(1, r, s) for s in seeds for r in (0.0, 0.5)]
    if args.part in ("all", "ablation"):
        arms += [(1, r, s) for s in abl_seeds for r in (0.1, 0.9)]
    if args.part in ("all", "2d"):
        arms += [(2, r, s) for s in seeds for r in (0.0, 0.5)]
    for dims, r, seed in arms:
        run_arm(dims, r, seed, out)
        report(out, seeds)
    if args.part == "2d-long":  # not in "all": the 2-D field at 4x the training steps
        for seed in (int(s) for s in args.wide_seeds.split(",")):
            for r in (0.0, 0.5):
                run_arm(2, r, seed, out, steps=10000)
                report(out, seeds)
    if args.part == "2d-conv":  # not in "all": the 2-D field with the spatial backbone FrameConv
        for seed in seeds:
            for r in (0.0, 0.5):
                run_arm(2, r, seed, out, conv=True, batch=args.conv_batch)
                report(out, seeds)
        for seed in abl_seeds:
            for r in (0.1, 0.9):
                run_arm(2, r, seed, out, conv=True, batch=args.conv_batch)
                report(out, seeds)
    if args.part == "2d-wide":  # not in "all": the 2-D field with 256-wide tokens (a frame has 256 values)
        for seed in (int(s) for s in args.wide_seeds.split(",")):
            for r in (0.0, 0.5):
                run_arm(2, r, seed, out, width=256)
                report(out, seeds)


if __name__ == "__main__":
    main()
