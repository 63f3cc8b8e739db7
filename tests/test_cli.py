"""The command line, end to end on the built-in mixture."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from steerdiff.app.cli import main


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


def test_sample_one_dimensional_mixture_plots_densities(tmp_path):
    """A 1-D model's samples have no second coordinate to scatter: the plot compares densities (it raised before)."""
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["sample", "--model", "gmm1d", "--method", "heun", "--steps", "20",
                                    "--n", "200", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert (out / "samples.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "metrics.json").read_text())["n"] == 200


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


# ------------------------------------------------------------------------------------------------ bad inputs
S = ["--n", "4", "--steps", "3", "--no-progress"]
A = ["--n", "2", "--particles", "2", "--steps", "3", "--no-progress"]
R = ["--steps", "3", "--chains", "2", "--no-progress", "--input", "digits:test:0"]
C = ["--n", "2", "--steps", "2"]
Q = ["--num-samples", "2", "--num-grids", "2", "--num-iters", "1"]
# (argv, text the error must contain): every command and flag; {file}, {dir}, ... are filled in by the test. Each
# must be a click usage error naming the option (or saying what the model is), never a traceback.
BAD_INPUTS = [
    (["sample", "--sigma-min", "-1", *S], "--sigma-min"),
    (["sample", "--sigma-min", "100", "--sigma-max", "1", *S], "--sigma-max"),
    (["sample", "--sigma-max", "inf", *S], "--sigma-max"),
    (["sample", "--sigma-min", "nan", *S], "--sigma-min"),
    (["sample", "--rho", "0", *S], "--rho"),
    (["sample", "--rho", "nan", *S], "--rho"),
    (["sample", "--steps", "0", "--n", "4"], "--steps"),
    (["sample", "--n", "0"], "--n"),
    (["sample", "--n", "-3"], "--n"),
    (["sample", "--class", "1", "--scale", "-1", *S], "--scale"),
    (["sample", "--class", "1", "--scale", "nan", *S], "--scale"),
    (["sample", "--eta", "2", *S], "--eta"),
    (["sample", "--eta", "nan", *S], "--eta"),
    (["sample", "--class", "1", "--guidance", "apg", "--scale", "3", "--momentum", "nan", *S], "--momentum"),
    (["sample", "--class", "1", "--guidance", "apg", "--scale", "3", "--r-rms", "nan", *S], "--r-rms"),
    (["sample", "--phi", "2", *S], "--phi"),
    (["sample", "--method", "ddim", "--ddim-eta", "2", *S], "--ddim-eta"),
    (["sample", "--seed", "-1", *S], "--seed"),
    (["sample", "--seed", str(2**70), *S], "--seed"),
    (["sample", "--model", "digits_classifier", *S], "digits_classifier is an image classifier"),
    (["sample", "--model", "digits_ocm", *S], "covariance head (TrunkHead) for the model digits"),
    (["sample", "--model", "circle_namm", *S], "NAMM bundle"),
    (["sample", "--model", "{missing}", *S], "--model"),
    (["sample", "--model", "{file}", *S], "--model"),
    (["sample", "--model", "digits", "--class", "12", *S], "--class"),
    (["sample", "--model", "gmm2d", "--class", "99", *S], "--class"),
    (["sample", "--model", "shapes_coind", "--expr", "shape=bogus", *S], "--expr"),
    (["sample", "--model", "shapes_band", *S], "--expr"),
    (["sample", "--model", "digits_mlp", "--covariance", "ocm", *S], "--covariance"),
    (["sample", "--out", "{file}", *S], "--out"),
    (["sample", "--out", "{file}/sub", *S], "--out"),
    (["sample", "--device", "bogus", *S], "'bogus' is not a device"),
    (["sample", "--device", "cuda:x", *S], "'cuda:x' is not a device"),
    (["sample", "--model", "digits", "--init", "digits:test:99999", *S], "split has 359 images"),
    (["sample", "--model", "digits", "--init", "{missing}", *S], "--init: {missing}: no such file"),
    (["sample", "--model", "digits", "--init", "{badpng}", *S], "not a readable PNG"),
    (["sample", "--model", "digits", "--init", "{nanpy}", *S], "non-finite"),
    (["sample", "--model", "gmm2d", "--init", "digits:test:0", *S], "samples have shape (2,)"),
    (["sample", "--model", "digits", "--init", "digits:test:0", "--strength", "0", *S], "0<x<=1"),
    (["sample", "--model", "digits", "--init", "digits:test:0", "--strength", "1.5", *S], "0<x<=1"),
    (["sample", "--model", "digits", "--init", "digits:test:0", "--strength", "nan", *S], "'nan' is not a finite"),
    (["sample", "--model", "digits", "--init", "digits:test:0", "--strength", "0.1", *S], "= 0 steps"),
    (["sample", "--strength", "0.5", *S], "--strength applies to --init only"),
    (["align", "--model", "gmm2d", "--reward", "linear:1", *A], "shape (2,)"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0,0", *A], "--reward"),
    (["align", "--model", "digits", "--reward", "linear:1,0", *A], "(64 entries)"),
    (["align", "--model", "gmm2d", "--reward", "0.5*linear:1,0+0.5*linear:1", *A], "--reward"),
    (["align", "--model", "gmm2d", "--reward", "linear:a,b", *A], "--reward"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,nan", *A], "--reward"),
    (["align", "--model", "gmm2d", "--reward", "x*linear:1,0", *A], "--reward"),
    (["align", "--model", "gmm2d", "--reward", "nan*linear:1,0", *A], "--reward"),
    (["align", "--model", "gmm2d", "--reward", "", *A], "--reward"),
    (["align", "--model", "gmm2d", "--reward", "class:3", *A], "--reward"),
    (["align", "--model", "digits", "--reward", "class:99", *A], "--reward"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "nan", *A], "--alpha"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "-1", *A], "--alpha"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "inf", *A], "--alpha"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--sigma-min", "-1", *A], "--sigma-min"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--sigma-min", "100", "--sigma-max", "1", *A],
     "--sigma-max"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--gamma", "-1", *A], "--gamma"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--gamma", "nan", *A], "--gamma"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--tempering", "bogus", *A], "--tempering"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--tempering", "nan", *A], "--tempering"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--tempering", "-2", *A], "--tempering"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--ess-threshold", "nan", *A], "--ess-threshold"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--method", "guidance", "--scale", "nan", *A],
     "--scale"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--class", "1", *A], "--class"),
    (["align", "--model", "digits", "--reward", "ink", "--class", "99", *A], "--class"),
    (["align", "--model", "digits_classifier", "--reward", "ink", *A], "image classifier"),
    (["align", "--model", "digits_ocm", "--reward", "ink", *A], "covariance head"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--seed", "-5", *A], "--seed"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--batch-size", "0", *A], "--batch-size"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--steps", "1", "--n", "2"], "--steps"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--device", "bogus", *A], "'bogus' is not a device"),
    (["align", "--model", "gmm2d", "--reward", "linear:1,0", "--out", "{file}", *A], "--out"),
    (["restore", "--model", "digits_classifier", *R], "image classifier"),
    (["restore", "--model", "digits_ocm", *R], "covariance head"),
    (["restore", "--model", "toy2d", *R], "greyscale images"),
    (["restore", "--model", "shapes", *R], "greyscale images"),
    (["restore", "--steps", "3", "--input", "{dir}"], "is a directory, not a file"),
    (["restore", "--steps", "3", "--input", "{txt}"], "--input"),
    (["restore", "--steps", "3", "--input", "{badpng}"], "not a readable PNG"),
    (["restore", "--steps", "3", "--input", "{nanpy}"], "non-finite"),
    (["restore", *R, "--method", "hr", "--lr", "-1"], "--lr"),
    (["restore", *R, "--method", "hr", "--lr", "nan"], "--lr"),
    (["restore", *R, "--method", "dps", "--scale", "-1"], "--scale"),
    (["restore", *R, "--method", "dps", "--scale", "nan"], "--scale"),
    (["restore", *R, "--method", "hr", "--beta", "nan"], "--beta"),
    (["restore", *R, "--class", "99"], "--class"),
    (["restore", *R, "--noise-std", "nan"], "--noise-std"),
    (["restore", *R, "--seed", "-1"], "--seed"),
    (["restore", *R, "--device", "bogus"], "'bogus' is not a device"),
    (["restore", *R, "--out", "{file}"], "--out"),
    (["quantize", "--model", "{quantized}", *Q, "--out", "{out}"], "already quantized (QuantizedModel"),
    (["quantize", "--model", "digits_classifier", *Q, "--out", "{out}"], "image classifier"),
    (["quantize", "--model", "digits_ocm", *Q, "--out", "{out}"], "covariance head"),
    (["quantize", "--model", "gmm2d", *Q, "--out", "{out}"], "--model"),
    (["quantize", "--model", "digits", "--rank", "-1", *Q, "--out", "{out}"], "--rank"),
    (["quantize", "--model", "digits", "--num-grids", "1", "--out", "{out}"], "--num-grids"),
    (["quantize", "--model", "digits", "--device", "bogus", *Q, "--out", "{out}"], "'bogus' is not a device"),
    (["quantize", "--model", "digits", *Q, "--out", "{file}"], "--out"),
    (["constrain", "sample", "--model", "nope", *C], "--model"),
    (["constrain", "sample", "--model", "digits", *C], "--model"),
    (["constrain", "sample", "--model", "circle_namm", "--sigma-min", "-1", *C], "--sigma-min"),
    (["constrain", "sample", "--model", "circle_namm", "--sigma-min", "100", "--sigma-max", "1", *C],
     "--sigma-max"),
    (["constrain", "sample", "--model", "digits_namm", "--class", "99", *C], "--class"),
    (["constrain", "sample", "--model", "circle_namm", "--class", "1", *C], "--class"),
    (["constrain", "sample", "--model", "digits_namm", "--scale", "nan", *C], "--scale"),
    (["constrain", "sample", "--model", "digits_namm", "--scale", "-1", *C], "--scale"),
    (["constrain", "sample", "--model", "circle_namm", "--n", "0"], "--n"),
    (["constrain", "sample", "--model", "circle_namm", "--seed", "-1", *C], "--seed"),
    (["constrain", "sample", "--model", "circle_namm", "--device", "bogus", *C], "'bogus' is not a device"),
    (["constrain", "sample", "--model", "circle_namm", *C, "--out", "{file}"], "--out"),
    (["constrain", "train", "nope_recipe"], "RECIPE"),
    (["constrain", "train", "digits_namm", "--stages", ""], "--stages"),
    (["constrain", "train", "digits_namm", "--device", "bogus"], "'bogus' is not a device"),
    (["train", "{missing}"], "CONFIG"),
    (["train", "{badjson}"], "invalid JSON"),
    (["train", "digits_unet", "--set", "steps"], "--set"),
    (["train", "digits_unet", "--set", "steps=abc", "--out", "{out}"], "--set"),
    (["train", "digits_unet", "--set", "lr=NaN", "--out", "{out}"], "--set"),
    (["train", "digits_unet", "--set", "betas=[1]", "--out", "{out}"], "--set"),
    (["train", "digits_unet", "--set", "steps=1", "--out", "{file}"], "--out"),
    (["train", "digits_unet", "--device", "bogus"], "'bogus' is not a device"),
    (["demo", "--only", "bogus", "--out", "{out}"], "--only"),
    (["demo", "--threads", "0", "--out", "{out}"], "--threads"),
    (["demo", "--seed", "-1", "--out", "{out}"], "--seed"),
    (["demo", "--device", "bogus", "--out", "{out}"], "'bogus' is not a device"),
    (["demo", "--quick", "--only", "constrain", "--out", "{file}"], "--out"),
]


