"""``steerdiff constrain``: constrained sampling with neural approximate mirror maps, and NAMM recipes.

NAMM is "Neural Approximate Mirror Maps for Constrained Diffusion Models" (Feng, Baptista, Bouman 2025).

    steerdiff constrain sample --model digits_namm --n 64 --out out/       # samples.png + metrics.json
    steerdiff constrain sample --model circle_namm --n 2000 --out out/
    steerdiff constrain train digits_namm --stages maps,mirror,plain,bundle

``sample`` draws in mirror space with the NAMM bundle's model (optionally class-conditional with CFG), decodes through
the inverse map and reports the constraint distance of the decoded and of the raw mirror samples, and the NFE.
"""

from __future__ import annotations

import inspect
import json

import click
import torch

from ._common import (
    POSITIVE,
    SEED,
    check_class,
    check_out,
    check_sigma_in_range,
    check_sigmas,
    device_option,
    dtype_name,
    dtype_option,
    dtype_refused,
    finite_range,
    model_to_dtype,
    plot_samples,
    prepare_out,
    progress_option,
    start_outputs,
    write_metrics,
)
from ._models import available


@click.group("constrain")
def constrain_cmd() -> None:
    """NAMM: sample constrained models, run NAMM recipes."""


@constrain_cmd.command("sample")
@click.option("--model", "model_name", default="digits_namm", show_default=True,
              help="A NAMM bundle directory or a shipped one (digits_namm, circle_namm).")
@click.option("--n", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--steps", type=click.IntRange(min=2), default=30, show_default=True)
@click.option("--class", "class_", type=int, default=None, help="Class of a conditional model (default: balanced).")
@click.option("--scale", type=finite_range(min=0), default=1.0, show_default=True,
              help="CFG scale in mirror space (1 = off).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Row i of the noise uses seed + i.")
@click.option("--sigma-min", type=POSITIVE, default=0.002, show_default=True)
@click.option("--sigma-max", type=POSITIVE, default=None, help="Default: 80 for images, 10 for 2-D models.")
@device_option
@dtype_option
@click.option("--out", default="out", show_default=True, help="Output directory.")
def sample_cmd(model_name, n, steps, class_, scale, seed, sigma_min, sigma_max, device, dtype, out) -> None:
    """Sample a NAMM bundle in mirror space and decode through the inverse map.

    ``--dtype``: the mirror-space diffusion model runs in it; the sampler's state, the maps (the inverse map that
    decodes, the forward map of the constraint check) and the constraint distances stay in float32: the
    constraint is met to the maps' precision, which half precision would coarsen for every sample."""
    from ... import core
    from ...constrain.io import load_namm
    from ...constrain.mirror import MirrorDenoiser
    from ...guidance import build_guider
    from ...io import CheckpointError, save_tensors

    check_out(out)
    try:
        namm, mirror = load_namm(model_name, device=device)
    except CheckpointError as err:
        raise click.BadParameter(f"{err}. Available: {available(('namm',))}", param_hint="--model") from err
    if mirror is None:
        raise click.BadParameter(f"{model_name} holds maps but no mirror-space model", param_hint="--model")
    md = MirrorDenoiser(mirror, namm)  # checks the mirror model against the maps it was trained on, as loaded
    model_to_dtype(mirror, dtype, "constrain sample", "the mirror-space model")  # in place: md holds it
    image = len(md.sample_shape) == 3
    sigma_max = sigma_max if sigma_max is not None else (80.0 if image else 10.0)
    check_sigmas(sigma_min, sigma_max)
    check_sigma_in_range(mirror, sigma_max, str(model_name), "--sigma-max")  # MirrorDenoiser declares no range
    sig = core.sigmas.karras(steps, sigma_min, sigma_max)
    cond = None
    if md.num_classes:
        check_class(class_, md.num_classes, str(model_name))
        k = md.num_classes[0]
        cond = torch.full((n,), class_, dtype=torch.long) if class_ is not None else torch.arange(n) % k
        cond = cond.to(device)
    elif class_ is not None:
        raise click.BadParameter("the model is unconditional", param_hint="--class")
    if scale != 1.0 and cond is None:
        raise click.BadParameter("CFG needs a conditional model", param_hint="--scale")
    noise = core.randn((n, *md.sample_shape), seeds=seed, device=device)
    with torch.no_grad():
        x, stats, raw = md.sample(noise, sig, cond=cond, guidance=build_guider("cfg", scale) if scale != 1.0 else None,
                                  return_stats=True, return_mirror=True)
        d, d_raw = namm.distance(x).cpu(), namm.distance(raw).cpu()
        x, raw = x.cpu(), raw.cpu()
    path = prepare_out(out)
    metrics = {"model": str(model_name), "n": n, "nfe": stats.nfe, "constraint_mean": float(d.mean()),
               "constraint_max": float(d.max()), "raw_mirror_constraint_mean": float(d_raw.mean()),
               "sampler": f"heun, {steps} steps", "scale": scale, "wall_time_s": stats.wall_time,
               "dtype": dtype_name(dtype)}
    start_outputs(path)  # the summary comes last: a failure in between leaves none
    save_tensors({"samples": x, "mirror_samples": raw}, path / "samples.safetensors")
    # Decoded images are in [0, 1]; the grid expects [-1, 1].
    plot_samples(2.0 * x - 1.0 if image else x, path / "samples.png",
                 title=f"NAMM samples (mean l {metrics['constraint_mean']:.4f})")
    write_metrics(path, metrics)
    click.echo(json.dumps(metrics))


@constrain_cmd.command("train")
@click.argument("recipe")
@click.option("--stages", default="maps,mirror,plain,bundle", show_default=True,
              help="Comma-separated: maps, mirror, plain, finetune, bundle.")
@device_option
@dtype_refused("constrain train", "the NAMM maps (input-convex networks whose inverse is solved numerically) train "
                                  "in float32 (mixed precision: steerdiff train --dtype bfloat16)")
@progress_option
def train_cmd(recipe, stages, device, progress) -> None:
    """Run a NAMM recipe (configs/*namm*.json): maps, mirror-space model, plain baseline, bundle."""
    from ..recipes.namm import STAGES, run

    wanted = stages.split(",")
    bad = sorted(set(wanted) - set(STAGES))
    if bad:
        raise click.BadParameter(f"unknown stages {bad}; choose from {STAGES}", param_hint="--stages")
    kwargs = {}
    if "device" in inspect.signature(run).parameters:
        kwargs["device"] = device
    elif device.type != "cpu":
        raise click.BadParameter(f"{device}: NAMM recipes train on cpu only (steerdiff.app.recipes.namm.run takes "
                                 "no device)", param_hint="--device")
    try:
        paths = run(recipe, wanted, progress=progress, **kwargs)
    except FileNotFoundError as err:
        raise click.BadParameter(str(err), param_hint="RECIPE") from err
    click.echo(json.dumps({k: str(v) for k, v in paths.items()}))
