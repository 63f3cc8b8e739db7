"""issue 36: ``--dtype`` (float32 / float16 / bfloat16) on every command that runs a model: the model is moved to it
and run in it (samples in bfloat16 differ from float32's by bfloat16's rounding, no more), or the command refuses it
naming itself and the option."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from steerdiff.app.cli import main


def _run(*argv):
    return CliRunner().invoke(main, list(argv))


def _samples(out):
    from steerdiff.io import load_tensors

    return load_tensors(out / "samples.safetensors")["samples"]


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_sample_model_runs_in_bfloat16(tmp_path):
    got = {}
    for dt in ("float32", "bfloat16"):
        res = _run("sample", "--model", "digits", "--n", "2", "--steps", "3", "--no-progress", "--dtype", dt,
                   "--out", str(tmp_path / dt))
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / dt / "metrics.json").read_text())["dtype"] == dt
        got[dt] = _samples(tmp_path / dt)
    # The network ran in bfloat16 (8 significant bits: rounding 2^-9 = 2e-3 per operation), the sampler's state in
    # float32: the same samples up to the network's rounding, and not the float32 run relabelled.
    assert got["bfloat16"].dtype == torch.float32
    rel = _rel(got["bfloat16"], got["float32"])
    assert 1e-6 < rel < 0.1, rel


@pytest.mark.parametrize("command", [["sample"], ["align", "--reward", "class:3", "--particles", "2"]])
def test_a_mixture_refuses_half_precision_naming_command_and_option(tmp_path, command):
    res = _run(*command, "--model", "gmm2d", "--steps", "2", "--dtype", "float16", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2, res.output
    assert f"steerdiff {command[0]} does not run in float16" in res.output and "--dtype" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "o").exists()


def test_align_model_runs_in_bfloat16(tmp_path):
    res = _run("align", "--model", "digits", "--reward", "class:3", "--alpha", "0.1", "--particles", "2", "--n", "2",
               "--steps", "3", "--no-progress", "--dtype", "bfloat16", "--out", str(tmp_path / "a"))
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["dtype"] == "bfloat16"
    assert torch.isfinite(_samples(tmp_path / "a").float()).all()


def test_quantize_calibrates_in_bfloat16(tmp_path):
    from safetensors import safe_open

    res = _run("quantize", "--model", "digits", "--method", "rtn", "--dtype", "bfloat16", "--no-progress",
               "--out", str(tmp_path / "q"))
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "q" / "quantization.json").read_text())
    assert summary["dtype"] == "bfloat16"
    dtypes = set()
    for f in (tmp_path / "q").glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            dtypes |= {fh.get_tensor(k).dtype for k in fh.keys()}
    # The quantizer stores its factors in float16 and its scales as it chooses; bfloat16 tensors can only be the
    # model's own (unquantized) weights, moved by --dtype.
    assert torch.bfloat16 in dtypes, dtypes


@pytest.mark.slow  # ~15 s: two pipeline runs
def test_sample_pipeline_runs_in_bfloat16(tmp_path_factory, tmp_path):
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    import tiny_pipelines

    from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer

    root = tmp_path_factory.mktemp("dtype_sd")
    write_clip_tokenizer(root / "tok")
    tiny_pipelines.make_sd(root / "tok", "euler").save_pretrained(root / "sd")
    got = {}
    for dt in ("float32", "bfloat16"):
        res = _run("sample", "--pipeline", str(root / "sd"), "--prompt", "a red disk", "--steps", "3", "--seed", "7",
                   "--no-progress", "--dtype", dt, "--out", str(tmp_path / dt))
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / dt / "metrics.json").read_text())["dtype"] == dt
        got[dt] = _samples(tmp_path / dt)
    rel = _rel(got["bfloat16"].float(), got["float32"].float())
    assert 1e-4 < rel < 0.1, rel


@pytest.mark.parametrize("command", [["geometry"], ["demo"], ["constrain", "train"]])
def test_commands_that_run_in_their_own_precision_refuse_half(command):
    res = _run(*command, "--dtype", "bfloat16")
    assert res.exit_code == 2, res.output
    assert f"steerdiff {' '.join(command)} does not run in bfloat16" in res.output and "--dtype" in res.output
    assert "Traceback" not in res.output


def _two_runs(tmp_path, *argv, metrics="metrics.json"):
    """The command in float32 and in bfloat16 (``--out`` appended); each run's metrics must record its dtype."""
    for dt in ("float32", "bfloat16"):
        res = _run(*argv, "--dtype", dt, "--out", str(tmp_path / dt))
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / dt / metrics).read_text())["dtype"] == dt
    return tmp_path / "float32", tmp_path / "bfloat16"


