"""The shipped MotionDreamer models (docs/methods/motiondreamer.md, "Shipped models"): they are what the recipe makes
(training budget and time recorded), and editing one keeps the reference's frames bit for bit with every seam within
the reference's own frame-to-frame steps (issue 42's editing target; "Applications", temporal editing)."""

import pytest
import torch

from steerdiff.app.recipes.motiondreamer import GEN_STEPS, SKELETONS, asset_name
from steerdiff.data.motion import motion_features
from steerdiff.data.motion_synth import reference_motion
from steerdiff.models.io import ASSETS_DIR
from steerdiff.motion.dreamer import MotionDreamer
from steerdiff.train.motion_vq import MotionVQConfig


@pytest.fixture(scope="module", params=SKELETONS)
def shipped(request):
    return MotionDreamer.load(ASSETS_DIR / asset_name(request.param))


def test_shipped_model_is_the_recipes(shipped):
    meta = shipped.meta
    assert meta["generator_log"]["config"]["steps"] == GEN_STEPS
    assert meta["tokenizer_log"]["config"]["steps"] == MotionVQConfig().steps
    assert 0 < meta["train_cpu_s"] < 30 * 60  # the budget: under 30 minutes on 2 cores


def test_edit_keeps_frames_and_seams_within_reference_steps(shipped):
    ref_meta = shipped.meta["reference"]
    ref = motion_features(reference_motion(shipped.skeleton, frames=ref_meta["frames"], seed=ref_meta["seed"]))
    res = shipped.edit(ref, 80, 160, count=8, steps=12, seed=0)  # what `steerdiff motion --edit 80:160 --count 8` runs
    a, b = res.span
    assert torch.equal(res.features[:, :a], ref[:a].expand(8, -1, -1))
    assert torch.equal(res.features[:, b:], ref[b:].expand(8, -1, -1))
    # independent of seam_statistics: every step across a seam against the reference's largest step
    ref_max = (ref[1:] - ref[:-1]).norm(dim=-1).max()
    seams = torch.stack([(res.features[:, a] - res.features[:, a - 1]).norm(dim=-1),
                         (res.features[:, b] - res.features[:, b - 1]).norm(dim=-1)])
    assert (seams <= ref_max).all(), (seams.max(), ref_max)
