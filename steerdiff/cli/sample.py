"""``steerdiff sample``: samples of a built-in mixture or a trained model, unguided or guided.

    steerdiff sample --model gmm2d --class 2 --guidance apg --scale 8 --out out/
    steerdiff sample --model digits --n 256 --out out/
    steerdiff sample --model shapes_coind --expr 'shape=disk & !colour=red' --scale 3 --out out/
    steerdiff sample --model digits --covariance ocm --steps 10 --out out/
    steerdiff sample --model digits --init digits:test:0 --strength 0.5 --class 3 --out out/
    steerdiff sample --pipeline DIR --prompt "a red disk" --negative "a square" --guidance apg --scale 10 --out out/

Guidance is CFG, CFG-rescale (Lin et al. 2023) or APG (Sadat et al. 2025), built through the guider registry;
``--expr`` samples a logical query over attribute values (CoInD, logical composition, Gaudi et al. 2025);
``--covariance ocm`` samples with the model's learned diagonal covariance (OCM, Ou et al. 2025); ``--init`` starts
from a given sample (diffusers' img2img rule: with ``--strength s`` the run starts at step
``steps - min(int(steps * s), steps)`` of the schedule, from ``init + sigma * noise``). Writes ``samples.png``,
``samples.safetensors`` and ``metrics.json``: NFE and wall time; for a built-in mixture (without ``--init``) the
sliced Wasserstein distance, MMD and mode-weight error to exact samples of the (conditional) target; for digits
models the class accuracy (and FID-digits for n >= 200) under the shipped classifier; for a query on the shapes
models its conformity.

``--pipeline DIR`` samples a diffusers text-to-image pipeline directory (loaded by ``sd.pipelines.load``:
safetensors only, no custom code) instead of ``--model``: ``--n`` images per ``--prompt`` (image ``j`` from seed
``seed + j``), ``--scale`` in diffusers' ``guidance_scale`` convention (default 7.5), ``--method`` by default the
sampler equivalent to the pipeline's scheduler; it also writes one ``image_NNN.png`` per image, and
``samples.safetensors`` holds the images in [-1, 1] (steerdiff/cli/_pipelines.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click
import torch

from .. import core, metrics
from ..guidance import build_guider
from ..models.gmm import BUILTIN_MIXTURES
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
    load_model,
    plot_samples,
    prepare_out,
    write_metrics,
)
from ._inputs import SPEC_HELP, read_start
from ._pipelines import check_prompts, reject_options, sample_pipeline

# Samplers that run without extra inputs (OCM's kernels need a covariance head: --covariance ocm).
METHODS = [name for name, spec in core.SAMPLERS.items() if not spec.required]
# --guidance value -> the options of this command its guider takes (the guider comes from guidance.GUIDERS).
GUIDER_OPTIONS = {"cfg": (), "cfg-rescale": ("phi",), "apg": ("eta", "momentum", "r_rms")}
DEFAULT_STRENGTH = 0.8  # diffusers' img2img default


@dataclass
class _Run:
    """What every sampling path shares: the sampler, the schedule, the batch, the device and the start."""

    method: str
    steps: int
    n: int
    seed: int
    sigmas: torch.Tensor
    eta: float | None
    progress: bool
    device: torch.device
    init: str | None = None
    strength: float | None = None

    def start_at(self, shape, dtype: torch.dtype) -> dict:
        """``core.sample``'s ``x_start``/``strength`` for ``--init`` (read and checked against ``shape``)."""
        if self.init is None:
            return {}
        x = read_start(self.init, shape, self.n).to(self.device, dtype)
        return {"x_start": x, "strength": self.strength}

    def info(self) -> dict:
        """The start as recorded in ``metrics.json``: the step and noise level the run starts from."""
        if self.init is None:
            return {}
        first = self.steps - min(int(self.steps * self.strength), self.steps)
        return {"init": self.init, "strength": self.strength, "start_step": first,
                "start_sigma": float(self.sigmas[first])}


