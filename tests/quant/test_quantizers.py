"""Quantizers of SVDQuant and its baselines (docs/methods/svdquant.md, "Quantizers") against element-wise
references written independently (plain Python loops)."""

from __future__ import annotations

import math

import pytest
import torch

from steerdiff.quant import quantizers as Q


def _ref_int4_group(v: list[float]) -> tuple[list[int], float]:
    s = float(torch.tensor(max(abs(a) for a in v) / 7).half())
    s = 1.0 if s == 0 else s
    return [max(-7, min(7, round(a / s))) for a in v], s  # Python round: half to even, like torch.round


def test_int4_matches_loop_reference():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(3, 128, generator=g) * torch.tensor([1.0, 50.0, 1e-3])[:, None]
    v[2, 64:] = 0.0  # an all-zero group: scale 1 (not 0)
    codes, scales = Q.quantize_int(v, 64)
    for row in range(3):
        for k in range(2):
            q, s = _ref_int4_group(v[row, 64 * k: 64 * (k + 1)].tolist())
            assert codes[row, 64 * k: 64 * (k + 1)].tolist() == q
            assert scales[row, k].item() == s
    assert codes.abs().max() == 7 and scales.dtype == torch.float16
    assert scales[2, 1].item() == 1.0


def test_uint4_unsigned_range_and_max_code():
    v = torch.rand(4, 64) * 3
    codes, s = Q.quantize_int(v, 64, signed=False)
    assert codes.min() >= 0 and codes.max() == 15
    assert torch.allclose(Q.dequantize_int(codes, s, 64), v, atol=float(s.float().max()) / 2 + 1e-6)


def _ref_e2m1(a: float) -> float:
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    mag = min(abs(a), 6.0)
    d = [abs(mag - gv) for gv in grid]
    best = min(d)
    ties = [i for i, x in enumerate(d) if x == best]
    i = ties[0] if len(ties) == 1 else next(i for i in ties if i % 2 == 0)  # ties to the even code
    return math.copysign(grid[i], a) if grid[i] else 0.0


def test_e2m1_round_to_nearest_ties_to_even():
    vals = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0, -0.2, 0.26, 2.4, 5.1, 0.0])
    got = Q.e2m1_values(Q.e2m1_codes(vals))
    assert got.tolist() == [_ref_e2m1(a) for a in vals.tolist()]
    assert got[:7].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # the hardware's ties-to-even choices


def test_e4m3_scale_clamped_before_cast_never_nan_or_zero():
    s = Q.e4m3(torch.tensor([1e6, 449.0, 1e-12, 0.0, 3.3]))
    assert torch.isfinite(s).all() and (s > 0).all()
    assert s[0] == 448 and s[1] == 448 and s[2] == 2**-9
    assert s[4] == torch.tensor(3.3).to(torch.float8_e4m3fn).float()


def test_nvfp4_weight_two_level_and_activation_one_level():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 64, generator=g)
    codes, sg, st = Q.quantize_nvfp4_weight(w)
    assert st.item() == pytest.approx(w.abs().max().item() / (6 * 448), rel=1e-6)
    deq = Q.dequantize_nvfp4(codes, sg, st)
    # every dequantized value is an E2M1 value times its group's (s_g s_t)
    G = (deq.reshape(8, 4, 16) / (sg.float() * st)[..., None]).flatten()
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    assert (G.abs()[:, None] - grid).abs().amin(1).max() < 1e-5
    rel = (deq - w).norm() / w.norm()
    assert rel < 0.15
    a = Q.fq_nvfp4_act(w)
    assert (a - w).norm() / w.norm() < 0.15


def test_pack_nibbles_low_nibble_even_index_roundtrip():
    q = torch.tensor([[1, 2, -7, 7, 0, -1]], dtype=torch.int8)
    p = Q.pack_nibbles(q)
    assert p.dtype == torch.uint8 and p.shape == (1, 3)
    assert p[0, 0].item() == 0x21 and p[0, 1].item() == (0x9 | (0x7 << 4)) and p[0, 2].item() == 0xF0
    assert torch.equal(Q.unpack_nibbles(p, signed=True), q)
    u = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    assert torch.equal(Q.unpack_nibbles(Q.pack_nibbles(u), signed=False), u)


def test_int8_rows_and_asym_int4():
    g = torch.Generator().manual_seed(2)
    v = torch.randn(4, 128, generator=g)
    q, s = Q.quantize_int8_rows(v)
    assert q.abs().max() == 127 and torch.allclose(s, v.abs().amax(1) / 127)
    c, sc, z = Q.quantize_int4_asym(v, 64)
    assert c.min() >= 0 and c.max() <= 15
    deq = Q.dequantize_int4_asym(c, sc, z, 64)
    assert ((deq - v).abs().reshape(4, 2, 64) <= sc[..., None] * 0.5 + 1e-6).all()


def test_group_must_divide():
    with pytest.raises(ValueError, match="multiple of the group size"):
        Q.quantize_int(torch.randn(2, 100), 64)
    # activations pad the ragged group (and drop the pad): equal to quantizing the zero-padded tensor
    v = torch.randn(3, 100)
    padded = torch.nn.functional.pad(v, (0, 28))
    assert torch.equal(Q.fake_quant_act(v, "int4"), Q.fq_int(padded, 64)[:, :100])
