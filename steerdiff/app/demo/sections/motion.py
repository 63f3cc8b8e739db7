"""Demo section: MotionDreamer, new motions from one reference motion, and temporal editing (Wang et al., ICLR 2025;
docs/methods/motiondreamer.md, "Applications"; the comparison with the baselines is ``benchmarks/motiondreamer.py``).

The shipped biped model (``motiondreamer_biped``) draws motions of the reference's length; each row of the strip is one
motion as stick figures (side view, every ``stride`` frames). Rows: the reference, generated motions, an edit of the
reference's middle (the kept frames are the reference's, bit for bit). Quick mode: two motions, 6 decoding rounds.
"""

from __future__ import annotations

import time

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

CONFIGS = {True: {"count": 2, "steps": 6}, False: {"count": 4, "steps": 12}}


@section("motion", "Motion: MotionDreamer from one reference motion, and temporal editing",
         requires=("steerdiff.motion",), order=97)
def run(ctx) -> SectionResult:
    """Generated and edited motions beside the reference, as stick-figure strips, with coverage and diversity."""
    import torch

    from ....data.motion import motion_features
    from ....data.motion_synth import reference_motion, skeleton
    from ....metrics.motion import coverage, local_diversity
    from ....models.io import ASSETS_DIR
    from ....motion.dreamer import META_NAME, MotionDreamer
    from ...recipes.motiondreamer import asset_name

    cfg = CONFIGS[ctx.quick]
    path = ASSETS_DIR / asset_name("biped")
    if not (path / META_NAME).is_file():
        raise SectionUnavailable("the shipped motiondreamer_biped model is missing; run scripts/make_assets.py "
                                 "--only motiondreamer_biped")
    md = MotionDreamer.load(path)
    sk = skeleton(md.skeleton)
    ref_meta = md.meta.get("reference", {"frames": 240, "seed": 0})
    ref = motion_features(reference_motion(md.skeleton, frames=ref_meta["frames"], seed=ref_meta["seed"]))
    stats = (ref.mean(0), ref.std(0).clamp_min(1e-2))

    class _Stats:
        def normalize(self, x):
            return (x - stats[0]) / stats[1]

    variants = []
    t0 = time.perf_counter()
    gen = md.sample(cfg["count"], ref.shape[0], steps=cfg["steps"], seed=ctx.seed)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = ref.shape[0]
    edit = md.edit(ref, n // 3, 2 * n // 3, count=1, steps=cfg["steps"], seed=ctx.seed)
    edit_s = time.perf_counter() - t0
    kept = torch.cat([edit.features[0, : edit.span[0]], edit.features[0, edit.span[1]:]])
    same = bool(torch.equal(kept, torch.cat([ref[: edit.span[0]], ref[edit.span[1]:]])))
    rows = [("reference", "reference", ref[None], {"nfe": 0, "wall_s": 0.0}),
            ("generated", "motiondreamer", gen,
             {"coverage": coverage(ref, list(gen), stats=_Stats()),
              "local_div": local_diversity(ref, list(gen), stats=_Stats()), "nfe": cfg["steps"], "wall_s": gen_s}),
            (f"edit frames {edit.span[0]}-{edit.span[1]}", "edit", edit.features,
             {"kept_identical": str(same), "seams_within": str(edit.seams["within"]), "nfe": cfg["steps"],
              "wall_s": edit_s})]
    keys = ("coverage", "local_div", "kept_identical", "seams_within", "nfe", "wall_s")
    for i, (name, method, feats, values) in enumerate(rows):
        image = _strip(ctx, feats, sk, f"motion{i}.png", highlight=edit.span if method == "edit" else None)
        values = {k: values.get(k) for k in keys}  # a column a row does not measure reads None ("-")
        variants.append(Variant(name, method, values, image, f"{name}: stick figures every 12 frames"))
    return SectionResult(
        "motion", "",
        about=("MotionDreamer tokenises one motion with a VQ-VAE whose codebook usage is regularised, and learns a "
               "masked-token transformer with sliding-window local attention on its tokens; confidence-ordered "
               "decoding then draws new motions that reuse the reference's local patterns in new orders. Editing "
               "masks a span of tokens and regenerates it with the rest fixed."),
        legend=("coverage: share of the reference's 30-frame windows found in the generated motions (higher is "
                "better); local div: distance of generated 15-frame windows to the nearest reference window (0 = a "
                "copy); kept identical: the edit's kept frames equal the reference's bit for bit; seams within: the "
                "edit's seam steps are no larger than the reference's largest frame-to-frame step."),
        columns=[Column("coverage", "coverage", ".3f", "higher"), Column("local_div", "local div", ".3f"),
                 Column("kept_identical", "kept identical", ""), Column("seams_within", "seams within", ""),
                 Column("nfe", "NFE", "g"), Column("wall_s", "wall s", ".2f")],
        variants=variants,
        findings=[f"The edit keeps {n - (edit.span[1] - edit.span[0])} frames bit-identical: {same}; seam steps "
                  f"{[round(float(v), 3) for v in edit.seams['seam_steps'].flatten()]} vs the reference's largest "
                  f"step {edit.seams['reference_max']:.3f}."],
        figures=[Figure(_root_plot(ctx, ref, gen, sk), "Root path seen from above (x against z) of the reference "
                        "(black) and the generated motions: new orders of the reference's local patterns.")],
        config={"model": "motiondreamer_biped (steerdiff.app.recipes.motiondreamer)", "count": cfg["count"],
                "decoding rounds": cfg["steps"], "seed": ctx.seed},
    )


def _strip(ctx, feats, sk, name: str, stride: int = 12, highlight=None) -> str:
    """One row of stick figures per motion (side view, figures shifted along the row by their frame)."""
    from ....data.motion import features_to_motion
    from ....viz import _pyplot

    plt = _pyplot()
    n_rows = feats.shape[0]
    fig, axes = plt.subplots(n_rows, 1, figsize=(10, 1.3 * n_rows), squeeze=False)
    parents = sk.parents
    for r in range(n_rows):
        pos = features_to_motion(feats[r], sk).positions().numpy()  # [T, J, 3]
        # side view: the horizontal axis along which the root travels most (x or z), against height y
        h = 0 if abs(pos[-1, 0, 0] - pos[0, 0, 0]) >= abs(pos[-1, 0, 2] - pos[0, 0, 2]) else 2
        pos = pos[..., [h, 1]]
        ax = axes[r, 0]
        height = max(float(pos[..., 1].max() - pos[..., 1].min()), 1e-3)
        for t in range(0, pos.shape[0], stride):
            p = pos[t]
            shift = t / stride * height * 0.8 - p[0, 0]  # root at a fixed spacing: the pose, not the path
            col = "C3" if highlight and highlight[0] <= t < highlight[1] else "C0"
            for j, q in enumerate(parents):
                if q >= 0:
                    ax.plot([p[q, 0] + shift, p[j, 0] + shift], [p[q, 1], p[j, 1]], color=col, lw=1)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.tight_layout()
    return ctx.plot(fig, name)


def _root_plot(ctx, ref, gen, sk) -> str:
    """Root trajectories from above: the reference and each generated motion."""
    from ....data.motion import features_to_motion
    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for i, feats in enumerate([ref, *gen]):
        root = features_to_motion(feats, sk).root_positions.detach().cpu().numpy()
        ax.plot(root[:, 0], root[:, 2], color="black" if i == 0 else None, lw=2 if i == 0 else 1,
                label="reference" if i == 0 else f"generated {i}")
    ax.set_xlabel("x")
    ax.set_ylabel("z")
    ax.set_aspect("equal", adjustable="datalim")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return ctx.plot(fig, "motion_root.png")
