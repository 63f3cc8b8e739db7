"""``steerdiff stylize``: reference-style samples by RB-Modulation's stochastic optimal control, or by its baselines
(RB-Modulation, Rout et al., ICLR 2025; docs/methods/rb_modulation.md).

    steerdiff stylize --reference digits:all:0 --reference-style thick --n 30 --out out/
    steerdiff stylize --method guidance --w 2 --reference digits:all:0 --reference-style thick --out out_g/
    steerdiff stylize --descriptor cnn --eta 0.05 --class 3 --reference ref.png --out out_cnn/
    steerdiff stylize --content-ref digits:all:13 --lam-content 3 --out out_subject/     # subject mode

The model (default the shipped three-style digits generator ``digits_styles``) samples ``--n`` images (classes cycle
0..9 unless ``--class``; noise seeds ``seed + i``) with ``--sampler`` on ``karras(--steps, --sigma-min, --sigma-max)``.
``--method rbmod`` runs :class:`steerdiff.control.RBModulation` as the sampler's ``x0_corrector`` (``--M``,
``--eta``, ``--lam-style``, ``--lam-prox``, ``--tau``); ``guidance`` the plain gradient guidance on the same cost
(``--w``); ``plain`` neither. Descriptors: ``thickness`` (stroke features, cost 1/2||.||^2) or ``cnn`` (the shipped
style CNN ``digits_styles_cnn``, cost 1 - cos). ``--content-ref`` (rbmod only) switches on the subject mode: the
content term ``--lam-content * (1 - cos)`` between the 10-way content head of ``digits_styles_cnn`` on the corrected
estimate and on the subject image (given as the reference is, not restyled); the samples are then null-class
(unconditional) unless ``--class``. Writes ``samples.safetensors``, ``metrics.json`` (settings, the
style cost and ink of the samples and of the reference, the content cost and the share of samples the content
head puts in the subject's class in the subject mode, NFE, denoiser backward passes, seconds) and ``samples.png``
(the reference first).
"""

from __future__ import annotations

import time

import click
import torch

from ... import core
from ...io import save_tensors
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
    karras_schedule,
    model_to_dtype,
    prepare_out,
    progress_option,
    start_outputs,
    write_metrics,
)
from ._inputs import SPEC_HELP, read_image

METHODS = [name for name, spec in core.SAMPLERS.items() if spec.corrector]
STYLES = ("normal", "thick", "thin")


# The options each method reads (the others are refused when given): RB-Modulation's inner problem, the guidance
# weight. --lam-content is read in the subject mode only (--content-ref).
_RBMOD_ONLY = ("m_steps", "eta", "lam_style", "lam_prox", "tau", "lam_content", "reentry")
_GUIDANCE_ONLY = ("w",)


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def _flag(ctx: click.Context, name: str) -> str:
    return next(p.opts[0] for p in ctx.command.params if p.name == name)


def _check_applies(ctx: click.Context, method: str, content_ref: str | None, tau: int | None, steps: int) -> None:
    """Refuse an option that the chosen ``--method`` does not read, ``--lam-content`` without ``--content-ref``, and
    a ``--tau`` beyond ``--steps`` (steps ``i < tau`` are corrected; there are only ``steps`` of them)."""
    for names, owner in ((_RBMOD_ONLY, "rbmod"), (_GUIDANCE_ONLY, "guidance")):
        for name in names:
            if method != owner and _given(ctx, name):
                flag = _flag(ctx, name)
                raise click.BadParameter(f"{flag} does not apply to --method {method} (it is --method {owner}'s)",
                                         param_hint=flag)
    if content_ref is None and _given(ctx, "lam_content"):
        raise click.BadParameter("--lam-content weighs the subject mode's content term: give --content-ref too",
                                 param_hint="--lam-content")
    if tau is not None and tau > steps:
        raise click.BadParameter(f"{tau} corrects steps i < {tau}, but the run has {steps} steps (--steps): use "
                                 f"--tau in 0..{steps} (or leave it out to correct every step)", param_hint="--tau")


@click.command("stylize")
@click.option("--model", "model_name", default="digits_styles", show_default=True,
              help="A shipped or saved denoiser on 8x8 images (digits_styles, digits, ...).")
@click.option("--reference", default="digits:all:0", show_default=True, help=f"The style reference: {SPEC_HELP}.")
@click.option("--reference-style", type=click.Choice(STYLES), default="thick", show_default=True,
              help="Redraw the reference in this stroke style first (normal: as given).")
