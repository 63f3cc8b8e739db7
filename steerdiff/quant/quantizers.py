"""Low-bit quantizers of SVDQuant (Li et al., ICLR 2025) and its baselines, with the rules of the official
deepcompressor configs (docs/methods/svdquant.md, "Quantizers").

Every quantizer works along the **last** dimension (the reduction / input-channel axis), in groups of ``g``
contiguous entries; callers pad that dimension to a multiple of ``g`` (zero padding, never a ragged last group).
Each comes as

* ``quantize_*(v) -> (codes, scales...)``: the integer (or E2M1) codes that are stored, and their scales;
* ``dequantize_*(codes, scales...) -> v_hat``;
* ``fq_*(v)``: fake quantization (quantize, then dequantize), the simulation path on CPU.

Formats:

* INT4 symmetric: ``s = fp16(max|v| / 7)`` (0 -> 1), ``q = clamp(round(v / s), -7, 7)``.
* UINT4 (shifted, non-negative inputs): ``s = fp16(max(v) / 15)``, ``q = clamp(round(v / s), 0, 15)``.
* NVFP4: E2M1 codes (magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; round to nearest, ties to even), g = 16, E4M3
  group scales (clamped to <= 448 before the cast, never 0). Weights: two levels with a float32 tensor scale
  ``s_t = max|R| / (6 * 448)``; activations: one level. We divide by the *rounded* scale (deepcompressor's
  choice; nunchaku divides by the unrounded one, with a tiny effect on metrics).
* INT8: symmetric ``max|v| / 127`` per row (weights per output channel, activations per token).
* INT4 asymmetric g64 (the W4A16 baseline): ``s = (max - min) / 15``, ``z = round(-min / s)``,
  ``q = clamp(round(v / s) + z, 0, 15)``, ``v_hat = (q - z) s`` (torch's CPU int4 kernel's rule).

Rounding is ``torch.round`` (half to even) throughout.
"""

from __future__ import annotations

import torch
from torch import Tensor

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Magnitudes of the FP4 E2M1 format; the 3-bit magnitude code is the index here, bit 3 is the sign."""
E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9
FORMATS = ("int4", "nvfp4")
GROUP = {"int4": 64, "nvfp4": 16, "int8": None}


def _groups(v: Tensor, g: int) -> Tensor:
    if v.shape[-1] % g:
        raise ValueError(f"last dimension {v.shape[-1]} is not a multiple of the group size {g}; pad it first")
    return v.reshape(*v.shape[:-1], v.shape[-1] // g, g)


def pad_last(v: Tensor, g: int) -> tuple[Tensor, int]:
    """Zero-pad the last dimension to a multiple of ``g``; returns the padded tensor and the pad width."""
    pad = (-v.shape[-1]) % g
    if pad:
        v = torch.nn.functional.pad(v, (0, pad))
    return v, pad


def _fp16_scale(amax: Tensor, qmax: float) -> Tensor:
    s = (amax / qmax).clamp(max=65504.0).to(torch.float16)
    return torch.where(s == 0, torch.ones_like(s), s)


# ---------------------------------------------------------------------------------------------- INT4 / UINT4


def int_codes(v: Tensor, g: int = 64, signed: bool = True, bits: int = 4) -> tuple[Tensor, Tensor]:
    """The codes of :func:`quantize_int` as float32, grouped ``[..., K / g, g]``, and the scales: what the
    simulation paths multiply back, without the int8 round trip (same values; one pass fewer each way)."""
    qmax = 2 ** (bits - 1) - 1 if signed else 2**bits - 1
    G = _groups(v.float(), g)
    amax = G.abs().amax(-1) if signed else G.clamp(min=0).amax(-1)
    s = _fp16_scale(amax, qmax)
    lo = -qmax if signed else 0
    q = G / s.float()[..., None]
    q.round_().clamp_(lo, qmax)  # in place on the fresh quotient: torch.clamp(torch.round(.)) without two buffers
    return q, s


def quantize_int(v: Tensor, g: int = 64, signed: bool = True, bits: int = 4) -> tuple[Tensor, Tensor]:
    """Symmetric (``signed``) or unsigned integer quantization per group of ``g`` along the last dim.

    Returns:
        ``codes`` (int8, same shape as ``v``) and ``scales`` (float16, ``[..., K / g]``).
    """
    q, s = int_codes(v, g, signed, bits)
    return q.to(torch.int8).reshape(v.shape), s


def dequantize_int(codes: Tensor, scales: Tensor, g: int) -> Tensor:
    """``q * s`` per group, in float32."""
    G = _groups(codes.float(), g)
    return (G * scales.float()[..., None]).reshape(codes.shape)


def fq_int(v: Tensor, g: int = 64, signed: bool = True, bits: int = 4) -> Tensor:
    """Fake INT quantization (quantize + dequantize) per group along the last dim."""
    q, s = int_codes(v, g, signed, bits)
    return (q * s.float()[..., None]).reshape(v.shape).to(v.dtype)


def quantize_int8_rows(v: Tensor) -> tuple[Tensor, Tensor]:
    """INT8 symmetric per row (last dim): ``s = max|v| / 127`` (float32; 0 -> 1), ``q`` int8 (W8A8)."""
    s = v.float().abs().amax(-1) / 127.0
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.clamp(torch.round(v.float() / s[..., None]), -127, 127).to(torch.int8)
    return q, s


def fq_int8_rows(v: Tensor) -> Tensor:
    q, s = quantize_int8_rows(v)
    return (q.float() * s[..., None]).to(v.dtype)


def quantize_int4_asym(v: Tensor, g: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric UINT4 per group (W4A16 RTN). Returns ``codes`` (uint8 0..15), ``scales``, ``zeros`` (fp32)."""
    G = _groups(v.float(), g)
    lo, hi = G.amin(-1), G.amax(-1)
    s = (hi - lo) / 15.0
    s = torch.where(s == 0, torch.ones_like(s), s)
    z = torch.round(-lo / s)
    q = torch.clamp(torch.round(G / s[..., None]) + z[..., None], 0, 15)
    return q.to(torch.uint8).reshape(v.shape), s, z


