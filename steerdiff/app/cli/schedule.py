"""``steerdiff schedule``: a sampling schedule optimised for one model and one sampler (Align-Your-Steps-style
coordinate refinement of the endpoint error; :mod:`steerdiff.core.schedule_opt`, docs/methods/samplers.md
"Optimised schedules").

    steerdiff schedule --model digits --sampler dpmpp_2m --steps 10 --out sigmas.json
    steerdiff schedule --model gmm2d --sampler euler --steps 5 --n 512 --out euler5.json
    steerdiff sample --model digits --method dpmpp_2m --steps 10 --sigmas sigmas.json --out out/
    steerdiff schedule --model digits --sampler dpmpp_2m --steps 5 --learned --out solver.safetensors
    steerdiff sample --model digits --solver solver.safetensors --out out/

``--learned`` goes on from the optimised schedule (or ``--init-sigmas FILE``) to a learned few-step solver: DPM-Solver++
2M's multistep weights, the levels and the evaluation levels fitted by regression to the same reference endpoints
(:mod:`steerdiff.core.learned_solver`, docs/methods/samplers.md "Learned few-step solver"); ``--out`` is then a
safetensors file for ``sample --solver``.

Writes ``--out`` (a JSON file): ``sigmas`` (``steps + 1`` levels ending in 0; ``"inf"`` for a flow model's first),
the sampler, steps, NFE, the objective before (Karras rho 7, or the flow grid) and after, and the settings.
"""

from __future__ import annotations

from pathlib import Path

import click
import torch

from ... import core
from ...core.learned_solver import LOSSES, fit_learned_solver
from ...core.schedule_opt import load_sigmas, optimise_schedule
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
from ._pipelines import reject_options

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
@click.option("--learned", is_flag=True,
              help="Then fit a learned solver from DPM-Solver++ 2M on that schedule (--sampler dpmpp_2m); --out is a "
                   "safetensors file for sample --solver.")
@click.option("--init-sigmas", type=click.Path(exists=True, dir_okay=False), default=None,
              help="--learned: start from this schedule (JSON, as written without --learned) instead of optimising "
                   "one first.")
@click.option("--iters", type=click.IntRange(min=0), default=300, show_default=True,
              help="--learned: Adam iterations.")
@click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True,
              help="--learned: noises of the --n per iteration.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True,
              help="--learned: Adam step size (cosine decay to a tenth).")
@click.option("--loss", type=click.Choice(LOSSES), default="l2", show_default=True,
              help="--learned: the fitting objective against the reference endpoints (l2; multiscale: pooled 1, 2, "
                   "4; denoiser: the model's own data prediction at --loss-sigma from both, a perceptual distance).")
@click.option("--loss-sigma", type=POSITIVE, default=0.5, show_default=True,
              help="--learned --loss denoiser: the noise level of the comparison.")
@click.option("--slack", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="--learned: LD3's relaxed objective, the relative radius of the ball around each noise from which "
                   "the solver may reach the reference endpoint (0: plain regression).")
@click.option("--band-pool", type=click.IntRange(min=0), default=0, show_default=True,
              help="--learned: fit the band family (images): each step's weights get corrections for the detail "
                   "finer than this block size (0: the plain family).")
@click.option("--moment-weight", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="--learned: add this weight times the pixel moment-matching distance (mean and covariance) to "
                   "the reference endpoints (0: off).")
