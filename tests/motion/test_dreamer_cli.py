"""MotionDreamer end to end on a tiny model: fit, save/load, the ``steerdiff motion`` command (BVH out, editing)."""

import json

import pytest
import torch
from click.testing import CliRunner

from steerdiff.app.cli import main
from steerdiff.data.motion import load_bvh, motion_features
from steerdiff.data.motion_synth import reference_motion
from steerdiff.motion.dreamer import MotionDreamer, fit
from steerdiff.motion.generator import GeneratorConfig
from steerdiff.train.motion_vq import MotionVQConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ref = motion_features(reference_motion("biped", frames=48))
    md = fit(ref, "biped", vq=MotionVQConfig(steps=3, window=16, hidden=16, code_dim=8, codebook_size=8),
             gen=GeneratorConfig(steps=3, dim=16, heads=2, depth=1))
    md.meta["reference"] = {"frames": 48, "seed": 0}
    path = tmp_path_factory.mktemp("md") / "model"
    md.save(path)
    return md, path


def test_save_load_round_trip(tiny):
    md, path = tiny
    back = MotionDreamer.load(path)
    assert back.skeleton == "biped" and torch.equal(back.reference_tokens, md.reference_tokens)
    a = md.sample(2, 40, steps=4, seed=3)
    assert a.shape[:2] == (2, 40)
    assert torch.equal(a, back.sample(2, 40, steps=4, seed=3))
    beats = md.sample(1, 40, steps=4, seed=3, beats=[0, 8, 16])  # CFG path runs (doubled batch)
    assert beats.shape[:2] == (1, 40)
    with pytest.raises(FileNotFoundError, match="not a saved MotionDreamer"):
        MotionDreamer.load(path / "tokenizer")


def test_cli_writes_bvh_and_edits(tiny, tmp_path):
    _, path = tiny
    runner = CliRunner()
    res = runner.invoke(main, ["motion", "--model", str(path), "--count", "2", "--frames", "32", "--steps", "4",
                               "--out", str(tmp_path / "gen")])
    assert res.exit_code == 0, res.output
    for i in range(2):
        m = load_bvh(tmp_path / "gen" / f"motion_{i}.bvh")
        assert m.n_frames == 32 and m.skeleton.n_joints == reference_motion("biped", frames=2).skeleton.n_joints
    res = runner.invoke(main, ["motion", "--model", str(path), "--edit", "10:30", "--steps", "4",
                               "--out", str(tmp_path / "edit")])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "edit" / "metrics.json").read_text())
    assert metrics["kept_bit_identical"] and metrics["edited_span"][0] <= 10 and metrics["edited_span"][1] >= 30
    assert (tmp_path / "edit" / "reference.bvh").is_file()
    res = runner.invoke(main, ["motion", "--model", str(path), "--beats", "0,8,16", "--particles", "4", "--count", "2",
                               "--frames", "32", "--steps", "4", "--out", str(tmp_path / "beats")])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "beats" / "metrics.json").read_text())
    assert metrics["particles"] == 4 and metrics["scale"] is None and len(metrics["beat_hit_rate"]) == 2
    assert metrics["nfe_per_motion"] == 4 * 4  # 4 rounds x 4 particles, no CFG
    res = runner.invoke(main, ["motion", "--model", str(path), "--edit", "30:10", "--out", str(tmp_path / "bad")])
    assert res.exit_code == 2 and "--edit" in res.output