@pytest.fixture(scope="module")
def bad_paths(tmp_path_factory):
    """Files for the bad inputs: a plain file, a directory, a corrupt PNG, a NaN array, bad JSON, a quantized model."""
    import numpy as np
    import torch

    import steerdiff as sd
    from steerdiff.models import MLP, EDMPrecond

    root = tmp_path_factory.mktemp("bad")
    (root / "dir").mkdir()
    (root / "img.txt").write_text("x")
    (root / "bad.png").write_bytes(b"not a png")
    np.save(root / "nan.npy", np.full((8, 8), np.nan))
    (root / "bad.json").write_text("{not json")
    torch.manual_seed(0)
    with torch.no_grad():
        q = sd.quant.quantize(EDMPrecond(MLP(dim=2, hidden=[16])), "svdquant", rank=2, num_samples=4, num_grids=2,
                              num_iters=1)
    sd.quant.save(q, root / "quantized")
    return {"dir": root / "dir", "txt": root / "img.txt", "badpng": root / "bad.png", "nanpy": root / "nan.npy",
            "badjson": root / "bad.json", "quantized": root / "quantized", "missing": root / "missing.json"}


@pytest.mark.parametrize("argv, hint", BAD_INPUTS, ids=[" ".join(a[:4]) + f" #{i}" for i, (a, _) in
                                                          enumerate(BAD_INPUTS)])
