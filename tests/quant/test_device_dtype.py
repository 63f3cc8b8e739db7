"""Quantized layers in a bf16 / fp16 model (issue 36): casting the model keeps the quantized format (the stored
scales and factors are not re-rounded), the layer returns its input's dtype, and a device move moves every buffer."""

import copy

import pytest
import torch
from torch import nn

from steerdiff.quant import W4A16Layer, W8A8Layer, build_svdq_layer


def _svdquant_w4a4(module: nn.Linear, rank: int = 8):
    """A W4A4 layer with a rank-8 low-rank branch (the top singular directions of W, stored in fp16)."""
    u, s, vh = torch.linalg.svd(module.weight.detach().double(), full_matrices=False)
    up, down = (u[:, :rank] * s[:rank]).half(), vh[:rank].half()
    return build_svdq_layer(module, wfmt="int4", afmt="int4", rank=rank, smooth=None, lora_down=down, lora_up=up)


def _layers():
    torch.manual_seed(0)
    lin = nn.Linear(128, 48)
    return {"svdquant_w4a4": _svdquant_w4a4(lin), "w8a8": W8A8Layer.from_float(lin),
            "w4a16": W4A16Layer.from_float(lin)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["svdquant_w4a4", "w8a8", "w4a16"])
def test_a_cast_model_keeps_the_quantized_format_and_computes_the_same_layer(name, dtype):
    """``layer.to(dtype)`` leaves every buffer's dtype as stored, and on a half-precision input the layer returns
    that dtype with exactly the float32 layer's output on the same (rounded) input, rounded once to ``dtype``: the
    layer computes in float32 from its input, so nothing but the final cast may differ."""
    layer = _layers()[name]
    stored = {n: b.dtype for n, b in layer.named_buffers()}
    cast = copy.deepcopy(layer).to(dtype)
    assert {n: b.dtype for n, b in cast.named_buffers()} == stored
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        y, ref = cast(x), layer(x.float())
    assert y.dtype == dtype
    assert torch.equal(y, ref.to(dtype))


def test_a_device_move_moves_every_buffer_and_keeps_its_dtype():
    layer = _layers()["svdquant_w4a4"]
    stored = {n: b.dtype for n, b in layer.named_buffers()}
    moved = copy.deepcopy(layer).to("meta", torch.bfloat16)
    assert all(b.device.type == "meta" for b in moved.buffers())
    assert {n: b.dtype for n, b in moved.named_buffers()} == stored
