"""``steerdiff sample``: samples of a built-in mixture or a trained model, unguided or guided.

    steerdiff sample --model gmm2d --class 2 --guidance apg --scale 8 --out out/
    steerdiff sample --model digits --n 256 --out out/
    steerdiff sample --model shapes_coind --expr 'shape=disk & !colour=red' --scale 3 --out out/
    steerdiff sample --model digits --covariance ocm --steps 10 --out out/

Guidance is CFG, CFG-rescale (Lin et al. 2023) or APG (Sadat et al. 2025), built through the guider registry;
``--expr`` samples a logical query over attribute values (CoInD, logical composition, Gaudi et al. 2025);
``--covariance ocm`` samples with the model's learned diagonal covariance (OCM, Ou et al. 2025). Writes
``samples.png`` and ``metrics.json``: NFE and wall time; for a built-in mixture the sliced Wasserstein distance, MMD
and mode-weight error to exact samples of the (conditional) target; for digits models the class accuracy (and
FID-digits for n >= 200) under the shipped classifier; for a query on the shapes models its conformity.
"""

from __future__ import annotations

from pathlib import Path

import click
import torch

from .. import core, metrics
from ..guidance import build_guider
from ..models.gmm import BUILTIN_MIXTURES
from ._common import load_denoiser, load_model, plot_samples, prepare_out, write_metrics

# Samplers that run without extra inputs (OCM's kernels need a covariance head: --covariance ocm).
METHODS = [name for name, spec in core.SAMPLERS.items() if not spec.required]
# --guidance value -> the options of this command its guider takes (the guider comes from guidance.GUIDERS).
GUIDER_OPTIONS = {"cfg": (), "cfg-rescale": ("phi",), "apg": ("eta", "momentum", "r_rms")}


@click.command("sample")
@click.option("--model", "model_name", default="gmm2d", show_default=True,
              help="A built-in mixture (gmm1d, gmm2d, gmm16d), a shipped model (digits, toy2d) or a model directory.")
@click.option("--method", type=click.Choice(METHODS), default="heun", show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=50, show_default=True, help="Sampling steps.")
@click.option("--n", "n", type=click.IntRange(min=2), default=2000, show_default=True, help="Number of samples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sample i uses seed + i.")
@click.option("--class", "class_", type=int, default=None,
              help="Class label for a conditional model (default: classes spread evenly).")
@click.option("--guidance", "guidance_name", type=click.Choice(list(GUIDER_OPTIONS)), default="cfg",
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
              help="Multi-attribute models: a logical query composed over attribute values (CoInD, logical "
                   "composition), e.g. 'shape=disk & !colour=red' or '2*shape=disk & !colour={red,green}'; --scale "
                   "is its weight w.")
@click.option("--compose", "compose_mode", type=click.Choice(["and", "joint"]), default="and", show_default=True,
              help="With --expr: 'and' composes the marginals; 'joint' is joint CFG on the joint label.")
