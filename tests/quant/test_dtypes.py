"""``sd.quant.quantize`` keeps the model's dtype: every method calibrates float64, float16 and bfloat16 models in
their own dtype, and the quantized model takes and returns that dtype (docs/methods/svdquant.md, "Model dtypes").

The truth a quantization in another dtype is checked against is the same method in float32, on the same weights
and inputs: the method does not depend on the dtype beyond rounding, so its output error against the fp model of
that dtype may exceed the float32 one only by that rounding. In float64 the methods without a data-dependent
search (RTN, W4A16, W8A8) store exactly the same codes and scales as in float32, since float64 holds the float32
weights exactly.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import steerdiff.quant as sq
from steerdiff.models import EDMPrecond

from .conftest import denoiser_inputs, tiny_dit, tiny_unet

DTYPES = [torch.float64, torch.float16, torch.bfloat16]
MODELS = {"dit": tiny_dit, "unet": tiny_unet}
CALIB, TEST = denoiser_inputs(tiny_dit(), 32, 1), denoiser_inputs(tiny_dit(), 16, 2)
OPTIONS = {"rank": 4, "num_grids": 2, "num_iters": 2, "max_tokens": 256}


def _quantize(model: EDMPrecond, method: str, dtype: torch.dtype):
    x, sigma, cond = CALIB
    return sq.quantize(model, method, calib=[(x.to(dtype), sigma, cond)], **OPTIONS)


def _rel_error(q, model, dtype) -> tuple[float, torch.dtype]:
    x, sigma, cond = TEST
    with torch.no_grad():
        y, ref = q(x.to(dtype), sigma, cond), model(x.to(dtype), sigma, cond)
    return float((y.double() - ref.double()).pow(2).sum() / ref.double().pow(2).sum()), y.dtype


@functools.cache
def float32_error(kind: str, method: str) -> float:
    model = MODELS[kind]()
    return _rel_error(_quantize(model, method, torch.float32), model, torch.float32)[0]


def _check_dtype(kind: str, method: str, dtype: torch.dtype) -> None:
    model = MODELS[kind]().to(dtype)
    q = _quantize(model, method, dtype)
    err, out_dtype = _rel_error(q, model, dtype)
    assert out_dtype == dtype  # the quantized model returns the model's dtype
    kept = q.net.patch_in if kind == "dit" else q.net.conv_in  # a layer the mapping leaves in floating point
    assert kept.weight.dtype == dtype
    e32 = float32_error(kind, method)
    assert 0 < e32 < 0.1  # the float32 reference really quantizes, and stays close to the fp model
    # the same method in another dtype: as close to its own fp model, up to that dtype's rounding
    assert err <= 1.5 * e32 + torch.finfo(dtype).eps ** 2, (err, e32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", sq.METHODS)
def test_every_method_quantizes_a_transformer_in_its_own_dtype(method, dtype):
    _check_dtype("dit", method, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
def test_svdquant_quantizes_a_conv_unet_in_its_own_dtype(dtype):
    """The convolution path (the reported ``Input type (float) and bias type (double)``)."""
    _check_dtype("unet", "svdquant", dtype)


@pytest.mark.parametrize("method", ["rtn", "w4a16", "w8a8"])
def test_float64_quantization_stores_the_float32_codes(method):
    q32 = _quantize(tiny_dit(), method, torch.float32)
    q64 = _quantize(tiny_dit().double(), method, torch.float64)
    layers = sq.quant_info(q32)["layers"]
    assert layers.keys() == sq.quant_info(q64)["layers"].keys()
    for path in layers:
        a, b = q32.get_submodule(path).state_dict(), q64.get_submodule(path).state_dict()
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (path, k)


def test_default_trajectory_calibration_of_a_float64_model():
    model = tiny_unet().double()
    q = sq.quantize(model, "rtn", num_samples=8)
    err, out_dtype = _rel_error(q, model, torch.float64)
    assert out_dtype == torch.float64
    assert err <= 1.5 * float32_error("unet", "rtn")


@pytest.mark.filterwarnings("ignore:Complex modules")
def test_an_unsupported_dtype_is_refused_naming_it_and_the_method():
    model = nn.Sequential(nn.Linear(64, 32)).to(torch.complex64)
    calls = []
    with pytest.raises(ValueError, match=r"complex64; svdquant quantizes float32, float64, float16 and bfloat16"):
        sq.quantize(model, "svdquant", calib=lambda: calls.append(1) or [torch.zeros(4, 64, dtype=torch.complex64)])
    assert not calls  # refused before any calibration