def dequantize_int4_asym(codes: Tensor, scales: Tensor, zeros: Tensor, g: int = 64) -> Tensor:
    G = _groups(codes.float(), g)
    return ((G - zeros[..., None]) * scales[..., None]).reshape(codes.shape)


# ---------------------------------------------------------------------------------------------- NVFP4


def e4m3(v: Tensor) -> Tensor:
    """Round positive scales to FP8 E4M3, clamped to [2^-9, 448] *before* the cast (PyTorch casts values above 448
    to NaN, and a scale that underflows to 0 would divide by zero)."""
    return v.float().clamp(min=E4M3_MIN_SUBNORMAL, max=E4M3_MAX).to(torch.float8_e4m3fn).float()


_E2M1 = torch.tensor(E2M1_VALUES)
_MIDS = (_E2M1[1:] + _E2M1[:-1]) / 2


def e2m1_codes(v: Tensor) -> Tensor:
    """4-bit E2M1 codes (bit 3 = sign, bits 0-2 = magnitude index) of ``v``, nearest value, ties to even code."""
    a = v.float().abs().clamp(max=6.0).contiguous()
    mids = _MIDS.to(a.device)
    lo = torch.bucketize(a, mids, right=False)  # a tie goes to the lower neighbour
    hi = torch.bucketize(a, mids, right=True)  # a tie goes to the upper neighbour
    idx = torch.where(lo == hi, lo, torch.where(lo % 2 == 0, lo, hi))  # ties: the even code (IEEE ties-to-even)
    sign = (v < 0) & (idx > 0)
    return (idx + 8 * sign).to(torch.uint8)


def e2m1_values(codes: Tensor) -> Tensor:
    mag = _E2M1.to(codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) > 0, -mag, mag)


def quantize_nvfp4_weight(w: Tensor, g: int = 16) -> tuple[Tensor, Tensor, Tensor]:
    """NVFP4 weights, two-level scales: ``codes`` uint8 (4-bit), ``s_g`` E4M3 (as float8), ``s_t`` fp32."""
    G = _groups(w.float(), g)
    amax = w.float().abs().amax()
    s_t = (amax / (6 * E4M3_MAX)).reshape(())
    s_t = torch.where(s_t == 0, torch.ones_like(s_t), s_t)
    s_g = e4m3(G.abs().amax(-1) / 6 / s_t)
    codes = e2m1_codes(G / (s_g * s_t)[..., None]).reshape(w.shape)
    return codes, s_g.to(torch.float8_e4m3fn), s_t


def dequantize_nvfp4(codes: Tensor, s_g: Tensor, s_t: Tensor | float, g: int = 16) -> Tensor:
    G = _groups(e2m1_values(codes), g)
    return (G * (s_g.float() * s_t)[..., None]).reshape(codes.shape)


def fq_nvfp4_act(v: Tensor, g: int = 16) -> Tensor:
    """NVFP4 activations, one level: ``s_g = e4m3(min(max|v_g| / 6, 448))``, ``q = E2M1(v_g / s_g)``."""
    G = _groups(v.float(), g)
    s_g = e4m3(G.abs().amax(-1) / 6)
    return (e2m1_values(e2m1_codes(G / s_g[..., None])) * s_g[..., None]).reshape(v.shape).to(v.dtype)


# ---------------------------------------------------------------------------------------------- packing


def pack_nibbles(codes: Tensor) -> Tensor:
    """Pack 4-bit codes two per byte along the last dim; low nibble = even index (the stored layout).

    Signed INT4 codes are stored as two's-complement nibbles. The last dim must be even.
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"cannot pack an odd number ({codes.shape[-1]}) of 4-bit codes per row")
    c = (codes.to(torch.int16) & 0xF).to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: Tensor, signed: bool) -> Tensor:
    """Inverse of :func:`pack_nibbles`: int8 codes (sign-extended if ``signed``) or uint8 codes."""
    lo, hi = packed & 0xF, packed >> 4
    out = torch.stack([lo, hi], -1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])
    if signed:
        out = out.to(torch.int16)
        return torch.where(out >= 8, out - 16, out).to(torch.int8)
    return out


# ---------------------------------------------------------------------------------------------- activations


def fake_quant_act(v: Tensor, fmt: str, unsigned: bool = False) -> Tensor:
    """Dynamic activation fake-quantization along the last dim (per token, per group), zero-padding a
    ragged last group and dropping the pad afterwards (zero entries change no scale).

    Args:
        v: ``[..., m]`` activations.
        fmt: ``"int4"`` (g 64; unsigned UINT4 if ``unsigned``), ``"nvfp4"`` (g 16), ``"int8"`` (per token),
            or ``"none"``.
    """
    if fmt == "none":
        return v
    if fmt == "int8":
        return fq_int8_rows(v)
    m = v.shape[-1]
    g = GROUP[fmt]
    vp, _ = pad_last(v, g)
    if fmt == "int4":
        out = fq_int(vp, g, signed=not unsigned)
    elif fmt == "nvfp4":
        out = fq_nvfp4_act(vp, g)
    else:
        raise ValueError(f"unknown activation format {fmt!r}; choose int4, nvfp4, int8 or none")
    return out[..., :m]
