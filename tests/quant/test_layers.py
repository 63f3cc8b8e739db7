"""T1 exactness, the integer form of the run-time forward, the real CPU kernels (as timed in T6), padding and ranks
(docs/methods/svdquant.md, "Run-time forward", "CPU kernels", "Validation")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steerdiff.quant import SVDQLayer, W4A16Layer, W8A8Layer, build_svdq_layer, kernel_support
from steerdiff.quant import quantizers as Q
from steerdiff.quant.calibrate import svd_r


def _linear(m, n, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(m, n)


def _conv(cin, cout, k=3, seed=0, stride=1):
    torch.manual_seed(seed)
    return nn.Conv2d(cin, cout, k, padding=k // 2, stride=stride)


def _factors(module, lam, r):
    w = module.weight.detach().double()
    wh = w * (lam.double() if w.ndim == 2 else lam.double()[:, None, None])
    return svd_r(wh.reshape(w.shape[0], -1), r)


@pytest.mark.parametrize("kind", ["linear", "conv"])
@pytest.mark.parametrize("rank,shift", [(0, 0.0), (5, 0.0), (8, 0.2734375)])
def test_t1_identity_quantizers_exact(kind, rank, shift):
    """T1: Q_w = Q_x = identity: the layer equals the fp layer (rel 1e-5) for any lambda, r, shift."""
    module = _linear(100, 48) if kind == "linear" else _conv(20, 16)
    cin = 100 if kind == "linear" else 20
    g = torch.Generator().manual_seed(3)
    lam = torch.exp(torch.randn(cin, generator=g))  # any positive lambda
    ld, lu = _factors(module, lam, rank) if rank else (None, None)
    layer = build_svdq_layer(module, wfmt="none", afmt="none", rank=rank, smooth=lam, lora_down=ld, lora_up=lu,
                             shift=shift, factor_dtype="float32")
    x = torch.randn(7, 100, generator=g) if kind == "linear" else torch.randn(3, 20, 6, 6, generator=g)
    with torch.no_grad():
        y, ref = layer(x), module(x)
    assert ((y - ref).norm() / ref.norm()).item() < 1e-5
    # padding to the group is recorded: 100 -> 128 for the linear; the conv's K = 3*3*20 = 180 -> 192
    assert layer.spec["pad"] == (28 if kind == "linear" else 12)


def test_channel_layout_checkpoints_still_exact():
    """A layer spec without ``k_layout`` (written before the flat layout) pads cin per kernel position, as then."""
    conv = _conv(20, 16)
    flat = build_svdq_layer(conv, wfmt="int4", afmt="none", rank=0, smooth=None, lora_down=None, lora_up=None)
    spec = {k: v for k, v in flat.spec.items() if k not in ("k_layout", "pad")}
    old = SVDQLayer(spec)
    assert old.k_layout == "channel" and old.spec["pad"] == 44 and old.codes.shape == (16, 9 * 64 // 2)
    old.set_weights(conv.weight.detach(), None, None, None, conv.bias.detach())
    # groups = the 20 channels of one kernel position (zero-padded to 64), quantized independently here
    w = nn.functional.pad(conv.weight.detach().permute(0, 2, 3, 1), (0, 44)).reshape(16, 9 * 64)
    q, sc = Q.quantize_int(w, 64)
    ref = Q.dequantize_int(q, sc, 64).reshape(16, 3, 3, 64)[..., :20].permute(0, 3, 1, 2)
    assert torch.equal(old.dequantized_residual(), ref)
    x = torch.randn(2, 20, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(old(x), nn.functional.conv2d(x, ref, conv.bias, padding=1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown k_layout"):
        SVDQLayer({**spec, "k_layout": "rows"})


def test_conv_flat_groups_equal_integer_im2col_form():
    """cin = 32 with g = 64: each K-group spans two kernel positions; the forward equals the int32 accumulation
    over im2col patches (K in [kh, kw, cin] order) per group times s_x s_w, and stores half the codes of the
    per-position layout."""
    conv = _conv(32, 8, seed=5)
    layer = build_svdq_layer(conv, wfmt="int4", afmt="int4", rank=0, smooth=None, lora_down=None, lora_up=None)
    assert layer.spec["pad"] == 32 and layer.codes.shape == (8, 320 // 2)  # K = 288 -> 320 (not 9 x 64 = 576)
    x = torch.randn(2, 32, 5, 5)
    xp = nn.functional.pad(x, (1, 1, 1, 1))
    patches = torch.stack([xp[:, :, i:i + 3, j:j + 3].permute(0, 2, 3, 1).reshape(2, -1)
                           for i in range(5) for j in range(5)], 1)  # [B, 25, 288], [kh, kw, cin] order
    qx, sx = Q.quantize_int(nn.functional.pad(patches, (0, 32)), 64)
    qw = Q.unpack_nibbles(layer.codes, signed=True)
    sw = layer.scales.float()
    acc = torch.zeros(2, 25, 8, dtype=torch.float64)
    for k in range(5):
        ints = qx[..., 64 * k: 64 * (k + 1)].int() @ qw[:, 64 * k: 64 * (k + 1)].int().t()
        acc += ints.double() * sx[..., k, None].double() * sw[None, None, :, k].double()
    expected = (acc + conv.bias.detach().double()).transpose(1, 2).reshape(2, 8, 5, 5)
    with torch.no_grad():
        got = layer(x).double()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_forward_equals_integer_groupwise_form():
    """The simulated forward equals the integer form: int32 accumulation of q_x q_w per K-group times s_x s_w."""
    module = _linear(128, 32, seed=1)
    layer = build_svdq_layer(module, wfmt="int4", afmt="int4", rank=0, smooth=None, lora_down=None, lora_up=None)
    x = torch.randn(5, 128)
    qx, sx = Q.quantize_int(x, 64)
    qw = Q.unpack_nibbles(layer.codes, signed=True)
    sw = layer.scales.float()
    acc = torch.zeros(5, 32, dtype=torch.float64)
    for k in range(2):
        ints = qx[:, 64 * k: 64 * (k + 1)].int() @ qw[:, 64 * k: 64 * (k + 1)].int().t()  # int32
        acc += ints.double() * sx[:, k, None].double() * sw[None, :, k].double()
    expected = acc + module.bias.detach().double()
    with torch.no_grad():
        got = layer(x).double()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_shift_gives_unsigned_codes_and_exact_bias_fold_at_conv_borders():
    conv = _conv(64, 8, seed=2)
    layer = build_svdq_layer(conv, wfmt="none", afmt="none", rank=0, smooth=None, lora_down=None, lora_up=None,
                             shift=0.5, unsigned=True, factor_dtype="float32")
    x = torch.randn(2, 64, 5, 5)
    with torch.no_grad():
        assert torch.allclose(layer(x), conv(x), atol=1e-5)  # includes the zero-padded border pixels
    assert torch.allclose(layer.bias.double(),
                          conv.bias.double() - 0.5 * conv.weight.double().sum(dim=(1, 2, 3)), atol=1e-6)


def test_rank_larger_than_layer_allows_raises():
    from steerdiff.quant import quantize

    model = nn.Sequential(nn.Linear(64, 16))
    with pytest.raises(ValueError, match="rank=17 is larger than"):
        quantize(model, "svdquant", rank=17, calib=torch.randn(32, 64), num_grids=2)


@pytest.mark.parametrize("n", [8, 24])
def test_w4a16_layer_of_a_width_the_kernel_cannot_tile_runs_the_exact_product(n):
    """The CPU int4 kernel packs weights in tiles of 16 output channels; other widths used to fail at the first call."""
    module, x = _linear(96, n), torch.randn(5, 96)
    layer = W4A16Layer.from_float(module)
    assert not layer.use_kernel
    w = layer.dequantized()[:, :96]
    with torch.no_grad():
        assert torch.allclose(layer(x), nn.functional.linear(x, w, module.bias), atol=1e-5)


def test_w4a16_kernel_matches_dequantized_reference():
    assert kernel_support()["int4pack_mm_cpu"], "torch 2.13 CPU provides _weight_int4pack_mm_for_cpu"
    for module, x in [(_linear(192, 64), torch.randn(9, 192)), (_conv(32, 16), torch.randn(2, 32, 6, 6))]:
        layer = W4A16Layer.from_float(module)
        assert layer.use_kernel
        w = layer.dequantized()[:, : module.weight[0].numel()].reshape(module.weight.shape)
        ref = (nn.functional.linear(x, w, module.bias) if isinstance(module, nn.Linear)
               else nn.functional.conv2d(x, w, module.bias, padding=1))
        with torch.no_grad():
            y = layer(x)
        assert ((y - ref).norm() / ref.norm()).item() < 1e-2  # bf16 activations/scales in the kernel
        layer.use_kernel = False
        with torch.no_grad():
            assert torch.allclose(layer(x), ref, atol=1e-4)


def test_w8a8_int_mm_matches_exact_integer_product():
    module = _linear(96, 40, seed=4)
    layer = W8A8Layer.from_float(module)
    x = torch.randn(33, 96)
    qx, sx = Q.quantize_int8_rows(x)
    exact = (qx.long() @ layer.codes.long().t()).double() * sx[:, None].double() * layer.scales.double()
    with torch.no_grad():
        y = layer(x)
    assert torch.allclose(y.double(), exact + module.bias.double(), atol=1e-4)
    assert ((y - module(x)).norm() / module(x).norm()).item() < 0.02


def test_svdq_layer_rejects_unknown_format():
    with pytest.raises(ValueError, match="unknown weight format"):
        SVDQLayer({"kind": "linear", "in_channels": 4, "out_channels": 4, "kernel": [1, 1], "stride": [1, 1],
                   "padding": [0, 0], "wfmt": "int3", "afmt": "int4", "group": 64, "rank": 0})
