"""``steerdiff align``: reward-aligned sampling, target ``p exp(r / alpha)``, with DAS or any registered aligner.

    steerdiff align --model digits --reward class:3 --alpha 0.1 --particles 64 --n 16 --out out/
    steerdiff align --model gmm2d --reward linear:1,0 --alpha 0.5 --method das
    steerdiff align --pipeline DIR --prompt "a disk" --reward red --method das --particles 8 --n 4

``--method`` is any aligner of :data:`steerdiff.align.ALIGNERS` (``das``, ``tds``, ``fk``, ``best_of_n`` / ``bon``,
``sir``, ``reward_guidance`` / ``guidance``, and any a plug-in registered before this module was imported), and the
method options (``--tempering``, ``--resampler``, ``--potential``, ...) are those the registered aligners take, read
from their signatures when the command is built (:func:`build_align_command`). A method option left out takes the
method's own default; one the chosen method does not take is refused, naming the option and the method.

With ``--pipeline DIR`` (a diffusers pipeline directory, steerdiff/app/cli/_pipelines.py) the samplers run on the
latent denoiser of the prompts (``--scale`` > 1: CFG, counted as 2 evaluations per call) and the reward is one of
the decoded images (``ink``, ``symmetry``, ``red``), differentiable through the VAE decoder; the outputs are also
written as ``image_NNN.png`` and ``samples.safetensors``.

DAS is the tempered SMC sampler of "Test-time Alignment of Diffusion Models without Reward Over-optimization" (Kim,
Kim, Park, ICLR 2025; ``docs/methods/das.md``); the baselines are TDS (Wu et al., NeurIPS 2023), reward-gradient
guidance, best-of-N and SIR; ``--method fk`` is FK steering (Singhal et al. 2025, ``docs/methods/fk_steering.md``:
gradient-free SMC with ``--potential`` difference, max or sum). Writes ``samples.png`` (image grid or scatter),
``samples.safetensors`` (``samples``, and ``labels`` with ``--class``; the particles' noise seeds and the command's
options as metadata) and ``metrics.json`` (the method's options, reward statistics, costs, ESS / tempering /
resampling traces; for the built-in mixtures with a linear reward also the error to the exact tilted mixture).

Under ``torchrun`` (``torchrun --nproc_per_node=2 --no-python -- steerdiff align ...``) the aligners that take
``dist`` (DAS, FK steering, TDS, best-of-N, SIR) spread their particles over the processes (``sd.align.das(...,
dist=...)``, docs/distributed.md); every rank gets the same result and rank 0 alone writes it. The others (reward
guidance) run in one process.
"""

from __future__ import annotations

import inspect
import math

import click
import torch

from ... import core
from ...align import ALIGNERS, POTENTIALS, RESAMPLERS, TEMPERING
from ...align.rewards import Linear, WeightedSum, check_reward_shape, from_spec
from ...align.smc import OUTPUTS
from ._common import (
    FINITE,
    POSITIVE,
    SEED,
    check_class,
    check_out,
    check_sigma_in_range,
    check_sigmas,
    device_option,
    dtype_option,
    finite_range,
    karras_schedule,
    load_denoiser,
    model_to_dtype,
    plot_samples,
    prepare_out,
    progress_param,
    refuse_dtype,
    start_outputs,
    write_metrics,
    write_samples,
)
from ._pipelines import align_pipeline, check_prompts, reject_options
from ._shard import begin, end, format_seeds, rank_device


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


class Tempering(click.ParamType):
    """``--tempering``: a registered schedule name (:data:`steerdiff.align.TEMPERING`) or a positive exponent."""

    name = "tempering"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) or value in TEMPERING:
            return value
        try:
            return POSITIVE.convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r}: use {', '.join(TEMPERING.names())} or a positive exponent", param, ctx)


# The aligners' arguments the command sets itself (from --alpha, --particles, --class, --seed, --batch-size,
# --progress, torchrun, --scale), or that cannot be given on a command line.
HANDLED = ("alpha", "particles", "cond", "generator", "batch_size", "progress", "callback", "dist", "scale")

