"""Per-candidate CPU cost of SVDQuant's calibration on the SD-size pair's first layer (1280 -> 5120, 512 tokens),
exact (``svd="full"``) against fast (``svd="fast"``), measured in process CPU seconds (``time.process_time``; robust
to a shared machine's queueing), one thread:

    python benchmarks/svdquant_costs.py

A whole calibration is about (39 + refinement iterations) x (SVD + build + evaluation), which is how
``svdquant_fast_svd.md`` extrapolates the exact path's time when it cannot be run to the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from steerdiff.quant.calibrate import GroupCalibrator, SearchConfig, smooth_factor
from steerdiff.quant.mapping import Group

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import results_dir, write_json  # noqa: E402
from svdquant import sd_pair  # noqa: E402


def cpu(f, reps=1):
    f()  # warm-up
    c = time.process_time()
    for _ in range(reps):
        f()
    return (time.process_time() - c) / reps


if __name__ == "__main__":
    torch.set_num_threads(1)
    net, xc, _ = sd_pair(512)
    out = {"layer": "Linear(1280, 5120), 512 tokens, rank 32", "threads": 1}
    for svd in ("full", "fast"):
        cal = GroupCalibrator(Group("0", ["0"]), [net[0]], xc, SearchConfig(rank=32, svd=svd, shift=False))
        lam = smooth_factor(cal.a, cal.w, 0.5, 0.5)
        lam2 = smooth_factor(cal.a, cal.w, 0.55, 0.45)
        st = cal._stack(lam)
        cal._factors(st, lam)  # a basis to warm-start from (fast)
        st2 = cal._stack(lam2)
        ld, lu = cal._factors(st2, lam2)
        layers = cal.build(lam2, ld, lu)
        row = {"stack": cpu(lambda cal=cal, lam2=lam2: cal._stack(lam2)),
               "svd": cpu(lambda cal=cal, st=st, lam=lam, st2=st2, lam2=lam2: (cal._factors(st, lam),
                                                                               cal._factors(st2, lam2)), 1) / 2,
               "build": cpu(lambda cal=cal, lam2=lam2, ld=ld, lu=lu: cal.build(lam2, ld, lu), 2),
               "error": cpu(lambda cal=cal, layers=layers: cal.error(layers), 2)}
        row["per_candidate"] = sum(row.values())
        out[svd] = row
        print(svd, row, flush=True)
    write_json(results_dir("svdquant") / "svdquant_costs.json", out)
