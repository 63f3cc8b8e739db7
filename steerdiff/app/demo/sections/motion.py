"""Demo section: MotionDreamer, new motions from one reference motion, and temporal editing (Wang et al., ICLR 2025;
docs/methods/motiondreamer.md, "Applications"; the comparison with the baselines is ``benchmarks/motiondreamer.py``).

The shipped biped model (``motiondreamer_biped``) draws motions of the reference's length; each row of the strip is one
motion as stick figures (side view, every ``stride`` frames). Rows: the reference, generated motions, an edit of the
reference's middle (the kept frames are the reference's, bit for bit). Then beat-aligned generation on the shipped
quadruped (docs/methods/motiondreamer.md, "Beat-aligned generation"): one evenly spaced beat sequence at the
reference's own beat rate, unguided draws against SMC-steered draws (:func:`steerdiff.motion.apps.align_to_beats`) of
the same seed, drawn as the pose at each requested beat (red where the motion pauses within 2 frames of it) over
ticks at the beats, with each arm's beat-hit rate and NFE. Quick mode: two motions per row, 6 decoding rounds, 8 SMC
particles (about 0.6 CPU s for the beat rows, docs/methods/motiondreamer.md "Beat-aligned generation").
"""

from __future__ import annotations

import time

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

CONFIGS = {True: {"count": 2, "steps": 6, "particles": 8}, False: {"count": 4, "steps": 12, "particles": 32}}
BEAT_SKELETON = "quadruped"
ALPHA = 0.02  # the SMC tilt temperature of `steerdiff motion --beats` (docs/methods/motiondreamer.md)
TOLERANCE = 2  # frames: a requested beat is hit by a pause this close (beat_alignment's default)


