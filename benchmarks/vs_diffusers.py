"""Sampling speed: steerdiff's DDIM through ``from_diffusers`` against diffusers' own DDIM, on one UNet.

All contenders sample the same random-weight ``UNet2DModel`` (3x32x32, block_out_channels (32, 64), one
attention level) for the same number of steps from the same start noise:

* ``steerdiff``: ``sd.sample(from_diffusers(unet, scheduler), noise, sigmas, method="ddim")``;
* ``diffusers pipeline``: ``DDIMPipeline(unet, scheduler)(batch_size, num_inference_steps, output_type="np")``
  (which also draws the noise and converts the images to numpy);
* ``diffusers loop``: ``scheduler.set_timesteps``, then ``unet(x, t).sample`` and ``scheduler.step`` per step;
* ``unet floor``: the bare ``unet(x, t)`` forward at each timestep (NFE of them): no sampler at all.

Timings are measured in one run, repetitions interleaved (the order rotates each repetition), under
``torch.inference_mode()``; each entry is the median over repetitions and the ratios are ratios of medians
(docs/methods/conventions.md, "Measuring": this machine is noisy). The outputs are checked to agree before anything is
timed.

    python benchmarks/vs_diffusers.py --steps 50 --batch 16 --repeats 5

prints markdown tables and writes ``benchmarks/results/vs_diffusers/vs_diffusers.json`` and ``.md`` (``--out`` moves
both).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

import steerdiff as sd
from steerdiff.models.diffusers_adapter import from_diffusers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, markdown_table, provenance, provenance_line, write_json, write_text  # noqa: E402

OUT = RESULTS / "vs_diffusers" / "vs_diffusers.json"
SEED = 0


def build_unet(seed: int = SEED):
    """A small CIFAR-like DDPM UNet with random (seeded) weights."""
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    return UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    ).eval()


def build_scheduler():
    """DDIM as diffusers' DDPM/DDIM image models use it, without clipping so that both sides do the same math."""
    from diffusers import DDIMScheduler

    return DDIMScheduler(clip_sample=False, set_alpha_to_one=True, steps_offset=1, timestep_spacing="leading")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ddim_sigmas(scheduler, steps: int) -> torch.Tensor:
    """The scheduler's own ``leading`` timesteps as a sigma schedule (what ``from_diffusers`` samples on)."""
    return sd.sigmas.from_alphas_cumprod(
        scheduler.alphas_cumprod, steps, spacing="leading", offset=scheduler.config.steps_offset
    )


def scheduler_loop(scheduler, net, z: torch.Tensor, steps: int, device: torch.device) -> torch.Tensor:
    """diffusers' raw loop: ``set_timesteps``, then ``net(x, t).sample`` and ``scheduler.step`` per step."""
    scheduler.set_timesteps(steps, device=device)
    x = z
    for t in scheduler.timesteps:
        x = scheduler.step(net(x, t).sample, t, x).prev_sample
    return x


def make_contenders(unet, scheduler, steps: int, batch: int, device: torch.device) -> dict[str, Callable]:
    """Each contender draws nothing at random in the timed region except the pipeline's own noise."""
    from diffusers import DDIMPipeline

    shape = (batch, 3, 32, 32)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(SEED)).to(device)  # x_T in VP units
    sigmas = ddim_sigmas(scheduler, steps)
    s0 = float(sigmas[0])
    noise = z * math.sqrt(1 + s0**2) / s0  # sd.sample starts at noise * sigmas[0] = x_T in sigma units
    denoiser = from_diffusers(unet, scheduler)
    pipe = DDIMPipeline(unet=unet, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    ours = partial(sd.sample, denoiser, noise, sigmas, method="ddim")
    loop = partial(scheduler_loop, build_scheduler(), unet, z, steps, device)

    def pipeline():
        gen = torch.Generator().manual_seed(SEED)  # the pipeline draws x_T = z itself
        return pipe(batch_size=batch, generator=gen, num_inference_steps=steps, output_type="np").images

    floor_steps = build_scheduler()
    floor_steps.set_timesteps(steps, device=device)

    def floor():
        for t in floor_steps.timesteps:
            out = unet(z, t).sample
        return out

    return {"steerdiff": ours, "diffusers pipeline": pipeline, "diffusers loop": loop, "unet floor": floor}


class _ConstantUNet(torch.nn.Module):
    """Stands in for the UNet with one precomputed output, leaving only the sampler's own per-step cost."""

    def __init__(self, out: torch.Tensor):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros((), dtype=out.dtype, device=out.device), requires_grad=False)
        self.result = SimpleNamespace(sample=out)

    @property
    def dtype(self) -> torch.dtype:
        return self.anchor.dtype

    def forward(self, sample, timestep, **kwargs):
        return self.result


