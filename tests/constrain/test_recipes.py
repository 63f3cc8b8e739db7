"""A tiny NAMM recipe through every stage (maps, mirror, plain, finetune, bundle) and the plain-vs-NAMM comparison."""

import json

import pytest

from steerdiff.app.protocols.namm import compare
from steerdiff.app.recipes.namm import run
from steerdiff.constrain.io import load_namm
from steerdiff.constrain.mirror import MirrorDenoiser

RECIPE = {
    "name": "tiny_namm",
    "data": {"name": "unit_circle", "n": 256, "seed": 0, "n_test": 64},
    "namm": {"forward": {"dim": 2, "hidden": 4, "layers": 1}, "inverse": {"dim": 2, "hidden": 8, "layers": 1},
             "train": {"steps": 3, "batch_size": 32}, "finetune": None},
    "model": {"class": "EDMPrecond", "config": {"sigma_data": 0.63, "net": {"class": "MLP", "config": {
        "dim": 2, "hidden": [8]}}}},
    "train": {"steps": 2, "batch_size": 32, "warmup_steps": 1, "checkpoint_every": 1},
    "sampler": {"steps": 3, "sigma_min": 0.002, "sigma_max": 10.0},
}


@pytest.mark.parametrize("samples", [0, 8])
def test_tiny_recipe_all_stages(tmp_path, samples):
    recipe = {**RECIPE, "namm": {**RECIPE["namm"], "finetune": {"samples": samples, "steps": 2}},
              "out_dir": str(tmp_path / "run")}
    path = tmp_path / "tiny_namm.json"
    path.write_text(json.dumps(recipe))
    paths = run(path)
    assert set(paths) == {"maps", "mirror", "plain", "finetune", "bundle"}
    namm, mirror = load_namm(paths["bundle"])
    maps, _ = load_namm(paths["maps"])
    assert namm.fingerprint == maps.fingerprint  # finetuning kept g, so the mirror model still fits
    assert namm.config["finetune_stages"][-1]["mdm_samples"] is (samples > 0)
    MirrorDenoiser(mirror, namm)
    res = compare(path, n=16)
    assert set(res["rows"]) == {"plain", "namm", "raw_mirror"} and res["rows"]["namm"]["nfe"] == 5
    assert compare(path, n=16)["rows"] == res["rows"]  # second call reads the sample cache: same draws
    again = run(path, ("maps",))  # existing maps with the same config are kept, not retrained
    assert load_namm(again["maps"])[0].fingerprint == maps.fingerprint
