"""``steerdiff align``: reward-aligned sampling, target ``p exp(r / alpha)``, with DAS or a baseline.

    steerdiff align --model digits --reward class:3 --alpha 0.1 --particles 64 --n 16 --out out/
    steerdiff align --model gmm2d --reward linear:1,0 --alpha 0.5 --method das
    steerdiff align --pipeline DIR --prompt "a disk" --reward red --method das --particles 8 --n 4

With ``--pipeline DIR`` (a diffusers pipeline directory, steerdiff/app/cli/_pipelines.py) the samplers run on the
latent denoiser of the prompts (``--scale`` > 1: CFG, counted as 2 evaluations per call) and the reward is one of
the decoded images (``ink``, ``symmetry``, ``red``), differentiable through the VAE decoder; the outputs are also
written as ``image_NNN.png`` and ``samples.safetensors``.

DAS is the tempered SMC sampler of "Test-time Alignment of Diffusion Models without Reward Over-optimization" (Kim,
Kim, Park 2025); the baselines are TDS (Wu et al. 2023), reward-gradient guidance, best-of-N and SIR; ``--method fk``
is FK steering (Singhal et al. 2025: gradient-free SMC with ``--potential`` difference, max or sum). Writes
``samples.png`` (image grid or scatter), ``samples.safetensors`` (``samples``, and ``labels`` with ``--class``; the
particles' noise seeds and the command's options as metadata) and ``metrics.json`` (reward statistics, costs, ESS /
tempering / resampling traces; for the built-in mixtures with a linear reward also the error to the exact tilted
mixture).

Under ``torchrun`` (``torchrun --nproc_per_node=2 --no-python -- steerdiff align ...``) DAS, FK steering, TDS,
best-of-N and SIR spread their particles over the processes (``sd.align.das(..., dist=...)``, docs/distributed.md);
every rank gets the same result and rank 0 alone writes it. ``--method guidance`` runs in one process.
"""

from __future__ import annotations

import math

import click
import torch

from ... import core
from ...align import best_of_n, das, fk_steering, reward_guidance, sir, tds
from ...align.fk import POTENTIALS
from ...align.rewards import Linear, WeightedSum, check_reward_shape, from_spec
from ._common import (
    FINITE,
    POSITIVE,
    SEED,
    check_class,
    check_out,
    check_sigmas,
    device_option,
    finite_range,
    load_denoiser,
    plot_samples,
    prepare_out,
    write_metrics,
    write_samples,
)
from ._pipelines import align_pipeline, check_prompts, reject_options
from ._shard import begin, end, format_seeds, rank_device

METHODS = ("das", "tds", "guidance", "bon", "sir", "fk")


def _reward(specs: tuple[str, ...], is_mixture: bool, sample_shape, device):
    """The reward of the ``--reward`` specs, checked against the model's sample shape (before any sampling)."""
    clf = None
    if any("class:" in s for s in specs):
        if is_mixture:
            raise click.BadParameter("class:K rewards need an image model", param_hint="--reward")
        from ...models.io import load

        clf = load("digits_classifier", device=device)
    try:
        parts = [from_spec(s, clf, sample_shape=sample_shape) for s in specs]
        reward = parts[0] if len(parts) == 1 else WeightedSum([(1.0, p) for p in parts])
        check_reward_shape(reward, sample_shape)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--reward") from err
    return reward


@click.command("align")
@click.option("--model", "model_name", default="digits", show_default=True,
              help="A shipped model (digits), a built-in mixture (gmm1d, gmm2d, gmm16d) or a model directory.")
@click.option("--pipeline", "pipeline_dir", default=None, metavar="DIR",
              help="A diffusers text-to-image pipeline directory (save_pretrained; safetensors only) instead of "
                   "--model; rewards are then of the decoded images (ink, symmetry, red).")
