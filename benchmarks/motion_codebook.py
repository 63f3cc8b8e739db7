"""MotionDreamer's codebook distribution regularisation: codebook usage and perplexity with and without it
(``docs/methods/motiondreamer.md``, "The tokeniser").

For each skeleton (biped, quadruped, snake) the tokeniser is trained on the skeleton's ONE reference motion
(``reference_motion(skeleton, frames)``, single-instance setting, random crops) with ``reg_weight`` = 0 (the
ablation) and the regularised weight, over ``--seeds``. Reported on the reference's tokens at every frame offset
(``reference_codebook_stats``): usage (fraction of the K codes used), perplexity (exp entropy of the code histogram,
K at best), the reconstruction MSE in normalised units, and CPU seconds per training. Mean and standard deviation
over seeds. Written to ``benchmarks/results/motion_codebook/``.

    OMP_NUM_THREADS=1 python benchmarks/motion_codebook.py [--steps 500] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from steerdiff.data.motion import motion_features
from steerdiff.data.motion_synth import reference_motion
from steerdiff.train.motion_vq import MotionVQConfig, train_motion_vq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402


def _ms(values: list[float], digits: int) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def _write(args: argparse.Namespace, meta: dict, runs: list[dict]) -> list[str]:
    rows = []
    for sk in args.skeletons.split(","):
        for weight in (0.0, args.reg_weight):
            sel = [r for r in runs if r["skeleton"] == sk and r["reg_weight"] == weight]
            if not sel:
                continue
            rows.append([sk, "none (ablation)" if weight == 0 else f"KL to uniform, weight {weight:g}",
                         ",".join(str(r["seed"]) for r in sel), _ms([r["usage"] for r in sel], 3),
                         _ms([r["perplexity"] for r in sel], 2), _ms([r["recon_mse"] for r in sel], 4),
                         f"{statistics.fmean(r['cpu_seconds'] for r in sel):.0f}"])
    k = args.codebook_size
    text = ["# Codebook distribution regularisation: usage and perplexity on one motion", "", provenance_line(meta), "",
            f"K = {k} codes, {args.steps} steps, reference {args.frames} frames, mean ± sd over the seeds listed. "
            f"Perplexity is at most K = {k}.", "",
            markdown_table(["skeleton", "regularisation", "seeds", "usage", "perplexity", "recon MSE (normalised)",
                            "CPU s / training"], rows)]
    out = results_dir("motion_codebook")
    name = "motion_codebook" + (f"_{args.tag}" if args.tag else "")
    write_json(out / f"{name}.json", {"meta": meta, "args": vars(args), "runs": runs})
    write_text(out / f"{name}.md", "\n".join(text) + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skeletons", default="biped,quadruped,snake")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=MotionVQConfig.steps)
    ap.add_argument("--frames", type=int, default=240, help="reference length (frames at 30 fps)")
    ap.add_argument("--codebook-size", type=int, default=MotionVQConfig.codebook_size)
    ap.add_argument("--reg-weight", type=float, default=MotionVQConfig.reg_weight, help="the regularised arm")
    ap.add_argument("--tag", default="", help="suffix of the output files")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    meta = provenance(argv, __file__)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = []
    skeletons = args.skeletons.split(",")
    feats = {sk: motion_features(reference_motion(sk, args.frames)) for sk in skeletons}
    for seed in seeds:  # seeds outermost and the tables rewritten after every run: a cut-short run still reports
        for sk in skeletons:
            for weight in (0.0, args.reg_weight):
                cfg = MotionVQConfig(steps=args.steps, codebook_size=args.codebook_size, reg_weight=weight, seed=seed)
                log = train_motion_vq(feats[sk], cfg).log
                runs.append({"skeleton": sk, "reg_weight": weight, "seed": seed,
                             **{k: log[k] for k in ("usage", "perplexity", "used", "recon_mse", "cpu_seconds")}})
                print(f"{sk:10s} reg {weight:<5g} seed {seed}: usage {log['usage']:.3f} perplexity "
                      f"{log['perplexity']:.2f} recon {log['recon_mse']:.4f} ({log['cpu_seconds']:.0f} CPU s)",
                      flush=True)
                text = _write(args, meta, runs)
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
