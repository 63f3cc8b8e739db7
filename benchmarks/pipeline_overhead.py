"""Pipeline overhead: wall time of ``sd.pipelines.Pipeline.__call__`` over the diffusers pipeline's own call.

On the tiny random-weight pipelines of :mod:`tests/tiny_pipelines.py` (SD 1.x with DDIM, SDXL with Euler, SD3
with FlowMatchEuler; built from configs, no download), both calls run the same prompts from the same initial
latents at equal NFE (CFG at ``guidance_scale``, ``steps`` steps, decoded images, ``output_type="pt"``). Repetitions
are interleaved (each round times both back to back, alternating which goes first, so that load drifting during
the run cancels). Reported: the ratio of the medians and the median of the paired ratios. Target: <= 1.05.

    python benchmarks/pipeline_overhead.py [--steps 20] [--batch 2] [--repeats 31] [--threads 2]
        [--families sd,sdxl,sd3,shapes]

``shapes`` is the shipped, trained pipeline (steerdiff/assets/shapes_pipeline: StableDiffusionPipeline, Euler).

Prints a markdown table and writes ``benchmarks/results/pipeline_overhead/pipeline_overhead.json`` and ``.md``.
The tiny networks take well under a millisecond per call, so this measures the per-step Python cost of each loop
(the worst case for a wrapper); on a real pipeline the network dominates both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import steerdiff as sd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

sys.path.insert(0, str(HERE.parent / "tests"))  # the tiny random-weight pipeline builders are a test harness
import tiny_pipelines  # noqa: E402

from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer  # noqa: E402

PROMPTS = ["a red disk on a grey background", "a blue square"]


def _tokenizer_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="clip_tokenizer_"))
    write_clip_tokenizer(d)
    return d


def _shipped():
    import diffusers

    from steerdiff.app.protocols.shapes_pipeline import shipped_dir

    raw = diffusers.DiffusionPipeline.from_pretrained(str(shipped_dir()), use_safetensors=True, local_files_only=True)
    raw.set_progress_bar_config(disable=True)
    return raw


def _build(family: str, d: Path):
    return {"sd": lambda: tiny_pipelines.make_sd(d, "ddim"), "sdxl": lambda: tiny_pipelines.make_sdxl(d),
            "sd3": lambda: tiny_pipelines.make_sd3(d), "shapes": _shipped}[family]()


def _time(fn) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    return time.perf_counter() - start


def run(family: str, d: Path, steps: int, batch: int, repeats: int, scale: float) -> dict:
    raw = _build(family, d)
    ours = sd.pipelines.from_diffusers(raw)
    ours.set_progress_bar_config(disable=True)  # as raw's: the bar is on by default, as in diffusers
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
    (gap_ours, cpu_gap_ours, net_ours), (gap_theirs, cpu_gap_theirs, net_theirs) = _step_gaps(
        ours.network, (ours_call, theirs_call), repeats)
    return {"family": family, "scheduler": type(raw.scheduler).__name__, "steps": steps, "batch": batch,
            "nfe_per_sample": nfe, "ours_median_s": statistics.median(t_ours),
            "diffusers_median_s": statistics.median(t_theirs), "ratio_of_medians": ratio, "median_paired_ratio": paired,
            "ours_step_gap_us": gap_ours, "diffusers_step_gap_us": gap_theirs,
            "ours_step_gap_cpu_us": cpu_gap_ours, "diffusers_step_gap_cpu_us": cpu_gap_theirs,
            "network_call_us": statistics.median([net_ours, net_theirs]), "ours_s": t_ours, "diffusers_s": t_theirs}


def _step_gaps(network, calls, repeats: int) -> list[tuple[float, float, float]]:
    """For each of ``calls``: the median time (us) from the end of one network call to the start of the next (the
    sampling loop's own per-step work: guidance, the solver step, conversions, checks), the same gap in the main
    thread's CPU time (``time.thread_time``: time the thread was not running, other processes' on a loaded machine,
    is left out), and the median network call time, over ``repeats`` rounds; less sensitive to load than the whole
    call's wall time. The calls are interleaved (each round runs every call once, in an order that alternates from
    round to round), as the whole-call timings are, so that load drifting during the run moves both alike."""
    marks: list[tuple[float, float]] = []

    def mark(*_, **__):
        marks.append((time.perf_counter(), time.thread_time()))

    hooks = [network.register_forward_pre_hook(mark), network.register_forward_hook(mark)]
    gaps: list[list[float]] = [[] for _ in calls]
    cpu_gaps: list[list[float]] = [[] for _ in calls]
    nets: list[list[float]] = [[] for _ in calls]
    try:
        for r in range(max(3, repeats)):
            for k in range(len(calls)) if r % 2 == 0 else reversed(range(len(calls))):
                marks.clear()
                _time(calls[k])
                nets[k] += [marks[i + 1][0] - marks[i][0] for i in range(0, len(marks) - 1, 2)]
                gaps[k] += [marks[i + 1][0] - marks[i][0] for i in range(1, len(marks) - 1, 2)]
                cpu_gaps[k] += [marks[i + 1][1] - marks[i][1] for i in range(1, len(marks) - 1, 2)]
    finally:
        for h in hooks:
            h.remove()
    return [(1e6 * statistics.median(g), 1e6 * statistics.median(c), 1e6 * statistics.median(n))
            for g, c, n in zip(gaps, cpu_gaps, nets, strict=True)]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--scale", type=float, default=7.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--families", default="sd,sdxl,sd3,shapes")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    d = _tokenizer_dir()
    load_before = os.getloadavg()  # the machine's load: wall times on a shared machine depend on it
    rows = [run(f, d, args.steps, args.batch, args.repeats, args.scale) for f in args.families.split(",")]
    meta = provenance(argv, packages=("diffusers", "transformers"))
    meta["loadavg_1_5_15_min"] = {"before": list(load_before), "after": list(os.getloadavg())}
    table = markdown_table(
        ["family", "scheduler", "steps", "batch", "NFE / sample", "ours (ms)", "diffusers (ms)", "ratio of medians",
         "median paired ratio", "step gap ours / diffusers (us)", "step gap CPU ours / diffusers (us)",
         "network call (us)"],
        [[r["family"], r["scheduler"], r["steps"], r["batch"], f"{r['nfe_per_sample']:g}",
          f"{1e3 * r['ours_median_s']:.1f}", f"{1e3 * r['diffusers_median_s']:.1f}", f"{r['ratio_of_medians']:.3f}",
          f"{r['median_paired_ratio']:.3f}", f"{r['ours_step_gap_us']:.0f} / {r['diffusers_step_gap_us']:.0f}",
          f"{r['ours_step_gap_cpu_us']:.0f} / {r['diffusers_step_gap_cpu_us']:.0f}",
          f"{r['network_call_us']:.0f}"] for r in rows], align="lllrrrrrrrrr")
    load = meta["loadavg_1_5_15_min"]
    text = (f"# Pipeline overhead: sd.pipelines vs the diffusers pipeline's own call\n\n{provenance_line(meta)}\n\n"
            f"Load average (1 / 5 / 15 min) before the run {' / '.join(f'{v:.2f}' for v in load['before'])}, after "
            f"{' / '.join(f'{v:.2f}' for v in load['after'])}.\n\n"
            f"{table}\n\nTarget: ratio <= 1.05 at equal NFE (CFG, decoded images). Tiny random-weight pipelines "
            "(tests/tiny_pipelines.py): the network costs well under a millisecond per call, so the ratio is "
            "the per-step Python cost of each sampling loop; `shapes` is the shipped pipeline "
            "(steerdiff/assets/shapes_pipeline). Step gap: median time between the end of one network call and the "
            "start of the next (the loop's own work per step), a load-robust view of the same overhead, over "
            f"{max(3, args.repeats)} interleaved calls of each; its CPU "
            "column counts the main thread's CPU time only (time.thread_time), which leaves out the time other "
            "processes held the core. Counted (load-independent) per-step work: "
            "benchmarks/pipeline_step_ops.py.\n")
    out = args.out or results_dir("pipeline_overhead")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "pipeline_overhead.json", {"provenance": meta, "args": vars(args) | {"out": str(out)},
                                                "rows": rows})
    write_text(out / "pipeline_overhead.md", text)
    print(text)
    return rows


if __name__ == "__main__":
    main()
