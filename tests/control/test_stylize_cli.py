"""``steerdiff stylize`` end to end on the shipped three-style digits generator."""

from __future__ import annotations

import json

import numpy as np
import torch
from click.testing import CliRunner

from steerdiff.app.cli import main
from steerdiff.io import load_tensors


def test_stylize_rbmod_and_baselines(tmp_path):
    runs = {}
    for name, extra in {"rbmod": [], "guidance": ["--method", "guidance", "--w", "2"],
                        "plain": ["--method", "plain"]}.items():
        out = tmp_path / name
        res = CliRunner().invoke(main, ["stylize", "--n", "10", "--out", str(out), *extra])
        assert res.exit_code == 0, res.output
        runs[name] = json.loads((out / "metrics.json").read_text())
        tensors = load_tensors(out / "samples.safetensors")
        assert tuple(tensors["samples"].shape) == (10, 1, 8, 8)
        assert (out / "samples.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert runs["rbmod"]["denoiser_backward_passes"] == 0
    assert runs["guidance"]["denoiser_backward_passes"] == 20  # one VJP per step
    assert runs["plain"]["denoiser_backward_passes"] == 0
    # both stylisers pull the style cost far below the plain samples'
    assert runs["rbmod"]["style_cost_mean"] < 0.25 * runs["plain"]["style_cost_mean"]
    assert runs["guidance"]["style_cost_mean"] < 0.25 * runs["plain"]["style_cost_mean"]


def test_stylize_other_sampler_and_reference_file(tmp_path):
    ref = tmp_path / "ref.npy"
    np.save(ref, np.full((8, 8), -1.0) + np.eye(8) * 2)
    res = CliRunner().invoke(main, ["stylize", "--n", "4", "--sampler", "heun", "--class", "3", "--reference",
                                    str(ref), "--reference-style", "normal", "--descriptor", "cnn", "--eta", "0.05",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["nfe"] == 39 and metrics["cost"] == "cosine" and metrics["class"] == 3


def test_stylize_bad_input(tmp_path):
    res = CliRunner().invoke(main, ["stylize", "--eta", "0", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--eta" in res.output
    ref = tmp_path / "big.npy"
    np.save(ref, np.zeros((12, 12)))
    res = CliRunner().invoke(main, ["stylize", "--reference", str(ref), "--out", str(tmp_path)])
    assert res.exit_code != 0 and "8x8" in res.output
    res = CliRunner().invoke(main, ["stylize", "--class", "12", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--class" in res.output


def test_stylize_subject_mode(tmp_path):
    """--content-ref: null-class samples pulled towards the subject's class by the content head; the default run
    (no subject) still equals RB-Mod built without content arguments, bit for bit."""
    import steerdiff as sd
    from steerdiff.control import RBModulation
    from steerdiff.control.descriptors import ThicknessDescriptor
    from steerdiff.control.styles import stylize_images
    from steerdiff.data.digits import load_digits

    images, labels = load_digits("all")
    idx = int(np.nonzero(np.asarray(labels) == 3)[0][1])
    runs = {}
    for lam in ("0", "3"):
        out = tmp_path / f"lam{lam}"
        res = CliRunner().invoke(main, ["stylize", "--n", "10", "--content-ref", f"digits:all:{idx}",
                                        "--lam-content", lam, "--out", str(out)])
        assert res.exit_code == 0, res.output
        runs[lam] = json.loads((out / "metrics.json").read_text())
    assert runs["3"]["denoiser_backward_passes"] == 0 and runs["3"]["nfe"] == 20
    assert runs["3"]["content_ref"] == f"digits:all:{idx}" and runs["3"]["class"] is None
    assert runs["3"]["content_cost_mean"] < 0.5 * runs["0"]["content_cost_mean"]
    assert runs["3"]["content_head_subject_share"] >= runs["0"]["content_head_subject_share"] + 0.5

    out = tmp_path / "default"
    res = CliRunner().invoke(main, ["stylize", "--n", "10", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "metrics.json").read_text())["content_cost_mean"] is None
    model = sd.models.load("digits_styles").eval().requires_grad_(False)
    ref = stylize_images(images[0:1].float(), "thick")
    rbm = RBModulation(ThicknessDescriptor(), None, M=3, eta=0.2, lam_style=1.0, lam_prox=1.0, reference=ref,
                       cost="squared")
    want = sd.sample(model, sd.randn((10, 1, 8, 8), seeds=0), sd.sigmas.karras(20, 0.002, 40.0), method="ddim",
                     cond=torch.arange(10) % 10, generator=0, x0_corrector=rbm)
    assert torch.equal(load_tensors(out / "samples.safetensors")["samples"], want)


def test_stylize_subject_mode_bad_input(tmp_path):
    res = CliRunner().invoke(main, ["stylize", "--method", "guidance", "--content-ref", "digits:all:3", "--out",
                                    str(tmp_path)])
    assert res.exit_code != 0 and "--content-ref" in res.output and "rbmod" in res.output
    big = tmp_path / "big.npy"
    np.save(big, np.zeros((12, 12)))
    res = CliRunner().invoke(main, ["stylize", "--content-ref", str(big), "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--content-ref" in res.output and "8x8" in res.output
    res = CliRunner().invoke(main, ["stylize", "--content-ref", "digits:all:3", "--lam-content", "-1", "--out",
                                    str(tmp_path)])
    assert res.exit_code != 0 and "--lam-content" in res.output


def test_stylize_options_that_do_not_apply_are_refused(tmp_path):
    """issue 35: options the chosen method ignores, and a --tau beyond the steps, were accepted without a word."""
    out = tmp_path / "o"
    cases = [
        (["--tau", "999", "--steps", "3"], "--tau", "3 steps"),
        (["--tau", "4", "--steps", "3"], "--tau", "3 steps"),
        (["--method", "plain", "--tau", "2"], "--tau", "--method plain"),
        (["--method", "guidance", "--M", "5"], "--M", "--method guidance"),
        (["--method", "guidance", "--eta", "0.5"], "--eta", "--method guidance"),
        (["--method", "plain", "--lam-style", "2"], "--lam-style", "--method plain"),
        (["--method", "guidance", "--lam-prox", "2"], "--lam-prox", "--method guidance"),
        (["--lam-content", "3"], "--lam-content", "--content-ref"),
        (["--method", "rbmod", "--w", "3"], "--w", "--method rbmod"),
        (["--method", "plain", "--w", "3"], "--w", "--method plain"),
    ]
    for extra, option, why in cases:
        res = CliRunner().invoke(main, ["stylize", "--n", "2", *extra, "--out", str(out)])
        assert res.exit_code == 2, (extra, res.output)
        assert option in res.output and why in res.output, (extra, res.output)
        assert "Traceback" not in res.output and not out.exists()


def test_stylize_tau_equal_to_steps_corrects_every_step(tmp_path):
    """--tau N with N steps corrects steps 0..N-1, every step: the same numbers as no --tau."""
    got = {}
    for name, extra in {"all": [], "tau": ["--tau", "3"]}.items():
        res = CliRunner().invoke(main, ["stylize", "--n", "2", "--steps", "3", *extra, "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        got[name] = load_tensors(tmp_path / name / "samples.safetensors")["samples"]
    assert torch.equal(got["all"], got["tau"])


def test_stylize_reentry(tmp_path):
    """--reentry official runs the official code's controller (the library's reentry="official"); it is an rbmod
    option, refused with another --method."""
    import steerdiff as sd
    from steerdiff.control import RBModulation
    from steerdiff.control.descriptors import ThicknessDescriptor
    from steerdiff.control.styles import stylize_images
    from steerdiff.data.digits import load_digits

    out = tmp_path / "official"
    res = CliRunner().invoke(main, ["stylize", "--n", "10", "--reentry", "official", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "metrics.json").read_text())["reentry"] == "official"
    images, _ = load_digits("all")
    model = sd.models.load("digits_styles").eval().requires_grad_(False)
    ref = stylize_images(images[0:1].float(), "thick")
    rbm = RBModulation(ThicknessDescriptor(), None, M=3, eta=0.2, reference=ref, cost="squared", reentry="official")
    want = sd.sample(model, sd.randn((10, 1, 8, 8), seeds=0), sd.sigmas.karras(20, 0.002, 40.0), method="ddim",
                     cond=torch.arange(10) % 10, generator=0, x0_corrector=rbm)
    assert torch.equal(load_tensors(out / "samples.safetensors")["samples"], want)
    res = CliRunner().invoke(main, ["stylize", "--method", "plain", "--reentry", "official", "--out",
                                    str(tmp_path / "p")])
    assert res.exit_code != 0 and "--reentry" in res.output