def sampler_overhead(unet, scheduler, steps: int, batch: int, device: torch.device, runs: int) -> dict:
    """Per-step time of everything but the UNet (adapter, conversions, checks, scheduler step), in us.

    The UNet is replaced by a module returning a precomputed output; the two loops alternate ``runs`` times
    and the minimum is kept (these runs take milliseconds, so the minimum is the undisturbed cost).
    """
    z = torch.randn((batch, 3, 32, 32), generator=torch.Generator().manual_seed(SEED)).to(device)
    const = _ConstantUNet(unet(z, 500).sample)
    denoiser = from_diffusers(unet, scheduler)
    denoiser.net.unet = const
    ours = partial(sd.sample, denoiser, z, ddim_sigmas(scheduler, steps), method="ddim")
    loop = partial(scheduler_loop, build_scheduler(), const, z, steps, device)

    best = {"steerdiff": math.inf, "diffusers loop": math.inf}
    for _ in range(runs):
        for name, fn in (("steerdiff", ours), ("diffusers loop", loop)):
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: 1e6 * seconds / steps for name, seconds in best.items()}


def check_agreement(contenders: dict[str, Callable]) -> dict[str, float]:
    """Max abs differences of steerdiff's samples from the loop's (VP units) and the pipeline's ([0, 1] images)."""
    ours, theirs = contenders["steerdiff"](), contenders["diffusers loop"]()
    images = torch.from_numpy(contenders["diffusers pipeline"]()).permute(0, 3, 1, 2)
    ours_images = (ours.cpu() / 2 + 0.5).clamp(0, 1)
    scale = float(theirs.abs().max().clamp(min=1))
    return {
        "max_abs_diff_vs_loop": float((ours - theirs).abs().max()),
        "scaled_diff_vs_loop": float((ours - theirs).abs().max()) / scale,
        "max_abs_diff_vs_pipeline_images": float((ours_images - images).abs().max()),
    }


def bench_sampling(args: argparse.Namespace) -> dict:
    """Interleaved wall times of the four contenders; medians and ratios."""
    device = torch.device(args.device)
    unet = build_unet().to(device)
    scheduler = build_scheduler()
    contenders = make_contenders(unet, scheduler, args.steps, args.batch, device)
    names = list(contenders)
    times: dict[str, list[float]] = {name: [] for name in names}
    with torch.inference_mode():
        agreement = check_agreement(contenders)  # also the warm-up: every contender has run once
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                _sync(device)
                start = time.perf_counter()
                contenders[name]()
                _sync(device)
                times[name].append(time.perf_counter() - start)
            print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names))
        overhead = sampler_overhead(unet, scheduler, args.steps, args.batch, device, runs=20)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}  # least disturbed by other load on a shared machine
    ratio = {
        "steerdiff / diffusers pipeline": median["steerdiff"] / median["diffusers pipeline"],
        "steerdiff / diffusers loop": median["steerdiff"] / median["diffusers loop"],
        "steerdiff / unet floor": median["steerdiff"] / median["unet floor"],
        "diffusers pipeline / unet floor": median["diffusers pipeline"] / median["unet floor"],
        "diffusers loop / unet floor": median["diffusers loop"] / median["unet floor"],
    }
    # Per-repetition ratios, paired within a repetition (they share the machine's state at that moment).
    paired = {
        f"steerdiff / {other}": statistics.median(a / b for a, b in zip(times["steerdiff"], times[other], strict=True))
        for other in ("diffusers pipeline", "diffusers loop", "unet floor")
    }
    return {
        "config": {
            "steps": args.steps,
            "nfe": args.steps,
            "batch": args.batch,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "device": str(device),
            "shape": [3, 32, 32],
            "unet_parameters": sum(p.numel() for p in unet.parameters()),
            "scheduler": "DDIMScheduler(clip_sample=False, set_alpha_to_one=True, steps_offset=1, leading)",
        },
        "agreement": agreement,
        "seconds": times,
        "median_seconds": median,
        "ratio_of_medians": ratio,
        "min_seconds": best,
        "ratio_of_mins": {"steerdiff / " + n: best["steerdiff"] / best[n] for n in names if n != "steerdiff"},
        "median_paired_ratio": paired,
        "overhead_us_per_step": overhead,
        "overhead_fraction_of_unet_step": {
            name: us * 1e-6 * args.steps / median["unet floor"] for name, us in overhead.items()
        },
    }


