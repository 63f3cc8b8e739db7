"""Every command writes its summary, ``metrics.json``, last: a failure between two writes leaves no summary (and no
stale one from an earlier run), never a complete-looking result whose samples or images are missing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import steerdiff.viz as viz
from steerdiff.app.cli import main


def _disk_full(*_args, **_kwargs):
    raise OSError(28, "No space left on device")


def _restore(out):
    return ["restore", "--model", "digits-gmm", "--task", "inpaint-center", "--method", "hr", "--input",
            "digits:test:0", "--steps", "4", "--chains", "2", "--no-progress", "--out", str(out)]


def _sample(out):
    return ["sample", "--model", "gmm2d", "--n", "16", "--steps", "3", "--no-progress", "--out", str(out)]


def _align(out):
    return ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--method", "das", "--n", "4", "--particles", "2",
            "--steps", "3", "--no-progress", "--out", str(out)]


@pytest.mark.parametrize("command, writer", [(_restore, "image_grid"), (_sample, "scatter"), (_align, "scatter")])
def test_a_failure_between_writes_leaves_no_summary(tmp_path, monkeypatch, command, writer):
    out = tmp_path / "out"
    ok = CliRunner().invoke(main, command(out))
    assert ok.exit_code == 0, ok.output
    assert json.loads((out / "metrics.json").read_text())  # an earlier, complete run
    monkeypatch.setattr(viz, writer, _disk_full)  # the image writer fails after the samples were written
    res = CliRunner().invoke(main, command(out))
    assert res.exit_code != 0
    assert (out / "samples.safetensors").is_file()  # written before the failure
    assert not (out / "metrics.json").exists()  # neither a new summary nor the earlier run's


def test_restore_writes_metrics_after_samples_and_image(tmp_path):
    out = tmp_path / "o"
    res = CliRunner().invoke(main, _restore(out))
    assert res.exit_code == 0, res.output
    times = {name: (out / name).stat().st_mtime_ns for name in ("samples.safetensors", "restored.png",
                                                                "metrics.json")}
    assert times["metrics.json"] >= max(times["samples.safetensors"], times["restored.png"])
    assert np.isfinite(json.loads((out / "metrics.json").read_text())["psnr_mean"])
