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


@pytest.mark.parametrize("command", [["restore"], ["forecast"], ["geometry"], ["stylize"], ["train"], ["demo"],
                                     ["constrain", "sample"], ["constrain", "train"]])
def test_commands_that_run_in_their_own_precision_refuse_half(command):
    res = _run(*command, "--dtype", "bfloat16")
    assert res.exit_code == 2, res.output
    assert f"steerdiff {' '.join(command)} does not run in bfloat16" in res.output and "--dtype" in res.output
    assert "Traceback" not in res.output


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