# How the command line presents the options of the built-in aligners (type and help); any other option of a
# registered aligner is offered with a type read from its default or annotation. Choices read the registries.
PRESENTATION = {
    "tempering": (lambda: Tempering(), "DAS's tempering schedule: {tempering} or a polynomial exponent."),
    "gradient": (None, "DAS: the reward-gradient (twisted) proposal of the paper, one VJP per particle and step; "
                       "the default is gradient-free DAS, which spends that cost on more particles."),
    "gamma": (lambda: POSITIVE, "Tempering rate (default: lambda = 1 at 87% of steps); with --tempering sigma, the "
                                 "scale s of lambda = min(1, (s / sigma)^2) (default 1)."),
    "ess_threshold": (lambda: FINITE, "Resample when the ESS falls below this fraction of the particles, in (0, 1]."),
    "resampler": (lambda: click.Choice(RESAMPLERS.names()), "The SMC resampling scheme."),
    "output": (lambda: click.Choice(list(OUTPUTS)), "The SMC output rule (one sample per group, or all particles)."),
    "potential": (lambda: click.Choice(POTENTIALS.names()),
                  "FK steering: the intermediate potential of the reward of the denoised estimate."),
    "resample_every": (lambda: click.IntRange(min=1),
                       "FK steering: weigh and (if the ESS fell) resample every this many steps, at most --steps."),
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _method_names() -> list[str]:
    return ALIGNERS.names() + sorted(a for _, spec in ALIGNERS.items() for a in spec.aliases)


def _doc_line(fn, name: str) -> str:
    """The first sentence of argument ``name`` in ``fn``'s Google-style docstring (``Args:``), or ''."""
    lines = (inspect.getdoc(fn) or "").splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(f"{name}:"):
            indent = len(line) - len(line.lstrip())
            text = [line.split(":", 1)[1].strip()]
            for more in lines[i + 1:]:
                if not more.strip() or len(more) - len(more.lstrip()) <= indent:
                    break
                text.append(more.strip())
            sentence = " ".join(text).replace("``", "").split(". ")[0].rstrip(".")
            return sentence[:1].upper() + sentence[1:] + "."
    return ""


def _generic_type(default, annotation):
    """A click type for an option of a registered aligner from its default (or, for a None default, its annotation);
    None (with ``is_flag``) for a boolean; ``...`` where it cannot be given on a command line."""
    if isinstance(default, bool):
        return None
    for t, click_t in ((int, click.INT), (float, FINITE), (str, click.STRING)):
        if type(default) is t:
            return click_t
    if default is None:
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
        for word, click_t in (("float", FINITE), ("int", click.INT), ("str", click.STRING)):
            if word in text.replace("None", ""):
                return click_t
    return ...


def method_options() -> dict[str, click.Option]:
    """The command-line options of every registered aligner (beyond those the command sets itself), each defaulting
    to None (the method's own default), with the methods that take it and their defaults in its help."""
    taken: dict[str, list] = {}
    for _, spec in ALIGNERS.items():
        params = inspect.signature(spec.fn).parameters
        for name, default in spec.options.items():
            if name not in HANDLED:
                taken.setdefault(name, []).append((spec, default, params[name].annotation))
    out = {}
    for name in sorted(taken, key=lambda n: list(PRESENTATION).index(n) if n in PRESENTATION else len(PRESENTATION)):
        users = taken[name]
        spec0, default0, annotation0 = users[0]
        if name in PRESENTATION:
            make, help_ = PRESENTATION[name]
            typ = None if make is None else make()
            help_ = help_.format(tempering=", ".join(TEMPERING.names()))
        else:
            typ = _generic_type(default0, annotation0)
            help_ = next((h for h in (_doc_line(s.fn, name) for s, _, _ in users) if h), f"The {name} option.")
        if typ is ...:
            continue
        by_default: dict[str, list[str]] = {}
        for s, d, _ in users:
            by_default.setdefault("required" if d is inspect.Parameter.empty else repr(d), []).append(s.name)
        shown = (next(iter(by_default)) if len(by_default) == 1 else
                 "; ".join(f"{d} ({', '.join(names)})" for d, names in by_default.items()))
        help_ = f"{help_} [methods: {', '.join(s.name for s, _, _ in users)}; default: {shown}]"
        decls = [f"{_flag(name)}/--no-{name.replace('_', '-')}"] if typ is None else [_flag(name)]
        out[name] = click.Option([*decls, name], type=typ, default=None, show_default=False, help=help_)
    return out


def build_align_command() -> click.Command:
    """The ``align`` command, its ``--method`` choices and method options read from :data:`steerdiff.align.ALIGNERS`
    now (a plug-in module imported before this call appears in ``--method`` and runs)."""
    per_method = method_options()
    params = [
        click.Option(["--model", "model_name"], default="digits", show_default=True,
                     help="A shipped model (digits), a built-in mixture (gmm1d, gmm2d, gmm16d) or a model directory."),
        click.Option(["--pipeline", "pipeline_dir"], default=None, metavar="DIR",
                     help="A diffusers text-to-image pipeline directory (save_pretrained; safetensors only) instead "
                          "of --model; rewards are then of the decoded images (ink, symmetry, red)."),
        click.Option(["--prompt", "prompts"], multiple=True, help="--pipeline: a prompt; repeat for several."),
        click.Option(["--negative", "negatives"], multiple=True,
                     help="--pipeline: a negative prompt (with --scale > 1), one for all prompts or one per --prompt."),
        click.Option(["--height"], type=click.IntRange(min=1), default=None,
                     help="--pipeline: image height in pixels."),
        click.Option(["--width"], type=click.IntRange(min=1), default=None,
                     help="--pipeline: image width in pixels."),
        click.Option(["--reward", "rewards"], multiple=True, required=True,
                     help="class:K, ink, symmetry, linear:a1,a2,... or a weighted sum '0.5*class:3+0.5*ink'; repeat "
                          "to add. With --pipeline: ink, symmetry or red, of the decoded images; repeat to add."),
        click.Option(["--alpha"], type=POSITIVE, default=0.1, show_default=True,
                     help="KL weight: target ∝ p exp(r / alpha) (methods that take alpha)."),
        click.Option(["--method"], type=click.Choice(_method_names()), default="das", show_default=True,
                     help="A registered aligner (steerdiff.align.ALIGNERS)."),
        click.Option(["--particles"], type=click.IntRange(min=1), default=16, show_default=True,
                     help="Particles per output (SMC methods), chains per output (best-of-N/SIR)."),
        click.Option(["--n", "n"], type=click.IntRange(min=1), default=16, show_default=True,
                     help="Number of outputs (with --pipeline: per prompt)."),
        click.Option(["--steps"], type=click.IntRange(min=2), default=50, show_default=True),
        click.Option(["--seed"], type=SEED, default=0, show_default=True, help="Row i of the noise uses seed + i."),
        click.Option(["--class", "class_"], type=int, default=None,
                     help="Condition of a conditional model (default null)."),
        *per_method.values(),
        click.Option(["--scale"], type=finite_range(min=0), default=1.0, show_default=True,
                     help="Guidance scale rho (--method guidance); with --pipeline: the CFG scale w of the prompt "
                          "model in D_u + w (D_c - D_u), as sample's --scale (0 = the unconditional model, 1 = the "
                          "conditional model; above 1 diffusers' guidance_scale)."),
        click.Option(["--batch-size"], type=click.IntRange(min=1), default=256, show_default=True),
        click.Option(["--sigma-min"], type=POSITIVE, default=0.002, show_default=True),
        click.Option(["--sigma-max"], type=POSITIVE, default=80.0, show_default=True),
    ]

    @click.pass_context
    def align_cmd(ctx, device, dtype, progress, **kwargs) -> None:
        """Reward-aligned samples (DAS by default); write samples.png, samples.safetensors and metrics.json to
        --out."""
        dist, started = begin(ctx, "align", device, ignore=("progress",))
        try:
            spec = ALIGNERS.get(kwargs["method"])
            if dist.distributed and not spec.distributed:
                raise click.UsageError(f"--method {kwargs['method']} runs in one process: launch it without torchrun")
            if dist.distributed and kwargs["pipeline_dir"] is not None:
                raise click.UsageError("--pipeline runs in one process: launch it without torchrun")
            options = _method_options(ctx, spec, kwargs, tuple(per_method))
            _align(ctx, dist, spec, options, device=rank_device(dist, device), dtype=dtype,
                   progress=progress and dist.is_main, **kwargs)
        finally:
            end(started)

    command = click.Command("align", callback=align_cmd, params=params, help=align_cmd.__doc__)
    command = dtype_option(device_option(command))
    command.params += [
        click.Option(["--out"], default="out", show_default=True, help="Output directory."),
        progress_param("Progress bar with the ESS [default: on when stderr is a terminal]."),
    ]
    return command


def _given(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was set away from its default (on the command line or by the environment)."""
    source = ctx.get_parameter_source(name)
    if source in (None, click.core.ParameterSource.DEFAULT):
        return False
    default = next(p.default for p in ctx.command.params if p.name == name)
    return ctx.params[name] != default


def _method_options(ctx: click.Context, spec, kwargs: dict, offered: tuple[str, ...]) -> dict:
    """The options given on the command line for the chosen aligner ``spec``; an option it does not take is refused
    (unless left at its default), naming the option and the method."""
    method = kwargs["method"]
    # The command's own options that an aligner may not take: the option's name -> the aligner's argument.
    own = {"alpha": "alpha", "particles": "particles", "class_": "cond", "batch_size": "batch_size"}
    if kwargs["pipeline_dir"] is None:
        own["scale"] = "scale"  # with --pipeline, --scale is the prompt model's CFG scale
    refused = [n for n in offered if n not in spec.options and kwargs[n] is not None]
    refused += [n for n, arg in own.items() if (arg not in spec.options or (n == "particles" and not spec.particles))
                and _given(ctx, n)]
    if refused:
        flags = {p.name: p.opts[0] for p in ctx.command.params}
        takes = [flags[n] for n in (*offered, *own) if own.get(n, n) in spec.options
                 and (n != "particles" or spec.particles)]
        raise click.UsageError(f"{', '.join(flags[n] for n in refused)}: not an option of --method {method} "
                               f"({spec.name} takes {', '.join(takes) or 'none of the method options'})")
    return {n: kwargs[n] for n in offered if n in spec.options and kwargs[n] is not None}


def _resolved(spec, options: dict, offered) -> dict:
    """The method's options as run: those given, and the method's defaults of the other command-line options."""
    defaults = {n: d for n, d in spec.defaults().items() if n in offered}
    return defaults | options


def _align(ctx, dist, spec, options, *, model_name, pipeline_dir, prompts, negatives, height, width, rewards, alpha,
           method, particles, n, steps, seed, class_, scale, batch_size, sigma_min, sigma_max, device, out, progress,
           dtype=torch.float32, **_method) -> None:
    """``steerdiff align`` once the process group is joined: every rank runs the aligner ``spec`` with ``options`` on
    its particles, rank 0 measures and writes."""
    offered = tuple(_method)
    shared = {"alpha": alpha} if "alpha" in spec.options else {}
    k = particles if spec.particles else 1
    resolved = _resolved(spec, options, offered)
    if "scale" in spec.options and pipeline_dir is None:
        resolved["scale"] = scale

    def call(model, reward, noise, sigmas, parts, cond, extra):
        kw = dict(particles=parts, cond=cond, generator=seed + 10**9, batch_size=batch_size, progress=progress)
        kw = {key: v for key, v in (kw | shared | extra).items() if key in spec.options}
        return spec.fn(model, reward, noise, sigmas, **kw, **options)

    if pipeline_dir is not None:
        if not spec.pipelines:
            raise click.UsageError(f"--method {method} does not run on a pipeline")
        if ctx.get_parameter_source("model_name") is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--pipeline and --model are mutually exclusive: align a pipeline directory or a "
                                   "model, not both")
        reject_options(ctx, ("class_", "sigma_min", "sigma_max"),
                       "not used with --pipeline (its prompts and scheduler define the run)")
        prompts, negatives = check_prompts(prompts, negatives)
        check_out(out)

        def run_method(model, reward, noise, sigmas, parts, cond):
            return call(model, reward, noise, sigmas, parts, cond, {})

        settings = shared | {"particles": k} | resolved
        align_pipeline(pipeline_dir, prompts, negatives, n, rewards=rewards, method=method, run_method=run_method,
                       particles=k, steps=steps, seed=seed, scale=scale, height=height, width=width, device=device,
                       out=out, progress=progress, settings=settings, dtype=dtype)
        return
    reject_options(ctx, ("prompts", "negatives", "height", "width"), "these options apply to --pipeline only")
    check_sigmas(sigma_min, sigma_max)
    check_out(out)
    model, is_mixture = load_denoiser(model_name, device)
    check_sigma_in_range(model, sigma_max, model_name, "--sigma-max")
    if is_mixture:
        refuse_dtype(dtype, "align", f"{model_name} is a built-in mixture, an exact denoiser evaluated in float64")
    else:  # the network runs in --dtype; the particles stay in float32 (as sample's state: small updates kept)
        model = model_to_dtype(model, dtype, "align", model_name)
    state = torch.float64 if is_mixture else torch.float32
    shape = tuple(model.sample_shape)
    reward = _reward(rewards, is_mixture, shape, device)
    cond = None
    if class_ is not None:
        check_class(class_, () if is_mixture else getattr(model, "num_classes", ()), model_name)
        cond = torch.full((n,), class_, device=device)
    # The last noise level is sigma_min > 0, so DAS's last proposal is stochastic like the others.
    sigmas = karras_schedule(steps + 1, sigma_min, sigma_max, 7.0)[:-1]
    noise = core.randn((n * k, *shape), seeds=seed, dtype=state, device=device)
    extra = {"dist": dist} | ({"scale": scale} if _given(ctx, "scale") else {})
    try:
        res = call(model, reward, noise, sigmas, k, cond, extra)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    if not dist.is_main:  # every rank holds the result; rank 0 writes it
        return
    out_dir = prepare_out(out)
    result = ({"model": model_name, "rewards": list(rewards), "alpha": alpha, "method": method, "steps": steps,
               "n": n, "seed": seed, "dtype": str(dtype).removeprefix("torch.")} | resolved | res.summary())
    if "potential_steps" in res.extras:
        result["potential_steps"] = res.extras["potential_steps"]
    if res.ess is not None:
        result["ess_frac_per_step"] = (res.ess.mean(1) / res.particles).tolist()
        result["lambda_per_step"] = res.lambdas.mean(1).tolist()
        result["resample_steps_group0"] = res.resample_steps[0]
    samples = res.samples.detach().cpu()
    if is_mixture and len(rewards) == 1 and isinstance(reward, Linear):
        result.update(_exact_linear(model, reward, alpha, samples))
    if not is_mixture and shape == (1, 8, 8):
        result.update(_digits_metrics(samples, rewards))
    start_outputs(out_dir)  # the summary comes last: a failure in between leaves none
    options_meta = {key: v for key, v in ctx.params.items()
                    if key not in ("out", "progress", "device", "pipeline_dir", "prompts", "negatives", "height",
                                   "width", *offered)} | resolved
    write_samples(out_dir, {"samples": samples} | ({"labels": cond.cpu()} if cond is not None else {}),
                  {"command": "align", "seeds": format_seeds(range(seed, seed + n * k)), "options": options_meta})
    plot_samples(samples, out_dir / "samples.png", title=f"{method}: {', '.join(rewards)}, alpha {alpha:g}")
    path = write_metrics(out_dir, result)
    for key in ("reward_mean", "nfe", "nfe_grad", "ess_mean_frac", "resamples_per_group", "relerr_to_exact",
                "class_accuracy"):
        if key in result and isinstance(result[key], float) and math.isfinite(result[key]):
            click.echo(f"{key:>20}: {result[key]:.4g}")
    click.echo(f"wrote {path}, {out_dir / 'samples.png'} and {out_dir / 'samples.safetensors'}")


align_cmd = build_align_command()


def _exact_linear(mixture, reward: Linear, alpha: float, samples) -> dict:
    """The exact mean reward under the tilted mixture, and the samples' errors to it."""
    from ...metrics import mode_weight_error

    try:
        tilted = mixture.tilt_linear(reward.a, alpha)
    except ValueError as err:  # exp(a . mu / alpha) overflows: the tilted weights are not representable
        click.echo(f"warning: no exact reference at --alpha {alpha:g} for this reward (the tilted mixture's weights "
                   f"overflow: {err}); metrics.json has no relerr_to_exact", err=True)
        return {}
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
