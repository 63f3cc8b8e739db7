"""Demo section: few-step sampling of the shipped digits UNet: OCM's learned diagonal covariances (Ou et al., ICLR 2025;
docs/methods/ocm.md, "Digits gate") vs fixed-variance DDPM and DDIM at 5, 10 and 20 steps (the full comparison, with
Analytic-DPM and the exact-mixture checks, is ``benchmarks/ocm.py``), beside the shipped rectified-flow model
``digits_flow`` (Esser et al. 2024, "Scaling Rectified Flow Transformers"; ``configs/digits_flow.json``) sampled from
pure noise (``sigma = inf``) with Euler and DPM-Solver++ 2M (Lu et al. 2022, DPM-Solver++, Algorithm 2) when those
samplers are registered (the frontier of every sampler is ``benchmarks/few_step.py``).

Every EDM method runs the same VP-linear grid from the same noise (seeds), so at each step count all methods cost the
same NFE; the OCM head is the shipped ``digits_ocm``. The flow model runs the uniform flow grid
``sd.sigmas.flow(steps, grid="flux")`` from the same noise rows, also at one NFE per step.
"""

from __future__ import annotations

import time

import torch

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

METHODS = {"ddpm-beta-tilde": "DDPM (fixed variance)", "ddim": "DDIM", "ocm-ddpm": "OCM-DDPM", "ocm-ddim": "OCM-DDIM"}
FLOW_METHODS = {"euler": "Flow model + Euler", "dpmpp_2m": "Flow model + DPM-Solver++ 2M"}
CONFIGS = {True: {"n": 20, "steps": (5, 10)}, False: {"n": 400, "steps": (5, 10, 20)}}
CLIP_PIXEL = 1.0  # the official code's last-step variance clip (one grey level), applied to every method alike


@section("fewstep", "Few-step sampling: OCM vs fixed-variance DDPM and DDIM at 5, 10, 20 steps",
         requires=("steerdiff.covariance",), order=50)
def run(ctx) -> SectionResult:
    """Each method at each step count; FID-digits and class accuracy."""
    from ....covariance import load_head_for
    from ....data.digits import load_digits
    from ....io import CheckpointError
    from ....metrics.images import class_accuracy, classifier_features, frechet_distance
    from ....models.io import load
    from ...recipes.ocm_digits import digits_samples

    cfg = CONFIGS[ctx.quick]
    n, step_counts = cfg["n"], cfg["steps"]
    model, clf = load("digits").eval(), load("digits_classifier").eval()
    try:
        head = load_head_for("digits", model)
    except (CheckpointError, FileNotFoundError) as err:
        raise SectionUnavailable(f"the shipped OCM head for digits cannot be loaded ({err})") from err
    real_f = classifier_features(clf, load_digits("test")[0])
    labels = torch.arange(n) % 10  # digits_samples draws class i % 10 for sample i
    bar = ctx.bar(len(step_counts) * len(METHODS), "fewstep")
    variants = []
    for k in step_counts:
        for method, label in METHODS.items():
            start = time.perf_counter()
            images, nfe, clamped = digits_samples(model, method, k, covariance=head, n=n, seed=ctx.seed,
                                                    clip_pixel=CLIP_PIXEL)
            wall = time.perf_counter() - start
            images = images.clamp(-1, 1)
            values = {"steps": k, "nfe": nfe, "wall_s": wall,
                      "fid": frechet_distance(real_f, classifier_features(clf, images)),
                      "accuracy": class_accuracy(clf, images, labels), "clamped": clamped}
            name = f"{label}, {k} steps"
            variants.append(Variant(name, label, values, ctx.grid(images[:20], f"{method}_k{k}.png", nrow=10),
                                    f"{name}, NFE {nfe:g}"))
            bar.update(1)
    flow_note = _flow_variants(ctx, clf, real_f, labels, n, step_counts, variants)
    findings = [flow_note] if flow_note else []
    for k in step_counts:
        rows = {v.method: v.values["fid"] for v in variants if v.values["steps"] == k}
        if not rows:
            continue
        best = min(rows, key=rows.get)
        findings.append(f"{k} steps: lowest FID {best} ({rows[best]:.3f}); "
                        + ", ".join(f"{m} {f:.3f}" for m, f in rows.items()) + ".")
    return SectionResult(
        "fewstep", "",
        about=("With few sampling steps, each reverse step must bridge a large gap in noise, and the Gaussian it "
               "draws from needs the right variance. OCM learns the diagonal of the posterior covariance with a "
               "small head on the denoiser and uses it in the DDPM / DDIM step, instead of DDPM's fixed variance or "
               "DDIM's deterministic step. The rectified-flow model beside them learns the straight-line velocity "
               "from noise to data; its paths are nearly straight, which is what few-step ODE solvers need."),
        legend=("FID-digits: Frechet distance between the shipped classifier's features of the samples and of the "
                "real test digits (lower is better); accuracy: share classified as the requested digit (higher is "
                "better); clamped: covariance entries clamped to [0, 1] (diagnostic). At each step count every "
                "method costs the same NFE."),
        columns=[Column("steps", "steps", "d"), Column("nfe", "NFE", "g"), Column("wall_s", "wall s", ".2f"),
                 Column("fid", "FID-digits", ".3f", "lower"), Column("accuracy", "accuracy", ".3f", "higher"),
                 Column("clamped", "clamped", "d")],
        variants=variants, findings=findings, group_by="steps",
        figures=[Figure(_plot(ctx, variants), "FID-digits against the number of steps (= NFE) per method; the flow "
                                              "model's lines are solid.")],
        config={"model": "digits (shipped UNet) + shipped OCM head digits_ocm", "samples per variant": n,
                "grid": "VP-linear", "seeds": f"noise rows from seed {ctx.seed} x 10^6",
                "denoised values": "clipped to [-1, 1]",
                "last step": f"variance clipped to {CLIP_PIXEL:g} grey level (official OCM code; every EDM method)",
                "flow model": "digits_flow (shipped rectified-flow UNet), from sigma = inf on sd.sigmas.flow(steps, "
                              "grid='flux'), same noise rows, D not clipped"},
    )


