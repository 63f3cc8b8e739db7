"""Clear errors of ``sd.quant.quantize``, raised before any calibration: an already quantized model, bad option
values, calibration data of the wrong kind, a layer mapping that does not fit the model (docs/methods/svdquant.md,
"Errors")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import steerdiff.quant as sq
from steerdiff.quant.mapping import Group


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()


class Recorder:
    """Calibration data as a callable that records whether quantize asked for it."""

    def __init__(self, items):
        self.items, self.calls = items, 0

    def __call__(self):
        self.calls += 1
        return self.items


X = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("method", sq.METHODS)
def test_an_already_quantized_model_is_refused_naming_its_method_and_format(method, digits, digits_calib):
    q = sq.quantize(digits, "rtn", fmt="nvfp4", calib=digits_calib)
    calib = Recorder(digits_calib)
    with pytest.raises(ValueError, match=r"already quantized \(method 'rtn', format 'nvfp4'\); quantize the "
                                         r"original floating-point model"):
        sq.quantize(q, method, calib=calib)
    assert calib.calls == 0  # refused before any calibration


def test_loaded_quantized_models_and_bare_quantized_layers_are_refused(tmp_path):
    q = sq.quantize(_mlp(), "w8a8")
    back = sq.load(sq.save(q, tmp_path / "q"), template=_mlp())
    with pytest.raises(ValueError, match=r"already quantized \(method 'w8a8', format None\)"):
        sq.quantize(back, "svdquant", calib=X)
    layer = sq.quantize(nn.Linear(64, 32), "rtn", calib=X)
    with pytest.raises(ValueError, match="already quantized"):
        sq.quantize(layer, "rtn", calib=X)
    held = nn.Sequential(nn.Linear(64, 64), sq.quantize(nn.Linear(64, 32), "w8a8"))  # a quantized layer, no record
    with pytest.raises(ValueError, match=r"already quantized \(it holds a quantized W8A8Layer at '1'\)"):
        sq.quantize(held, "rtn", calib=X)


@pytest.mark.parametrize("option,value,match", [
    ("rank", True, "rank must be a non-negative int"),
    ("num_grids", 0, "num_grids must be an int >= 1"),
    ("num_grids", "20", "num_grids must be an int >= 1"),
    ("num_iters", 0, "num_iters must be an int >= 1"),
    ("num_samples", 0, "num_samples must be an int >= 1"),
    ("max_tokens", 0, "max_tokens must be an int >= 1"),
    ("factor_dtype", "float8", "factor_dtype must be one of"),
    ("alpha", 1.5, r"alpha must be None \(searched\) or a number in \[0, 1\]"),
    ("alpha", "0.5", r"alpha must be None \(searched\) or a number in \[0, 1\]"),
    ("shift", "yes", "shift must be None"),
    ("early_stop", "no", "early_stop must be a bool"),
    ("groups", "0", "groups must be a non-empty list of steerdiff.quant.Group"),
    ("groups", [], "groups must be a non-empty list of steerdiff.quant.Group"),
])
def test_bad_option_values_name_the_option(option, value, match):
    calib = Recorder([X])
    with pytest.raises(ValueError, match=match):
        sq.quantize(_mlp(), "smoothquant", calib=calib, **{option: value})
    assert calib.calls == 0


@pytest.mark.parametrize("groups,match", [
    ([Group("nope", ["nope"])], "groups: group 'nope' names layer 'nope', which the model does not have"),
    ([Group("1", ["1"])], "groups: layer '1' of group '1' cannot be quantized: only nn.Linear and nn.Conv2d"),
    ([Group("both", ["0", "2"])], r"layers sharing an input must have equal in_channels, got \[64, 128\]"),
])
def test_a_layer_mapping_that_does_not_fit_the_model_is_refused(groups, match):
    calib = Recorder([X])
    with pytest.raises(ValueError, match=match):
        sq.quantize(_mlp(), "svdquant", calib=calib, groups=groups)
    assert calib.calls == 0


def test_calibration_data_of_the_wrong_kind():
    with pytest.raises(ValueError, match="calib holds no calibration input"):
        sq.quantize(_mlp(), "rtn", calib=[])
    with pytest.raises(TypeError, match="calib item 1 is a str; each item must be a tensor, a tuple"):
        sq.quantize(_mlp(), "rtn", calib=[X, "x"])
    with pytest.raises(ValueError, match="calib has dtype torch.int64 but the model's layers are torch.float32"):
        sq.quantize(_mlp(), "rtn", calib=torch.ones(8, 64, dtype=torch.long))
    with pytest.raises(ValueError, match="calib has dtype torch.float64 but the model's layers are torch.float32"):
        sq.quantize(_mlp(), "rtn", calib=X.double())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_calibration_inputs_are_refused_not_turned_into_a_nan_model(bad):
    x = X.clone()
    x[3, 5] = bad
    with pytest.raises(ValueError, match=r"non-finite \(NaN or Inf\) inputs to layers \['0', '2'\]"):
        sq.quantize(_mlp(), "svdquant", rank=4, calib=x, num_grids=2, num_iters=1)