def test_bad_input_is_a_click_error_naming_the_option(argv, hint, bad_paths, tmp_path):
    user_file = tmp_path / "afile"
    user_file.write_text("keep me")
    fill = {k: str(v) for k, v in bad_paths.items()} | {"file": str(user_file), "out": str(tmp_path / "o")}
    args = [a.format(**fill) if "{" in a else a for a in argv]
    if args[0] in ("sample", "align", "restore") and "--out" not in args or args[:2] == ["constrain", "sample"] \
            and "--out" not in args:
        args += ["--out", str(tmp_path / "o")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0, f"{args} was accepted:\n{res.output}"
    assert isinstance(res.exception, SystemExit), f"{args} raised {res.exception!r} (a traceback)"
    assert "Traceback" not in res.output and "Error:" in res.output
    assert hint.format(**fill) in " ".join(res.output.split()), res.output
    assert user_file.read_text() == "keep me"  # an --out that is a file is never replaced


def test_device_cuda_without_cuda_is_a_device_error(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (["sample", "--n", "2", "--steps", "1"], ["align", "--model", "gmm2d", "--reward", "linear:1,0"],
                 ["restore", "--input", "digits:test:0"], ["quantize", "--out", str(tmp_path / "q")],
                 ["constrain", "sample"], ["constrain", "train", "digits_namm"], ["train", "digits_unet"],
                 ["demo"]):
        res = CliRunner().invoke(main, [*argv, "--device", "cuda", *([] if "--out" in argv or argv[0] in (
            "train", "demo") or argv == ["constrain", "train", "digits_namm"] else ["--out", str(tmp_path / "o")])])
        assert isinstance(res.exception, SystemExit) and res.exit_code == 2, (argv, res.output)
        assert "--device" in res.output and "CUDA is not available" in res.output, (argv, res.output)


def test_device_cpu_explicitly_on_every_command(tmp_path):
    """``--device cpu`` runs each command and gives the numbers of the default run (same seed)."""
    runs = {
        "sample": ["sample", "--model", "gmm2d", "--n", "32", "--steps", "4", "--no-progress"],
        "sample_digits": ["sample", "--model", "digits", "--class", "3", "--n", "4", "--steps", "3", "--no-progress"],
        "align": ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--n", "4", "--particles", "2", "--steps",
                  "3", "--no-progress"],
        "restore": ["restore", "--model", "digits", "--input", "digits:test:0", "--steps", "3", "--chains", "2"],
        "constrain": ["constrain", "sample", "--model", "circle_namm", "--n", "4", "--steps", "2"],
    }
    for name, argv in runs.items():
        results = []
        for extra in ([], ["--device", "cpu"]):
            out = tmp_path / f"{name}{len(extra)}"
            res = CliRunner().invoke(main, [*argv, *extra, "--out", str(out)])
            assert res.exit_code == 0, (name, extra, res.output)
            results.append(json.loads((out / "metrics.json").read_text()))
        keys = [k for k, v in results[0].items() if isinstance(v, float) and "time" not in k]
        assert keys and all(results[0][k] == results[1][k] for k in keys), (name, results)
    path = _tiny_recipe(tmp_path)
    res = CliRunner().invoke(main, ["train", str(path), "--out", str(tmp_path / "run"), "--device", "cpu",
                                    "--no-progress"])
    assert res.exit_code == 0 and (tmp_path / "run" / "final" / "model.safetensors").is_file(), res.output


# ------------------------------------------------------------------------------------------------ --model kinds
def _available(output: str) -> list[str]:
    listing = output.split("Available:", 1)[1]
    return [name.strip(" .\n") for name in " ".join(listing.split()).split(",") if name.strip(" .\n")]


@pytest.mark.parametrize("argv", [["sample"], ["align", "--reward", "ink"], ["restore", "--input", "digits:test:0"],
                                  ["quantize"]])
def test_available_lists_what_the_command_takes(argv, tmp_path):
    """Every name in a command's ``Available:`` list loads as a model it takes; every other shipped model, named,
    is refused with what it is (never a traceback)."""
    import steerdiff as sd
    from steerdiff.models.gmm import BUILTIN_MIXTURES
    from steerdiff.models.io import ASSETS_DIR

    res = CliRunner().invoke(main, [*argv, "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--model" in res.output, res.output
    listed = _available(res.output)
    shipped = sorted(p.name for p in ASSETS_DIR.iterdir() if p.is_dir())
    assert "digits" in listed
    for name in listed:
        if name in BUILTIN_MIXTURES or name == "digits-gmm":
            continue
        model = sd.models.load(name)
        assert hasattr(model, "sample_shape") and type(model).__name__ in ("EDMPrecond", "FlowModel"), name
        if argv[0] == "restore":
            assert tuple(model.sample_shape)[0] == 1 and len(model.sample_shape) == 3, name
    for name in sorted(set(shipped) - set(listed)):
        if argv[0] == "sample" and name == "graphs_lggm":
            continue  # a graph model: sample takes it on its own path (tests/test_cli_graphs.py)
        extra = ["--n", "2", "--steps", "2", "--no-progress"] if argv[0] in ("sample", "align") else []
        extra = ["--num-samples", "2", "--num-grids", "2", "--num-iters", "1"] if argv[0] == "quantize" else extra
        res = CliRunner().invoke(main, [*argv, "--model", name, *extra, "--out", str(tmp_path / name)])
        assert isinstance(res.exception, SystemExit) and res.exit_code == 2, (name, res.output)
        assert f"{name} is " in res.output or f"{name} samples shape" in res.output, (name, res.output)


# ------------------------------------------------------------------------------------------------ --init
def test_init_starts_from_the_given_sample_on_the_mixture(tmp_path):
    """``sample --init`` on the exact mixture with a stochastic sampler draws the posterior around the start: the
    law of x0 given x0 + sigma_t * eps = x_init + sigma_t * eps' (diffusers' img2img rule for the start step), whose
    mean and covariance come from the mixture's exact posterior (``E_eps[D]``, ``E_eps[Cov + D D^T]``)."""
    import numpy as np
    import torch

    import steerdiff as sd
    from steerdiff.io import load_tensors

    steps, strength, n = 100, 0.5, 2000
    gmm = sd.models.builtin_mixture("gmm2d")
    x_init = 0.5 * (gmm.means[0] + gmm.means[1])  # between two modes: the answer is far from the prior and from x
    np.save(tmp_path / "x.npy", x_init.numpy())
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--init", str(tmp_path / "x.npy"), "--strength",
                                    str(strength), "--method", "ddpm", "--steps", str(steps), "--n", str(n),
                                    "--out", str(tmp_path / "o"), "--no-progress"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    first = steps - min(int(steps * strength), steps)
    s_t = float(sd.sigmas.karras(steps, 0.002, 80.0)[first])
    assert m["start_step"] == first and m["start_sigma"] == pytest.approx(s_t) and m["nfe"] == steps - first
    x = load_tensors(tmp_path / "o" / "samples.safetensors")["samples"]
    # Exact moments of the target by Monte Carlo over eps only (the posterior given y is exact).
    y = x_init + s_t * torch.randn(50_000, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sig = torch.full((y.shape[0],), s_t, dtype=torch.float64)
    d, cov = gmm(y, sig), gmm.posterior_cov(y, sig)
    mean = d.mean(0)
    target_cov = (cov + d[:, :, None] * d[:, None, :]).mean(0) - mean[:, None] * mean[None]
    # Sampling error of the mean is ~0.04 here; DDPM's finite steps add a small bias, well below what a start from
    # the prior (mean error ~1) or from x_init without noise (mean error ~0.45, 23% less variance) would give.
    assert (x.mean(0) - mean).abs().max() < 0.2, (x.mean(0), mean)
    assert torch.trace(torch.cov(x.T)) == pytest.approx(float(torch.trace(target_cov)), rel=0.12)


def test_init_on_digits_keeps_the_image_at_low_strength(tmp_path):
    """With a start at a tiny noise level (one step from sigma ~ sigma_min), the output is the init image itself;
    every row starts from it."""
    from steerdiff.data.digits import load_digits
    from steerdiff.io import load_tensors

    res = CliRunner().invoke(main, ["sample", "--model", "digits", "--init", "digits:test:5", "--strength", "0.1",
                                    "--steps", "10", "--n", "3", "--out", str(tmp_path / "o"), "--no-progress"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["start_step"] == 9 and m["nfe"] == 1 and m["start_sigma"] < 0.01
    x = load_tensors(tmp_path / "o" / "samples.safetensors")["samples"]
    image = load_digits("test")[0][5]
    assert x.shape == (3, 1, 8, 8) and (x - image).abs().max() < 0.05


def test_fid_of_a_one_class_sample_is_measured_against_that_class():
    """Real class-3 digits (train split, repeated with small noise) are close to the class-3 test images and far from
    the whole test set, whose other nine classes they lack: ``--class 3`` reports FID against class 3 only."""
    import torch

    from steerdiff.app.cli.sample import _image_metrics
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import classifier_features, frechet_distance
    from steerdiff.models import load

    images, labels = load_digits("train")
    threes = images[labels == 3]
    g = torch.Generator().manual_seed(0)
    samples = threes[torch.arange(240) % len(threes)] + 0.02 * torch.randn(240, 1, 8, 8, generator=g)
    out = _image_metrics(samples, torch.full((240,), 3), class_=3)
    assert set(out) == {"class_accuracy", "fid_digits_vs_test_class_3"}
    clf = load("digits_classifier")
    test_images, _ = load_digits("test")
    whole = frechet_distance(classifier_features(clf, test_images), classifier_features(clf, samples.clamp(-1, 1)))
    assert out["fid_digits_vs_test_class_3"] < 0.25 * whole, (out, whole)
    assert "fid_digits_vs_test" in _image_metrics(samples, None)


# ------------------------------------------------------------------------------------------------ registries
def test_guider_flags_apply_only_to_the_guiders_that_take_them(tmp_path):
    """``--guidance`` and its flags come from the guider registry: a flag the chosen guider's constructor does not
    take is an error naming it (with those it takes), as is a guider flag where no guider runs."""
    s = ["sample", "--model", "gmm2d", "--class", "2", "--n", "4", "--steps", "2", "--no-progress"]
    cases = [
        (["--guidance", "apg", "--scale", "3", "--phi", "0.7"], "--phi", "it takes --eta, --momentum, --r-rms"),
        (["--guidance", "cfg", "--scale", "3", "--eta", "0.5"], "--eta", "it takes none of the guider flags"),
        (["--guidance", "cfg-rescale", "--phi", "0.5"], "--phi", "no guider runs at --scale 1"),
        (["--guidance", "cfg-rescale", "--scale", "1", "--phi", "0.5"], "--phi", "no guider runs at --scale 1"),
    ]
    for extra, flag, message in cases:
        res = CliRunner().invoke(main, [*s, *extra, "--out", str(tmp_path / "bad")])
        assert res.exit_code == 2 and f"Invalid value for {flag}" in res.output and message in res.output, \
            (extra, res.output)
    res = CliRunner().invoke(main, [*s, "--guidance", "cfg-rescale", "--scale", "3", "--phi", "0.25",
                                    "--out", str(tmp_path / "ok")])
    assert res.exit_code == 0, res.output
    guidance = json.loads((tmp_path / "ok" / "metrics.json").read_text())["guidance"]
    assert guidance["name"] == "cfg-rescale" and guidance["phi"] == 0.25 and guidance["scale"] == 3


def test_a_guider_registered_at_run_time_is_offered_with_its_flags(tmp_path):
    """A guider registered after the command was built is offered by ``--guidance``; it takes ``--phi`` because
    its constructor has a ``phi``, keeps its default for an option without a flag (``offset``), and the samples are
    CFG's at the scale it was given, times phi: checked against plain CFG at that scale."""
    import torch
    from safetensors.torch import load_file

    from steerdiff.guidance import CFG, GUIDERS, register_guider

    class HalfCFG(CFG):
        def __init__(self, scale, phi=1.0, offset=0.0, **window):
            super().__init__(scale, **window)
            self.phi, self.offset = phi, offset

        def combine(self, d_cond, d_null, x, sigma, step=None):
            return super().combine(d_cond, d_null, x, sigma, step) * self.phi + self.offset

    s = ["sample", "--model", "gmm2d", "--class", "2", "--n", "6", "--steps", "1", "--method", "euler",
         "--sigma-max", "2", "--scale", "3", "--no-progress"]
    assert "half-cfg-test" not in CliRunner().invoke(main, ["sample", "--help"]).output
    register_guider("half_cfg_test", aliases=("half-cfg-test",))(HalfCFG)
    try:
        shown = " ".join(CliRunner().invoke(main, ["sample", "--help"]).output.split())
        assert "half-cfg-test" in shown and "cfg-rescale (default 0.7), half-cfg-test (default 1.0)" in shown
        res = CliRunner().invoke(main, [*s, "--guidance", "half-cfg-test", "--phi", "0.5",
                                        "--out", str(tmp_path / "h")])
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(main, [*s, "--guidance", "cfg", "--out", str(tmp_path / "c")])
        assert res.exit_code == 0, res.output
    finally:
        GUIDERS.remove("half_cfg_test")
    half, plain = (load_file(tmp_path / d / "samples.safetensors")["samples"] for d in ("h", "c"))
    # One Euler step from sigma = 2 to 0 lands on the guided D: x + (D - x) = D (up to one rounding).
    assert torch.allclose(half, 0.5 * plain, rtol=0, atol=1e-12) and not torch.allclose(half, plain)


def test_a_model_kind_registered_at_run_time_is_recognised_and_loaded(tmp_path):
    """``--model`` kinds are a registry: a kind registered at run time detects its directories, loads them with
    its loader (here: the shipped model a file points at) and, when not samplable, is refused with its words."""
    import torch
    from safetensors.torch import load_file

    from steerdiff.app.cli import MODEL_KINDS, register_model_kind
    from steerdiff.app.cli._models import ModelKind, classify
    from steerdiff.models.io import load

    linked, other = tmp_path / "linked", tmp_path / "other"
    linked.mkdir()
    (linked / "points_to.txt").write_text("toy2d")
    other.mkdir()
    (other / "not_a_model.txt").write_text("")
    register_model_kind("link-test", samplable=True,
                        detect=lambda d, cfg: ModelKind("link-test") if (d / "points_to.txt").is_file() else None,
                        load=lambda name, device: load((Path(name) / "points_to.txt").read_text(), device=device))
    register_model_kind("note-test", detect=lambda d, cfg: ModelKind("note-test")
                        if (d / "not_a_model.txt").is_file() else None,
                        describe=lambda name, kind: f"{name} holds notes, not a model")
    try:
        assert classify(linked).kind == "link-test" and classify(other).kind == "note-test"
        with pytest.raises(ValueError, match="a different model kind is already registered as 'note-test'"):
            register_model_kind("note-test", detect=classify)
        with pytest.raises(ValueError, match="give detect"):
            register_model_kind("nothing-test")
        s = ["sample", "--n", "4", "--steps", "3", "--no-progress"]
        res = CliRunner().invoke(main, [*s, "--model", str(linked), "--out", str(tmp_path / "a")])
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(main, [*s, "--model", "toy2d", "--out", str(tmp_path / "b")])
        assert res.exit_code == 0, res.output
        a, b = (load_file(tmp_path / d / "samples.safetensors")["samples"] for d in ("a", "b"))
        assert torch.equal(a, b)
        res = CliRunner().invoke(main, [*s, "--model", str(other), "--out", str(tmp_path / "c")])
        assert res.exit_code == 2 and f"{other} holds notes, not a model" in res.output, res.output
    finally:
        MODEL_KINDS.remove("link-test")
        MODEL_KINDS.remove("note-test")
