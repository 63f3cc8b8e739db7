"""Demo section: logical composition of attributes, CoInD (Gaudi et al., ICLR 2025: conditionally independent marginals;
docs/methods/coind.md) vs the plain conditional model, on the shipped ``band``-split pair.

Both shipped models (``shapes_band``: lambda = 0, ``shapes_coind``: lambda = 1) are the same two-slot UNet trained
with the same budget on the 8 (shape, colour) pairs of the ``band`` split; the other 8 pairs were never seen. Each
pair is queried as ``shape=s & colour=c`` composed from the marginals (the AND rule, one stacked batch of 3 rows per
evaluation) and, for the plain model, by joint CFG on the joint label (2 rows per evaluation). The full protocol with
weight selection, NOT queries and the JSD metric is ``benchmarks/coind.py``.
"""

from __future__ import annotations

import time

import torch

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

SCALE = 7.5  # the weight benchmarks/coind.py selected for AND on both models
CONFIGS = {True: {"n": 2, "steps": 4, "pairs": 4}, False: {"n": 12, "steps": 20, "pairs": None}}  # pairs: per split


@section("composition", "Composition: CoInD vs the plain conditional model on held-out attribute pairs",
         requires=("steerdiff.guidance.compose",), order=40)
def run(ctx) -> SectionResult:
    """Sample every seen and held-out (shape, colour) pair with each model and rule; score with the classifier."""
    from ....core import sample, sigmas
    from ....data.shapes import COLOURS, SHAPES, split_combos
    from ....guidance import Compose, load_composable
    from ....io import CheckpointError
    from ....metrics.composition import conformity, label_entropy
    from ....models.io import load

    cfg = CONFIGS[ctx.quick]
    n, steps = cfg["n"], cfg["steps"]
    try:
        models = {"plain": load_composable("shapes_band"), "coind": load_composable("shapes_coind")}
        clf = load("shapes_classifier")
    except (CheckpointError, FileNotFoundError) as err:
        raise SectionUnavailable(f"a shipped shapes model cannot be loaded ({err})") from err
    grid = sigmas.karras(steps, 0.002, 80.0)
    parts = {part: split_combos("band", split)[:cfg["pairs"]] for part, split in (("held", "test"), ("seen", "train"))}
    plan = [("plain model (lambda = 0), composed AND", "plain", "and"),
            ("plain model (lambda = 0), joint CFG", "plain", "joint"),
            ("CoInD (lambda = 1), composed AND", "coind", "and")]
    bar = ctx.bar(len(plan), "composition")
    variants = []
    for i, (label, key, mode) in enumerate(plan):
        model = models[key]
        scores, held_images, nfe, start = {}, [], 0.0, time.perf_counter()
        for part, combos in parts.items():
            conforming = 0.0
            for q, (s, c) in enumerate(combos):
                guider = Compose.for_model(model, f"shape={SHAPES[s]} & colour={COLOURS[c]}", SCALE, mode=mode)
                seed = ctx.seed + 1000 * q + (0 if part == "held" else 500)
                noise = torch.randn(n, *model.sample_shape, generator=torch.Generator().manual_seed(seed))
                with torch.no_grad():
                    x, stats = sample(model, noise, grid, method="euler", cond=guider.cond(n), guidance=guider,
                                      return_stats=True)
                x = x.clamp(-1, 1)
                nfe = float(stats.nfe)
                conforming += conformity(clf.predict(x), guider.terms)
                if part == "held":
                    held_images.append(x)
            scores[part] = conforming / len(combos)
        # Diversity of the uncontrolled attribute: colour entropy for shape-only queries (AND rule only).
        entropy = None
        if mode == "and":
            ent = []
            for s in range(len(SHAPES)):
                guider = Compose.for_model(model, f"shape={SHAPES[s]}", SCALE, mode="and")
                noise = torch.randn(4 * n, *model.sample_shape,
                                    generator=torch.Generator().manual_seed(ctx.seed + 7000 + s))
                with torch.no_grad():
                    x = sample(model, noise, grid, method="euler", cond=guider.cond(4 * n), guidance=guider)
                ent.append(label_entropy(clf.predict(x.clamp(-1, 1))[:, 1], len(COLOURS)))
            entropy = sum(ent) / len(ent)
        values = {"nfe": nfe, "wall_s": time.perf_counter() - start, "cs_held": scores["held"],
                  "cs_seen": scores["seen"], "colour_entropy_bits": entropy}
        image = ctx.grid(torch.cat(held_images), f"{i}_{key}_{mode}.png", nrow=n * 2)
        variants.append(Variant(label, f"{key}-{mode}", values, image,
                                f"{label}: {len(parts['held'])} held-out pairs, {n} samples each, NFE {nfe:g}"))
        bar.update(1)
    plain, coind = variants[0].values, variants[2].values
    findings = [f"Held-out pairs: CoInD conforms on {coind['cs_held']:.2f} of samples, the plain model on "
                f"{plain['cs_held']:.2f} (same AND rule, same NFE {coind['nfe']:g}); seen pairs "
                f"{coind['cs_seen']:.2f} vs {plain['cs_seen']:.2f}.",
                "At this CPU training budget neither model composes the unseen pairs reliably (benchmarks/coind.py "
                "measures the same miss: its test P1 asks CoInD >= plain + 0.15); CoInD's gain shows in colour "
                "diversity for shape-only queries and in the conditional-independence metric."]
    return SectionResult(
        "composition", "",
        about=("A model trained on some attribute pairs is asked for pairs it never saw by composing its per-"
               "attribute conditionals (shape AND colour). CoInD trains those conditionals to be independent so "
               "that the composition is faithful; the plain model is trained on the same data without that term."),
        legend=("CS held-out / seen: fraction of samples whose classified shape and colour both match the query "
                "(higher is better; held-out pairs were never in training); colour entropy: bits of the colour "
                "distribution for shape-only queries (higher = more diverse, max 2); NFE per sample."),
        columns=[Column("nfe", "NFE", "g"), Column("wall_s", "wall s", ".2f"),
                 Column("cs_held", "CS held-out", ".3f", "higher"), Column("cs_seen", "CS seen", ".3f", "higher"),
                 Column("colour_entropy_bits", "colour entropy (bits)", ".2f", "higher")],
        variants=variants, findings=findings,
        figures=[Figure(_bars(ctx, variants), "Share of conforming samples on held-out and seen pairs per variant.")],
        config={"models": "shipped shapes_band (lambda 0) and shapes_coind (lambda 1), band split",
                "sampler": f"Euler, {steps} steps, karras(0.002, 80)", "scale": SCALE,
                "samples": f"{n} per pair, {len(parts['held'])} held-out + {len(parts['seen'])} seen pairs; "
                           f"{4 * n} per shape-only query"},
    )


def _bars(ctx, variants) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    width = 0.38
    for j, (key, label) in enumerate((("cs_held", "held-out pairs"), ("cs_seen", "seen pairs"))):
        ax.bar([i + (j - 0.5) * width for i in range(len(variants))], [v.values[key] for v in variants], width,
               label=label)
    ax.set_xticks(range(len(variants)), [v.method for v in variants], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("conformity (share of samples)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return ctx.plot(fig, "conformity.png")
