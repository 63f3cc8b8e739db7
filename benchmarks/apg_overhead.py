"""APG against CFG on the shipped pipeline on CPU: wall time of the same steerdiff pipeline call with
``guidance=sd.guidance.APG(w)`` and with CFG at the same ``w`` (issue 36's target: APG <= 1.01x CFG).

Same prompts, latents and steps (NFE 2 per step for both: APG, "Eliminating Oversaturation and Artifacts of High
Guidance Scales in Diffusion Models" (Sadat et al., ICLR 2025), Sec. 3, changes only how the conditional and
unconditional outputs are combined). Repetitions interleaved (each round times both back to back, alternating which
goes first); reported: ratio of the medians, median of the paired ratios, and the step gap of each
(``pipeline_overhead._step_gaps``, interleaved: the loop's own work between network calls, where APG's projection runs).

    python benchmarks/apg_overhead.py [--steps 20] [--batch 2] [--repeats 15] [--scale 7.5] [--threads 1]

Writes ``benchmarks/results/pipeline_overhead/apg_overhead.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

import steerdiff as sd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402
from pipeline_overhead import PROMPTS, _shipped, _step_gaps, _time  # noqa: E402


def run(steps: int, batch: int, repeats: int, scale: float) -> dict:
    ours = sd.pipelines.from_diffusers(_shipped())
    ours.set_progress_bar_config(disable=True)
    prompts = (PROMPTS * batch)[:batch]
    latents = torch.randn((batch, *ours.latent_shape()), generator=torch.Generator().manual_seed(0))
    calls = {
        "cfg": lambda: ours(prompts, num_inference_steps=steps, guidance_scale=scale, latents=latents.clone(),
                            output_type="pt"),
        "apg": lambda: ours(prompts, num_inference_steps=steps, guidance=sd.guidance.APG(scale),
                            latents=latents.clone(), output_type="pt"),
    }
    nfe = {k: f().nfe for k, f in calls.items()}  # warm-up; both 2 per step
    if nfe["cfg"] != nfe["apg"]:
        raise RuntimeError(f"unequal NFE: {nfe}")
    times: dict[str, list[float]] = {"cfg": [], "apg": []}
    for r in range(repeats):
        for k in (("apg", "cfg") if r % 2 else ("cfg", "apg")):
            times[k].append(_time(calls[k]))
    gaps = dict(zip(calls, _step_gaps(ours.network, list(calls.values()), repeats), strict=True))
    return {"steps": steps, "batch": batch, "scale": scale, "nfe_per_sample": nfe["cfg"],
            "cfg_median_s": statistics.median(times["cfg"]), "apg_median_s": statistics.median(times["apg"]),
            "ratio_of_medians": statistics.median(times["apg"]) / statistics.median(times["cfg"]),
            "median_paired_ratio": statistics.median(a / c for a, c in zip(times["apg"], times["cfg"], strict=True)),
            "cfg_step_gap_cpu_us": gaps["cfg"][1], "apg_step_gap_cpu_us": gaps["apg"][1],
            "network_call_us": gaps["cfg"][2], "times_s": times}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--scale", type=float, default=7.5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import os

    load = os.getloadavg()
    res = run(args.steps, args.batch, args.repeats, args.scale)
    res["load_before"] = load
    res["load_after"] = os.getloadavg()
    meta = provenance()
    write_json(results_dir("pipeline_overhead") / "apg_overhead.json", {"meta": meta, **res})
    rows = [["shapes (shipped)", res["steps"], res["batch"], res["nfe_per_sample"], f"{1e3 * res['cfg_median_s']:.1f}",
             f"{1e3 * res['apg_median_s']:.1f}", f"{res['ratio_of_medians']:.3f}", f"{res['median_paired_ratio']:.3f}",
             f"{res['cfg_step_gap_cpu_us']:.0f} / {res['apg_step_gap_cpu_us']:.0f}"]]
    text = "\n".join([
        "# APG against CFG on the shipped pipeline (CPU)", "", provenance_line(meta), "",
        "Load average (1 / 5 / 15 min) before the run " + " / ".join(f"{v:.2f}" for v in res["load_before"])
        + ", after " + " / ".join(f"{v:.2f}" for v in res["load_after"]) + ".", "",
        markdown_table(["pipeline", "steps", "batch", "NFE / sample", "CFG (ms)", "APG (ms)", "ratio of medians",
                        "median paired ratio", "step gap CPU, CFG / APG (us)"], rows, "lrrrrrrrr"), "",
        f"Target: APG <= 1.01x CFG (issue 36). Guidance scale {res['scale']:g} for both, interleaved repeats "
        "(`python benchmarks/apg_overhead.py`).", ""])
    write_text(results_dir("pipeline_overhead") / "apg_overhead.md", text)
    print(text)
    return res


if __name__ == "__main__":
    main()
