"""Baselines of SVDQuant (Li et al., ICLR 2025) with real CPU low-bit kernels: W4A16 and W8A8
(docs/methods/svdquant.md, "Baselines" and "CPU kernels").

* :class:`W4A16Layer`: asymmetric UINT4 g64 weights, 16-bit (bfloat16) activations. Forward through
  ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (tinygemm rule ``(q - 8) s + z``; our ``(q - z0) s`` is
  stored as ``z = (8 - z0) s``) when available and the output width is a multiple of 16 (the kernel's tile),
  else a dequantized float matmul (``use_kernel=False``).
* :class:`W8A8Layer`: INT8 per-output-channel weights, INT8 per-token dynamic activations, through
  ``torch._int_mm`` (int8 x int8 -> int32) when available, else an exact int64 product.

Convolutions run as im2col (``F.unfold``) + the same matmul; the K order is PyTorch's ``(cin, kh, kw)``, padded
to a multiple of the group. Checked at run time: :func:`kernel_support` reports what this torch build has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import quantizers as Q
from .layers import StoredFormat, layer_geometry, matrix, weight_of
from .registry import QuantJob, register_quantizer


def kernel_support() -> dict[str, bool]:
    """Which real CPU low-bit ops this torch build provides (probed with ``hasattr``: they vary across versions)."""
    aten = torch.ops.aten
    return {
        "int4pack_mm_cpu": hasattr(aten, "_weight_int4pack_mm_for_cpu")
        and hasattr(aten, "_convert_weight_to_int4pack_for_cpu"),
        "int8pack_mm": hasattr(aten, "_weight_int8pack_mm"),
        "int_mm": hasattr(torch, "_int_mm"),
        "w4a4": False,  # no CPU W4A4 kernel exists in PyTorch, torchao or quanto: W4A4 is simulated
    }


class _Im2col(StoredFormat):
    """Shared plumbing: a matmul over ``[T, K]`` tokens, im2col for convolutions."""

    def __init__(self, spec: dict):
        super().__init__()
        self.spec = dict(spec)
        self.kind = spec["kind"]

    def _tokens(self, x: Tensor) -> tuple[Tensor, tuple]:
        if self.kind == "linear":
            return x.reshape(-1, x.shape[-1]), x.shape[:-1]
        b, _, h, w = x.shape
        ph, pw = self.spec["padding"]
        (kh, kw), (sh, sw) = self.spec["kernel"], self.spec["stride"]
        cols = F.unfold(x, (kh, kw), padding=(ph, pw), stride=(sh, sw))  # [B, cin*kh*kw, L]
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        return cols.transpose(1, 2).reshape(-1, cols.shape[1]), (b, ho, wo)

    def _untokens(self, y: Tensor, lead: tuple) -> Tensor:
        if self.kind == "linear":
            return y.reshape(*lead, y.shape[-1])
        b, ho, wo = lead
        return y.reshape(b, ho, wo, -1).permute(0, 3, 1, 2)

    def forward(self, x: Tensor) -> Tensor:
        t, lead = self._tokens(x.float())
        y = self.matmul(t)
        if self.bias is not None:
            y = y + self.bias
        return self._untokens(y, lead).to(x.dtype)


class W4A16Layer(_Im2col):
    """INT4 asymmetric g64 weight-only layer (the W4A16 RTN baseline) with the CPU tinygemm kernel where present."""

    def __init__(self, spec: dict):
        super().__init__(spec)
        n = spec["out_channels"]
        m = spec["in_channels"] * spec["kernel"][0] * spec["kernel"][1]
        g = self.group = int(spec["group"])
        self.pad = (-m) % g
        self.spec["pad"] = self.pad
        mp = m + self.pad
        self.register_buffer("codes", torch.zeros(n, mp // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.ones(n, mp // g, dtype=torch.float16))
        self.register_buffer("zeros", torch.zeros(n, mp // g, dtype=torch.uint8))
        if spec.get("bias", True):
            self.register_buffer("bias", torch.zeros(n, dtype=torch.float32))
        else:
            self.bias = None
        # The CPU int4 kernel packs the weight in tiles of 16 output channels; other widths take the exact
        # dequantized product.
        self.use_kernel = kernel_support()["int4pack_mm_cpu"] and n % 16 == 0
        self._packed: tuple | None = None

    @classmethod
    def from_float(cls, module: nn.Module) -> W4A16Layer:
        spec = {**layer_geometry(module), "group": 64, "bias": module.bias is not None}
        layer = cls(spec)
        w, _ = Q.pad_last(matrix(weight_of(module)).float(), layer.group)
        q, s, z = Q.quantize_int4_asym(w, layer.group)
        layer.codes.copy_(Q.pack_nibbles(q))
        layer.scales.copy_(s.to(torch.float16))
        layer.zeros.copy_(z.to(torch.uint8))
        if layer.bias is not None:
            layer.bias.copy_(module.bias.detach())
        return layer

    def dequantized(self) -> Tensor:
        """``(q - z) s`` as float32 ``[n, K_padded]`` (the reference the kernel is checked against)."""
        q = Q.unpack_nibbles(self.codes, signed=False)
        return Q.dequantize_int4_asym(q, self.scales.float(), self.zeros.float(), self.group)

    def _kernel_weight(self) -> tuple[Tensor, Tensor]:
        key = tuple((b.data_ptr(), b._version) for b in (self.codes, self.scales, self.zeros))
        if self._packed is None or self._packed[0] != key:
            q = Q.unpack_nibbles(self.codes, signed=False).to(torch.int32)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            s = self.scales.float()
            sz = torch.stack([s.t(), ((8 - self.zeros.float()) * s).t()], -1)
            self._packed = (key, packed, sz.to(torch.bfloat16).contiguous())
        return self._packed[1], self._packed[2]

    def matmul(self, t: Tensor) -> Tensor:
        t, _ = Q.pad_last(t, self.group)
        if self.use_kernel:
            packed, sz = self._kernel_weight()
            return torch.ops.aten._weight_int4pack_mm_for_cpu(t.to(torch.bfloat16), packed, self.group, sz).float()
        return t @ self.dequantized().t()


class W8A8Layer(_Im2col):
    """INT8 weights per output channel, INT8 dynamic per-token activations (W8A8), ``torch._int_mm`` on CPU."""

    def __init__(self, spec: dict):
        super().__init__(spec)
        n = spec["out_channels"]
        m = spec["in_channels"] * spec["kernel"][0] * spec["kernel"][1]
        self.register_buffer("codes", torch.zeros(n, m, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(n, dtype=torch.float32))
        if spec.get("bias", True):
            self.register_buffer("bias", torch.zeros(n, dtype=torch.float32))
        else:
            self.bias = None
        self.use_kernel = kernel_support()["int_mm"]

    @classmethod
    def from_float(cls, module: nn.Module) -> W8A8Layer:
        spec = {**layer_geometry(module), "bias": module.bias is not None}
        layer = cls(spec)
        q, s = Q.quantize_int8_rows(matrix(weight_of(module)))
        layer.codes.copy_(q)
        layer.scales.copy_(s)
        if layer.bias is not None:
            layer.bias.copy_(module.bias.detach())
        return layer

    def matmul(self, t: Tensor) -> Tensor:
        qx, sx = Q.quantize_int8_rows(t)
        if self.use_kernel:
            try:
                acc = torch._int_mm(qx, self.codes.t()).float()
            except RuntimeError:  # shape constraints of some builds; fall back to the exact product
                acc = (qx.long() @ self.codes.long().t()).float()
        else:
            acc = (qx.long() @ self.codes.long().t()).float()
        return acc * sx[:, None] * self.scales[None, :]


@register_quantizer("w4a16", calibrated=False)
def w4a16(job: QuantJob) -> None:
    """INT4 asymmetric g64 weight-only, bfloat16 activations, PyTorch's real CPU int4 kernel (no calibration)."""
    for path in job.paths():
        new = W4A16Layer.from_float(job.root.get_submodule(path))
        job.replace(path, new, {"type": "W4A16Layer", **new.spec})


@register_quantizer("w8a8", calibrated=False)
def w8a8(job: QuantJob) -> None:
    """INT8 per-channel weights, per-token dynamic INT8 activations, ``torch._int_mm`` (no calibration)."""
    for path in job.paths():
        new = W8A8Layer.from_float(job.root.get_submodule(path))
        job.replace(path, new, {"type": "W8A8Layer", **new.spec})