@click.option("--out", default=None, help="Output file [sigmas.json; with --learned solver.safetensors].")
@device_option
@dtype_option
@progress_option
def schedule_cmd(model_name, sampler, steps, n, seed, sigma_min, sigma_max, sweeps, evals, ref_steps, learned,
                 init_sigmas, iters, batch, lr, loss, loss_sigma, slack, band_pool, moment_weight, out, device, dtype,
                 progress):
    """Optimise a schedule for MODEL and SAMPLER at STEPS steps; write it as JSON for sample --sigmas (with --learned:
    a learned solver for sample --solver)."""
    ctx = click.get_current_context()
    if not learned:
        reject_options(ctx, ("init_sigmas", "iters", "batch", "lr", "loss", "loss_sigma", "slack", "band_pool",
                             "moment_weight"),
                       "these options apply to --learned only")
    elif sampler != "dpmpp_2m":
        raise click.BadParameter("--learned fits DPM-Solver++ 2M's family: use --sampler dpmpp_2m",
                                 param_hint="--sampler")
    out = out or ("solver.safetensors" if learned else "sigmas.json")
    out_path = Path(out)
    if out_path.is_dir():
        raise click.BadParameter(f"{out} is a directory; give a file name such as sigmas.json", param_hint="--out")
    model, is_mixture = load_denoiser(model_name, device=device)
    if is_mixture:
        refuse_dtype(dtype, "schedule", f"{model_name} is a built-in mixture, an exact denoiser evaluated in float64")
    else:
        model = model_to_dtype(model, dtype, "schedule", model_name)
    if learned and band_pool:
        shape = tuple(getattr(model, "sample_shape", ()))
        if len(shape) < 3 or band_pool < 2 or shape[-1] % band_pool or shape[-2] % band_pool:
            raise click.BadParameter(f"the band family needs image samples whose size the block divides (>= 2); "
                                     f"{model_name}'s samples have shape {shape}", param_hint="--band-pool")
    num_classes = tuple(getattr(model, "num_classes", ()) or ())
    cond = None
    if len(num_classes) == 1:
        cond = (torch.arange(n) % num_classes[0]).to(device)
    noise_dtype = torch.float64 if is_mixture else dtype
    if out_path.parent != Path(""):
        out_path.parent.mkdir(parents=True, exist_ok=True)
    if learned and init_sigmas is not None:
        reject_options(ctx, ("sigma_min", "sigma_max", "sweeps", "evals"), "--init-sigmas gives the starting schedule")
        try:
            init = load_sigmas(init_sigmas)
        except (ValueError, TypeError, OSError) as err:
            raise click.BadParameter(str(err), param_hint="--init-sigmas") from err
        if ctx.get_parameter_source("steps") == click.core.ParameterSource.COMMANDLINE and init.numel() != steps + 1:
            raise click.BadParameter(f"--steps {steps} but {init_sigmas} has {init.numel() - 1} steps",
                                     param_hint="--steps")
        schedule_meta = {"init_sigmas_file": init_sigmas}
    else:
        res = optimise_schedule(model, sampler, steps, n=n, seed=seed, sigma_min=sigma_min, sigma_max=sigma_max,
                                cond=cond, sweeps=sweeps, evals=evals, ref_steps=ref_steps, device=device,
                                dtype=noise_dtype, progress=progress)
        res.meta["model"] = model_name
        if not learned:
            res.save(out_path)
            levels = ", ".join(f"{s:.4g}" for s in res.sigmas.tolist())
            click.echo(f"{sampler} x{steps} ({res.nfe} NFE) on {model_name}: endpoint MSE {res.init_loss:.4g} -> "
                       f"{res.loss:.4g}; sigmas [{levels}] -> {out_path}")
            return
        init, schedule_meta = res.sigmas, {"schedule_loss": res.loss, "karras_loss": res.init_loss}
    if init.numel() - 1 < 2:
        raise click.BadParameter("a learned solver needs at least 2 steps", param_hint="--init-sigmas")
    solver = fit_learned_solver(model, init, n=n, seed=seed, cond=cond, iters=iters, lr=lr, batch=batch,
                                ref_steps=ref_steps, loss=loss, loss_sigma=loss_sigma, slack=slack,
                                band_pool=band_pool, moment_weight=moment_weight, dtype=noise_dtype, device=device,
                                progress=progress)
    solver.meta.update(model=model_name, **schedule_meta)
    solver.save(out_path)
    levels = ", ".join(f"{s:.4g}" for s in solver.sigmas.tolist())
    what = ("endpoint MSE" if loss == "l2" else f"{loss} loss") + (f" (LD3 slack {slack:g})" if slack else "")
    what += (f" (band family, pool {band_pool})" if band_pool else "") + (
        f" + {moment_weight:g} x moments" if moment_weight else "")
    click.echo(f"learned solver x{solver.steps} ({solver.steps} NFE) on {model_name}: {what} "
               f"{solver.meta['init_loss']:.4g} (dpmpp_2m on the starting schedule) -> {solver.meta['loss']:.4g}; "
               f"sigmas [{levels}] -> {out_path}")