@click.option("--covariance", "covariance_name", type=click.Choice(["none", "ocm"]), default="none",
              show_default=True,
              help="ocm: the model's shipped OCM head (learned diagonal covariance, Ou et al. 2025); samples with "
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
        _sample_expr(model_name, expr, compose_mode, scale, class_, guidance_name, method, steps, n, seed,
                     core.sigmas.karras(steps, sigma_min, sigma_max, rho), ddim_eta, out, progress)
        return
    guider_options = {"phi": phi, "eta": eta, "momentum": momentum, "r_rms": r_rms}
    try:
        guider = build_guider(guidance_name, scale, **{k: guider_options[k] for k in GUIDER_OPTIONS[guidance_name]})
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--guidance options") from err
    out_dir = prepare_out(out)
    sigmas = core.sigmas.karras(steps, sigma_min, sigma_max, rho)
    common = dict(method=method, steps=steps, n=n, seed=seed, sigmas=sigmas, eta=ddim_eta, progress=progress)
    model, is_mixture = load_denoiser(model_name)
    if is_mixture:
        result = _sample_mixture(model, model_name, out_dir, class_=class_, scale=scale, guider=guider, **common)
    else:
        head = None
        if covariance_name == "ocm":
            from ..core.sigmas import vp_linear
            from ..covariance import load_head_for
            from ..io import CheckpointError

            try:
                head = load_head_for(model_name, model)
            except (CheckpointError, FileNotFoundError) as err:
                raise click.BadParameter(str(err), param_hint="--covariance") from err
            sigmas = vp_linear(steps)  # the grid the head was trained and benchmarked on
            common.update(sigmas=sigmas, method="ocm-ddpm" if method == "ddpm" else "ocm-ddim")
        result = _sample_network(model, model_name, out_dir, class_=class_, scale=scale, guider=guider,
                                 covariance=head, **common)
    if scale != 1.0:
        result["guidance"] = {"name": guidance_name, **guider.config}
    if covariance_name == "ocm":
        result["schedule"] = {"kind": "vp-linear", "steps": steps}
    else:
        result["schedule"] = {"kind": "karras", "sigma_min": sigma_min, "sigma_max": sigma_max, "rho": rho}
    _finish(result, out_dir)


def _finish(result: dict, out_dir: Path) -> None:
    """Write metrics.json and print its numbers."""
    path = write_metrics(out_dir, result)
    for key, value in result.items():
        if isinstance(value, float):
            click.echo(f"{key:>26}: {value:.4g}")
    click.echo(f"wrote {path} and {out_dir / 'samples.png'}")


def _sample_mixture(mixture, model_name, out_dir, class_, scale, guider, method, steps, n, seed, sigmas, eta,
                    progress) -> dict:
    """A built-in mixture's exact denoiser, measured against exact samples of the (conditional) target."""
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
    plot_samples(samples, out_dir / "samples.png", reference=exact, title=(
        f"{model_name}: {method}, {steps} steps, NFE {stats.nfe:g}, SW2 {result['sliced_w2_to_exact']:.3f}"))
    return result


def _sample_expr(model_name, expr, mode, scale, class_, guidance_name, method, steps, n, seed, sigmas, eta, out,
                 progress) -> None:
    """``sample --expr``: logical composition over attribute values with :class:`steerdiff.guidance.Compose`."""
    from ..guidance.compose import Compose, load_composable

    if class_ is not None or guidance_name != "cfg":
        raise click.BadParameter("--expr defines the query; do not combine it with --class or --guidance",
                                 param_hint="--expr")
    if model_name in BUILTIN_MIXTURES:
        raise click.BadParameter(f"{model_name} has no attribute slots; use a multi-attribute model such as "
                                 "shapes_coind", param_hint="--model")
    model = load_model(model_name, extra=sorted(BUILTIN_MIXTURES), loader=load_composable)
    try:
        guider = Compose.for_model(model, expr, scale, mode=mode)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--expr") from err
    out_dir = prepare_out(out)
    noise = core.randn((n, *model.sample_shape), seeds=seed)
    with torch.no_grad():
        samples, stats = core.sample(model, noise, sigmas, method=method, cond=guider.cond(n), guidance=guider,
                                     generator=seed + 10**9, eta=eta, progress=progress, return_stats=True)
    result = {"model": model_name, "method": method, "steps": steps, "n": n, "seed": seed, "expr": expr,
              "guidance": {"name": "compose", **guider.config}, "nfe": stats.nfe, "wall_time_s": stats.wall_time}
    from ..models.io import load, shipped_models

    if samples.shape[1:] == (3, 12, 12) and "shapes_classifier" in shipped_models():
        from ..metrics.composition import conformity

        pred = load("shapes_classifier").predict(samples.clamp(-1, 1))
        result["conformity"] = conformity(pred, guider.terms)
    plot_samples(samples, out_dir / "samples.png", title=f"{model_name}: {expr}", max_images=256)
    _finish(result, out_dir)


def _sample_network(model, model_name, out_dir, class_, scale, guider, method, steps, n, seed, sigmas, eta,
                    progress, covariance=None) -> dict:
    """A trained model, unconditional or class-conditional (classes spread evenly unless --class)."""
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
        result.update(_image_metrics(samples, cond))
    plot_samples(samples, out_dir / "samples.png", title=f"{model_name}: {method}, {steps} steps", max_images=256)
    return result


def _image_metrics(samples: torch.Tensor, cond) -> dict:
    """Class accuracy (and FID-digits for n >= 200) with the shipped digits classifier, for digits models."""
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
        out["fid_digits_vs_test"] = frechet_distance(classifier_features(clf, load_digits("test")[0]),
                                                     classifier_features(clf, images))
    return out