@click.option("--prompt", "prompts", multiple=True, help="--pipeline: a prompt; repeat for several.")
@click.option("--negative", "negatives", multiple=True,
              help="--pipeline: a negative prompt (with --scale > 1), one for all prompts or one per --prompt.")
@click.option("--height", type=click.IntRange(min=1), default=None, help="--pipeline: image height in pixels.")
@click.option("--width", type=click.IntRange(min=1), default=None, help="--pipeline: image width in pixels.")
@click.option("--reward", "rewards", multiple=True, required=True,
              help="class:K, ink, symmetry, linear:a1,a2,... or a weighted sum '0.5*class:3+0.5*ink'; repeat to add. "
                   "With --pipeline: ink, symmetry or red, of the decoded images; repeat to add.")
@click.option("--alpha", type=POSITIVE, default=0.1, show_default=True, help="KL weight: target ∝ p exp(r / alpha).")
@click.option("--method", type=click.Choice(METHODS), default="das", show_default=True)
@click.option("--particles", type=click.IntRange(min=1), default=16, show_default=True,
              help="Particles per output (DAS/TDS), chains per output (best-of-N/SIR).")
@click.option("--n", "n", type=click.IntRange(min=1), default=16, show_default=True,
              help="Number of outputs (with --pipeline: per prompt).")
@click.option("--steps", type=click.IntRange(min=2), default=50, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True, help="Row i of the noise uses seed + i.")
@click.option("--class", "class_", type=int, default=None, help="Condition of a conditional model (default null).")
@click.option("--tempering", default="adaptive", show_default=True,
              help="--method das: adaptive, exp (the paper's), constant or an exponent.")
@click.option("--gradient/--no-gradient", default=False, show_default=True,
              help="--method das: the reward-gradient (twisted) proposal of the paper, one VJP per particle and "
                   "step; the default is gradient-free DAS, which spends that cost on more particles.")
@click.option("--gamma", type=POSITIVE, default=None, help="Tempering rate (default: lambda = 1 at 87% of steps).")
@click.option("--ess-threshold", type=FINITE, default=0.5, show_default=True,
              help="Resample when the ESS falls below this fraction of the particles, in (0, 1].")
@click.option("--resampler", type=click.Choice(["ssp", "systematic", "stratified", "multinomial", "residual"]),
              default="ssp", show_default=True)
@click.option("--output", type=click.Choice(["sample_one", "argmax"]), default="sample_one", show_default=True)
@click.option("--potential", type=click.Choice(POTENTIALS), default="difference", show_default=True,
              help="--method fk: the intermediate potential of the reward of the denoised estimate.")
@click.option("--resample-every", type=click.IntRange(min=1), default=1, show_default=True,
              help="--method fk: weigh and (if the ESS fell) resample every this many steps, at most --steps.")
@click.option("--scale", type=finite_range(min=0), default=1.0, show_default=True,
              help="Guidance scale rho (--method guidance); with --pipeline: the CFG scale of the prompt model "
                   "(diffusers' guidance_scale; 1 = the conditional model).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--sigma-min", type=POSITIVE, default=0.002, show_default=True)
@click.option("--sigma-max", type=POSITIVE, default=80.0, show_default=True)
@device_option
@click.option("--out", default="out", show_default=True, help="Output directory.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar with the ESS.")
@click.pass_context
def align_cmd(ctx, device, progress, **kwargs) -> None:
    """Reward-aligned samples (DAS by default); write samples.png, samples.safetensors and metrics.json to --out."""
    dist, started = begin(ctx, "align", device, ignore=("progress",))
    try:
        if dist.distributed and kwargs["method"] == "guidance":
            raise click.UsageError("--method guidance runs in one process: launch it without torchrun")
        if dist.distributed and kwargs["pipeline_dir"] is not None:
            raise click.UsageError("--pipeline runs in one process: launch it without torchrun")
        _align(ctx, dist, device=rank_device(dist, device), progress=progress and dist.is_main, **kwargs)
    finally:
        end(started)


