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


def test_restore_offers_and_runs_a_task_registered_at_run_time(tmp_path):
    """``--task`` reads the task registry when the command runs: a task registered after the command was built is
    offered, and its operator makes the measurement (4x4 block means of the clean image, computed here by hand)."""
    from steerdiff.inverse import TASKS, Downsample, register_task

    args = ["--model", "digits-gmm", "--method", "dr", "--input", "digits:test:0", "--noise-std", "0"]
    res = _run(*args, "--task", "sr4-test", "--out", str(tmp_path / "before"))
    assert res.exit_code == 2 and "sr4-test" in res.output and "inpaint-center" in res.output, res.output
    register_task("sr4-test")(lambda shape: Downsample(4, shape))
    try:
        assert "sr4-test" in CliRunner().invoke(cli, ["restore", "--help"]).output
        res = _run(*args, "--task", "sr4-test", "--out", str(tmp_path / "o"))
        assert res.exit_code == 0, res.output
        y = load_file(tmp_path / "o" / "samples.safetensors")["y"]
        clean = load_digits("test")[0][0, 0].double().numpy()
        blocks = clean.reshape(2, 4, 2, 4).mean(axis=(1, 3)).reshape(-1)
        assert y.shape == (4,) and np.allclose(y.double().numpy(), blocks, atol=1e-12)
        assert json.loads((tmp_path / "o" / "metrics.json").read_text())["task"] == "sr4-test"
    finally:
        TASKS.remove("sr4-test")


def test_task_operator_old_path_warns_and_gives_the_registry_function():
    import steerdiff.inverse as inverse
    import steerdiff.inverse.operators as operators
    from steerdiff.inverse import tasks

    with pytest.warns(DeprecationWarning, match="steerdiff.inverse.tasks.task_operator"):
        old = operators.task_operator
    with pytest.warns(DeprecationWarning, match="steerdiff.inverse.tasks.TASKS"):
        old_tasks = operators.TASKS
    assert old is tasks.task_operator is inverse.task_operator and old_tasks is tasks.TASKS is inverse.TASKS
    with pytest.raises(ValueError, match="unknown task 'colorize'; choose one of deblur, hdr"):
        inverse.task_operator("colorize")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        operators.nope  # noqa: B018