def _check_init(init: str | None, strength: float | None, steps: int) -> float | None:
    """``--init``/``--strength``: the strength used (diffusers' default 0.8), checked to run at least one step."""
    if init is None:
        if strength is not None:
            raise click.BadParameter("--strength applies to --init only", param_hint="--strength")
        return None
    strength = DEFAULT_STRENGTH if strength is None else strength
    if int(steps * strength) < 1:
        raise click.BadParameter(f"{strength:g} with --steps {steps} runs int({steps} * {strength:g}) = 0 steps; "
                                 "raise --strength or --steps", param_hint="--strength")
    return strength


@click.command("sample")
@click.option("--model", "model_name", default="gmm2d", show_default=True,
              help="A built-in mixture (gmm1d, gmm2d, gmm16d), a shipped model (digits, toy2d) or a model directory.")
@click.option("--pipeline", "pipeline_dir", default=None, metavar="DIR",
              help="A diffusers text-to-image pipeline directory (save_pretrained; safetensors only) instead of "
                   "--model; with --prompt, --negative, --height, --width.")
@click.option("--prompt", "prompts", multiple=True, help="--pipeline: a prompt; repeat for several.")
@click.option("--negative", "negatives", multiple=True,
              help="--pipeline: a negative prompt, one for all prompts or one per --prompt (default empty).")
@click.option("--height", type=click.IntRange(min=1), default=None, help="--pipeline: image height in pixels.")
@click.option("--width", type=click.IntRange(min=1), default=None, help="--pipeline: image width in pixels.")
@click.option("--method", type=click.Choice(METHODS), default=None,
              help="Sampler [default: heun; with --pipeline the equivalent of the pipeline's scheduler].")
@click.option("--steps", type=click.IntRange(min=1), default=50, show_default=True, help="Sampling steps.")
@click.option("--n", "n", type=click.IntRange(min=1), default=None,
              help="Number of samples [default: 2000, at least 2; with --pipeline: images per prompt, default 1].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Sample i uses seed + i.")
@click.option("--class", "class_", type=int, default=None,
              help="Class label for a conditional model (default: classes spread evenly).")
@click.option("--guidance", "guidance_name", type=click.Choice(list(GUIDER_OPTIONS)), default="cfg",
              show_default=True, help="Guider used when --scale != 1.")
@click.option("--scale", type=finite_range(min=0), default=None,
              help="Guidance scale w in D_u + w (D_c - D_u) (diffusers' guidance_scale); 1 = plain conditional "
                   "[default: 1; with --pipeline 7.5].")
@click.option("--eta", type=finite_range(0, 1), default=0.0, show_default=True,
              help="APG: weight of the update's component parallel to D_c (1 with no clamp/momentum = CFG).")
@click.option("--momentum", type=FINITE, default=-0.5, show_default=True, help="APG: momentum beta, |beta| < 1.")
@click.option("--r-rms", type=finite_range(min=0), default=None,
              help="APG: clamp of the update's norm per element RMS (r = r_rms * sqrt(d)); default no clamp.")
@click.option("--phi", type=finite_range(0, 1), default=0.7, show_default=True, help="CFG-rescale: phi.")
@click.option("--schedule", type=click.Choice(["auto", "karras", "flow"]), default="auto", show_default=True,
              help="Noise levels: karras (sigma-min/max, rho) or flow (from pure noise, sigma = inf: t uniform in "
                   "(0, 1], FLUX's grid, with --shift); auto = flow for a flow-matching model, else karras.")
@click.option("--shift", type=POSITIVE, default=1.0, show_default=True,
              help="Flow schedule: the static time shift s of t' = s t / (1 + (s - 1) t) (3 for SD3).")
