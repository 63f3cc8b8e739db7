"""``steerdiff restore`` end to end (a click group built here; the main CLI registers the command)."""

import json

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from steerdiff.app.cli.restore import restore_cmd
from steerdiff.data.digits import load_digits


@click.group()
def cli():
    pass


cli.add_command(restore_cmd)
FAST = ["--steps", "10", "--chains", "3", "--no-progress"]


def _run(*args):
    return CliRunner().invoke(cli, ["restore", *args, *FAST])


def test_restore_digits_test_image_writes_png_tensors_and_metrics(tmp_path):
    out = tmp_path / "o"
    res = _run("--model", "digits", "--task", "inpaint-center", "--method", "hr", "--input", "digits:test:0",
               "--out", str(out))
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["method"] == "hr" and m["chains"] == 3 and m["nfe"] == 10 and m["nfe_vjp"] == 0
    assert len(m["psnr_chains"]) == 3 and m["psnr_mean"] > 5 and len(m["chi2_per_chain"]) == 3
    t = load_file(out / "samples.safetensors")
    assert t["samples"].shape == (3, 1, 8, 8) and t["y"].shape == (48,)
    assert (out / "restored.png").read_bytes()[:4] == b"\x89PNG"


def test_restore_reads_png_and_npy_and_degraded_low_res(tmp_path):
    from PIL import Image

    img = load_digits("test")[0][1, 0].numpy()
    png = tmp_path / "d.png"
    Image.fromarray(np.round((img + 1) * 127.5).astype(np.uint8), mode="L").save(png)
    res = _run("--model", "digits-gmm", "--task", "sr2", "--method", "dps", "--input", str(png),
               "--out", str(tmp_path / "a"))
    assert res.exit_code == 0, res.output
    low = img.reshape(4, 2, 4, 2).mean((1, 3))
    np.save(tmp_path / "low.npy", low)
    res = _run("--task", "sr2", "--method", "dr", "--input", str(tmp_path / "low.npy"), "--degraded",
               "--out", str(tmp_path / "b"))
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert "psnr_mean" not in m  # no clean image is known
    save_file({"image": torch.from_numpy(img.copy())}, str(tmp_path / "x.safetensors"))
    res = _run("--task", "deblur", "--input", str(tmp_path / "x.safetensors"), "--out", str(tmp_path / "c"))
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("args, message", [
    (["--input", "digits:test:9999"], "has 359 images"),
    (["--input", "digits:nope:1"], "split must be one of"),
    (["--input", "missing.png"], "no such file"),
    (["--input", "digits:test:0", "--noise-std", "-1"], "-1"),
    (["--input", "digits:test:0", "--method", "hr", "--beta", "2"], "beta must lie in"),
    (["--input", "digits:test:0", "--model", "digits-gmm", "--class", "3"], "unconditional"),
])
def test_restore_bad_input(tmp_path, args, message):
    res = _run(*args, "--out", str(tmp_path / "o"))
    assert res.exit_code != 0 and message in res.output, res.output


def test_restore_rejects_a_wrong_size_image(tmp_path):
    np.save(tmp_path / "big.npy", np.zeros((9, 9)))
    res = _run("--input", str(tmp_path / "big.npy"), "--out", str(tmp_path / "o"))
    assert res.exit_code != 0 and "must be 8x8" in res.output
    res = _run("--input", str(tmp_path / "big.npy"), "--degraded", "--task", "sr2", "--out", str(tmp_path / "o"))
    assert res.exit_code != 0 and "must have 16 pixels" in res.output