@click.option("--method", type=click.Choice(["rbmod", "guidance", "plain"]), default="rbmod", show_default=True)
@click.option("--descriptor", type=click.Choice(["thickness", "cnn"]), default="thickness", show_default=True)
@click.option("--M", "m_steps", type=click.IntRange(min=0), default=3, show_default=True,
              help="Adam steps per sampler step.")
@click.option("--eta", type=POSITIVE, default=0.2, show_default=True, help="Adam learning rate (decays linearly).")
@click.option("--lam-style", type=click.FloatRange(min=0), default=1.0, show_default=True)
@click.option("--lam-prox", type=click.FloatRange(min=0), default=1.0, show_default=True)
@click.option("--tau", type=click.IntRange(min=0), default=None,
              help="Correct steps i < tau only, in 0..--steps (default all).")
@click.option("--content-ref", default=None,
              help=f"Subject mode (rbmod): the subject image, {SPEC_HELP}; null-class samples unless --class.")
@click.option("--lam-content", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Weight of the content term (with --content-ref; 0: style mode).")
@click.option("--reentry", type=click.Choice(["consistent", "official"]), default="consistent", show_default=True,
              help="RB-Modulation's re-entry: eps-hat from the corrected estimate (consistent) or from the "
                   "uncorrected one (official, as the paper's code); docs/methods/rb_modulation.md 'Re-entry'.")
@click.option("--w", type=click.FloatRange(min=0), default=1.0, show_default=True, help="Guidance weight.")
@click.option("--n", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--class", "class_", type=click.IntRange(min=0), default=None, help="One class for every sample.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--sampler", type=click.Choice(METHODS), default="ddim", show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--sigma-min", type=POSITIVE, default=0.002, show_default=True)
@click.option("--sigma-max", type=POSITIVE, default=40.0, show_default=True)
@device_option
@dtype_option
@click.option("--out", default="out", show_default=True, help="Output directory.")
@progress_option
@click.pass_context
def stylize_cmd(ctx, model_name, reference, reference_style, method, descriptor, m_steps, eta, lam_style, lam_prox, tau,
                content_ref, lam_content, reentry, w, n, class_, seed, sampler, steps, sigma_min, sigma_max, device,
                dtype, out, progress) -> None:
    """Samples in the style of a reference image; write samples.safetensors, metrics.json and samples.png.

    ``--dtype``: the denoiser runs in it; the sampler's state, the style and content descriptors and the
    optimal-control solve on the denoised estimate stay in float32 (a few Adam steps of size ``--eta`` on an
    estimate rounded to bfloat16's 8 bits would lose their small updates)."""
    from ...control import RBModulation, style_guidance
    from ...control.descriptors import ThicknessDescriptor
    from ...control.styles import stylize_images
    from ...models.io import load
    from ..protocols.rbmod import BackwardCounter

    check_sigmas(sigma_min, sigma_max)
    _check_applies(ctx, method, content_ref, tau, steps)
    check_out(out)
    ref = read_image(reference, "--reference").float()
    if tuple(ref.shape) != (8, 8):
        raise click.BadParameter(f"expected an 8x8 greyscale image in [-1, 1], got shape {tuple(ref.shape)}",
                                 param_hint="--reference")
    ref = stylize_images(ref[None, None], reference_style).to(device)
    subject = None
    if content_ref is not None:
        if method != "rbmod":
            raise click.BadParameter(f"the subject mode is RB-Modulation's (--method rbmod), got --method {method}",
                                     param_hint="--content-ref")
        subject = read_image(content_ref, "--content-ref").float()
        if tuple(subject.shape) != (8, 8):
            raise click.BadParameter(f"expected an 8x8 greyscale image in [-1, 1], got shape {tuple(subject.shape)}",
                                     param_hint="--content-ref")
        subject = subject[None, None].to(device)
    model = load(model_name, device=device).eval()
    try:
        core.sampling.check_denoiser(model)
    except TypeError as err:  # a classifier or another network that is no denoiser D(x, sigma, cond)
        raise click.BadParameter(f"{model_name} is not a denoiser: {err}", param_hint="--model") from err
    for p in model.parameters():
        p.requires_grad_(False)
    model = model_to_dtype(model, dtype, "stylize", model_name)
    if tuple(getattr(model, "sample_shape", (1, 8, 8))) != (1, 8, 8):
        raise click.BadParameter(f"{model_name} does not make 8x8 greyscale images", param_hint="--model")
    check_sigma_in_range(model, sigma_max, model_name, "--sigma-max")
    sigmas = karras_schedule(steps, sigma_min, sigma_max, 7.0)
    classes = tuple(getattr(model, "num_classes", ()) or ())
    check_class(class_, classes, model_name)
    if classes and (class_ is not None or subject is None):
        cond = torch.full((n,), class_, device=device) if class_ is not None else torch.arange(n, device=device) % \
            classes[0]
    else:  # an unconditional model, or the subject mode without --class: null class
        cond = None
    psi = ThicknessDescriptor().to(device) if descriptor == "thickness" else load("digits_styles_cnn",
                                                                                   device=device).eval()
    cost = "squared" if descriptor == "thickness" else "cosine"
    kwargs: dict = {}
    content: dict = {}
    if subject is not None:
        cnn = psi if descriptor == "cnn" else load("digits_styles_cnn", device=device).eval()
        cnn.requires_grad_(False)
        content = {"content_descriptor": cnn.content_logits, "content_reference": subject, "lam_content": lam_content}
    if method == "rbmod":
        kwargs["x0_corrector"] = RBModulation(psi, None, M=m_steps, eta=eta, lam_style=lam_style, lam_prox=lam_prox,
                                              tau=tau, reference=ref, cost=cost, reentry=reentry, **content)
    elif method == "guidance":
        kwargs["guidance"] = style_guidance(psi, w, reference=ref, cost=cost)
        if cond is None:
            cond = torch.full((n,), -1, device=device)
    noise = core.randn((n, 1, 8, 8), seeds=seed).to(device)
    counter = BackwardCounter(model)
    start = time.perf_counter()
    try:
        x, stats = core.sample(model, noise, sigmas, method=sampler, cond=cond, generator=seed, return_stats=True,
                               progress=progress, **kwargs)
    except ValueError as err:  # a check of the sampler's on these options
        raise click.UsageError(str(err)) from err
    finally:
        counter.remove()
    seconds = time.perf_counter() - start
    scorer = RBModulation(psi, reference=ref, cost=cost, **content)
    content_metrics = {"content_ref": content_ref, "lam_content": lam_content if subject is not None else None,
                       "content_cost_mean": None, "content_head_subject_share": None}
    with torch.no_grad():
        style_cost = scorer.style_cost(x.clamp(-1, 1))
        if subject is not None:
            head = content["content_descriptor"]
            content_metrics["content_cost_mean"] = float(scorer.content_cost(x.clamp(-1, 1)).mean())
            content_metrics["content_head_subject_share"] = float(
                (head(x.clamp(-1, 1)).argmax(1) == head(subject).argmax(1)).float().mean())
    out_dir = start_outputs(prepare_out(out))  # the summary comes last: a failure in between leaves none
    save_tensors({"samples": x.detach().cpu().contiguous(), "reference": ref.cpu().contiguous()},
                 out_dir / "samples.safetensors")
    result = {"model": model_name, "dtype": dtype_name(dtype), "reference": reference,
              "reference_style": reference_style, "method": method,
              "descriptor": descriptor, "cost": cost, "n": n, "class": class_, "seed": seed, "sampler": sampler,
              "steps": steps, "M": m_steps, "eta": eta, "lam_style": lam_style, "lam_prox": lam_prox, "tau": tau,
              "reentry": reentry if method == "rbmod" else None,
              "w": w if method == "guidance" else None, "style_cost_mean": float(style_cost.mean()),
              "ink": float(((x.clamp(-1, 1) + 1) / 2).mean()), "reference_ink": float(((ref + 1) / 2).mean()),
              **content_metrics, "nfe": stats.nfe, "denoiser_backward_passes": counter.count,
              "seconds": round(seconds, 3)}
    try:
        from ...viz import image_grid

        image_grid(torch.cat([ref.cpu(), x.detach().cpu()]), out_dir / "samples.png", nrow=min(n + 1, 11), scale=4)
    except ImportError as err:
        click.echo(f"warning: {err}; skipped samples.png", err=True)
    write_metrics(out_dir, result)
    click.echo(f"stylize ({method}, {descriptor}) {n} samples -> {out_dir}: style cost "
               f"{result['style_cost_mean']:.3f}, "
               f"ink {result['ink']:.3f} (reference {result['reference_ink']:.3f}), NFE {stats.nfe:g}, denoiser "
               f"backward passes {counter.count} ({seconds:.1f} s)")
