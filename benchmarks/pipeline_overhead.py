"""Pipeline overhead: wall time of ``sd.pipelines.Pipeline.__call__`` over the diffusers pipeline's own call.

On the tiny random-weight pipelines of ``tests/pipelines/conftest.py`` (SD 1.x with DDIM, SDXL with Euler, SD3
with FlowMatchEuler; built from configs, no download), both calls run the same prompts from the same initial
latents at equal NFE (CFG at ``guidance_scale``, ``steps`` steps, decoded images, ``output_type="pt"``). Repetitions
are interleaved (each round times both back to back, alternating which goes first, so that load drifting during
the run cancels). Reported: the ratio of the medians and the median of the paired ratios. Target: <= 1.05.

    python benchmarks/pipeline_overhead.py [--steps 20] [--batch 2] [--repeats 15] [--threads 2]
        [--families sd,sdxl,sd3]

Prints a markdown table and writes ``benchmarks/results/pipeline_overhead/pipeline_overhead.json`` and ``.md``.
The tiny networks take well under a millisecond per call, so this measures the per-step Python cost of each loop
(the worst case for a wrapper); on a real pipeline the network dominates both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import steerdiff as sd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "pipelines"))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

from steerdiff.pipelines.tokenizer import write_clip_tokenizer  # noqa: E402

PROMPTS = ["a red disk on a grey background", "a blue square"]


def _tokenizer_dir() -> Path:

    d = Path(tempfile.mkdtemp(prefix="clip_tokenizer_"))
    write_clip_tokenizer(d)
    return d


def _build(family: str, d: Path):
    import conftest

    return {"sd": lambda: conftest.make_sd(d, "ddim"), "sdxl": lambda: conftest.make_sdxl(d),
            "sd3": lambda: conftest.make_sd3(d)}[family]()


def _time(fn) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    return time.perf_counter() - start


def run(family: str, d: Path, steps: int, batch: int, repeats: int, scale: float) -> dict:
    raw = _build(family, d)
    ours = sd.pipelines.from_diffusers(raw)
    prompts = (PROMPTS * batch)[:batch]
    latents = torch.randn((batch, *ours.latent_shape()), generator=torch.Generator().manual_seed(0))

    def theirs_call():
        raw(prompts, num_inference_steps=steps, guidance_scale=scale, latents=latents.clone(), output_type="pt")

    def ours_call():
        return ours(prompts, num_inference_steps=steps, guidance_scale=scale, latents=latents.clone(),
                    output_type="pt")

    nfe = ours_call().nfe  # warm-up, and the NFE of both calls (2 per step under CFG)
    theirs_call()
    t_ours, t_theirs = [], []
    for r in range(repeats):
        if r % 2:
            t_theirs.append(_time(theirs_call))
            t_ours.append(_time(ours_call))
        else:
            t_ours.append(_time(ours_call))
            t_theirs.append(_time(theirs_call))
    ratio = statistics.median(t_ours) / statistics.median(t_theirs)
    paired = statistics.median(a / b for a, b in zip(t_ours, t_theirs, strict=True))
    return {"family": family, "scheduler": type(raw.scheduler).__name__, "steps": steps, "batch": batch,
            "nfe_per_sample": nfe, "ours_median_s": statistics.median(t_ours),
            "diffusers_median_s": statistics.median(t_theirs), "ratio_of_medians": ratio, "median_paired_ratio": paired,
            "ours_s": t_ours, "diffusers_s": t_theirs}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--scale", type=float, default=7.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--families", default="sd,sdxl,sd3")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    d = _tokenizer_dir()
    rows = [run(f, d, args.steps, args.batch, args.repeats, args.scale) for f in args.families.split(",")]
    meta = provenance(argv, packages=("diffusers", "transformers"))
    table = markdown_table(
        ["family", "scheduler", "steps", "batch", "NFE / sample", "ours (ms)", "diffusers (ms)", "ratio of medians",
         "median paired ratio"],
        [[r["family"], r["scheduler"], r["steps"], r["batch"], f"{r['nfe_per_sample']:g}",
          f"{1e3 * r['ours_median_s']:.1f}", f"{1e3 * r['diffusers_median_s']:.1f}", f"{r['ratio_of_medians']:.3f}",
          f"{r['median_paired_ratio']:.3f}"] for r in rows], align="lllrrrrrr")
    text = (f"# Pipeline overhead: sd.pipelines vs the diffusers pipeline's own call\n\n{provenance_line(meta)}\n\n"
            f"{table}\n\nTarget: ratio <= 1.05 at equal NFE (CFG, decoded images). Tiny random-weight pipelines "
            "(tests/pipelines/conftest.py): the network costs well under a millisecond per call, so the ratio is "
            "the per-step Python cost of each sampling loop.\n")
    out = args.out or results_dir("pipeline_overhead")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "pipeline_overhead.json", {"provenance": meta, "args": vars(args) | {"out": str(out)},
                                                "rows": rows})
    write_text(out / "pipeline_overhead.md", text)
    print(text)
    return rows


if __name__ == "__main__":
    main()
