"""Every failure the library reports while a command runs ends in an ``Error: ...`` line, never a traceback
(issue 35, "Raw tracebacks"): a model returning NaN, a directory that cannot be written, a full disk, a run too large
for memory, unreadable input files. A genuine bug keeps its traceback.
"""

import errno
import math
import pathlib

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import steerdiff as sd
from steerdiff.app.cli import main

S = ["--n", "4", "--steps", "2"]


def _clean_error(res, code: int, text: str) -> None:
    """Exit ``code``, an ``Error:`` line holding ``text``, and no traceback."""
    assert res.exit_code == code, res.output
    assert isinstance(res.exception, SystemExit), f"raised {res.exception!r} (a traceback)"
    assert "Traceback" not in res.output and "Error:" in res.output, res.output
    assert text in " ".join(res.output.split()), res.output


def test_model_with_nan_weights_is_an_error_line(tmp_path):
    from steerdiff.models import MLP, EDMPrecond

    model = EDMPrecond(MLP(dim=2, hidden=[8]))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
    sd.models.save(model, tmp_path / "nan_model")
    res = CliRunner().invoke(main, ["sample", "--model", str(tmp_path / "nan_model"), *S, "--out",
                                    str(tmp_path / "o")])
    _clean_error(res, 1, "non-finite values at step 0")
    assert "NaN" in res.output


def test_scale_that_overflows_is_an_error_line(tmp_path):
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--class", "1", "--scale", "1e300", *S, "--out",
                                    str(tmp_path / "o")])
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit), res.output
    assert res.exit_code in (1, 2) and "--scale" in res.output, res.output


def test_unwritable_out_is_an_error_line(tmp_path, monkeypatch):
    real_mkdir = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):  # a read-only parent, whoever runs the test (root may write anywhere)
        if self.name == "sub":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", *S, "--out", str(tmp_path / "ro" / "sub")])
    # --out is checked before the run: a usage error naming the option (exit 2), not the run-time Error line
    _clean_error(res, 2, "Permission denied")
    assert "Invalid value for --out" in res.output