@click.option("--sigma-min", type=POSITIVE, default=0.002, show_default=True)
@click.option("--sigma-max", type=POSITIVE, default=80.0, show_default=True)
@click.option("--rho", type=POSITIVE, default=7.0, show_default=True, help="Karras schedule exponent.")
@click.option("--ddim-eta", type=finite_range(0, 1), default=None, help="DDIM stochasticity (ddim only).")
@click.option("--expr", default=None,
              help="Multi-attribute models: a logical query composed over attribute values (CoInD, logical "
                   "composition), e.g. 'shape=disk & !colour=red' or '2*shape=disk & !colour={red,green}'; --scale "
                   "is its weight w.")
@click.option("--compose", "compose_mode", type=click.Choice(["and", "joint"]), default="and", show_default=True,
              help="With --expr: 'and' composes the marginals; 'joint' is joint CFG on the joint label.")
@click.option("--covariance", "covariance_name", type=click.Choice(["none", "ocm"]), default="none",
              show_default=True,
              help="ocm: the model's shipped OCM head (learned diagonal covariance, Ou et al. 2025); samples with "
                   "ocm-ddim (ocm-ddpm with --method ddpm) on the VP-linear grid, unguided.")
@click.option("--init", default=None, metavar="SPEC",
              help=f"Start from this sample instead of pure noise ({SPEC_HELP}); one sample of the model's shape, "
                   "shared by every row, or one per row.")
@click.option("--strength", type=finite_range(0, 1, min_open=True), default=None,
              help=f"With --init: the share of the schedule run, in (0, 1] (default {DEFAULT_STRENGTH}; 1 starts at "
                   "the top noise level).")
