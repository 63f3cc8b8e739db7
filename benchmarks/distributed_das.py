"""Sharded DAS on 1 vs 2 processes (gloo, one thread each) on the digits UNet: throughput, identity, communication.

Issue 26's scaling check: one SMC population (``--layout particles``: the particles of every group spread over the
ranks, resampled particles move point to point) or whole groups per rank (``--layout groups``), against the same
run in one process. The runs are interleaved (1, 2, 1, 2, ...) and the medians compared, so that the ratio is
measured in one sitting. Every 2-process run's samples are compared bitwise with the 1-process run's (the micro-batch
``--batch`` divides each rank's rows per group, so both evaluate the UNet on the same batches).

    OMP_NUM_THREADS=1 python benchmarks/distributed_das.py                 # P = 32 and 128, ~2 min on 2 idle cores
    OMP_NUM_THREADS=1 python benchmarks/distributed_das.py --quick --tag quick

Writes ``benchmarks/results/distributed/das[_TAG].{json,md}``. Throughput is particle-steps per second of the
sampler call (the model is loaded and the process group joined before the clock starts; the slowest rank counts).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402


def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    import steerdiff as sd
    from steerdiff.align import das
    from steerdiff.align.rewards import ink
    from steerdiff.distributed import barrier
    from steerdiff.models.io import ASSETS_DIR, load

    ctx = sd.distributed.init(backend="gloo", timeout=600)
    model = load(ASSETS_DIR / "digits")
    G, P = args.groups, args.particles[0]  # a worker runs one population size
    noise = sd.randn((G * P, *model.sample_shape), seeds=0)
    sig = sd.sigmas.karras(args.steps, 0.002, 80.0, 7.0)
    cond = torch.arange(G) % 10
    barrier(ctx)
    start = time.perf_counter()
    res = das(model, ink, noise, sig, alpha=0.1, particles=P, cond=cond, generator=0, batch_size=args.batch,
              ess_threshold=args.ess_threshold, resampler=args.resampler, dist=ctx, shard_by=args.layout)
    seconds = time.perf_counter() - start
    out = {"rank": ctx.rank, "world": ctx.world, "seconds": seconds, "nfe": res.nfe,
           "communication": res.extras.get("communication"), "resampled_steps": int(res.resampled.sum())}
    if ctx.is_main:
        from safetensors.torch import save_file

        save_file({"samples": res.samples.contiguous()}, str(Path(args.out) / f"samples_w{ctx.world}.safetensors"))
    Path(args.out, f"timing_w{ctx.world}_r{ctx.rank}.json").write_text(json.dumps(out))
    sd.distributed.shutdown()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, args, out: Path) -> list[dict]:
    port = _port()
    cmd = [sys.executable, __file__, "--worker", "--out", str(out), "--groups", str(args.groups), "--particles",
           str(args.particles), "--steps", str(args.steps), "--batch", str(args.batch), "--layout", args.layout,
           "--ess-threshold", str(args.ess_threshold), "--resampler", args.resampler]
    procs = []
    for rank in range(world):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(cmd, env=env))
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError(f"a worker of the {world}-process run failed (exit {p.returncode})")
    return [json.loads((out / f"timing_w{world}_r{r}.json").read_text()) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--particles", type=int, nargs="+", default=[32, 128],
                    help="particles per group; one comparison per value")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="micro-batch rows (divides each rank's rows per group)")
    ap.add_argument("--layout", choices=["particles", "groups"], default="particles")
    ap.add_argument("--ess-threshold", type=float, default=1.0, help="1: resample at every step (most traffic)")
    ap.add_argument("--resampler", default="multinomial")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="G=2, P=16, 8 steps, 1 repeat")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.groups, args.particles, args.steps, args.repeats, args.batch = 2, [16], 8, 1, 8
    meta = provenance()
    rows, table, summaries = [], [], []
    for particles in args.particles:
        run_args = argparse.Namespace(**{**vars(args), "particles": particles})
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            for rep in range(args.repeats):
                for world in (1, 2):
                    ranks = launch(world, run_args, out)
                    from safetensors.torch import load_file

                    samples = load_file(str(out / f"samples_w{world}.safetensors"))["samples"]
                    if world == 1:
                        reference = samples
                    rows.append({"particles": particles, "repeat": rep, "world": world,
                                 "seconds": max(r["seconds"] for r in ranks),
                                 "identical_to_1_process": bool((samples == reference).all()) if world == 2 else True,
                                 "communication": ranks[0]["communication"], "nfe": ranks[0]["nfe"]})
                    print(f"P={particles} repeat {rep} world {world}: {rows[-1]['seconds']:.2f} s", flush=True)
        mine = [r for r in rows if r["particles"] == particles]
        work = args.groups * particles * args.steps
        med = {w: statistics.median(r["seconds"] for r in mine if r["world"] == w) for w in (1, 2)}
        comm = next(r["communication"] for r in mine if r["world"] == 2)
        share = 100 * (comm["gathered_bytes_per_step"] + comm["moved_bytes_per_step"]) / comm["state_bytes"]
        summaries.append({"particles": particles, "rows": args.groups * particles, "median_seconds": med,
                          "throughput_particle_steps_per_s": {w: work / s for w, s in med.items()},
                          "throughput_ratio": med[1] / med[2], "met": med[1] / med[2] >= 1.6,
                          "identical_to_1_process": all(r["identical_to_1_process"] for r in mine),
                          "communication_rank0": comm, "sent_share_of_state_per_step": share / 100})
        for w in (1, 2):
            table.append([particles, args.groups * particles, w, f"{med[w]:.2f}", f"{work / med[w]:.0f}",
                          f"{med[1] / med[w]:.2f}x", "yes" if w == 1 or summaries[-1]["identical_to_1_process"]
                          else "NO", f"{comm['gathered_bytes_per_step']:.0f}" if w == 2 else "-",
                          f"{comm['moved_bytes_per_step']:.0f}" if w == 2 else "-",
                          f"{comm['state_bytes']} ({share:.0f}%)" if w == 2 else "-"])
    summary = {"groups": args.groups, "steps": args.steps, "batch": args.batch, "layout": args.layout,
               "ess_threshold": args.ess_threshold, "resampler": args.resampler, "target_ratio": 1.6,
               "by_particles": summaries}
    tag = f"_{args.tag}" if args.tag else ""
    d = results_dir("distributed")
    write_json(d / f"das{tag}.json", {"meta": meta, "summary": summary, "runs": rows})
    lines = [
        "# Sharded DAS, 1 vs 2 processes (gloo, 1 thread each), digits UNet", "", provenance_line(meta), "",
        f"G = {args.groups} groups, {args.steps} steps, micro-batch {args.batch}, layout `{args.layout}`, "
        f"ess_threshold {args.ess_threshold} ({args.resampler}); medians of {args.repeats} interleaved repeats.", "",
        markdown_table(["P per group", "rows", "processes", "seconds", "particle-steps / s", "throughput vs 1 process",
                        "bitwise = 1 process", "gathered B / step", "moved B / step", "state B (sent share)"],
                       table), "",
        "Gathered: the per-particle scalars (rewards, flags, ratios) and the resampling uniforms rank 0 sent per step; "
        "moved: the particle states (x, denoised, condition) it sent to the other rank; state: the whole "
        "population's x. The target is >= 1.6x.",
    ]
    for sm in summaries:
        lines.append(f"- P = {sm['particles']} ({sm['rows']} rows): **{sm['throughput_ratio']:.2f}x** "
                     f"({'met' if sm['met'] else 'NOT met'})")
    write_text(d / f"das{tag}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
