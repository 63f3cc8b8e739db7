"""The ``steerdiff`` command line (click): sample, and later train, bench and demo."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import click
import torch

from . import core, metrics
from .models.gmm import BUILTIN_MIXTURES, builtin_mixture


def write_json_atomic(obj: dict, path: Path) -> None:
    """Write JSON to a temporary file beside ``path`` and move it into place (numbers of other types, e.g. numpy
    or 0-d tensors, are written as floats)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, default=float)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _prepare_out(out: str) -> Path:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK):
        raise click.BadParameter(f"{out} is not writable", param_hint="--out")
    return path


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="steerdiff")
def main() -> None:
    """Steer diffusion models at sampling time."""


def _model_choices() -> str:
    from .models.io import shipped_models

    return ", ".join(sorted(BUILTIN_MIXTURES) + shipped_models())


@main.command("sample")
@click.option("--model", "model_name", default="gmm2d", show_default=True,
              help="A built-in mixture (gmm1d, gmm2d, gmm16d), a shipped model (digits, toy2d) or a model directory.")
@click.option("--method", type=click.Choice(sorted(core.SAMPLERS)), default="heun", show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=50, show_default=True, help="Sampling steps.")
@click.option("--n", "n", type=click.IntRange(min=2), default=2000, show_default=True, help="Number of samples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sample i uses seed + i.")
@click.option("--class", "class_", type=int, default=None,
              help="Class label for a conditional model (default: classes spread evenly).")
@click.option("--guidance", "guidance_name", type=click.Choice(["cfg", "cfg-rescale", "apg"]), default="cfg",
              show_default=True, help="Guider used when --scale != 1.")