@section("motion", "Motion: MotionDreamer from one reference motion, temporal editing and beat alignment",
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
    for name in ("biped", BEAT_SKELETON):
        if not (ASSETS_DIR / asset_name(name) / META_NAME).is_file():
            raise SectionUnavailable(f"the shipped {asset_name(name)} model is missing; run scripts/make_assets.py "
                                     f"--only {asset_name(name)}")
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
    keys = ("skeleton", "coverage", "local_div", "beat_hit", "kept_identical", "seams_within", "nfe", "wall_s")
    for i, (name, method, feats, values) in enumerate(rows):
        image = _strip(ctx, feats, sk, f"motion{i}.png", highlight=edit.span if method == "edit" else None)
        values = {k: values.get(k) for k in keys}  # a column a row does not measure reads None ("-")
        values["skeleton"] = md.skeleton
        variants.append(Variant(name, method, values, image, f"{name}: stick figures every 12 frames"))
    beat_rows, beat_findings, beat_config = _beat_rows(ctx, cfg)
    variants += [Variant(name, method, {k: values.get(k) for k in keys}, image, caption)
                 for name, method, values, image, caption in beat_rows]
    return SectionResult(
        "motion", "",
        about=("MotionDreamer tokenises one motion with a VQ-VAE whose codebook usage is regularised, and learns a "
               "masked-token transformer with sliding-window local attention on its tokens; confidence-ordered "
               "decoding then draws new motions that reuse the reference's local patterns in new orders. Editing "
               "masks a span of tokens and regenerates it with the rest fixed. Beat alignment steers the token "
               "sampler by SMC (particles resampled by a reward: the share of requested beats where the decoded "
               "motion pauses) against unguided draws of the same seed."),
        legend=("coverage: share of the reference's 30-frame windows found in the generated motions (higher is "
                "better); local div: distance of generated 15-frame windows to the nearest reference window (0 = a "
                "copy); beat hit: share of the requested beats with a pause of the motion (a local minimum of its "
                "speed below the median) within 2 frames, mean over the row's motions (higher is better); kept "
                "identical: the edit's kept frames equal the reference's bit for bit; seams within: the edit's seam "
                "steps are no larger than the reference's largest frame-to-frame step. NFE: generator evaluations "
                "per motion (SMC: rounds x particles). Rows are compared within a skeleton."),
        columns=[Column("skeleton", "skeleton", ""), Column("coverage", "coverage", ".3f", "higher"),
                 Column("local_div", "local div", ".3f"), Column("beat_hit", "beat hit", ".2f", "higher"),
                 Column("kept_identical", "kept identical", ""), Column("seams_within", "seams within", ""),
                 Column("nfe", "NFE", "g"), Column("wall_s", "wall s", ".2f")],
        variants=variants,
        group_by="skeleton",
        findings=[f"The edit keeps {n - (edit.span[1] - edit.span[0])} frames bit-identical: {same}; seam steps "
                  f"{[round(float(v), 3) for v in edit.seams['seam_steps'].flatten()]} vs the reference's largest "
                  f"step {edit.seams['reference_max']:.3f}.", *beat_findings],
        figures=[Figure(_root_plot(ctx, ref, gen, sk), "Root path seen from above (x against z) of the reference "
                        "(black) and the generated motions: new orders of the reference's local patterns.")],
        config={"model": "motiondreamer_biped (steerdiff.app.recipes.motiondreamer)", "count": cfg["count"],
                "decoding rounds": cfg["steps"], "seed": ctx.seed, **beat_config},
    )


def _beat_rows(ctx, cfg) -> tuple[list, list[str], dict]:
    """Beat-aligned generation on the shipped quadruped: unguided draws and SMC-steered draws (``align_to_beats``)
    of the same seed against one evenly spaced beat sequence at the reference's own beat rate (as
    ``benchmarks/motiondreamer.py``'s beat study, at a fixed phase: half a beat period). Returns the rows
    ``(name, method, values, image, caption)``, findings and config entries."""
    from ....data.motion import FeatureStats, motion_features
    from ....data.motion_synth import reference_motion, skeleton
    from ....metrics.motion import coverage, local_diversity
    from ....models.io import ASSETS_DIR
    from ....motion.apps import align_to_beats, beat_alignment, kinematic_beats
    from ....motion.dreamer import MotionDreamer
    from ...recipes.motiondreamer import asset_name

    md = MotionDreamer.load(ASSETS_DIR / asset_name(BEAT_SKELETON))
    sk = skeleton(md.skeleton)
    ref_meta = md.meta.get("reference", {"frames": 240, "seed": 0})
    ref = motion_features(reference_motion(md.skeleton, frames=ref_meta["frames"], seed=ref_meta["seed"]))
    stats, norm = FeatureStats.fit(ref), md.tokenizer.normalize  # metrics' space; the beats' (the tokeniser's)
    n, n_tok = ref.shape[0], md.reference_tokens.shape[0]
    gap = max(n // max(len(kinematic_beats(norm(ref))), 1), 6)  # the reference's own beat period (frames)
    beats = list(range(gap // 2, n, gap))
    count, steps, particles = cfg["count"], cfg["steps"], cfg["particles"]
    t0 = time.perf_counter()
    free = md.sample(count, n, steps=steps, seed=ctx.seed)
    free_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = align_to_beats(md.generator, md.tokenizer, beats, n_tok, count=count, particles=particles, alpha=ALPHA,
                         steps=steps, seed=ctx.seed)
    smc_s = time.perf_counter() - t0
    steered = res.features[:, :n]
    rows, hits = [], {}
    for method, name, feats, nfe, wall in (
            ("unguided", f"beats: unguided ({md.skeleton})", free, steps, free_s),
            ("smc", f"beats: SMC, {particles} particles ({md.skeleton})", steered, res.steered.nfe, smc_s)):
        hits[method] = [beat_alignment(beats, norm(f), TOLERANCE) for f in feats]
        values = {"skeleton": md.skeleton, "beat_hit": sum(hits[method]) / count,
                  "coverage": coverage(ref, list(feats), stats=stats),
                  "local_div": local_diversity(ref, list(feats), stats=stats), "nfe": nfe, "wall_s": wall}
        image = _beat_strip(ctx, feats, sk, beats, norm, f"motion_beats_{method}.png")
        caption = (f"{name}: the pose at each requested beat (ticks), red where the motion pauses within "
                   f"{TOLERANCE} frames of it; triangles: the motion's pauses")
        rows.append((name, method, values, image, caption))
    k = len(beats)
    findings = [f"Beats every {gap} frames ({k} in {n} frames, the {md.skeleton} reference's own rate): unguided "
                f"draws hit {[round(h * k) for h in hits['unguided']]} of {k}, SMC-steered draws of the same seed "
                f"{[round(h * k) for h in hits['smc']]} at {particles}x the NFE; coverage "
                f"{rows[0][2]['coverage']:.3f} vs {rows[1][2]['coverage']:.3f}."]
    config = {"beat model": f"{asset_name(BEAT_SKELETON)}", "beat frames": beats, "SMC particles": particles,
              "SMC alpha": ALPHA, "beat tolerance (frames)": TOLERANCE}
    return rows, findings, config


def _draw_poses(ax, pos, parents, frames, xs, colours, widths: dict | None = None) -> None:
    """Stick figures of ``pos [T, J, 2]`` (side view) at ``frames``, the i-th frame's root at ``xs[i]``, coloured
    ``colours[i]``: one line collection per colour (hundreds of bones as a few artists; one ``plot`` call per
    bone cost about half a CPU second per strip)."""
    from matplotlib.collections import LineCollection

    segments: dict[str, list] = {}
    for t, x, colour in zip(frames, xs, colours, strict=True):
        dx = x - pos[t, 0, 0]
        segments.setdefault(colour, []).extend(
            [(pos[t, q, 0] + dx, pos[t, q, 1]), (pos[t, j, 0] + dx, pos[t, j, 1])]
            for j, q in enumerate(parents) if q >= 0)
    for colour, segs in segments.items():
        ax.add_collection(LineCollection(segs, colors=colour, linewidths=(widths or {}).get(colour, 1.0)))
    ax.autoscale_view()


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
        # root at a fixed spacing: the pose, not the path
        frames = range(0, pos.shape[0], stride)
        _draw_poses(ax, pos, parents, frames, [t / stride * height * 0.8 for t in frames],
                    ["C3" if highlight and highlight[0] <= t < highlight[1] else "C0" for t in frames])
        ax.set_aspect("equal")
        ax.axis("off")
    fig.tight_layout()
    return ctx.plot(fig, name)


def _beat_strip(ctx, feats, sk, beats: list[int], norm, name: str) -> str:
    """One row per motion: the pose at each requested beat frame along a time axis (red where the motion pauses
    within ``TOLERANCE`` frames of the beat, as ``beat_alignment`` counts a hit), ticks under the row at the beats
    and triangles at the motion's own pauses (``kinematic_beats``)."""
    import torch

    from ....data.motion import features_to_motion
    from ....motion.apps import kinematic_beats
    from ....viz import _pyplot

    plt = _pyplot()
    n_rows = feats.shape[0]
    fig, axes = plt.subplots(n_rows, 1, figsize=(10, 0.9 * n_rows), squeeze=False)
    parents = sk.parents
    req = torch.as_tensor(beats)
    gap = int(req[1] - req[0]) if len(beats) > 1 else 12
    for r in range(n_rows):
        pos = features_to_motion(feats[r], sk).positions().numpy()  # [T, J, 3]
        h = 0 if abs(pos[-1, 0, 0] - pos[0, 0, 0]) >= abs(pos[-1, 0, 2] - pos[0, 0, 2]) else 2
        pos = pos[..., [h, 1]]
        height = max(float(pos[..., 1].max() - pos[..., 1].min()), 1e-3)
        rel = pos[..., 0] - pos[:, :1, 0]
        width = max(float((rel.max(1) - rel.min(1)).max()), height)
        per_frame = 1.15 * width / gap  # x per frame: neighbouring beat poses do not overlap
        pauses = kinematic_beats(norm(feats[r]))
        hit = ((req[:, None] - pauses[None]).abs() <= TOLERANCE).any(1) if pauses.numel() else req < 0
        ax = axes[r, 0]
        _draw_poses(ax, pos, parents, beats, [b * per_frame for b in beats],
                    ["C3" if ok else "C0" for ok in hit.tolist()], widths={"C3": 1.6})
        y0 = float(pos[..., 1].min()) - 0.1 * height  # the time axis under the poses
        ax.plot([0, (pos.shape[0] - 1) * per_frame], [y0, y0], color="0.6", lw=0.8)
        ax.vlines([b * per_frame for b in beats], y0 - 0.3 * height, y0, color="black", lw=1.5)
        ax.plot([float(f) * per_frame for f in pauses], [y0 - 0.45 * height] * len(pauses), "^", color="C1", ms=4)
        ax.text(-0.02, 0.5, f"{int(hit.sum())}/{len(beats)}", transform=ax.transAxes, ha="right", va="center",
                fontsize=9)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.tight_layout(pad=0.3)
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