@device_option
@click.option("--out", default="out", show_default=True, help="Output directory.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.pass_context
def sample_cmd(ctx, model_name, pipeline_dir, prompts, negatives, height, width, method, steps, n, seed, class_,
               guidance_name, scale, eta, momentum, r_rms, phi, schedule, shift, sigma_min, sigma_max, rho, ddim_eta,
               expr, compose_mode, covariance_name, init, strength, device, out, progress) -> None:
    """Draw samples; write samples.png, samples.safetensors and metrics.json to --out."""
    if pipeline_dir is not None:
        _sample_pipeline(ctx, pipeline_dir, prompts, negatives, height, width, method, steps, n, seed,
                         guidance_name, scale, eta, momentum, r_rms, phi, device, out, progress)
        return
    reject_options(ctx, ("prompts", "negatives", "height", "width"), "these options apply to --pipeline only")
    method = "heun" if method is None else method
    scale = 1.0 if scale is None else scale
    n = 2000 if n is None else n
    if n < 2:
        raise click.BadParameter(f"{n} is smaller than the minimum 2 (without --pipeline)", param_hint="--n")
    check_sigmas(sigma_min, sigma_max)
    check_out(out)
    strength = _check_init(init, strength, steps)
    if ddim_eta is not None and method != "ddim":
        raise click.BadParameter("--ddim-eta applies to --method ddim only", param_hint="--ddim-eta")
    if covariance_name != "none":
        if scale != 1.0 or expr is not None:
            raise click.BadParameter("--covariance ocm samples the unguided model (--scale 1, no --expr): the head "
                                     "is the Jacobian of the unguided denoiser", param_hint="--covariance")
        if model_name in BUILTIN_MIXTURES:
            raise click.BadParameter("built-in mixtures have no shipped head; use a shipped model such as digits",
                                     param_hint="--covariance")
    run = _Run(method, steps, n, seed, core.sigmas.karras(steps, sigma_min, sigma_max, rho), ddim_eta, progress,
               device, init, strength)
    if expr is not None:
        _sample_expr(model_name, expr, compose_mode, scale, class_, guidance_name, run, out)
        return
    guider_options = {"phi": phi, "eta": eta, "momentum": momentum, "r_rms": r_rms}
    try:
        guider = build_guider(guidance_name, scale, **{k: guider_options[k] for k in GUIDER_OPTIONS[guidance_name]})
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--guidance options") from err
    model, is_mixture = load_denoiser(model_name, device)
    if schedule == "flow" or (schedule == "auto" and isinstance(model, core.FlowDenoiser)):
        if covariance_name != "none":
            raise click.BadParameter("--covariance ocm runs on the VP-linear grid, not a flow schedule",
                                     param_hint="--schedule")
        run.sigmas = core.sigmas.flow(steps, shift, grid="flux")
        schedule = "flow"
    if is_mixture:
        result = _sample_mixture(model, model_name, out, class_=class_, scale=scale, guider=guider, run=run)
    else:
        head = None
        if covariance_name == "ocm":
            from ..core.sigmas import vp_linear
            from ..covariance import load_head_for
            from ..io import CheckpointError

            try:
                head = load_head_for(model_name, model).to(device)
            except (CheckpointError, FileNotFoundError) as err:
                raise click.BadParameter(str(err), param_hint="--covariance") from err
            run.sigmas = vp_linear(steps)  # the grid the head was trained and benchmarked on
            run.method = "ocm-ddpm" if method == "ddpm" else "ocm-ddim"
        result = _sample_network(model, model_name, out, class_=class_, scale=scale, guider=guider, run=run,
                                 covariance=head)
    if scale != 1.0:
        result["guidance"] = {"name": guidance_name, **guider.config}
    if covariance_name == "ocm":
        result["schedule"] = {"kind": "vp-linear", "steps": steps}
    elif schedule == "flow":
        result["schedule"] = {"kind": "flow", "grid": "flux", "shift": shift, "steps": steps}
    else:
        result["schedule"] = {"kind": "karras", "sigma_min": sigma_min, "sigma_max": sigma_max, "rho": rho}
    _finish(result, Path(out))


# Options of the --model path that a pipeline does not take (its schedule and condition come from the pipeline).
_MODEL_ONLY = ("model_name", "class_", "schedule", "shift", "sigma_min", "sigma_max", "rho", "ddim_eta", "expr",
               "compose_mode", "covariance_name", "init", "strength")


def _sample_pipeline(ctx, pipeline_dir, prompts, negatives, height, width, method, steps, n, seed, guidance_name,
                     scale, eta, momentum, r_rms, phi, device, out, progress) -> None:
    """``sample --pipeline DIR``: text to image with a diffusers pipeline (steerdiff/cli/_pipelines.py)."""
    if ctx.get_parameter_source("model_name") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--pipeline and --model are mutually exclusive: sample a pipeline directory or a "
                               "model, not both")
    reject_options(ctx, _MODEL_ONLY, "not used with --pipeline (its schedule and prompts define the run)")
    prompts, negatives = check_prompts(prompts, negatives)
    check_out(out)
    scale = 7.5 if scale is None else scale
    guider = None
    if guidance_name != "cfg":
        guider_options = {"phi": phi, "eta": eta, "momentum": momentum, "r_rms": r_rms}
        try:
            guider = build_guider(guidance_name, scale,
                                  **{k: guider_options[k] for k in GUIDER_OPTIONS[guidance_name]})
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--guidance options") from err
    sample_pipeline(pipeline_dir, prompts, negatives, 1 if n is None else n, guidance_name=guidance_name,
                    guider=guider, scale=scale, method=method, steps=steps, seed=seed, height=height, width=width,
                    device=device, out=out, progress=progress)


def _draw(model, noise, run: _Run, cond, guidance, start: dict, **extra):
    """``core.sample`` with the run's settings; a bad start or condition found by the sampler is a usage error."""
    try:
        return core.sample(model, noise, run.sigmas, method=run.method, cond=cond, guidance=guidance,
                           generator=run.seed + 10**9, eta=run.eta, progress=run.progress, return_stats=True,
                           **start, **extra)
    except ValueError as err:
        raise click.UsageError(str(err)) from err


def _save(samples: torch.Tensor, out_dir: Path) -> None:
    from ..io import save_tensors

    save_tensors({"samples": samples.detach().cpu().contiguous()}, out_dir / "samples.safetensors")


