"""``steerdiff motion``: new motions from a MotionDreamer model trained on one reference motion (Wang et al., ICLR 2025;
docs/methods/motiondreamer.md, "Command line").

    steerdiff motion --skeleton biped --count 4 --out out/motion
    steerdiff motion --skeleton quadruped --edit 60:120 --count 2 --out out/edit
    steerdiff motion --skeleton biped --beats 0,20,40,60,80 --out out/beats
    steerdiff motion --model runs/motiondreamer_biped --frames 480 --out out/long

Writes ``motion_<i>.bvh`` (BVH, the skeleton's joints, the model's frame rate), ``features.safetensors`` (``features``
``[count, frames, F]``) and ``metrics.json`` (tokens, NFE, CPU time; with ``--edit`` the regenerated frame span, the
seams' frame-to-frame steps beside the reference's and ``reference.bvh``; with ``--beats`` the beat-hit rate).
``--beats`` steers the token sampler by SMC (``--particles``, ``--alpha``) towards motions that pause on the beats
(docs/methods/motiondreamer.md, "Beat-aligned generation"); ``--scale`` adds classifier-free guidance on the beat
flags.
``--edit START:END`` regenerates those frames of the model's reference motion (widened to whole tokens) and keeps the
others bit for bit.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import torch

from ...data.motion import features_to_motion, motion_features, write_bvh
from ...data.motion_synth import reference_motion, skeleton
from ...io import save_tensors
from ...models.io import ASSETS_DIR
from ...motion.apps import beat_alignment
from ...motion.dreamer import META_NAME, MotionDreamer
from ..recipes.motiondreamer import SKELETONS, asset_name
from ._common import POSITIVE, SEED, device_option, dtype_option, prepare_out, start_outputs, write_metrics
from ._models import ModelKind, register_model_kind


def _span(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        a, b = (int(v) for v in value.split(":"))
    except ValueError:
        raise click.BadParameter(f"expected START:END frames (e.g. 60:120), got {value!r}",
                                 param_hint="--edit") from None
    if not 0 <= a < b:
        raise click.BadParameter(f"needs 0 <= START < END, got {value!r}", param_hint="--edit")
    return a, b


def _beats(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        beats = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated frame indices, got {value!r}",
                                 param_hint="--beats") from None
    if not beats or min(beats) < 0:
        raise click.BadParameter(f"expected non-negative frame indices, got {value!r}", param_hint="--beats")
    return beats


def load_dreamer(name: str | None, skel: str) -> MotionDreamer:
    """A saved model folder, or the shipped one of ``skel``."""
    path = Path(name) if name else ASSETS_DIR / asset_name(skel)
    if not (path / META_NAME).is_file():
        hint = "" if name else " (the shipped model is missing: python scripts/make_assets.py --only " \
                                f"{asset_name(skel)})"
        raise click.BadParameter(f"{path} is not a MotionDreamer model folder{hint}", param_hint="--model")
    return MotionDreamer.load(path)


def _detect_motion(directory: Path, _config: dict | None) -> ModelKind | None:
    return ModelKind("motion") if (directory / META_NAME).is_file() else None


# a MotionDreamer folder (tokeniser + generator): the sampling commands refuse it by name and point here
register_model_kind(
    "motion", detect=_detect_motion,
    describe=lambda name, _kind: f"{name} is a MotionDreamer motion model (tokeniser and masked generator), not a "
                                 f"denoiser; generate motions with steerdiff motion --model {name}")


@click.command("motion")
@click.option("--skeleton", "skel", type=click.Choice(SKELETONS), default="biped", show_default=True,
              help="Which shipped model (ignored with --model, which names its own skeleton).")
@click.option("--model", default=None, help="A MotionDreamer folder (default: the shipped one of --skeleton).")
@click.option("--count", type=click.IntRange(1, 256), default=4, show_default=True, help="Motions to write.")
@click.option("--frames", type=click.IntRange(8, 100000), default=None,
              help="Frames per motion (default: the reference's length).")
@click.option("--steps", type=click.IntRange(1, 1000), default=12, show_default=True,
              help="Confidence-ordered decoding rounds (NFE).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Motion i uses seed + i.")
@click.option("--edit", "edit", default=None, metavar="START:END", help="Regenerate these frames of the reference.")
@click.option("--beats", default=None, metavar="F1,F2,...",
              help="Beat frames to align the motion to (SMC steering towards a beat reward).")
@click.option("--particles", type=click.IntRange(1, 4096), default=32, show_default=True,
              help="SMC particles per motion with --beats (1: classifier-free guidance on the beat flags alone).")
@click.option("--alpha", type=POSITIVE, default=0.02, show_default=True,
              help="SMC tilt temperature with --beats (smaller: stronger pull towards the beats).")
@click.option("--scale", type=POSITIVE, default=None,
              help="CFG scale on the beat flags with --beats (default: none when steering, 2 with --particles 1).")
@click.option("--out", required=True, help="Output directory.")
@device_option
@dtype_option
def motion_cmd(skel, model, count, frames, steps, seed, edit, beats, particles, alpha, scale, out, device, dtype):
    """MotionDreamer: new motions (BVH) from a model of one reference motion; --edit regenerates a span."""
    span, beat_frames = _span(edit), _beats(beats)
    if span is not None and beat_frames is not None:
        raise click.BadParameter("--edit and --beats do not combine", param_hint="--beats")
    out_dir = start_outputs(prepare_out(out))
    md = load_dreamer(model, skel)
    md.generator.to(device, dtype)  # the transformer runs in --dtype; the tokeniser decodes in float32
    md.tokenizer.to(device)
    sk = skeleton(md.skeleton)
    fps = float(md.meta.get("fps", 30.0))
    c0, metrics = time.process_time(), {"skeleton": md.skeleton, "count": count, "steps": steps, "seed": seed}
    if span is not None:
        ref_meta = md.meta.get("reference", {"frames": 240, "seed": 0})
        ref = motion_features(reference_motion(md.skeleton, frames=ref_meta["frames"], seed=ref_meta["seed"]))
        ref = ref.to(device)
        if span[1] > ref.shape[0]:
            raise click.BadParameter(f"END must be <= the reference's {ref.shape[0]} frames, got {edit}",
                                     param_hint="--edit")
        res = md.edit(ref, *span, count=count, steps=steps, seed=seed)
        feats = res.features
        write_bvh(features_to_motion(ref, sk, fps), out_dir / "reference.bvh")
        kept = torch.cat([feats[:, : res.span[0]], feats[:, res.span[1]:]], 1)
        same = torch.cat([ref[: res.span[0]], ref[res.span[1]:]]).expand_as(kept)
        metrics.update({"edited_span": list(res.span), "kept_bit_identical": bool(torch.equal(kept, same)),
                        "seam_steps": res.seams["seam_steps"].tolist(),
                        "reference_step_max": res.seams["reference_max"],
                        "reference_step_p99": res.seams["reference_p99"], "seams_within": res.seams["within"]})
    else:
        if scale is None and particles == 1:
            scale = 2.0
        feats = md.sample(count, frames, steps=steps, seed=seed, beats=beat_frames, guidance_scale=scale,
                          particles=particles, alpha=alpha)
        if beat_frames is not None:
            norm = md.tokenizer.normalize
            metrics["beat_hit_rate"] = [beat_alignment(beat_frames, norm(f)) for f in feats]
            metrics.update({"scale": scale, "particles": particles, "alpha": alpha if particles > 1 else None})
    for i, f in enumerate(feats):
        write_bvh(features_to_motion(f, sk, fps), out_dir / f"motion_{i}.bvh")
    save_tensors({"features": feats.float()}, out_dir / "features.safetensors")
    nfe = steps if beat_frames is None else steps * (2 if scale is not None else 1) * particles
    metrics.update({"frames": int(feats.shape[1]), "nfe_per_motion": nfe,
                    "cpu_s": time.process_time() - c0})
    write_metrics(out_dir, metrics)
    click.echo(f"wrote {count} motion(s) of {feats.shape[1]} frames to {out_dir}")