def sampling_table(result: dict) -> str:
    median, best, steps = result["median_seconds"], result["min_seconds"], result["config"]["steps"]
    rows = [(name, f"{seconds:.3f}", f"{1000 * seconds / steps:.1f}", f"{seconds / median['unet floor']:.3f}",
             f"{median['steerdiff'] / seconds:.3f}", f"{best[name]:.3f}", f"{best['steerdiff'] / best[name]:.3f}")
            for name, seconds in median.items()]
    overhead = [(name, f"{us:.0f}", f"{result['overhead_fraction_of_unet_step'][name]:.2e}")
                for name, us in result["overhead_us_per_step"].items()]
    return "\n".join([
        markdown_table(["sampler", "median s", "ms / step", "median / floor", "steerdiff / this (median)", "min s",
                        "steerdiff / this (min)"], rows, "lrrrrrr"), "",
        markdown_table(["per-step cost without the UNet", "us / step", "fraction of a UNet step"], overhead, "lrr")])


def training_table(t: dict) -> str:
    return markdown_table(["trainer", "images/s", "steps/s", "vs bare loop"], [
        ("steerdiff.train.train", f"{t['ours_images_per_s']:.1f}", f"{t['ours_steps_per_s']:.2f}",
         f"{t['ours_over_bare']:.3f}"),
        ("bare fwd+bwd+AdamW loop", f"{t['bare_images_per_s']:.1f}", f"{t['bare_steps_per_s']:.2f}", "1.000")],
        "lrrr")


def markdown(results: dict, note: str = "") -> str:
    """The tables of a ``vs_diffusers.json``: trainer throughput, sampling wall times, agreement."""
    s, cfg = results["sampling"], results["sampling"]["config"]
    t = results["training"]
    return "\n".join([
        "# steerdiff vs diffusers: DDIM sampling on one UNet, and trainer throughput", "",
        note or provenance_line(results.get("meta", results)), "",
        f"## Trainer ({t['steps']} steps, batch {t['batch']}, the shipped digits UNet recipe)", "", training_table(t),
        "", f"## Sampling ({cfg['steps']} DDIM steps = NFE, batch {cfg['batch']}, {cfg['repeats']} interleaved "
        f"repeats, device {cfg['device']}, {cfg['threads']} thread(s); {cfg['unet_parameters']} UNet parameters)", "",
        sampling_table(s), "",
        "Agreement: " + json.dumps(s["agreement"]), "",
        "Paired ratios (median over repeats): " + json.dumps(s["median_paired_ratio"])]) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="sampling steps (= NFE) for every contender")
    parser.add_argument("--batch", type=int, default=16, help="samples per run")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed repetitions per contender")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="where to write the JSON results (the markdown tables go beside it, .md)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def bench_training(args, steps: int = 60, batch: int = 128) -> dict:
    """Training throughput of our trainer on the shipped digits UNet recipe, beside a bare training loop.

    The bare loop does only forward (EDM loss), backward and AdamW on the same model and batch size; the ratio
    shows the trainer's own cost (data order, condition dropout, EMA, gradient clipping, logging).
    """
    import tempfile

    from steerdiff.data.digits import load_digits
    from steerdiff.io import read_json
    from steerdiff.models.io import build_model
    from steerdiff.train import edm_loss, train

    recipe = read_json(Path(__file__).resolve().parents[1] / "configs" / "digits_unet.json")
    x, y = load_digits("train")
    cfg = dict(recipe["train"], steps=steps, batch_size=batch, checkpoint_every=10**6, log_every=10**6)

    torch.manual_seed(0)
    model = build_model(recipe["model"])
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        train(model, (x, y), cfg, tmp, progress=False)
        ours = time.perf_counter() - start

    torch.manual_seed(0)
    model = build_model(recipe["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,), generator=g)
        loss = edm_loss(model, x[idx], y[idx], generator=g).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    bare = time.perf_counter() - start
    return {"steps": steps, "batch": batch, "ours_s": ours, "bare_s": bare, "ours_images_per_s": steps * batch / ours,
            "bare_images_per_s": steps * batch / bare, "ours_steps_per_s": steps / ours,
            "bare_steps_per_s": steps / bare, "ours_over_bare": ours / bare}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results = {"benchmark": "vs_diffusers", "sampling": bench_sampling(args)}
    results["training"] = bench_training(args)
    results["meta"] = provenance(argv, script=__file__, packages=("diffusers",))
    text = markdown(results)
    print()
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, results)
    write_text(args.out.with_suffix(".md"), text)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return results


if __name__ == "__main__":
    main()