@pytest.mark.parametrize("method", ["dps", "dr"])
def test_restore_runs_the_network_in_bfloat16(tmp_path, method):
    """The network in bfloat16, the chains in float32: the same chains up to the network's rounding (bfloat16 rounds
    at 2^-9 relative per operation; a few levels and Adam steps carry it to a few 1e-3), and not the float32 run."""
    f32, bf16 = _two_runs(tmp_path, "restore", "--model", "digits", "--task", "inpaint-center", "--method", method,
                          "--input", "digits:test:0", "--chains", "2", "--steps", "5", "--no-progress")
    a, b = _samples(f32), _samples(bf16)
    assert b.dtype == torch.float32
    assert 1e-5 < _rel(b, a) < 0.1, _rel(b, a)


def test_restore_surrogate_refuses_half_precision(tmp_path):
    res = _run("restore", "--model", "digits-gmm", "--task", "inpaint-center", "--input", "digits:test:0",
               "--dtype", "bfloat16", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2, res.output
    assert "steerdiff restore does not run in bfloat16" in res.output and "float64" in res.output
    assert not (tmp_path / "o").exists()


def test_forecast_runs_the_network_in_bfloat16(tmp_path):
    f32, bf16 = _two_runs(tmp_path, "forecast", "--context", "test:1", "--members", "2", "--steps", "6",
                          "--no-progress")
    from steerdiff.io import load_tensors

    a, b = (load_tensors(d / "forecast.safetensors")["forecast"] for d in (f32, bf16))
    assert b.dtype == torch.float32  # the sampler's state
    assert 1e-5 < _rel(b, a) < 0.1, _rel(b, a)


def test_stylize_runs_the_denoiser_in_bfloat16(tmp_path):
    f32, bf16 = _two_runs(tmp_path, "stylize", "--method", "guidance", "--n", "3", "--steps", "4", "--no-progress")
    a, b = _samples(f32), _samples(bf16)
    assert b.dtype == torch.float32
    assert 1e-5 < _rel(b, a) < 0.1, _rel(b, a)


def test_constrain_sample_runs_the_mirror_model_in_bfloat16(tmp_path):
    f32, bf16 = _two_runs(tmp_path, "constrain", "sample", "--n", "3", "--steps", "4")
    a, b = _samples(f32), _samples(bf16)
    assert b.dtype == torch.float32  # decoded by the float32 inverse map
    assert 1e-5 < _rel(b, a) < 0.1, _rel(b, a)


def test_train_bfloat16_is_mixed_precision(tmp_path):
    """``--dtype bfloat16`` trains under autocast: the recipe's config records it, the weights (and the shipped
    final model) stay float32, the loss is bfloat16-close to float32's but not equal; resuming in another dtype is a
    config change, refused; float16 is refused naming why."""
    from safetensors import safe_open
    from test_cli import _tiny_recipe

    recipe = _tiny_recipe(tmp_path)
    logs = {}
    for dt in ("float32", "bfloat16"):
        res = _run("train", str(recipe), "--out", str(tmp_path / dt), "--no-progress", "--dtype", dt)
        assert res.exit_code == 0, res.output
        logs[dt] = json.loads((tmp_path / dt / "train_log.json").read_text())
        with safe_open(str(tmp_path / dt / "final" / "model.safetensors"), "pt") as fh:
            assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.float32}
    assert logs["bfloat16"]["config"]["autocast"] == "bfloat16" and logs["float32"]["config"]["autocast"] is None
    a, b = (logs[dt]["history"][-1]["loss"] for dt in ("float32", "bfloat16"))
    assert 0 < abs(b - a) / a < 1e-2, (a, b)
    res = _run("train", str(recipe), "--out", str(tmp_path / "float32"), "--resume", "--no-progress", "--dtype",
               "bfloat16")
    assert res.exit_code != 0 and "autocast" in res.output
    res = _run("train", str(recipe), "--dtype", "float16")
    assert res.exit_code == 2 and "steerdiff train does not run in float16" in res.output
    assert "loss scaling" in res.output and "Traceback" not in res.output


def test_every_command_that_runs_a_model_takes_dtype():
    import click

    def leaves(cmd, path=()):
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from leaves(sub, (*path, name))
        else:
            yield path, cmd

    for path, cmd in leaves(main):
        names = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if "--device" in names:  # a command that runs a model takes both
            assert "--dtype" in names, path
