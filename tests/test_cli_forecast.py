"""``steerdiff forecast`` end to end on the shipped DyDiff forecaster (docs/methods/dydiff.md)."""

import json

import numpy as np
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from steerdiff.app.cli import main
from steerdiff.data import advection
from steerdiff.metrics.forecast import crps_fair, ensemble_mse
from steerdiff.temporal import forecast, load_forecaster


def test_forecast_test_cases_write_outputs_and_scores(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["forecast", "--model", "advection_dydiff", "--context", "test:3", "--members", "3",
                                    "--steps", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    got = load_file(str(out / "forecast.safetensors"))
    assert got["forecast"].shape == (3, 3, 6, 32) and got["context"].shape == (3, 4, 32)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nfe_per_member"] == 7 and metrics["r"] == 0.5 and metrics["cases"] == 3
    truth = advection.test_set(1, n=3)[:, 4:]
    assert metrics["mse"] == np.float32(ensemble_mse(got["forecast"], truth)).item()
    assert abs(metrics["crps"] - crps_fair(got["forecast"], truth).item()) < 1e-6
    assert metrics["oracle_mse"] < metrics["persistence_mse"]
    assert (out / "forecast.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same as the library call
    ref = forecast(load_forecaster("advection_dydiff"), advection.test_set(1, n=3)[:, :4], members=3, steps=4)
    assert torch.equal(ref, got["forecast"])


def test_forecast_from_files(tmp_path):
    ctx = advection.test_set(1, n=2)[:, :4]
    np.save(tmp_path / "one.npy", ctx[0].numpy())
    save_file({"context": ctx.contiguous()}, str(tmp_path / "two.safetensors"))
    for spec, cases in (("one.npy", 1), ("two.safetensors", 2)):
        out = tmp_path / f"out_{cases}"
        res = CliRunner().invoke(main, ["forecast", "--model", "advection_baseline", "--context",
                                        str(tmp_path / spec), "--members", "2", "--steps", "2", "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert load_file(str(out / "forecast.safetensors"))["forecast"].shape == (cases, 2, 6, 32)
        assert "mse" not in json.loads((out / "metrics.json").read_text())  # no truth for a file context


def test_forecast_bad_inputs(tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((4, 31), dtype=np.float32))
    res = CliRunner().invoke(main, ["forecast", "--context", str(tmp_path / "bad.npy"), "--out", str(tmp_path)])
    assert res.exit_code != 0 and "context must have shape" in res.output
    res = CliRunner().invoke(main, ["forecast", "--model", "nope", "--context", "test:1", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--model" in res.output
    res = CliRunner().invoke(main, ["forecast", "--context", "test:0", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "test:K" in res.output
    res = CliRunner().invoke(main, ["forecast", "--context", str(tmp_path / "missing.npy"), "--out", str(tmp_path)])
    assert res.exit_code != 0 and "no such file" in res.output


def test_forecast_test_index_out_of_range_is_refused(tmp_path):
    # issue 35: test:99999 was clamped to the 128 test sequences without a word.
    from steerdiff.data.advection import TEST_SIZE

    for spec in (f"test:{TEST_SIZE + 1}", "test:99999"):
        res = CliRunner().invoke(main, ["forecast", "--context", spec, "--out", str(tmp_path / "o")])
        assert res.exit_code == 2, res.output
        assert "--context" in res.output and f"1..{TEST_SIZE}" in res.output and spec in res.output
        assert not (tmp_path / "o").exists()
    res = CliRunner().invoke(main, ["forecast", "--context", "test:x", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--context" in res.output and "test:K" in res.output
