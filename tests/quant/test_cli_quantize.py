"""``steerdiff quantize`` writes a loadable directory; ``steerdiff sample --model DIR`` samples from it."""

from __future__ import annotations

import json

from click.testing import CliRunner

from steerdiff.app.cli import main
from steerdiff.app.cli.quantize import quantize_cmd


def test_quantize_then_sample(tmp_path):
    out = tmp_path / "q"
    res = CliRunner().invoke(quantize_cmd, ["--model", "digits", "--method", "svdquant", "--rank", "4",
                                            "--num-samples", "16", "--num-grids", "2", "--num-iters", "2",
                                            "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "quantization.json").read_text())
    assert summary["method"] == "svdquant" and len(summary["layers"]) == 24
    assert all(e["bytes"] == e["formula_bytes"] for e in summary["layers"].values())
    # the default search="auto", resolved per group (the digits' groups are narrow: exact), is in the record
    assert [(c["search_requested"], c["search_mode"]) for c in summary["calibration"]] == [("auto", "exact")] * 24
    res = CliRunner().invoke(main, ["sample", "--model", str(out), "--n", "8", "--steps", "3", "--no-progress",
                                    "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "s" / "metrics.json").read_text())["nfe"] == 5
    # A quantized checkpoint is refused, from its config.json, before anything is loaded or written.
    res = CliRunner().invoke(quantize_cmd, ["--model", str(out), "--out", str(tmp_path / "qq")])
    assert res.exit_code == 2 and "--model" in res.output and "already quantized" in res.output, res.output
    assert not (tmp_path / "qq").exists()


def test_quantize_bad_model_and_rank(tmp_path):
    res = CliRunner().invoke(quantize_cmd, ["--model", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "--model" in res.output
    res = CliRunner().invoke(quantize_cmd, ["--model", "digits", "--rank", "1000", "--num-samples", "4",
                                            "--num-grids", "2", "--out", str(tmp_path / "y")])
    assert res.exit_code != 0 and "rank=1000" in res.output


def test_quantize_never_replaces_a_file_given_as_out(tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    res = CliRunner().invoke(quantize_cmd, ["--model", "digits", "--num-samples", "2", "--num-grids", "2",
                                            "--num-iters", "1", "--device", "cpu", "--out", str(precious)])
    assert res.exit_code == 2 and "--out" in res.output and "not a directory" in res.output, res.output
    assert precious.read_text() == "keep me"


def test_quantize_search_option(tmp_path):
    """``--search`` offers the registered search modes, and is refused for a method without a smoothing search."""
    res = CliRunner().invoke(quantize_cmd, ["--model", "digits", "--search", "nope", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "--search" in res.output and "exact" in res.output, res.output
    res = CliRunner().invoke(quantize_cmd, ["--model", "digits", "--method", "w4a16", "--search", "exact",
                                            "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "--search does not apply" in res.output, res.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