@click.option("--scale", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Guidance scale w in D_u + w (D_c - D_u) (diffusers' guidance_scale); 1 = plain conditional.")
@click.option("--eta", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="APG: weight of the update's component parallel to D_c (1 with no clamp/momentum = CFG).")
@click.option("--momentum", type=float, default=-0.5, show_default=True, help="APG: momentum beta, |beta| < 1.")
@click.option("--r-rms", type=click.FloatRange(min=0), default=None,
              help="APG: clamp of the update's norm per element RMS (r = r_rms * sqrt(d)); default no clamp.")
@click.option("--phi", type=click.FloatRange(0, 1), default=0.7, show_default=True, help="CFG-rescale: phi.")
@click.option("--sigma-min", type=float, default=0.002, show_default=True)
@click.option("--sigma-max", type=float, default=80.0, show_default=True)
@click.option("--rho", type=float, default=7.0, show_default=True, help="Karras schedule exponent.")
@click.option("--ddim-eta", type=click.FloatRange(0, 1), default=None, help="DDIM stochasticity (ddim only).")
@click.option("--expr", default=None,
              help="Multi-attribute models: a logical query composed over attribute values (guidance.md 4.3), e.g. "
                   "'shape=disk & !colour=red' or '2*shape=disk & !colour={red,green}'; --scale is its weight w.")
@click.option("--compose", "compose_mode", type=click.Choice(["and", "joint"]), default="and", show_default=True,
              help="With --expr: 'and' composes the marginals; 'joint' is joint CFG on the joint label.")
@click.option("--covariance", "covariance_name", type=click.Choice(["none", "ocm"]), default="none",
              show_default=True,
              help="ocm: the model's shipped OCM head (learned diagonal covariance, covariance.md); samples with "
                   "ocm-ddim (ocm-ddpm with --method ddpm) on the VP-linear grid, unguided.")
@click.option("--out", default="out", show_default=True, help="Output directory.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def sample_cmd(model_name, method, steps, n, seed, class_, guidance_name, scale, eta, momentum, r_rms, phi,
               sigma_min, sigma_max, rho, ddim_eta, expr, compose_mode, covariance_name, out, progress) -> None:
    """Draw samples; write a plot or image grid (samples.png) and metrics (metrics.json) to --out."""
    if ddim_eta is not None and method != "ddim":
        raise click.BadParameter("--ddim-eta applies to --method ddim only", param_hint="--ddim-eta")
    if covariance_name != "none":
        if scale != 1.0 or expr is not None:
            raise click.BadParameter("--covariance ocm samples the unguided model (--scale 1, no --expr): the head "
                                     "is the Jacobian of the unguided denoiser", param_hint="--covariance")
        if model_name in BUILTIN_MIXTURES:
            raise click.BadParameter("built-in mixtures have no shipped head; use a shipped model such as digits",
                                     param_hint="--covariance")
    if expr is not None:
        _sample_expr_cmd(model_name, expr, compose_mode, scale, class_, guidance_name, method, steps, n, seed,
                         core.sigmas.karras(steps, sigma_min, sigma_max, rho), ddim_eta, out, progress)
        return
    from . import guidance as guiders

    try:
        guider = {
            "cfg": lambda: guiders.CFG(scale),
            "cfg-rescale": lambda: guiders.CFGRescale(scale, phi=phi),
            "apg": lambda: guiders.APG(scale, eta=eta, momentum=momentum, r_rms=r_rms),
        }[guidance_name]()
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--guidance options") from err
    eta = ddim_eta
    out_dir = _prepare_out(out)
    sigmas = core.sigmas.karras(steps, sigma_min, sigma_max, rho)
    common = dict(method=method, steps=steps, n=n, seed=seed, sigmas=sigmas, eta=eta, progress=progress)
    if model_name in BUILTIN_MIXTURES:
        result = _sample_mixture(model_name, out_dir, class_=class_, scale=scale, guider=guider, **common)
    else:
        from .io import CheckpointError
        from .models.io import load

        try:
            model = load(model_name)
        except (CheckpointError, FileNotFoundError) as err:
            raise click.BadParameter(f"{err}. Available: {_model_choices()}", param_hint="--model") from err
        if covariance_name == "ocm":
            from .core.sigmas import vp_linear
            from .covariance import load_head_for

            try:
                head = load_head_for(model_name, model)
            except (CheckpointError, FileNotFoundError) as err:
                raise click.BadParameter(str(err), param_hint="--covariance") from err
            sigmas = vp_linear(steps)  # the grid the head was trained and benchmarked on
            common.update(sigmas=sigmas, method="ocm-ddpm" if method == "ddpm" else "ocm-ddim")
            result = _sample_network(model, model_name, out_dir, class_=class_, scale=scale, guider=guider,
                                     covariance=head, **common)
        else:
            result = _sample_network(model, model_name, out_dir, class_=class_, scale=scale, guider=guider,
                                     **common)
    if scale != 1.0:
        result["guidance"] = {"name": guidance_name, **guider.config}
    if covariance_name == "ocm":
        result["schedule"] = {"kind": "vp-linear", "steps": steps}
    else:
        result["schedule"] = {"kind": "karras", "sigma_min": sigma_min, "sigma_max": sigma_max, "rho": rho}
    write_json_atomic(result, out_dir / "metrics.json")
    for key, value in result.items():
        if isinstance(value, float):
            click.echo(f"{key:>26}: {value:.4g}")
    click.echo(f"wrote {out_dir / 'metrics.json'} and {out_dir / 'samples.png'}")


def _sample_mixture(model_name, out_dir, class_, scale, guider, method, steps, n, seed, sigmas, eta, progress) -> dict:
    mixture = builtin_mixture(model_name)
    target, cond = mixture, None
    if class_ is not None:  # the exact conditional model: the components carrying that label
        k = mixture.n_components
        if not 0 <= class_ < k:
            raise click.BadParameter(f"must be in [0, {k - 1}] for {model_name}", param_hint="--class")
        target, cond = mixture.restrict(torch.tensor(class_)), torch.full((n,), class_)
    elif scale != 1.0:
        raise click.BadParameter("guidance (--scale != 1) needs --class", param_hint="--scale")
    noise = core.randn((n, mixture.dim), seeds=seed, dtype=torch.float64)
    samples, stats = core.sample(mixture, noise, sigmas, method=method, cond=cond,
                                 guidance=guider if scale != 1.0 else None, generator=seed + 10**9, eta=eta,
                                 progress=progress, return_stats=True)
    # Reference: exact samples of the (conditional) target from a seed disjoint from the sampler's.
    g = torch.Generator().manual_seed(seed + 2 * 10**9)
    exact, exact2 = target.sample(n, generator=g), target.sample(n, generator=g)
    result = {
        "model": model_name, "method": method, "steps": steps, "n": n, "seed": seed, "class": class_,
        "scale": scale, "nfe": stats.nfe, "wall_time_s": stats.wall_time,
        "sliced_w2_to_exact": metrics.sliced_wasserstein(samples, exact),
        "sliced_w2_exact_vs_exact": metrics.sliced_wasserstein(exact2, exact),
        "mmd_rbf_to_exact": metrics.mmd_rbf(samples, exact),
        "mode_weight_error": metrics.mode_weight_error(samples, target),
        "mode_weight_error_exact": metrics.mode_weight_error(exact, target),
    }
    _plot(lambda viz: viz.scatter(samples, out_dir / "samples.png", reference=exact, title=(
        f"{model_name}: {method}, {steps} steps, NFE {stats.nfe:g}, SW2 {result['sliced_w2_to_exact']:.3f}")))
    return result


def _sample_expr_cmd(model_name, expr, mode, scale, class_, guidance_name, method, steps, n, seed, sigmas, eta, out,
                     progress) -> None:
    """``sample --expr``: logical composition over attribute values with :class:`steerdiff.guidance.Compose`."""
    from .guidance.compose import Compose, load_composable
    from .io import CheckpointError

    if class_ is not None or guidance_name != "cfg":
        raise click.BadParameter("--expr defines the query; do not combine it with --class or --guidance",
                                 param_hint="--expr")
    if model_name in BUILTIN_MIXTURES:
        raise click.BadParameter(f"{model_name} has no attribute slots; use a multi-attribute model such as "
                                 "shapes_coind", param_hint="--model")
    try:
        model = load_composable(model_name)
    except (CheckpointError, FileNotFoundError) as err:
        raise click.BadParameter(f"{err}. Available: {_model_choices()}", param_hint="--model") from err
    try:
        guider = Compose.for_model(model, expr, scale, mode=mode)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--expr") from err
    out_dir = _prepare_out(out)
    noise = core.randn((n, *model.sample_shape), seeds=seed)
    with torch.no_grad():
        samples, stats = core.sample(model, noise, sigmas, method=method, cond=guider.cond(n), guidance=guider,
                                     generator=seed + 10**9, eta=eta, progress=progress, return_stats=True)
    result = {"model": model_name, "method": method, "steps": steps, "n": n, "seed": seed, "expr": expr,
              "guidance": {"name": "compose", **guider.config}, "nfe": stats.nfe, "wall_time_s": stats.wall_time}
    from .models.io import load, shipped_models

    if samples.shape[1:] == (3, 12, 12) and "shapes_classifier" in shipped_models():
        from .metrics.composition import conformity

        pred = load("shapes_classifier").predict(samples.clamp(-1, 1))
        result["conformity"] = conformity(pred, guider.terms)
    if len(model.sample_shape) == 3:
        _plot(lambda viz: viz.image_grid(samples[:256], out_dir / "samples.png"))
    else:
        _plot(lambda viz: viz.scatter(samples, out_dir / "samples.png", title=f"{model_name}: {expr}"))
    write_json_atomic(result, out_dir / "metrics.json")
    for key, value in result.items():
        if isinstance(value, float):
            click.echo(f"{key:>26}: {value:.4g}")
    click.echo(f"wrote {out_dir / 'metrics.json'} and {out_dir / 'samples.png'}")


def _sample_network(model, model_name, out_dir, class_, scale, guider, method, steps, n, seed, sigmas, eta,
                    progress, covariance=None) -> dict:
    num_classes = tuple(getattr(model, "num_classes", ()) or ())
    cond = None
    if num_classes:
        if len(num_classes) != 1:
            raise click.BadParameter("multi-attribute models are sampled with --expr, e.g. "
                                     "--expr 'shape=disk & !colour=red'", param_hint="--model")
        k = num_classes[0]
        if class_ is not None and not 0 <= class_ < k:
            raise click.BadParameter(f"must be in [0, {k - 1}] for {model_name}", param_hint="--class")
        cond = torch.full((n,), class_) if class_ is not None else torch.arange(n) % k
    elif class_ is not None or scale != 1.0:
        raise click.BadParameter(f"{model_name} is unconditional", param_hint="--class")
    noise = core.randn((n, *model.sample_shape), seeds=seed)
    guidance = guider if scale != 1.0 else None
    with torch.no_grad():
        samples, stats = core.sample(model, noise, sigmas, method=method, cond=cond, guidance=guidance,
                                     generator=seed + 10**9, eta=eta, progress=progress, return_stats=True,
                                     covariance=covariance)
    result = {"model": model_name, "method": method, "steps": steps, "n": n, "seed": seed, "scale": scale,
              "class": class_, "nfe": stats.nfe, "wall_time_s": stats.wall_time}
    if covariance is not None:
        result["clamped_variances"] = stats.clamped
    if len(model.sample_shape) == 3:
        result.update(_image_metrics(model_name, samples, cond))
        _plot(lambda viz: viz.image_grid(samples[:256], out_dir / "samples.png"))
    else:
        _plot(lambda viz: viz.scatter(samples, out_dir / "samples.png", title=f"{model_name}: {method}, {steps} steps"))
    return result


def _image_metrics(model_name: str, samples: torch.Tensor, cond) -> dict:
    """Class accuracy (and FID-digits for n >= 200) with the shipped digits classifier, for digits models."""
    from .models.io import load, shipped_models

    if samples.shape[1:] != (1, 8, 8) or "digits_classifier" not in shipped_models():
        return {}
    from .data.digits import load_digits
    from .metrics.images import class_accuracy, classifier_features, frechet_distance

    clf = load("digits_classifier")
    images = samples.clamp(-1, 1)
    out = {}
    if cond is not None:
        out["class_accuracy"] = class_accuracy(clf, images, cond)
    if images.shape[0] >= 200:
        out["fid_digits_vs_test"] = frechet_distance(classifier_features(clf, load_digits("test")[0]),
                                                     classifier_features(clf, images))
    return out


def _plot(draw) -> None:
    try:
        from . import viz

        draw(viz)
    except ImportError as err:
        click.echo(f"warning: {err}; skipped samples.png", err=True)


@main.command("train")
@click.argument("config")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in the run directory.")
@click.option("--out", default=None, help="Run directory (default: the recipe's out_dir).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a field of the recipe's train section, e.g. --set steps=2000 (VALUE is read as JSON: "
                   "numbers, true/false, null; anything else is a string). Repeatable.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def train_cmd(config, resume, out, overrides, progress) -> None:
    """Train a model from a JSON recipe (a path, or a name under configs/ such as digits_unet)."""
    from .train.recipes import train_from_config

    values = _parse_overrides(overrides)
    try:
        result = train_from_config(config, resume=resume, out_dir=out, progress=progress, overrides=values)
    except FileNotFoundError as err:
        raise click.BadParameter(str(err), param_hint="CONFIG") from err
    except ValueError as err:  # a bad recipe or --set value: the message names the field
        raise click.ClickException(str(err)) from err
    except FileExistsError as err:
        raise click.UsageError(f"{err} (pass --resume to continue it)") from err
    click.echo(f"trained {result.step} steps; final model in {result.final_dir}")


def _parse_overrides(items: tuple[str, ...]) -> dict:
    """``("steps=2000", "lr=1e-3")`` -> ``{"steps": 2000, "lr": 0.001}`` (values parsed as JSON where they parse)."""
    values = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        try:
            values[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            values[key.strip()] = raw
    return values


def _register_subcommands() -> None:
    # Commands that live beside their method's package (one paper, one module).
    from .cli_align import align_cmd
    from .cli_constrain import constrain_cmd
    from .cli_demo import demo_cmd
    from .cli_quantize import quantize_cmd
    from .cli_restore import restore_cmd

    main.add_command(align_cmd)
    main.add_command(constrain_cmd)
    main.add_command(demo_cmd)
    main.add_command(quantize_cmd)
    main.add_command(restore_cmd)


_register_subcommands()


if __name__ == "__main__":  # pragma: no cover
    main()