def _align(ctx, dist, model_name, pipeline_dir, prompts, negatives, height, width, rewards, alpha, method, particles,
           n, steps, seed, class_, tempering, gradient, gamma, ess_threshold, resampler, output, potential,
           resample_every, scale, batch_size, sigma_min, sigma_max, device, out, progress) -> None:
    """``steerdiff align`` once the process group is joined: every rank runs the sampler on its particles, rank 0
    measures and writes."""
    if tempering not in ("exp", "adaptive", "constant", "zero"):
        try:
            tempering = POSITIVE.convert(tempering, None, None)
        except click.BadParameter as err:
            raise click.BadParameter(f"{tempering!r}: use exp, adaptive, constant, zero or a positive exponent",
                                     param_hint="--tempering") from err
    if pipeline_dir is not None:
        if ctx.get_parameter_source("model_name") is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--pipeline and --model are mutually exclusive: align a pipeline directory or a "
                                   "model, not both")
        reject_options(ctx, ("class_", "sigma_min", "sigma_max"),
                       "not used with --pipeline (its prompts and scheduler define the run)")
        prompts, negatives = check_prompts(prompts, negatives)
        check_out(out)
        k = 1 if method == "guidance" else particles

        def run_method(model, reward, noise, sigmas, parts, cond):
            common = dict(particles=parts, cond=cond, generator=seed + 10**9, batch_size=batch_size,
                          progress=progress)
            return _run(method, model, reward, noise, sigmas, common, alpha=alpha, tempering=tempering,
                        gradient=gradient, gamma=gamma, ess_threshold=ess_threshold, resampler=resampler,
                        output=output, scale=1.0, potential=potential, resample_every=resample_every)

        settings = {"alpha": alpha, "particles": k, "tempering": tempering, "gradient": gradient,
                    "resampler": resampler, "output": output} | ({"potential": potential} if method == "fk" else {})
        align_pipeline(pipeline_dir, prompts, negatives, n, rewards=rewards, method=method, run_method=run_method,
                       particles=k, steps=steps, seed=seed, scale=scale, height=height, width=width, device=device,
                       out=out, progress=progress, settings=settings)
        return
    reject_options(ctx, ("prompts", "negatives", "height", "width"), "these options apply to --pipeline only")
    check_sigmas(sigma_min, sigma_max)
    check_out(out)
    model, is_mixture = load_denoiser(model_name, device)
    shape = tuple(model.sample_shape)
    reward = _reward(rewards, is_mixture, shape, device)
    dtype = torch.float64 if is_mixture else torch.float32
    k = 1 if method == "guidance" else particles
    cond = None
    if class_ is not None:
        check_class(class_, () if is_mixture else getattr(model, "num_classes", ()), model_name)
        cond = torch.full((n,), class_, device=device)
    # The last noise level is sigma_min > 0, so DAS's last proposal is stochastic like the others.
    sigmas = core.sigmas.karras(steps + 1, sigma_min, sigma_max)[:-1]
    noise = core.randn((n * k, *shape), seeds=seed, dtype=dtype, device=device)
    common = dict(particles=k, cond=cond, generator=seed + 10**9, batch_size=batch_size, progress=progress)
    if method != "guidance":
        common["dist"] = dist
    try:
        res = _run(method, model, reward, noise, sigmas, common, alpha=alpha, tempering=tempering,
                   gradient=gradient, gamma=gamma, ess_threshold=ess_threshold, resampler=resampler,
                   output=output, scale=scale, potential=potential, resample_every=resample_every)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    if not dist.is_main:  # every rank holds the result; rank 0 writes it
        return
    out_dir = prepare_out(out)
    result = {"model": model_name, "rewards": list(rewards), "alpha": alpha, "method": method, "steps": steps,
              "n": n, "seed": seed} | res.summary()
    if method == "fk":
        result |= {"potential": potential, "potential_steps": res.extras["potential_steps"]}
    if res.ess is not None:
        result["ess_frac_per_step"] = (res.ess.mean(1) / res.particles).tolist()
        result["lambda_per_step"] = res.lambdas.mean(1).tolist()
        result["resample_steps_group0"] = res.resample_steps[0]
    samples = res.samples.detach().cpu()
    if is_mixture and len(rewards) == 1 and isinstance(reward, Linear):
        result.update(_exact_linear(model, reward, alpha, samples))
    if not is_mixture and shape == (1, 8, 8):
        result.update(_digits_metrics(samples, rewards))
    path = write_metrics(out_dir, result)
    options = {k: v for k, v in ctx.params.items()
               if k not in ("out", "progress", "device", "pipeline_dir", "prompts", "negatives", "height", "width")}
    write_samples(out_dir, {"samples": samples} | ({"labels": cond.cpu()} if cond is not None else {}),
                  {"command": "align", "seeds": format_seeds(range(seed, seed + n * k)), "options": options})
    plot_samples(samples, out_dir / "samples.png", title=f"{method}: {', '.join(rewards)}, alpha {alpha:g}")
    for key in ("reward_mean", "nfe", "nfe_grad", "ess_mean_frac", "resamples_per_group", "relerr_to_exact",
                "class_accuracy"):
        if key in result and isinstance(result[key], float) and math.isfinite(result[key]):
            click.echo(f"{key:>20}: {result[key]:.4g}")
    click.echo(f"wrote {path}, {out_dir / 'samples.png'} and {out_dir / 'samples.safetensors'}")


