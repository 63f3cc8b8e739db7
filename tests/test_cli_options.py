"""issue 35: options accepted and ignored, or with two meanings, are refused or given one meaning (the option named)."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from steerdiff.app.cli import main


def _sample(tmp_path, *argv):
    return CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--steps", "2", "--no-progress", *argv,
                                     "--out", str(tmp_path / "o")])


def test_duplicate_seeds_are_refused_naming_them(tmp_path):
    # before: 0-3,2 drew seed 2 twice (two equal samples counted as two) without a word
    for seeds, dups in (("0-3,2", "2"), ("1,1", "1"), ("0-9,5-6,9", "5, 6, 9")):
        res = _sample(tmp_path, "--seeds", seeds)
        assert res.exit_code == 2, res.output
        assert "--seeds" in res.output and f"repeats seed{'s' if ',' in dups else ''} {dups}" in res.output, res.output
        assert "Traceback" not in res.output and not (tmp_path / "o").exists()
    res = _sample(tmp_path, "--seeds", "3,0-2")  # any order, each once: fine
    assert res.exit_code == 0, res.output


def _samples(out):
    from steerdiff.io import load_tensors

    return load_tensors(out / "samples.safetensors")["samples"]


def test_scale_zero_is_the_unconditional_model_with_model(tmp_path):
    """--scale w is w in D_u + w (D_c - D_u): at 0 the class does not matter (the unconditional model)."""
    got = {}
    for cls in ("3", "5"):
        res = CliRunner().invoke(main, ["sample", "--model", "digits", "--class", cls, "--scale", "0", "--n", "4",
                                        "--steps", "4", "--no-progress", "--out", str(tmp_path / cls)])
        assert res.exit_code == 0, res.output
        got[cls] = _samples(tmp_path / cls)
    assert torch.equal(got["3"], got["5"])
    res = CliRunner().invoke(main, ["sample", "--model", "digits", "--class", "3", "--scale", "1", "--n", "4",
                                    "--steps", "4", "--no-progress", "--out", str(tmp_path / "c")])
    assert res.exit_code == 0 and not torch.allclose(_samples(tmp_path / "c"), got["3"], atol=1e-3)


@pytest.mark.parametrize("value", ["nan", "-5", "inf", "-0.5", "x"])
@pytest.mark.parametrize("path", ["model", "pipeline"])
def test_invalid_scale_is_refused_naming_it(tmp_path, value, path):
    src = ["--model", "digits"] if path == "model" else ["--pipeline", str(tmp_path), "--prompt", "a"]
    res = CliRunner().invoke(main, ["sample", *src, "--scale", value, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--scale" in res.output and "Traceback" not in res.output, res.output


def test_scale_has_one_meaning_with_pipeline(tmp_path_factory, tmp_path):
    """With --pipeline, --scale 0 is the unconditional model too (the negative prompt's, here the empty prompt):
    it equals --scale 1 (the conditional model alone) on the prompt "" and does not depend on the prompt; before,
    --scale 0 ran the conditional model (diffusers' guidance_scale <= 1)."""
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    import tiny_pipelines

    from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer

    root = tmp_path_factory.mktemp("scale_sd")
    write_clip_tokenizer(root / "tok")
    tiny_pipelines.make_sd(root / "tok").save_pretrained(root / "sd")

    def run(name, prompt, scale):
        res = CliRunner().invoke(main, ["sample", "--pipeline", str(root / "sd"), "--prompt", prompt, "--scale",
                                        scale, "--steps", "3", "--seed", "7", "--no-progress", "--out",
                                        str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        return _samples(tmp_path / name)

    u_red, u_square = run("u_red", "a red disk", "0"), run("u_square", "a square", "0")
    empty, cond = run("empty", "", "1"), run("cond", "a red disk", "1")
    assert torch.allclose(u_red, empty, atol=1e-5) and torch.allclose(u_square, empty, atol=1e-5)
    assert (u_red - cond).abs().max() > 1e-3
    half = run("half", "a red disk", "0.5")  # between the two, as CFG at w = 0.5 is
    assert torch.allclose(half, u_red, atol=1e-5) is False and torch.allclose(half, cond, atol=1e-5) is False


@pytest.mark.parametrize("argv, option", [
    (["--compose", "joint"], "--compose"),  # --compose without --expr
    (["--guidance", "apg"], "--guidance"),  # no guider runs at --scale 1
    (["--guidance", "cfg", "--scale", "1"], "--guidance"),
    (["--shift", "3"], "--shift"),  # the Karras schedule has no shift
    (["--schedule", "karras", "--shift", "3"], "--shift"),
    (["--schedule", "flow", "--rho", "3"], "--rho"),  # the flow grid has no rho, sigma-min or sigma-max
    (["--schedule", "flow", "--sigma-min", "0.01"], "--sigma-min"),
    (["--schedule", "flow", "--sigma-max", "10"], "--sigma-max"),
])
def test_sample_options_the_run_ignores_are_refused(tmp_path, argv, option):
    # before: each ran and wrote samples as if the option had not been given
    res = _sample(tmp_path, *argv)
    assert res.exit_code == 2, res.output
    assert option in res.output and "Traceback" not in res.output and not (tmp_path / "o").exists(), res.output


@pytest.mark.parametrize("argv, option", [
    (["--schedule", "flow"], "--schedule"),  # --expr samples on the Karras schedule
    (["--shift", "2"], "--shift"),
])
def test_expr_refuses_schedule_options_it_ignores(tmp_path, argv, option):
    res = CliRunner().invoke(main, ["sample", "--model", "shapes_coind", "--expr", "shape=disk", "--scale", "2",
                                    "--steps", "2", "--no-progress", *argv, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and option in res.output and not (tmp_path / "o").exists(), res.output


def test_flow_and_karras_options_still_apply_where_they_are_read(tmp_path):
    """The same options on the schedule that reads them: accepted and recorded."""
    import json

    res = _sample(tmp_path, "--schedule", "karras", "--rho", "3", "--sigma-max", "10", "--class", "1", "--guidance",
                  "apg", "--scale", "2")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["schedule"]["rho"] == 3 and m["schedule"]["sigma_max"] == 10 and m["guidance"]["name"] == "apg"
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--steps", "2", "--no-progress", "--schedule",
                                    "flow", "--shift", "3", "--out", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "f" / "metrics.json").read_text())["schedule"]["shift"] == 3


GEOMETRY = ["geometry", "--n", "2", "--no-progress", "--sketch-dim", "4"]


@pytest.mark.parametrize("argv, option", [
    (["--at-samples"], "--at-samples"),  # the generator map has no noise level to add
    (["--map", "denoiser", "--sigma", "0.5", "--method", "euler"], "--method"),  # --at-noise: no sampler runs
    (["--map", "denoiser", "--sigma", "0.5", "--steps", "5"], "--steps"),
    (["--map", "denoiser", "--sigma", "0.5", "--sigma-max", "10"], "--sigma-max"),
    (["--map", "denoiser", "--sigma", "0.5", "--rho", "3"], "--rho"),
    (["--no-delta", "--radius", "0.5"], "--radius"),  # delta is skipped
    (["--no-delta", "--vertices", "4"], "--vertices"),
])
def test_geometry_options_the_run_ignores_are_refused(tmp_path, argv, option):
    res = CliRunner().invoke(main, [*GEOMETRY, *argv, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and option in res.output and not (tmp_path / "o").exists(), res.output


def test_geometry_sampler_options_apply_at_samples(tmp_path):
    res = CliRunner().invoke(main, [*GEOMETRY, "--map", "denoiser", "--sigma", "0.5", "--at-samples", "--method",
                                    "euler", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("argv, option", [
    (["--method", "w8a8", "--fmt", "nvfp4"], "--fmt"),  # real-kernel methods: no 4-bit format, no calibration
    (["--method", "w4a16", "--rank", "4"], "--rank"),
    (["--method", "w8a8", "--num-samples", "8"], "--num-samples"),
    (["--method", "w4a16", "--num-iters", "3"], "--num-iters"),
    (["--method", "rtn", "--rank", "4"], "--rank"),  # no low-rank branch
    (["--method", "smoothquant", "--num-iters", "3"], "--num-iters"),
])
def test_quantize_options_the_method_ignores_are_refused(tmp_path, argv, option):
    res = CliRunner().invoke(main, ["quantize", "--model", "digits", *argv, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and option in res.output and not (tmp_path / "o").exists(), res.output


def test_ocm_refuses_a_sampler_it_would_replace(tmp_path):
    # before: --method heun with --covariance ocm ran ocm-ddim and recorded it, without a word
    base = ["sample", "--model", "digits", "--covariance", "ocm", "--n", "2", "--steps", "3", "--no-progress"]
    res = CliRunner().invoke(main, [*base, "--method", "heun", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--method" in res.output and "ocm-ddim" in res.output, res.output
    assert not (tmp_path / "o").exists()
    import json

    for method, ran in (("ddpm", "ocm-ddpm"), ("ddim", "ocm-ddim")):
        res = CliRunner().invoke(main, [*base, "--method", method, "--out", str(tmp_path / method)])
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / method / "metrics.json").read_text())["method"] == ran


def test_ocm_applies_ddim_eta_and_init_and_records_them(tmp_path):
    # issue 35: --ddim-eta and --init with --covariance ocm. Both are applied (ocm-ddim takes DDIM's eta; the run
    # starts from --init on the VP-linear grid): the samples equal the library call with those arguments, eta is
    # recorded in metrics.json, and --ddim-eta without --method (ocm-ddim, the default) is no longer refused as
    # "ddim only"; with ocm-ddpm, which has no eta, it is refused.
    import json

    import steerdiff as sd
    from steerdiff.app.cli._inputs import read_start
    from steerdiff.core.sigmas import vp_linear
    from steerdiff.covariance import load_head_for
    from steerdiff.io import load_tensors

    base = ["sample", "--model", "digits", "--covariance", "ocm", "--n", "3", "--steps", "6", "--no-progress"]
    out = tmp_path / "o"
    res = CliRunner().invoke(main, [*base, "--ddim-eta", "0.7", "--init", "digits:test:0", "--strength", "0.5",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["method"] == "ocm-ddim" and metrics["ddim_eta"] == 0.7 and metrics["start_step"] == 3
    sig = vp_linear(6)
    assert metrics["start_sigma"] == float(sig[3])
    model = sd.models.load("digits")
    head = load_head_for("digits", model)
    seeds = [0, 1, 2]
    noise = sd.randn((3, 1, 8, 8), seeds=seeds)
    start = read_start("digits:test:0", (1, 8, 8), 3)
    with torch.no_grad():
        ref = sd.sample(model, noise, sig, method="ocm-ddim", covariance=head, cond=torch.arange(3) % 10,
                        generator=[s + 10**9 for s in seeds], eta=0.7, x_start=start, strength=0.5)
    assert torch.equal(load_tensors(out / "samples.safetensors")["samples"], ref)
    res = CliRunner().invoke(main, [*base, "--ddim-eta", "0", "--out", str(tmp_path / "e0")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, [*base, "--method", "ddpm", "--ddim-eta", "0.5", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "--ddim-eta" in res.output and "ocm-ddpm" in res.output, res.output


def test_guidance_scale_where_the_images_saturate_warns(tmp_path):
    # issue 35: scales of 100-10,000 on digits were silent (the core rule fires near 1e4 only) while the class
    # accuracy under the shipped classifier collapses; the warning follows the samples' share beyond the images'
    # range. Accuracy (the independent check) and the warning, at a scale that steers and one far past it.
    import json

    for scale, warns in (("3", False), ("300", True)):
        out = tmp_path / scale
        res = CliRunner().invoke(main, ["sample", "--model", "digits", "--n", "20", "--steps", "10", "--scale", scale,
                                        "--no-progress", "--out", str(out)])
        assert res.exit_code == 0, res.output
        metrics = json.loads((out / "metrics.json").read_text())
        if warns:
            assert metrics["class_accuracy"] < 0.7 and f"warning: --scale {scale}" in res.output, res.output
            assert any("--scale" in w for w in metrics["warnings"])
        else:
            assert metrics["class_accuracy"] >= 0.9 and "warning" not in res.output and "warnings" not in metrics