def _finish(result: dict, out_dir: Path) -> None:
    """Write metrics.json and print its numbers."""
    path = write_metrics(out_dir, result)
    for key, value in result.items():
        if isinstance(value, float):
            click.echo(f"{key:>26}: {value:.4g}")
    click.echo(f"wrote {path}, {out_dir / 'samples.png'} and {out_dir / 'samples.safetensors'}")


def _sample_mixture(mixture, model_name, out, class_, scale, guider, run: _Run) -> dict:
    """A built-in mixture's exact denoiser, measured against exact samples of the (conditional) target."""
    target, cond = mixture, None
    if class_ is not None:  # the exact conditional model: the components carrying that label
        k = mixture.n_components
        if not 0 <= class_ < k:
            raise click.BadParameter(f"must be in [0, {k - 1}] for {model_name}", param_hint="--class")
        target, cond = mixture.restrict(torch.tensor(class_)), torch.full((run.n,), class_, device=run.device)
    elif scale != 1.0:
        raise click.BadParameter("guidance (--scale != 1) needs --class", param_hint="--scale")
    start = run.start_at(mixture.sample_shape, torch.float64)
    out_dir = prepare_out(out)
    noise = core.randn((run.n, mixture.dim), seeds=run.seed, dtype=torch.float64, device=run.device)
    samples, stats = _draw(mixture, noise, run, cond, guider if scale != 1.0 else None, start)
    samples = samples.cpu()
    result = {"model": model_name, "method": run.method, "steps": run.steps, "n": run.n, "seed": run.seed,
              "class": class_, "scale": scale, "nfe": stats.nfe, "wall_time_s": stats.wall_time} | run.info()
    # Reference: exact samples of the (conditional) target from a seed disjoint from the sampler's. A run from
    # --init targets another law (the posterior around the start, for a stochastic sampler), so none is reported.
    g = torch.Generator().manual_seed(run.seed + 2 * 10**9)
    exact, exact2 = target.sample(run.n, generator=g), target.sample(run.n, generator=g)
    if run.init is None:
        result |= {
            "sliced_w2_to_exact": metrics.sliced_wasserstein(samples, exact),
            "sliced_w2_exact_vs_exact": metrics.sliced_wasserstein(exact2, exact),
            "mmd_rbf_to_exact": metrics.mmd_rbf(samples, exact),
            "mode_weight_error": metrics.mode_weight_error(samples, target),
            "mode_weight_error_exact": metrics.mode_weight_error(exact, target),
        }
    _save(samples, out_dir)
    title = f"{model_name}: {run.method}, {run.steps} steps, NFE {stats.nfe:g}"
    if "sliced_w2_to_exact" in result:
        title += f", SW2 {result['sliced_w2_to_exact']:.3f}"
    plot_samples(samples, out_dir / "samples.png", reference=exact, title=title)
    return result


def _sample_expr(model_name, expr, mode, scale, class_, guidance_name, run: _Run, out) -> None:
    """``sample --expr``: logical composition over attribute values with :class:`steerdiff.guidance.Compose`."""
    from ..guidance.compose import Compose, load_composable

    if class_ is not None or guidance_name != "cfg":
        raise click.BadParameter("--expr defines the query; do not combine it with --class or --guidance",
                                 param_hint="--expr")
    if model_name in BUILTIN_MIXTURES:
        raise click.BadParameter(f"{model_name} has no attribute slots; use a multi-attribute model such as "
                                 "shapes_coind", param_hint="--model")
    model = load_model(model_name, extra=sorted(BUILTIN_MIXTURES), loader=load_composable, device=run.device)
    try:
        guider = Compose.for_model(model, expr, scale, mode=mode)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--expr") from err
    start = run.start_at(model.sample_shape, torch.float32)
    out_dir = prepare_out(out)
    noise = core.randn((run.n, *model.sample_shape), seeds=run.seed, device=run.device)
    with torch.no_grad():
        samples, stats = _draw(model, noise, run, guider.cond(run.n, run.device), guider, start)
    samples = samples.cpu()
    result = {"model": model_name, "method": run.method, "steps": run.steps, "n": run.n, "seed": run.seed,
              "expr": expr, "guidance": {"name": "compose", **guider.config}, "nfe": stats.nfe,
              "wall_time_s": stats.wall_time} | run.info()
    from ..models.io import load, shipped_models

    if samples.shape[1:] == (3, 12, 12) and "shapes_classifier" in shipped_models():
        from ..metrics.composition import conformity

        pred = load("shapes_classifier").predict(samples.clamp(-1, 1))
        result["conformity"] = conformity(pred, guider.terms)
    _save(samples, out_dir)
    plot_samples(samples, out_dir / "samples.png", title=f"{model_name}: {expr}", max_images=256)
    _finish(result, out_dir)


