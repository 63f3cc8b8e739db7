"""The command line, end to end on the built-in mixture."""

import json

from click.testing import CliRunner

from steerdiff.cli import main


def test_sample_writes_plot_and_metrics(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--method", "heun", "--steps", "20",
                                    "--n", "300", "--seed", "1", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nfe"] == 39 and metrics["n"] == 300
    for key in ("sliced_w2_to_exact", "mode_weight_error", "wall_time_s", "sliced_w2_exact_vs_exact"):
        assert metrics[key] >= 0
    assert (out / "samples.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Same seed, same numbers.
    CliRunner().invoke(main, ["sample", "--steps", "20", "--n", "300", "--seed", "1", "--out", str(tmp_path / "b"),
                              "--no-progress"])
    again = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert again["sliced_w2_to_exact"] == metrics["sliced_w2_to_exact"]


def test_sample_bad_input(tmp_path):
    res = CliRunner().invoke(main, ["sample", "--model", "nope", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "unknown model" in res.output
    res = CliRunner().invoke(main, ["sample", "--method", "rk4", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "rk4" in res.output
    f = tmp_path / "file"
    f.write_text("x")
    res = CliRunner().invoke(main, ["sample", "--out", str(f)])
    assert res.exit_code != 0 and "not a directory" in res.output
    res = CliRunner().invoke(main, ["sample", "--method", "heun", "--ddim-eta", "0.5", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--ddim-eta" in res.output
    res = CliRunner().invoke(main, ["sample", "--scale", "3", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--class" in res.output
    res = CliRunner().invoke(main, ["sample", "--class", "1", "--guidance", "apg", "--scale", "3", "--momentum",
                                    "1.5", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "momentum" in res.output


def test_guided_sampling_of_the_mixture(tmp_path):
    shift = {}
    for name in ("cfg", "cfg-rescale", "apg"):
        out = tmp_path / name
        res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--class", "2", "--guidance", name,
                                        "--scale", "8", "--n", "400", "--steps", "32", "--method", "euler",
                                        "--out", str(out), "--no-progress"])
        assert res.exit_code == 0, res.output
        m = json.loads((out / "metrics.json").read_text())
        assert m["nfe"] == 64 and m["guidance"]["name"] == name and m["guidance"]["scale"] == 8
        shift[name] = m["sliced_w2_to_exact"]
    # Guidance at w = 8 moves samples off the exact conditional component (it sharpens, by design).
    assert all(v > m["sliced_w2_exact_vs_exact"] for v in shift.values())


def test_sample_shipped_digits_model(tmp_path):
    res = CliRunner().invoke(main, ["sample", "--model", "digits", "--class", "3", "--n", "8", "--steps", "6",
                                    "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["nfe"] == 11 and metrics["class"] == 3 and 0 <= metrics["class_accuracy"] <= 1
    assert (tmp_path / "samples.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = CliRunner().invoke(main, ["sample", "--model", "digits", "--class", "12", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "[0, 9]" in res.output
    res = CliRunner().invoke(main, ["sample", "--model", "no_such_model", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "digits" in res.output  # lists what is available


def _tiny_recipe(tmp_path):
    """A 6-step recipe of a tiny 2-D MLP, written to ``tmp_path/tiny.json``."""
    recipe = {
        "name": "tiny",
        "data": {"name": "toy2d:moons", "n": 256, "seed": 0},
        "model": {"class": "EDMPrecond", "config": {"sigma_data": 0.5, "net": {"class": "MLP", "config": {
            "dim": 2, "hidden": [16], "num_classes": None, "cond_dim": 4, "fourier_dim": 4, "noise_dim": 8}}}},
        "train": {"steps": 6, "batch_size": 32, "warmup_steps": 1, "checkpoint_every": 3, "p_uncond": 0.0},
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(recipe))
    return path


def test_train_command_runs_a_recipe_and_resumes(tmp_path):
    path = _tiny_recipe(tmp_path)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", str(path), "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert (out / "final" / "model.safetensors").exists()
    res = CliRunner().invoke(main, ["train", str(path), "--out", str(out), "--no-progress"])
    assert res.exit_code != 0 and "--resume" in res.output
    res = CliRunner().invoke(main, ["train", str(path), "--out", str(out), "--resume", "--no-progress"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["train", str(tmp_path / "missing.json")])
    assert res.exit_code != 0 and "not found" in res.output


def test_train_command_overrides_recipe_fields(tmp_path):
    path = _tiny_recipe(tmp_path)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", str(path), "--out", str(out), "--no-progress", "--set", "steps=2",
                                    "--set", "lr_schedule=cosine"])
    assert res.exit_code == 0, res.output
    assert "trained 2 steps" in res.output
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["steps"] == 2 and log["config"]["lr_schedule"] == "cosine"
    assert json.loads(path.read_text())["train"]["steps"] == 6  # the recipe file is untouched
    for bad, message in (("stpes=2", "stpes"), ("steps", "KEY=VALUE"), ("=3", "KEY=VALUE"), ("steps=-1", "steps")):
        res = CliRunner().invoke(main, ["train", str(path), "--out", str(tmp_path / "bad"), "--set", bad])
        assert res.exit_code != 0 and message in res.output, (bad, res.output)
        assert "Traceback" not in res.output


def test_sample_with_the_shipped_ocm_head(tmp_path):
    import warnings

    out = tmp_path / "ocm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # clamped variances are also counted in metrics.json
        res = CliRunner().invoke(main, ["sample", "--model", "digits", "--covariance", "ocm", "--steps", "4",
                                        "--n", "8", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["method"] == "ocm-ddim" and metrics["nfe"] == 4  # one denoiser call per step, no extra pass
    assert metrics["schedule"]["kind"] == "vp-linear" and metrics["clamped_variances"] >= 0
    for args, hint in ((["--model", "digits", "--scale", "2"], "--covariance"),  # head = unguided Jacobian
                       (["--model", "toy2d"], "toy2d_ocm"),  # no head ships for it
                       (["--model", "gmm2d"], "--covariance")):
        res = CliRunner().invoke(main, ["sample", *args, "--covariance", "ocm", "--out", str(tmp_path / "bad")])
        assert res.exit_code != 0 and hint in res.output, res.output
