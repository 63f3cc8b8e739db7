"""Seed-sharded ``steerdiff sample`` on 1 vs 2 processes (gloo, one thread each) on the digits UNet: throughput.

Issue 26's scaling check for seed-sharded sampling: ``steerdiff sample --model digits --seeds 0-1023`` in one process
and under ``torchrun --nproc_per_node=2``, the runs interleaved (1, 2, 1, 2, ...) and the medians compared, so that
the ratio is measured in one sitting. Every 2-process run's ``samples.safetensors`` is compared bitwise with the
1-process run's.

    OMP_NUM_THREADS=1 python benchmarks/distributed_sampling.py          # ~3 min on 2 idle cores
    OMP_NUM_THREADS=1 python benchmarks/distributed_sampling.py --quick --tag quick

Writes ``benchmarks/results/distributed/sampling[_TAG].{json,md}``. Throughput is samples per second of the
sampling phase as the command reports it (``metrics.json``'s ``wall_time_s``: the slowest rank's time in the
sampler, after the model is loaded and the process group joined); the whole command's wall time (start-up, imports,
rendezvous, the gather, the metrics and the writing) is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

TARGET = 1.6


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    return env | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                  "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def run(world: int, args, out: Path) -> dict:
    """One ``steerdiff sample`` run on ``world`` processes; its metrics and the command's wall time."""
    cmd = ["steerdiff", "sample", "--model", "digits", "--seeds", args.seeds, "--steps", str(args.steps),
           "--batch", str(args.batch), "--no-progress", "--out", str(out)]
    if world > 1:  # "--" ends torchrun's options (its argparse would read --n... as one of its own abbreviations)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               "--no-python", "--", *cmd]
    start = time.perf_counter()
    res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"world": world, "sampling_seconds": metrics["wall_time_s"], "command_seconds": seconds,
            "n": metrics["n"], "nfe": metrics["nfe"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0-1023")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=256, help="seeds per chunk (the unit the ranks share)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="seeds 0-63, 6 steps, chunks of 16, 1 repeat")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.steps, args.batch, args.repeats = "0-63", 6, 16, 1
    from safetensors.torch import load_file

    meta = provenance()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for world in (1, 2):
                out = Path(tmp) / f"r{rep}_w{world}"
                row = run(world, args, out)
                samples = load_file(str(out / "samples.safetensors"))
                if world == 1:
                    reference = samples
                row |= {"repeat": rep, "identical_to_1_process": all(
                    samples[k].equal(reference[k]) for k in reference) and samples.keys() == reference.keys()}
                rows.append(row)
                print(f"repeat {rep} world {world}: sampling {row['sampling_seconds']:.2f} s, command "
                      f"{row['command_seconds']:.2f} s", flush=True)
    n = rows[0]["n"]
    med = {w: statistics.median(r["sampling_seconds"] for r in rows if r["world"] == w) for w in (1, 2)}
    med_cmd = {w: statistics.median(r["command_seconds"] for r in rows if r["world"] == w) for w in (1, 2)}
    ratio, ratio_cmd = med[1] / med[2], med_cmd[1] / med_cmd[2]
    identical = all(r["identical_to_1_process"] for r in rows)
    summary = {"seeds": args.seeds, "n": n, "steps": args.steps, "nfe_per_sample": rows[0]["nfe"],
               "batch": args.batch, "repeats": args.repeats, "median_sampling_seconds": med,
               "median_command_seconds": med_cmd, "samples_per_s": {w: n / s for w, s in med.items()},
               "throughput_ratio": ratio, "command_throughput_ratio": ratio_cmd, "target_ratio": TARGET,
               "met": ratio >= TARGET, "identical_to_1_process": identical}
    table = [[w, f"{med[w]:.2f}", f"{n / med[w]:.1f}", f"{med[1] / med[w]:.2f}x", f"{med_cmd[w]:.2f}",
              f"{med_cmd[1] / med_cmd[w]:.2f}x"] for w in (1, 2)]
    tag = f"_{args.tag}" if args.tag else ""
    d = results_dir("distributed")
    write_json(d / f"sampling{tag}.json", {"meta": meta, "summary": summary, "runs": rows})
    lines = [
        "# Seed-sharded `steerdiff sample`, 1 vs 2 processes (gloo, 1 thread each), digits UNet", "",
        provenance_line(meta), "",
        f"`steerdiff sample --model digits --seeds {args.seeds}` ({n} samples), heun, {args.steps} steps "
        f"({rows[0]['nfe']:g} NFE per sample), chunks of {args.batch} seeds; 2 processes through `torchrun "
        f"--nproc_per_node=2 --no-python -- steerdiff sample ...`; medians of {args.repeats} interleaved repeats.", "",
        markdown_table(["processes", "sampling s", "samples / s", "vs 1 process", "command s", "vs 1 process"],
                       table), "",
        f"- sampling throughput ratio **{ratio:.2f}x** (target >= {TARGET}x: "
        f"{'met' if ratio >= TARGET else 'NOT met'}); whole command (start-up, imports, rendezvous, metrics, "
        f"writing included): {ratio_cmd:.2f}x",
        f"- 2-process samples.safetensors bitwise equal to the 1-process run's: **{identical}**",
    ]
    write_text(d / f"sampling{tag}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
