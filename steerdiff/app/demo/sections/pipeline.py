"""Demo section: the shipped text-to-image pipeline (``steerdiff/assets/shapes_pipeline``, a diffusers
``StableDiffusionPipeline`` trained here on coloured shapes with captions; docs/methods/pipelines.md), steered by
steerdiff through ``sd.pipelines``: CFG vs APG at high guidance scales, DAS vs best-of-N on a decoded-image reward,
and a prompt composition vs the joint prompt on caption pairs never seen in training, each beside its baseline.
The same measurements at full size: ``python benchmarks/shapes_pipeline.py``.
"""

from __future__ import annotations

import time

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

APG_OPTIONS = {"eta": 0.0, "momentum": -0.5, "r_rms": 0.05}  # the guidance section's setting (digits)
ALPHA = 0.002  # DAS's temperature for the redness reward (its range over the red squares is about 0.1)
REWARD_PAIR = (0, 0)  # "a red square on a grey background"
CONFIGS = {  # quick: the CI run; full: the README's main job
    True: {"n": 1, "steps": 4, "scales": (15.0,), "groups": 2, "budget": 2, "compose_n": 1,
           "compose_pairs": 4},
    False: {"n": 8, "steps": 30, "scales": (7.5, 15.0, 25.0), "groups": 8, "budget": 4, "compose_n": 8,
            "compose_pairs": None},
}


@section("pipeline", "Text-to-image pipeline: APG, DAS and prompt composition on a diffusers pipeline",
         requires=("diffusers", "transformers"), order=70)
