"""``steerdiff stylize`` end to end on the shipped three-style digits generator."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from steerdiff.cli import main
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