def _sample_network(model, model_name, out, class_, scale, guider, run: _Run, covariance=None) -> dict:
    """A trained model, unconditional or class-conditional (classes spread evenly unless --class)."""
    num_classes = tuple(getattr(model, "num_classes", ()) or ())
    cond = None
    if num_classes:
        if len(num_classes) != 1:
            raise click.BadParameter("multi-attribute models are sampled with --expr, e.g. "
                                     "--expr 'shape=disk & !colour=red'", param_hint="--model")
        check_class(class_, num_classes, model_name)
        k = num_classes[0]
        cond = torch.full((run.n,), class_) if class_ is not None else torch.arange(run.n) % k
        cond = cond.to(run.device)
    elif class_ is not None or scale != 1.0:
        raise click.BadParameter(f"{model_name} is unconditional", param_hint="--class")
    start = run.start_at(model.sample_shape, torch.float32)
    out_dir = prepare_out(out)
    noise = core.randn((run.n, *model.sample_shape), seeds=run.seed, device=run.device)
    with torch.no_grad():
        samples, stats = _draw(model, noise, run, cond, guider if scale != 1.0 else None, start,
                               covariance=covariance)
    samples = samples.cpu()
    result = {"model": model_name, "method": run.method, "steps": run.steps, "n": run.n, "seed": run.seed,
              "scale": scale, "class": class_, "nfe": stats.nfe, "wall_time_s": stats.wall_time} | run.info()
    if covariance is not None:
        result["clamped_variances"] = stats.clamped
    if len(model.sample_shape) == 3:
        result.update(_image_metrics(samples, None if cond is None else cond.cpu(), class_))
    _save(samples, out_dir)
    plot_samples(samples, out_dir / "samples.png", title=f"{model_name}: {run.method}, {run.steps} steps",
                 max_images=256)
    return result


def _image_metrics(samples: torch.Tensor, cond, class_: int | None = None) -> dict:
    """Class accuracy (and FID-digits for n >= 200) with the shipped digits classifier, for digits models.

    FID is measured against the test images of the classes sampled: all of them, or only ``class_``'s (against
    the whole test set a one-class sample would score its missing classes, not its quality)."""
    from ..models.io import load, shipped_models

    if samples.shape[1:] != (1, 8, 8) or "digits_classifier" not in shipped_models():
        return {}
    from ..data.digits import load_digits
    from ..metrics.images import class_accuracy, classifier_features, frechet_distance

    clf = load("digits_classifier")
    images = samples.clamp(-1, 1)
    out = {}
    if cond is not None:
        out["class_accuracy"] = class_accuracy(clf, images, cond)
    if images.shape[0] >= 200:
        test_images, test_labels = load_digits("test")
        key = "fid_digits_vs_test"
        if class_ is not None:
            test_images, key = test_images[test_labels == class_], f"fid_digits_vs_test_class_{class_}"
        out[key] = frechet_distance(classifier_features(clf, test_images), classifier_features(clf, images))
    return out