def run(ctx) -> SectionResult:
    """Guidance, reward alignment and composition on the shipped pipeline; the classifier judges the images."""
    from ....align.rewards import redness
    from ....guidance import APG
    from ...protocols import shapes_pipeline as sp

    cfg = CONFIGS[ctx.quick]
    n, steps = cfg["n"], cfg["steps"]
    try:
        pipe, judge = sp.load_shipped(), sp.load_judge()
    except (FileNotFoundError, ValueError, OSError) as err:
        raise SectionUnavailable(f"the shipped pipeline cannot be loaded ({err})") from err
    seen, held = sp.train_pairs(), sp.held_out_pairs()
    reference = sp.reference_images(pipe, seen, max(n, 8), seed=ctx.seed + 99)
    labels = sp.pair_labels(seen, n)
    bar = ctx.bar(2 * len(cfg["scales"]) + 4, "pipeline")
    variants = []

    # 1. Guidance: CFG vs APG at the same scale and NFE, the 8 seen captions.
    for w in cfg["scales"]:
        for key, label in (("cfg", "CFG"), ("apg", "APG")):
            guider = None if key == "cfg" else APG(w, **APG_OPTIONS)
            start = time.perf_counter()
            images, nfe = sp.prompt_samples(pipe, seen, n, steps=steps, scale=w, guidance=guider, seed=ctx.seed)
            scores = sp.image_scores(images, labels, judge, reference)
            values = {"experiment": "guidance", "setting": f"w = {w:g}", "nfe": nfe, "cost": nfe, "wall_s":
                      time.perf_counter() - start, **_pick(scores, "conformity", "saturation_excess", "clipped"),
                      "reward": None}
            name = f"{label} w = {w:g}"
            image = ctx.grid(images[::n], f"{key}_w{w:g}".replace(".", "p") + ".png", nrow=8)
            variants.append(Variant(name, label, values, image, f"{name}: one image per seen caption, NFE {nfe:g}"))
            bar.update(1)

    # 2. Reward alignment on decoded images: DAS vs best-of-N at equal cost per output.
    runs = sp.reward_runs(pipe, REWARD_PAIR, redness, groups=cfg["groups"], budget=cfg["budget"], alpha=ALPHA,
                          steps=steps, seed=ctx.seed)
    for method, label in (("das", "DAS"), ("bon", "best-of-N")):
        r = runs[method]
        k = r["result"].particles  # the library's gradient-free DAS and best-of-N: 3 x budget (equal cost)
        setting = f"P = {k}, no gradient" if method == "das" else f"K = {k}"
        values = {"experiment": "reward", "setting": setting, "nfe": r["nfe"], "cost": r["cost"],
                  "wall_s": r["wall_s"], "conformity": None, "saturation_excess": None, "clipped": None,
                  "reward": r["reward"]}
        image = ctx.grid(r["images"], f"reward_{method}.png", nrow=min(8, cfg["groups"]))
        variants.append(Variant(f"{label} ({setting})", label, values, image,
                                f"{label}, redness of 'a red square', cost {r['cost']:.0f} per output"))
        bar.update(1)

    # 3. Composition of held-out pairs from seen captions vs the joint caption.
    held = held[:cfg["compose_pairs"]]  # quick: the first held-out pairs
    comp = sp.composition_scores(pipe, judge, held, cfg["compose_n"], steps=steps, seed=ctx.seed)
    for key, label in (("joint", "joint prompt (CFG)"), ("composed", "composed seen prompts")):
        r = comp[key]
        values = {"experiment": "composition", "setting": f"{len(held)} held-out pairs", "nfe": r["nfe"],
                  "cost": r["nfe"], "wall_s": r["wall_s"],
                  "conformity": r["conformity"], "saturation_excess": None, "clipped": None, "reward": None}
        k = cfg["compose_n"]
        image = ctx.grid(r["images"][::k], f"compose_{key}.png", nrow=8)
        variants.append(Variant(label, label, values, image, f"{label}: one image per held-out pair"))
        bar.update(1)

    by = {(v.values["experiment"], v.method, v.values["setting"]): v.values for v in variants}
    findings = []
    for w in cfg["scales"]:
        c, a = by[("guidance", "CFG", f"w = {w:g}")], by[("guidance", "APG", f"w = {w:g}")]
        findings.append(f"w = {w:g}: saturation excess CFG {c['saturation_excess']:+.3f}, APG "
                        f"{a['saturation_excess']:+.3f}; conformity CFG {c['conformity']:.2f}, APG "
                        f"{a['conformity']:.2f} (same NFE {c['nfe']:g}).")
    findings.append(f"Redness of 'a red square' at equal cost: DAS {runs['das']['reward']:.3f}, best-of-N "
                    f"{runs['bon']['reward']:.3f}.")
    findings.append(f"Held-out caption pairs: composed from seen captions {comp['composed']['conformity']:.2f} "
                    f"conforming (NFE {comp['composed']['nfe']:g}), joint prompt {comp['joint']['conformity']:.2f} "
                    f"(NFE {comp['joint']['nfe']:g}).")
    return SectionResult(
        "pipeline", "",
        about=("A diffusers StableDiffusionPipeline (VAE, CLIP text encoder, UNet, Euler scheduler) trained here on "
               "captioned coloured shapes, for 8 of the 16 (shape, colour) pairs, is steered through sd.pipelines: "
               "APG against CFG at the same high scale, DAS against best-of-N on a reward computed on the decoded "
               "images, and the unseen pairs composed from seen captions (red disk = red square AND green disk "
               "NOT green square) against asking for them by name."),
        legend=("conformity: share of images whose classified shape and colour match the request (higher is "
                "better); saturation excess: mean HSV saturation minus that of data of the same captions as the "
                "VAE reproduces them (closer to 0 is better; CFG's over-saturation makes it grow with the scale); "
                "clipped: share of pixel values at the decoder's clamp (lower is better); reward: mean redness of "
                "the decoded images (higher is better); NFE per image (a CFG step costs 2, a composition step one "
                "per term plus the null); cost: NFE + 2 x VJP per image (a backward pass costs about two forward "
                "passes). Rows of one experiment compare at equal cost, except composition (its cost is shown)."),
        columns=[Column("experiment", "experiment", ""), Column("setting", "setting", ""),
                 Column("nfe", "NFE", "g"), Column("cost", "cost", ".0f"), Column("wall_s", "wall s", ".2f"),
                 Column("conformity", "conformity", ".3f", "higher"),
                 Column("saturation_excess", "saturation excess", "+.3f", "lower"),
                 Column("clipped", "clipped", ".4f", "lower"), Column("reward", "reward", ".4f", "higher")],
        variants=variants, findings=findings, group_by="experiment",
        figures=[Figure(ctx.grid(reference[::max(n, 8)][:8], "data.png", nrow=8),
                        "Data through the VAE (decode(encode(x)), the saturation reference): one training image per "
                        "seen caption.", kind="reference", group="guidance"),
                 Figure(_plot(ctx, variants), "Saturation excess against the guidance scale (left); decoded reward "
                        "at equal cost and held-out-pair conformity (right).")],
        config={"pipeline": "steerdiff/assets/shapes_pipeline (StableDiffusionPipeline, 32x32, Euler trailing)",
                "steps": steps, "images per caption": n, "APG": ", ".join(f"{k} {v}" for k, v in APG_OPTIONS.items()),
                "reward": f"redness of decoded images, caption {sp.shapes.caption(*REWARD_PAIR)!r}, alpha {ALPHA}",
                "cost": "NFE + 2 x VJP per output (best-of-N K = 3 P)", "composition scale": sp.DEFAULT_SCALE,
                "judge": "shipped shapes classifier on the centre crop, 2x2 average"},
    )


def _pick(d: dict, *keys: str) -> dict:
    return {k: d[k] for k in keys}


def _plot(ctx, variants: list[Variant]) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for label in ("CFG", "APG"):
        rows = [v.values for v in variants if v.values["experiment"] == "guidance" and v.method == label]
        axes[0].plot([float(r["setting"].split("= ")[1]) for r in rows], [r["saturation_excess"] for r in rows],
                     "o-", label=label)
    axes[0].set_xlabel("guidance scale w")
    axes[0].set_ylabel("saturation excess")
    axes[0].legend(fontsize=8)
    axes[0].grid(alpha=0.3)
    bars = [(v.name, v.values["reward"] if v.values["experiment"] == "reward" else v.values["conformity"])
            for v in variants if v.values["experiment"] in ("reward", "composition")]
    axes[1].bar(range(len(bars)), [b for _, b in bars], color=["C0", "C1", "C2", "C3"][: len(bars)])
    axes[1].set_xticks(range(len(bars)), [name.split(" (")[0] for name, _ in bars], fontsize=7)
    axes[1].set_title("redness (DAS, best-of-N) / conformity (joint, composed)", fontsize=9)
    axes[1].grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return ctx.plot(fig, "pipeline.png")
