"""``steerdiff schedule``: a sampling schedule optimised for one model and one sampler (Align-Your-Steps-style
coordinate refinement of the endpoint error; :mod:`steerdiff.core.schedule_opt`, docs/methods/samplers.md
"Optimised schedules").

    steerdiff schedule --model digits --sampler dpmpp_2m --steps 10 --out sigmas.json
    steerdiff schedule --model gmm2d --sampler euler --steps 5 --n 512 --out euler5.json
    steerdiff sample --model digits --method dpmpp_2m --steps 10 --sigmas sigmas.json --out out/

Writes ``--out`` (a JSON file): ``sigmas`` (``steps + 1`` levels ending in 0; ``"inf"`` for a flow model's first),
the sampler, steps, NFE, the objective before (Karras rho 7, or the flow grid) and after, and the settings.
"""

from __future__ import annotations

from pathlib import Path

import click
import torch

from ... import core
from ...core.schedule_opt import optimise_schedule
from ._common import (
    POSITIVE,
    SEED,
    device_option,
    dtype_option,
    load_denoiser,
    model_to_dtype,
    progress_option,
    refuse_dtype,
)

METHODS = [name for name, spec in core.SAMPLERS.items() if not spec.required and not spec.stochastic(spec.default_eta)]


@click.command("schedule")
@click.option("--model", "model_name", required=True, help="A samplable model or a built-in mixture (gmm2d, ...).")
@click.option("--sampler", type=click.Choice(METHODS), required=True, help="Deterministic sampler to optimise for.")
@click.option("--steps", type=click.IntRange(min=2), default=10, show_default=True, help="Sampler steps.")
@click.option("--n", type=click.IntRange(min=1), default=256, show_default=True, help="Monte-Carlo samples.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Noise of sample i from the seed.")
@click.option("--sigma-min", type=POSITIVE, default=None, help="Floor of the last positive level [model's, >= 0.002].")
@click.option("--sigma-max", type=POSITIVE, default=None, help="Fixed top level [model's, <= 80; inf for flow].")
@click.option("--sweeps", type=click.IntRange(min=1), default=4, show_default=True, help="Passes over the levels.")
@click.option("--evals", type=click.IntRange(min=2), default=8, show_default=True,
              help="Objective evaluations per level (golden-section search).")
@click.option("--ref-steps", type=click.IntRange(min=10), default=200, show_default=True,
              help="Heun steps of the reference ODE solution.")
@click.option("--out", default="sigmas.json", show_default=True, help="Output JSON file.")
@device_option
@dtype_option
@progress_option
def schedule_cmd(model_name, sampler, steps, n, seed, sigma_min, sigma_max, sweeps, evals, ref_steps, out, device,
                 dtype, progress):
    """Optimise a schedule for MODEL and SAMPLER at STEPS steps; write it as JSON for sample --sigmas."""
    out_path = Path(out)
    if out_path.is_dir():
        raise click.BadParameter(f"{out} is a directory; give a file name such as sigmas.json", param_hint="--out")
    model, is_mixture = load_denoiser(model_name, device=device)
    if is_mixture:
        refuse_dtype(dtype, "schedule", f"{model_name} is a built-in mixture, an exact denoiser evaluated in float64")
    else:
        model = model_to_dtype(model, dtype, "schedule", model_name)
    num_classes = tuple(getattr(model, "num_classes", ()) or ())
    cond = None
    if len(num_classes) == 1:
        cond = (torch.arange(n) % num_classes[0]).to(device)
    res = optimise_schedule(model, sampler, steps, n=n, seed=seed, sigma_min=sigma_min, sigma_max=sigma_max,
                            cond=cond, sweeps=sweeps, evals=evals, ref_steps=ref_steps, device=device,
                            dtype=torch.float64 if is_mixture else dtype, progress=progress)
    res.meta["model"] = model_name
    if out_path.parent != Path(""):
        out_path.parent.mkdir(parents=True, exist_ok=True)
    res.save(out_path)
    levels = ", ".join(f"{s:.4g}" for s in res.sigmas.tolist())
    click.echo(f"{sampler} x{steps} ({res.nfe} NFE) on {model_name}: endpoint MSE {res.init_loss:.4g} -> "
               f"{res.loss:.4g}; sigmas [{levels}] -> {out_path}")