def _run(method, model, reward, noise, sigmas, common, *, alpha, tempering, gamma, ess_threshold, resampler, output,
         scale, gradient=False, potential="difference", resample_every=1):
    """The reward sampler ``method`` of steerdiff.align on ``model`` with the command's settings."""
    if method == "fk":
        return fk_steering(model, reward, noise, sigmas, alpha=alpha, potential=potential,
                           resample_every=resample_every, ess_threshold=ess_threshold, resampler=resampler,
                           output=output, **common)
    if method == "das":
        return das(model, reward, noise, sigmas, alpha=alpha, tempering=tempering, gradient=gradient, gamma=gamma,
                   ess_threshold=ess_threshold, resampler=resampler, output=output, **common)
    if method == "tds":
        return tds(model, reward, noise, sigmas, alpha=alpha, output=output, **common)
    if method == "guidance":
        return reward_guidance(model, reward, noise, sigmas, alpha=alpha, scale=scale, **common)
    if method == "bon":
        return best_of_n(model, reward, noise, sigmas, **common)
    return sir(model, reward, noise, sigmas, alpha=alpha, **common)


def _exact_linear(mixture, reward: Linear, alpha: float, samples) -> dict:
    """The exact mean reward under the tilted mixture, and the samples' errors to it."""
    from ...metrics import mode_weight_error

    tilted = mixture.tilt_linear(reward.a, alpha)
    exact = float(tilted.weights @ (tilted.means @ reward.a))
    mean = float(reward(samples.double()).mean())
    return {"exact_reward": exact, "relerr_to_exact": abs(mean - exact) / max(abs(exact), 1e-12),
            "mode_tv_to_exact": mode_weight_error(samples, tilted)}


def _digits_metrics(samples, rewards) -> dict:
    """Class accuracy under the shipped digits classifier when exactly one reward term is a class:K."""
    from ...metrics.images import class_accuracy
    from ...models.io import load

    targets = [int(s.split("class:")[1].split("+")[0].split("*")[0]) for s in rewards if "class:" in s]
    if len(targets) != 1:
        return {}
    clf = load("digits_classifier")
    return {"class_accuracy": class_accuracy(clf, samples.clamp(-1, 1), torch.full((samples.shape[0],), targets[0]))}
