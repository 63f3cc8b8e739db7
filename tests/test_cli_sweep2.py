"""issue 35, the second CLI bad-input sweep (docs/bad_inputs_sweep.md, "Second CLI sweep"): every input ends in a
usage error (exit 2) that names the option, never a raw traceback, and before anything is written.

Rows marked ``fixed`` were a raw traceback or a misleading error before (at 0c3a911); the others were found clear and
are kept here so that they stay so.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from steerdiff.app.cli import main


def _files(d):
    np.save(d / "nan.npy", np.full((4, 32), np.nan, np.float32))
    np.save(d / "bool.npy", np.zeros((4, 32), bool))
    np.save(d / "scalar.npy", np.float32(1.0))
    np.save(d / "zero.npy", np.zeros((0, 4, 32), np.float32))
    np.save(d / "wrong.npy", np.zeros((3, 8), np.float32))
    np.save(d / "nan88.npy", np.full((8, 8), np.nan, np.float32))
    (d / "ctx.txt").write_text("1 2 3")
    (d / "f.txt").write_text("x")
    save_file({"a": torch.zeros(4, 32), "b": torch.zeros(4, 32)}, str(d / "two.safetensors"))


F = ["forecast", "--steps", "6", "--members", "2"]
S = ["stylize", "--n", "2", "--steps", "3"]
D = ["sample", "--model", "digits", "--n", "2", "--steps", "3"]
A = ["align", "--model", "digits", "--n", "2", "--particles", "2", "--steps", "3"]
Q = ["quantize", "--model", "digits"]

# (argv, the option the error names, a phrase of the message); {d} is the test's folder of bad files
CASES = [
    ([*F, "--context", "test:-1"], "--context", "1..128"),
    ([*F, "--context", "test:"], "--context", "test:K"),
    ([*F, "--context", "{d}/ctx.txt"], "--context", ".npy or .safetensors"),
    ([*F, "--context", "{d}/nan.npy"], "--context", "non-finite"),
    ([*F, "--context", "{d}/bool.npy"], "--context", "not a numeric"),
    ([*F, "--context", "{d}/scalar.npy"], "--context", "must have shape"),
    ([*F, "--context", "{d}/zero.npy"], "--context", "no case"),  # fixed: RuntimeError traceback (min of empty)
    ([*F, "--context", "{d}/two.safetensors"], "--context", "one named 'context'"),
    (["forecast", "--context", "test:1", "--members", "0"], "--members", "x>=1"),
    (["forecast", "--context", "test:1", "--steps", "0"], "--steps", "x>=1"),
    ([*F, "--context", "test:1", "--sigma-min", "100"], "--sigma-min", "must be below"),
    ([*F, "--context", "test:1", "--rho", "0"], "--rho", "x>0"),
    ([*F, "--context", "test:1", "--method", "ocm-ddim"], "--method", "is not one of"),
    ([*F, "--model", "digits", "--context", "test:1"], "--model", "not a DyDiff forecaster"),
    ([*F, "--context", "test:1", "--seed", "-1"], "--seed", "0<=x"),
    ([*F, "--context", "test:1", "--sigma-max", "1e300"], "--sigma-max", "160"),  # fixed: ValueError traceback
    ([*S, "--reference", "nope"], "--reference", "no such file"),
    ([*S, "--reference", "digits:test:99999"], "--reference", "359 images"),
    (["stylize", "--n", "0"], "--n", "x>=1"),
    ([*S, "--sigma-min", "50"], "--sigma-min", "must be below"),
    ([*S, "--model", "digits_classifier"], "--model", "not a denoiser"),  # fixed: TypeError traceback
    ([*S, "--class", "10"], "--class", "[0, 9]"),
    ([*S, "--reference-style", "bold"], "--reference-style", "is not one of"),
    ([*S, "--method", "plain", "--content-ref", "digits:test:1"], "--content-ref", "--method rbmod"),
    ([*S, "--reference", "{d}/wrong.npy"], "--reference", "8x8"),
    ([*S, "--reference", "{d}/nan88.npy"], "--reference", "non-finite"),
    ([*S, "--sigma-max", "1e300"], "--sigma-max", "160"),  # fixed: ValueError traceback
    ([*S, "--sigma-max", "1e30"], "--sigma-max", "160"),  # fixed: ValueError traceback
    ([*D, "--init", "{d}/wrong.npy"], "--init", "(1, 8, 8)"),
    ([*D, "--init", "{d}/missing.npy"], "--init", "no such file"),
    ([*D, "--class", "-1"], "--class", "[0, 9]"),
    ([*D, "--batch", "0"], "--batch", "x>=1"),
    ([*D, "--init", "{d}/nan88.npy"], "--init", "non-finite"),
    ([*D, "--sigma-max", "1e300"], "--sigma-max", "160"),  # fixed: "sigmas must be strictly decreasing"
    (["sample", "--model", "gmm2d", "--n", "2", "--steps", "3", "--sigma-max", "1e300"], "--sigma-max",
     "float64"),  # fixed: "sigmas must be strictly decreasing"
    ([*D, "--covariance", "ocm", "--method", "ddpm", "--ddim-eta", "0.5"], "--ddim-eta", "ocm-ddpm"),
    ([*Q, "--model", "gmm2d", "--method", "w8a8"], "--model", "unknown model"),
    ([*Q, "--rank", "-1"], "--rank", "x>=0"),
    ([*Q, "--method", "w8a8", "--move-aside", "--out", "{d}/f.txt"], "--out", "not a directory"),
    ([*A, "--reward", "nope"], "--reward", "unknown reward"),
    ([*A, "--reward", "ink", "--particles", "0"], "--particles", "x>=1"),
    ([*A, "--reward", "ink", "--sigma-max", "1e300"], "--sigma-max", "160"),  # fixed: RuntimeError traceback
    ([*A, "--reward", "ink", "--sigma-max", "1e30"], "--sigma-max", "160"),  # fixed: ran silently
    (["train", "nonexistent_recipe"], "CONFIG", "not found"),
    (["train", "digits_unet", "--set", "steps=abc"], "--set", "must be an integer"),
]


@pytest.mark.parametrize("argv,option,phrase", CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CASES])
def test_bad_cli_input_is_a_usage_error_naming_the_option(tmp_path, argv, option, phrase):
    _files(tmp_path)
    argv = [a.format(d=tmp_path) for a in argv]
    out = ["--out", str(tmp_path / "o")] if argv[0] != "train" and "--out" not in argv else []
    res = CliRunner().invoke(main, [*argv, *out])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, res.output
    assert option in res.output and phrase in res.output, res.output
    assert not (tmp_path / "o").exists()
