"""Quantizers as a registry: the built-in methods are registered entries with their options, ``quantize``
dispatches through :data:`steerdiff.quant.QUANTIZERS`, unknown names are refused with the registered ones listed,
and a quantizer registered at run time (a plugin module, one file) runs through ``quantize``, ``save`` / ``load``
and ``steerdiff quantize`` (a process that imports the plugin before the CLI: its ``--method`` offers it).

Independent truth for the plugin: its layers must equal ``W8A8Layer.from_float`` of the float layers (built here
directly), the layers it leaves alone must be the float layers, and the model's output must be what those layers
compute in sequence.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import steerdiff.quant as sq
from steerdiff.quant import QUANTIZERS, W8A8Layer, register_quantizer

PLUGIN = '''"""A quantizer plugin: W8A8 on the first layer group only (the rest stays float)."""

from steerdiff.quant import QuantJob, W8A8Layer, register_quantizer


@register_quantizer("w8a8_first")
def w8a8_first(job: QuantJob) -> None:
    """W8A8 on the first layer group only."""
    group = job.groups[0]
    job.report.append({"group": group.name, "input_shape": list(job.inputs[group.paths[0]].shape)})
    for path in group.paths:
        job.replace(path, W8A8Layer.from_float(job.layer(path)))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin module written to a folder on sys.path, imported (it registers ``w8a8_first``)."""
    (tmp_path / "my_quant_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("my_quant_plugin")
    yield tmp_path
    QUANTIZERS.remove("w8a8_first")
    sys.modules.pop("my_quant_plugin", None)


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()


X = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))


def test_builtin_quantizers_are_registered_with_their_options():
    assert QUANTIZERS.names() == ["rtn", "smoothquant", "svd", "svdquant", "w4a16", "w8a8"]
    assert sorted(sq.METHODS) == QUANTIZERS.names()
    assert "rank" in QUANTIZERS.get("svdquant").options and "rank" not in QUANTIZERS.get("rtn").options
    assert "alpha" in QUANTIZERS.get("smoothquant").options
    assert not QUANTIZERS.get("w8a8").calibrated and QUANTIZERS.get("svd").calibrated
    assert sorted(sq.api.W4A4_METHODS) == ["rtn", "smoothquant", "svd", "svdquant"]


def test_unknown_method_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"method must be one of \['rtn', 'smoothquant', 'svd', 'svdquant', 'w4a16', "
                                         r"'w8a8'\], got 'nope'"):
        sq.quantize(_mlp(), "nope", calib=X)
    with pytest.raises(ValueError, match="unknown options"):
        register_quantizer("bad", options=("ranks",))
    with pytest.raises(TypeError, match="decorates a function"):
        register_quantizer("bad")(3)
    assert "bad" not in QUANTIZERS


def test_a_quantizer_registered_at_run_time_runs_through_quantize(plugin, tmp_path):
    assert "w8a8_first" in QUANTIZERS and QUANTIZERS.get("w8a8_first").summary == "W8A8 on the first layer group only."
    model = _mlp()
    q = sq.quantize(model, "w8a8_first", calib=X)
    info = sq.quant_info(q)
    assert info["method"] == "w8a8_first" and info["fmt"] is None
    assert list(info["layers"]) == ["0"] and info["layers"]["0"]["type"] == "W8A8Layer"
    assert info["report"] == [{"group": info["report"][0]["group"], "input_shape": [64, 64]}]  # the fp inputs
    assert isinstance(q[0], W8A8Layer) and isinstance(q[2], nn.Linear) and isinstance(model[0], nn.Linear)
    first = W8A8Layer.from_float(model[0])
    assert torch.equal(q[2].weight, model[2].weight)
    with torch.no_grad():
        assert torch.equal(q(X), model[2](model[1](first(X))))
        back = sq.load(sq.save(q, tmp_path / "saved"), template=_mlp())
        assert torch.equal(back(X), q(X))
    with pytest.raises(ValueError, match=r"method must be one of \[.*'w8a8_first'.*\], got 'nope'"):
        sq.quantize(_mlp(), "nope", calib=X)


def test_the_cli_offers_the_registered_quantizers():
    from steerdiff.app.cli.quantize import quantize_cmd

    choices = next(p for p in quantize_cmd.params if p.name == "method").type.choices
    assert list(choices) == QUANTIZERS.names()
    res = CliRunner().invoke(quantize_cmd, ["--method", "nope", "--out", "x"])
    assert res.exit_code == 2 and "nope" in res.output and "svdquant" in res.output


def test_a_plugin_imported_before_the_cli_is_offered_and_runs(plugin, tmp_path):
    out = tmp_path / "q"
    script = "import sys, my_quant_plugin; from steerdiff.app.cli import main; main(sys.argv[1:])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), str(Path(sq.__file__).parents[2])]),
           "OMP_NUM_THREADS": "1"}
    help_ = subprocess.run([sys.executable, "-c", script, "quantize", "--help"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert help_.returncode == 0 and "w8a8_first" in help_.stdout, help_.stderr
    res = subprocess.run([sys.executable, "-c", script, "quantize", "--model", "digits", "--method", "w8a8_first",
                          "--num-samples", "2", "--out", str(out)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "quantization.json").read_text())
    assert summary["method"] == "w8a8_first" and len(summary["layers"]) >= 1
    assert json.loads((out / "config.json").read_text())["quantization"]["method"] == "w8a8_first"
