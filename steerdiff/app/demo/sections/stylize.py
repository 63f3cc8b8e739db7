"""Demo section: reference-style digits by RB-Modulation's stochastic optimal control vs plain gradient guidance
(RB-Modulation, Rout et al., ICLR 2025; docs/methods/rb_modulation.md "The digits protocol"; the full protocol is
``benchmarks/rbmod.py``).

The shipped three-style generator ``digits_styles`` (trained without style labels) samples one class per column;
the style reference is a dilated ("thick") zero. Rows: plain sampling, RB-Modulation (SOC on x0-hat, no denoiser
backward), plain gradient guidance on the same cost through the denoiser, and RB-Modulation with the style CNN as
descriptor (its adversarial failure mode). Quick mode: 2 samples per class and fewer guidance weights.
"""

from __future__ import annotations

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

CONFIGS = {True: {"n_per_class": 2, "weights": (2.0,)}, False: {"n_per_class": 30, "weights": (0.5, 1.0, 2.0, 4.0)}}


@section("stylize", "Style control: RB-Modulation (SOC) vs plain gradient guidance", requires=("steerdiff.control",),
         order=95)
def run(ctx) -> SectionResult:
    """RB-Modulation and its baselines on the three-style digits, with their grids and numbers."""
    import torch

    from ....io import CheckpointError
    from ...protocols.rbmod import evaluate, load_task, reference_metrics, run_method

    cfg = CONFIGS[ctx.quick]
    try:
        task = load_task(n_per_class=cfg["n_per_class"], seed=ctx.seed)
    except (CheckpointError, FileNotFoundError, OSError) as err:
        raise SectionUnavailable(f"a shipped model is missing ({err}); run scripts/make_control_assets.py") from None
    runs = [("plain", "plain", "thickness", {}),
            ("RB-Mod (M=3, eta=0.2, lam_prox=1)", "rbmod", "thickness", {"M": 3, "eta": 0.2, "lam_prox": 1.0})]
    runs += [(f"guidance w={w:g}", "guidance", "thickness", {"w": w}) for w in cfg["weights"]]
    runs.append(("RB-Mod, CNN descriptor (eta=0.1)", "rbmod", "cnn", {"M": 3, "eta": 0.1, "lam_prox": 1.0}))
    bar = ctx.bar(len(runs), "stylize")
    per = cfg["n_per_class"]
    first = torch.arange(10) * per
    variants = []
    for i, (name, method, desc, params) in enumerate(runs):
        x, cost = run_method(task, method, desc, **params)
        values = cost | evaluate(task, x)
        image = ctx.grid(torch.cat([task.reference, x[first]]).clamp(-1, 1), f"row{i}.png", nrow=11)
        variants.append(Variant(name, method, values, image, f"{name} ({desc} descriptor): reference, then one "
                                                             "sample per class 0-9"))
        bar.update(1)
    plain, rbm = variants[0].values, variants[1].values
    g_index = 2 + list(cfg["weights"]).index(2.0)  # guidance at w = 2: thick success on par with RB-Mod's
    guided = variants[g_index].values
    ink = reference_metrics(task)["ink"]
    findings = [
        f"RB-Mod: thick {rbm['thick']:.0%} (plain {plain['thick']:.0%}), class accuracy {rbm['class_acc']:.3f} "
        f"(plain {plain['class_acc']:.3f}), ink {rbm['ink']:.3f} (plain {plain['ink']:.3f}, reference {ink:.3f}), "
        f"{rbm['denoiser_backward_passes']} denoiser backward passes.",
        f"Guidance at w=2: thick {guided['thick']:.0%}, class accuracy {guided['class_acc']:.3f}, "
        f"{guided['denoiser_backward_passes']} denoiser backward passes (one per step).",
        f"With the style CNN as descriptor, SOC on raw pixels attacks the CNN: class accuracy "
        f"{variants[-1].values['class_acc']:.3f} at thick {variants[-1].values['thick']:.0%}."]
    return SectionResult(
        "stylize", "",
        about=("RB-Modulation treats stylisation as stochastic optimal control: at every sampler step it takes a few "
               "Adam steps on the denoised estimate towards the reference's style descriptor (plus a proximal term), "
               "and the sampler continues as if the model had predicted the corrected estimate (steerdiff's default "
               "re-entry; the official code keeps the model's noise estimate: reentry='official'). No "
               "gradient goes through the denoiser. Plain gradient guidance instead differentiates the same style "
               "cost through the denoiser."),
        legend=("thick: share of samples a pixel logistic regression calls 'thick' (the reference's style; higher "
                "is better); class acc: share classified as their conditioning class (higher is better); ink: mean "
                "(x+1)/2 (the reference's is in the findings); CNN dist: distance of the style-CNN embeddings to the "
                "reference's (lower is better); leakage: share of non-0 samples classified as 0, the reference's "
                "class (lower is better); bwd: backward passes through the denoiser."),
        columns=[Column("class_acc", "class acc", ".3f", "higher"), Column("thick", "thick", ".2f", "higher"),
                 Column("ink", "ink", ".3f"), Column("cnn_style_dist", "CNN dist", ".3f", "lower"),
                 Column("leakage", "leakage", ".3f", "lower"), Column("denoiser_backward_passes", "bwd", "d"),
                 Column("nfe", "NFE", "g"), Column("wall_s", "wall s", ".2f")],
        variants=variants, findings=findings,
        figures=[Figure(_plot(ctx, variants), "Style (thick share) against content (class accuracy), one point per "
                        "variant; up and to the right is better.")],
        config={"model": "digits_styles (3 x 384 ReLU MLP, configs/rbmod_digits.json)",
                "sampler": "DDIM eta 0, 20 steps, karras(0.002, 40, rho 7), no CFG",
                "samples": f"{per} per class", "reference": "first label-0 digit, dilated (thick)",
                "seed": ctx.seed},
    )


def _plot(ctx, variants: list[Variant]) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for v in variants:
        ax.plot(v.values["thick"], v.values["class_acc"], "o", label=v.name)
    ax.set_xlabel("thick share (style of the reference)")
    ax.set_ylabel("class accuracy (content)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return ctx.plot(fig, "style_vs_content.png")
