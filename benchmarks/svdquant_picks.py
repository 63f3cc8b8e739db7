"""Which smoothing candidate ``search="sampled"`` keeps against ``search="exact"``, per group of the shipped digits
model (SVDQuant rank 8, INT4 and NVFP4, the calibration of ``benchmarks/svdquant.py --part t3search``), for given
randomized-SVD seeds: the groups where the picks differ and each one's calibration error after the refinement.

    OMP_NUM_THREADS=1 python benchmarks/svdquant_picks.py --seeds 0,1

Writes ``benchmarks/results/svdquant/svdquant_sampled_picks.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import steerdiff.quant as sq
import steerdiff.quant.calibrate as cal
from steerdiff.models.io import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import provenance, results_dir, write_json  # noqa: E402


def main(seeds: list[int]) -> dict:
    model = load("digits").requires_grad_(False)
    calib = sq.trajectory_calibration(model)
    out = {}
    for seed in seeds:
        cal.SVD_SEED = seed
        for fmt in ("nvfp4", "int4"):
            reps = [sq.quant_info(sq.quantize(model, "svdquant", calib=calib, rank=8, fmt=fmt, search=s))["report"]
                    for s in ("exact", "sampled")]
            rows = [{"group": a["group"], "exact": [a.get("alpha"), a.get("beta")],
                     "sampled": [b.get("alpha"), b.get("beta")], "err_exact": a["rel_error"],
                     "err_sampled": b["rel_error"]} for a, b in zip(*reps, strict=True)]
            diff = [r for r in rows if r["exact"] != r["sampled"]]
            print(seed, fmt, f"{len(rows)} groups, {len(diff)} different picks", flush=True)
            for r in diff:
                print("   ", r, flush=True)
            out[f"seed{seed}_{fmt}"] = {"groups": len(rows), "different": diff}
    cal.SVD_SEED = 0
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1")
    args = ap.parse_args()
    torch.set_num_threads(1)
    res = main([int(s) for s in args.seeds.split(",")])
    path = write_json(results_dir("svdquant") / "svdquant_sampled_picks.json", {**res, "meta": provenance()})
    print(f"wrote {path}")
