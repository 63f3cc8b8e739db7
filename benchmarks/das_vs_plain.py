"""DAS with P particles against P plain samples at equal NFE, on the shipped digits UNet (issue 36's target: DAS at
most 1.1x the wall time of as many plain samples).

Three samplers from the same noise, grid and batch size, interleaved and repeated (medians):

* ``plain``: ``steerdiff.sample(method="euler_ancestral")`` of ``G * P`` rows (the plain ancestral chain, eta = 1);
* ``chains``: the same chains inside the align code (:func:`steerdiff.align.best_of_n` without its final reward
  cost mattering: one reward call on the final rows);
* ``das``: the library's default DAS (gradient-free, adaptive tempering), ``G`` groups of ``P`` particles: one
  denoiser call per particle and step (the same NFE) plus a reward call per step and the SMC bookkeeping.

The reward is ``ink`` (a mean: its cost is negligible, so the ratio is the SMC machinery's) and, separately, the
shipped digit classifier's ``log p(3 | x)`` (a second network per step, which plain sampling does not run).

    python benchmarks/das_vs_plain.py [--groups 16] [--particles 8] [--steps 25] [--repeats 5]
    python benchmarks/das_vs_plain.py --pipeline --groups 4 --particles 8 --steps 25 --repeats 9

``--pipeline``: the same on the shipped shapes pipeline (:func:`pipeline_main`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.align import best_of_n, das
from steerdiff.align.rewards import ClassLogProb, ink

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import provenance, results_dir, write_json  # noqa: E402


def main(groups: int, particles: int, steps: int, repeats: int, batch_size: int) -> dict:
    model = sd.models.load("digits")
    rewards = {"ink": ink, "class3": ClassLogProb(sd.models.load("digits_classifier"), 3)}
    sig = sd.sigmas.karras(steps, 0.002, 80.0)  # ends in 0: `steps` model calls per row for every sampler
    rows = groups * particles
    noise = sd.randn((rows, 1, 8, 8), seeds=0)
    runs = {
        "plain": lambda: sd.sample(model, noise, sig, method="euler_ancestral", generator=1),
        "chains": lambda: best_of_n(model, ink, noise, sig, particles=particles, generator=1, batch_size=batch_size),
        **{f"das_{name}": (lambda r=r: das(model, r, noise, sig, alpha=0.1, particles=particles, generator=1,
                                           batch_size=batch_size)) for name, r in rewards.items()},
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}  # process CPU time: less disturbed by other processes
    smc: list[float] = []
    runs["plain"]()  # warm-up
    for _ in range(repeats):
        for name, fn in runs.items():
            t, c = time.perf_counter(), time.process_time()
            out = fn()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            if name == "das_ink":
                smc.append(out.smc_time)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}  # the least disturbed run of each (a shared machine)
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    report = {"config": {"groups": groups, "particles": particles, "steps": steps, "repeats": repeats,
                         "batch_size": batch_size, "rows": rows},
              "median_s": med, "min_s": best, "cpu_median_s": cpu_med,
              "das_ink_over_plain_cpu": cpu_med["das_ink"] / cpu_med["plain"],
              "das_class3_over_plain_cpu": cpu_med["das_class3"] / cpu_med["plain"],
              "chains_over_plain_cpu": cpu_med["chains"] / cpu_med["plain"],
              "das_ink_over_plain_min": best["das_ink"] / best["plain"],
              "das_class3_over_plain_min": best["das_class3"] / best["plain"],
              "das_ink_over_plain": med["das_ink"] / med["plain"],
              "das_ink_over_chains": med["das_ink"] / med["chains"],
              "das_class3_over_plain": med["das_class3"] / med["plain"],
              "chains_over_plain": med["chains"] / med["plain"],
              "das_ink_smc_bookkeeping_s": statistics.median(smc), "times": times, "cpu_times": cpu,
              "env": provenance()}
    write_json(results_dir("das") / "das_vs_plain.json", report)
    print(json.dumps({k: v for k, v in report.items() if k not in ("times", "cpu_times", "env")}, indent=1))
    return report


def pipeline_main(groups: int, particles: int, steps: int, repeats: int) -> dict:
    """The same comparison on a pipeline: the shipped shapes pipeline (a diffusers ``UNet2DConditionModel`` with its
    text encoder, :mod:`steerdiff.pipelines`), ``groups`` captions bound as row labels (``sd.pipelines.bind``),
    ``particles`` rows per caption, no guidance (one network call per row and step on both sides), its default
    sigma grid at ``steps`` steps, and a latent reward that costs nothing beside the UNet (minus the latent's mean
    square; the ``gpu.py`` ``das`` section's). ``plain`` is ``sd.sample(method="euler_ancestral")`` of the same rows;
    ``das`` the library's default DAS with ``gradient=False`` (the reward's gradient would need the UNet's). Each
    repeat runs both, in alternating order; CPU seconds of this process (one thread), medians."""
    from steerdiff.app.protocols.shapes_pipeline import load_shipped, train_pairs
    from steerdiff.data import shapes

    pipe = load_shipped()
    prompts = [shapes.caption(s, c) for s, c in train_pairs()[:groups]]
    cond = pipe.encode(prompts)
    den, labels = sd.pipelines.bind(pipe, cond)
    sigmas = pipe.default_sigmas(steps)
    shape = pipe.latent_shape()
    noise = sd.randn((groups * particles, *shape), seeds=0)

    def reward(z):
        return -z.float().flatten(1).pow(2).mean(1)

    runs = {
        "plain": lambda: sd.sample(den, noise * sigmas[0], sigmas, method="euler_ancestral",
                                   cond=labels.repeat_interleave(particles), generator=1),
        "das": lambda: das(den, reward, noise, sigmas, alpha=0.1, particles=particles, cond=labels, gradient=False,
                           generator=1),
    }
    names = list(runs)
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    wall: dict[str, list[float]] = {k: [] for k in runs}
    with torch.no_grad():
        for n in names:  # warm-up
            runs[n]()
        for r in range(repeats):
            for n in names[r % 2:] + names[:r % 2]:
                t, c = time.perf_counter(), time.process_time()
                runs[n]()
                wall[n].append(time.perf_counter() - t)
                cpu[n].append(time.process_time() - c)
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    report = {"config": {"pipeline": "shapes_pipeline (shipped)", "groups": groups, "particles": particles,
                         "steps": steps, "repeats": repeats, "rows": groups * particles, "latent": list(shape),
                         "reward": "-mean(z^2) (latent, no decode)", "threads": torch.get_num_threads()},
              "cpu_median_s": cpu_med, "wall_median_s": {k: statistics.median(v) for k, v in wall.items()},
              "das_over_plain_cpu": cpu_med["das"] / cpu_med["plain"],
              "das_over_plain_cpu_paired_median": statistics.median(
                  a / b for a, b in zip(cpu["das"], cpu["plain"], strict=True)),
              "cpu_times": cpu, "wall_times": wall, "env": provenance()}
    write_json(results_dir("das") / "das_vs_plain_pipeline.json", report)
    print(json.dumps({k: v for k, v in report.items() if k not in ("cpu_times", "wall_times", "env")}, indent=1))
    return report


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--particles", type=int, default=8)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--pipeline", action="store_true",
                    help="the shipped shapes pipeline with a latent reward instead of the digits UNet "
                         "(writes das_vs_plain_pipeline.json)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.pipeline:
        pipeline_main(a.groups, a.particles, a.steps, a.repeats)
    else:
        main(a.groups, a.particles, a.steps, a.repeats, a.batch_size)