def test_full_disk_is_an_error_line(tmp_path, monkeypatch):
    import os

    def fsync(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", *S, "--out", str(tmp_path / "o")])
    _clean_error(res, 1, "no space left on the device")
    assert not list((tmp_path / "o").glob(".*tmp*")), "a temporary file was left behind"


def test_out_of_memory_is_an_error_line(tmp_path, monkeypatch):
    from steerdiff import core

    def randn(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(core, "randn", randn)
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", *S, "--out", str(tmp_path / "o")])
    _clean_error(res, 1, "out of memory (use a smaller --n or --batch)")


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    from steerdiff import core

    def randn(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(core, "randn", randn)
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", *S, "--out", str(tmp_path / "o")])
    assert isinstance(res.exception, RuntimeError) and str(res.exception) == "a bug"


@pytest.mark.parametrize("n", ["100000000000", "10000000000"])
def test_huge_n_is_refused_up_front(tmp_path, n):
    res = CliRunner().invoke(main, ["sample", "--model", "digits", "--n", n, "--steps", "2", "--out",
                                    str(tmp_path / "o")])
    _clean_error(res, 2, "--n")
    assert "GiB of memory" in res.output
    assert not (tmp_path / "o").exists()


@pytest.fixture
def arrays(tmp_path):
    (tmp_path / "empty.npy").write_bytes(b"")
    np.save(tmp_path / "strings.npy", np.array([["a", "b"], ["c", "d"]]))
    np.save(tmp_path / "big.npy", np.full((8, 8), 1e6))
    np.save(tmp_path / "bytes.npy", np.full((8, 8), 255.0))
    np.save(tmp_path / "near.npy", np.full((8, 8), 1.01))
    return tmp_path


@pytest.mark.parametrize("argv, hint", [
    (["sample", "--model", "digits", "--init", "{empty.npy}", *S], "--init: {empty.npy}: not a plain numeric"),
    (["sample", "--model", "digits", "--init", "{big.npy}", *S], "images are in [-1, 1], this one reaches 1e+06"),
    (["sample", "--model", "digits", "--init", "{bytes.npy}", *S], "x / 127.5 - 1"),
    (["forecast", "--context", "{strings.npy}", "--members", "2", "--steps", "2"], "--context"),
    (["forecast", "--context", "{empty.npy}", "--members", "2", "--steps", "2"], "--context"),
], ids=["init empty file", "init 1e6", "init 0..255", "forecast context strings", "forecast context empty file"])
def test_bad_files_are_click_errors(arrays, argv, hint):
    fill = {name: str(arrays / name) for name in ("empty.npy", "strings.npy", "big.npy", "bytes.npy")}
    args = [fill[a[1:-1]] if a.startswith("{") else a for a in argv]
    hint = hint.replace("{empty.npy}", fill["empty.npy"])
    res = CliRunner().invoke(main, [*args, "--out", str(arrays / "o")])
    _clean_error(res, 2, hint)
    assert not (arrays / "o").exists()


def test_init_just_past_one_is_accepted(arrays):
    res = CliRunner().invoke(main, ["sample", "--model", "digits", "--init", str(arrays / "near.npy"), *S,
                                    "--out", str(arrays / "o")])
    assert res.exit_code == 0, res.output


def test_sigma_max_above_the_training_range_is_refused(tmp_path):
    res = CliRunner().invoke(main, ["sample", "--model", "digits", "--sigma-max", "1e6", *S, "--out",
                                    str(tmp_path / "o")])
    _clean_error(res, 2, "--sigma-max: 1e+06 is above digits's sigma_max 160")
    res = CliRunner().invoke(main, ["sample", "--model", "digits", *S, "--out", str(tmp_path / "ok")])
    assert res.exit_code == 0, res.output


def test_scale_far_past_where_it_steers_warns(tmp_path):
    res = CliRunner().invoke(main, ["sample", "--model", "digits", "--scale", "1e9", *S, "--out",
                                    str(tmp_path / "o")])
    assert "Traceback" not in res.output
    assert "warning: the guided samples reach" in res.output and "scale 1e+09" in res.output, res.output


@pytest.mark.parametrize("argv", [
    ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--n", "2", "--particles", "2", "--steps", "3",
     "--no-progress"],
    ["restore", "--steps", "3", "--chains", "2", "--no-progress", "--input", "digits:test:0"],
    ["constrain", "sample", "--model", "circle_namm", "--n", "2", "--steps", "2"],
    ["quantize", "--model", "digits", "--num-samples", "2", "--num-grids", "2", "--num-iters", "1"],
    ["forecast", "--context", "test:1", "--members", "2", "--steps", "2"],
], ids=["align", "restore", "constrain", "quantize", "forecast"])
def test_full_disk_in_every_command_is_an_error_line(tmp_path, monkeypatch, argv):
    import os

    def fsync(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    res = CliRunner().invoke(main, [*argv, "--out", str(tmp_path / "o")])
    _clean_error(res, 1, "no space left on the device")


def test_model_with_nan_weights_in_align_is_an_error_line(tmp_path):
    from steerdiff.models import MLP, EDMPrecond

    model = EDMPrecond(MLP(dim=2, hidden=[8]))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
    sd.models.save(model, tmp_path / "nan_model")
    res = CliRunner().invoke(main, ["align", "--model", str(tmp_path / "nan_model"), "--reward", "linear:1,0",
                                    "--n", "2", "--particles", "2", "--steps", "3", "--no-progress", "--out",
                                    str(tmp_path / "o")])
    assert res.exit_code in (1, 2) and isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output and "Error:" in res.output


@pytest.mark.parametrize("argv, hint", [
    (["geometry", "--model", "digits_geometry", "--n", "2", "--sigma-max", "1e6"], "--sigma-max"),
    (["geometry", "--model", "digits_geometry", "--n", "2", "--map", "denoiser", "--sigma", "1e6"], "--sigma"),
    (["constrain", "sample", "--model", "circle_namm", "--n", "2", "--steps", "2", "--sigma-max", "1e6"],
     "--sigma-max"),
], ids=["geometry sigma-max", "geometry denoiser sigma", "constrain sigma-max"])
def test_noise_levels_above_the_training_range_are_refused(tmp_path, argv, hint):
    res = CliRunner().invoke(main, [*argv, "--out", str(tmp_path / "o")])
    _clean_error(res, 2, "the top of the noise range it was trained for")
    assert hint in res.output and not (tmp_path / "o").exists()


def test_alpha_whose_exact_reference_overflows_is_reported_not_a_traceback(tmp_path):
    res = CliRunner().invoke(main, ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "1e-300",
                                    "--n", "2", "--particles", "2", "--steps", "3", "--no-progress", "--out",
                                    str(tmp_path / "o")])
    assert isinstance(res.exception, SystemExit) or res.exception is None, repr(res.exception)
    assert "Traceback" not in res.output
    assert "warning: no exact reference at --alpha 1e-300" in " ".join(res.output.split()), res.output


def _tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_quantize_over_an_unmarked_checkpoint_says_how_to_go_on(tmp_path):
    # issue 35: a checkpoint directory of an earlier version (no .steerdiff-checkpoint marker; e.g. make_assets'
    # scratch folders) was refused with no way forward. The refusal now names --move-aside (and moving or deleting
    # it by hand); --move-aside renames it to OUT.old, byte for byte, and writes the new checkpoint: nothing deleted.
    import steerdiff as sd
    from steerdiff.io import MARKER_NAME

    old = tmp_path / "ckpt"
    sd.models.save(sd.models.load("digits_mlp"), old)
    (old / MARKER_NAME).unlink()  # as an earlier steerdiff wrote it
    user = tmp_path / "mine"
    (user / "data").mkdir(parents=True)
    (user / "config.json").write_text('{"exp": 1}')
    (user / "data" / "results.csv").write_text("keep\n")
    for target in (old, user):
        before = _tree(target)
        argv = ["quantize", "--model", "digits", "--method", "w8a8", "--out", str(target)]
        res = CliRunner().invoke(main, argv)
        assert res.exit_code == 2 and "--move-aside" in res.output and f"{target.name}.old" in res.output, res.output
        assert "move or delete it yourself" in res.output and _tree(target) == before
        assert ("earlier steerdiff" in res.output) == (target == old)  # a user's config.json is not taken for one
        if target == user:
            assert "no checkpoint written by steerdiff" in res.output
        res = CliRunner().invoke(main, [*argv, "--move-aside", "--no-progress"])
        assert res.exit_code == 0, res.output
        aside = target.with_name(target.name + ".old")
        assert _tree(aside) == before and f"moved the existing {target} to {aside}" in res.output
        assert (target / MARKER_NAME).is_file() and sd.models.load(target) is not None
        # a second run replaces its own (marked) output in place: nothing more is moved aside
        res = CliRunner().invoke(main, [*argv, "--move-aside", "--no-progress"])
        assert res.exit_code == 0 and "moved" not in res.output
        assert not target.with_name(target.name + ".old-2").exists()
    (tmp_path / "f.txt").write_text("x")
    res = CliRunner().invoke(main, ["quantize", "--model", "digits", "--method", "w8a8", "--move-aside", "--out",
                                    str(tmp_path / "f.txt")])
    assert res.exit_code == 2 and (tmp_path / "f.txt").read_text() == "x"  # a file is never moved
