"""Wall time per generated frame against sequence length: all-at-once (DAWN, Cheng et al. 2025, "DAWN: Dynamic frame
Avatar With Non-autoregressive diffusion framework") vs the autoregressive baseline, past the lengths of
benchmarks/sequence.py (docs/methods/sequence.md).

Both arms run the benchmark's network size (SequenceTransformer width 64, depth 4, heads 4, window 8; random weights:
the cost of a call does not depend on them) with the same sampler (Heun, 12 steps, NFE 23 per sampler run); the
autoregressive arm generates 16-frame chunks after 4 frames, one sampler run per chunk. A third arm is the all-at-once
generator with the attention forced dense (the full masked n x n scores, what every length used before the
block-local attention), to show what the block-local form buys at long S; a fourth the all-at-once model with
``global_context=True`` (the form that meets the growth goal on the rest-point system). The arms are timed in turn
within one run (median of ``--repeats``); the ratios are what count on a shared machine::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/sequence_speed.py

Results in benchmarks/results/sequence_speed/; the batch-64 rows came from ``--batches 64 --lengths 128 512
--name sequence_speed_b64``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

import steerdiff.temporal as seq  # noqa: E402
from steerdiff.models.sequence_attention import LOCAL_ATTENTION_FROM  # noqa: E402

ARMS = ("all_at_once", "all_at_once_dense", "all_at_once_global", "autoregressive")
LABELS = {"all_at_once": "all-at-once", "all_at_once_dense": "all-at-once, dense attention",
          "all_at_once_global": "all-at-once, global context", "autoregressive": "autoregressive (chunk 16, overlap 4)"}


def _generate(arm: str, models: dict, signal, context, steps: int):
    if arm == "autoregressive":
        return seq.generate_autoregressive(models["banded"], signal, context, chunk=16, overlap=4, steps=steps)
    model = models["global" if arm == "all_at_once_global" else "banded"]
    model.net.local_attention = False if arm == "all_at_once_dense" else None
    try:
        return seq.generate_sequence(model, signal, context, steps=steps)
    finally:
        model.net.local_attention = None


def _random_model(global_context: bool):
    torch.manual_seed(0)
    model = seq.sequence_model(width=64, depth=4, heads=4, window=8, global_context=global_context).eval()
    with torch.no_grad():
        for param in model.parameters():  # the zero-initialised layers too, so no call is a shortcut
            param.normal_(0.0, 0.05)
    return model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--dense-max", type=int, default=512, help="longest S the dense arm runs (its cost grows as S^2)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="sequence_speed", help="stem of the result files")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    meta = provenance(argv)
    models = {"banded": _random_model(False), "global": _random_model(True)}
    rows, raw = [], {}
    for batch in args.batches:
        for s in args.lengths:
            g = torch.Generator().manual_seed(s)
            signal = torch.randn(batch, s, 2, generator=g)
            context = torch.randn(batch, 4, 2, generator=g)
            arms = [a for a in ARMS if a != "all_at_once_dense" or s <= args.dense_max]
            times: dict[str, list[float]] = {a: [] for a in arms}
            for _ in range(args.repeats):
                for arm in arms:
                    with torch.no_grad():
                        start = time.perf_counter()
                        _generate(arm, models, signal, context, args.steps)
                        times[arm].append(1e3 * (time.perf_counter() - start) / (batch * s))
            ms = {a: float(np.median(v)) for a, v in times.items()}
            raw[f"B{batch}_S{s}"] = {"ms_per_frame": ms, "all": times}
            rows.append([batch, s] + [f"{ms[a]:.3f}" if a in ms else "-" for a in ARMS]
                        + [f"{ms['autoregressive'] / ms[a]:.2f}" for a in ("all_at_once", "all_at_once_global")])
            print(rows[-1], flush=True)
    out = results_dir("sequence_speed")
    write_json(out / f"{args.name}.json", {"meta": meta, "args": vars(args), "results": raw})
    header = (["B", "S"] + [f"ms/frame {LABELS[a]}" for a in ARMS]
              + ["autoregressive / all-at-once", "autoregressive / global context"])
    text = "\n\n".join([
        "# Wall time per generated frame against sequence length (all-at-once vs autoregressive)",
        provenance_line(meta),
        f"SequenceTransformer width 64, depth 4, heads 4, window 8 (random weights); Heun {args.steps} steps (NFE "
        f"{2 * args.steps - 1} per sampler run); 4 known frames; the arms timed in turn, median of {args.repeats}. "
        f"The dense arm runs up to S = {args.dense_max}.",
        markdown_table(header, rows, "rr" + "r" * (len(header) - 2)),
        "all-at-once: one sampler run over the S frames (block-local attention from "
        f"{LOCAL_ATTENTION_FROM} tokens, steerdiff.models.sequence_attention.use_local_attention). dense: the same "
        "with "
        "the full masked score matrix. global context: the all-at-once model with global_context=True (its "
        "4 known frames seen by every frame). autoregressive: S / 16 sampler runs one after another, each over "
        "4 + 16 tokens, of the banded model.",
    ])
    write_text(out / f"{args.name}.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