def _flow_variants(ctx, clf, real_f, labels, n: int, step_counts, variants: list[Variant]) -> str | None:
    """Append the flow model's variants (Euler, DPM-Solver++ 2M where registered); a note when it cannot run."""
    from ....core import SAMPLERS, randn, sample, sigmas
    from ....io import CheckpointError
    from ....metrics.images import class_accuracy, classifier_features, frechet_distance
    from ....models.io import load

    try:
        flow = load("digits_flow").eval()
    except CheckpointError as err:
        return f"The flow model is not shown: the shipped digits_flow cannot be loaded ({err})."
    methods = {m: label for m, label in FLOW_METHODS.items() if m in SAMPLERS}
    noise = randn((n, *flow.sample_shape), seeds=ctx.seed * 10**6)  # the noise rows of the EDM methods
    for k in step_counts:
        for method, label in methods.items():
            start = time.perf_counter()
            with torch.no_grad():
                images, stats = sample(flow, noise, sigmas.flow(k, grid="flux"), method=method, cond=labels,
                                       return_stats=True)
            wall = time.perf_counter() - start
            images = images.clamp(-1, 1)
            values = {"steps": k, "nfe": stats.nfe, "wall_s": wall,
                      "fid": frechet_distance(real_f, classifier_features(clf, images)),
                      "accuracy": class_accuracy(clf, images, labels), "clamped": None}
            name = f"{label}, {k} steps"
            variants.append(Variant(name, label, values, ctx.grid(images[:20], f"flow_{method}_k{k}.png", nrow=10),
                                    f"{name}, NFE {stats.nfe:g}"))
    missing = sorted(set(FLOW_METHODS) - set(methods))
    return f"Flow samplers not registered in this build: {missing}." if missing else None


def _plot(ctx, variants: list[Variant]) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label in (*METHODS.values(), *FLOW_METHODS.values()):
        rows = [v.values for v in variants if v.method == label]
        if rows:
            style = "s-" if label in FLOW_METHODS.values() else "o--"
            ax.plot([r["steps"] for r in rows], [r["fid"] for r in rows], style, label=label)
    ax.set_xlabel("steps (= NFE)")
    ax.set_ylabel("FID-digits (lower is better)")
    ax.set_xticks(sorted({v.values["steps"] for v in variants}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return ctx.plot(fig, "fid_vs_steps.png")
