"""The SVDQuant quantized layer and its run-time forward (Li et al., ICLR 2025: a 4-bit residual GEMM plus a
16-bit low-rank branch; docs/methods/svdquant.md, "Run-time forward" and "Convolutions").

:class:`SVDQLayer` replaces an ``nn.Linear`` or an ``nn.Conv2d`` and computes::

    x' = x + c                 (shifted layers only; b' = b - W c folded in float64 at build time)
    x^ = x' / lambda           (per input channel; lambda = 1 when there is no smoothing)
    y  = Q_x(x^) * Q_w(R)^T  +  (x^ * L_down^T) * L_up^T  +  b'

It covers every W4A4 variant: SVDQuant (lambda and L), naive RTN (neither), SmoothQuant (lambda only), the
SVD-only ablation (L only), in INT4 g64 or NVFP4 g16 ("Baselines" in the docs page).

**W4A4 is simulated on CPU.** No CPU kernel multiplies 4-bit activations by 4-bit weights ("CPU kernels"), so the
4-bit term is computed as a float32 product of the *dequantized* codes. That equals the integer form (int32
accumulation of ``q_x q_w`` per 64-wide K-group, times ``s_x s_w``) up to float32 summation order; a test checks
the two against each other. Storage is real: packed 4-bit codes and their scales are the layer's buffers.

Convolutions (a steerdiff extension: the official deepcompressor code restricts the low-rank branch to linears and
1x1 convs and skips ResNet 3x3 convs): a
KxK conv is a linear map of its KxK patches (im2col), with K laid out as ``[kh, kw, cin]`` (channels fastest) and
quantized in groups of ``g`` consecutive K entries, weights and activations alike; only K as a whole is padded to a
multiple of ``g`` (``k_layout = "flat"``, pad recorded in ``spec["pad"]``). When ``g`` divides ``cin`` every group
lies inside one kernel position, so activations are quantized per pixel per ``g`` channels and the conv runs
directly; otherwise the activations are quantized on the im2col patches. Checkpoints written before the flat layout
(no ``k_layout`` key) used ``"channel"``: ``cin`` padded to a multiple of ``g`` at every kernel position, which
doubles the storage of a 32-channel conv; they still load and run as written. Lambda scales input channels (shared
across kernel positions, so ``x / lambda`` stays a per-channel scaling of the feature map), ``L_down`` is a KxK
conv to ``r`` channels and ``L_up`` a 1x1 conv. Zero padding is applied *before* the shift so the folded bias
``b - W c`` is exact at the borders too.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import quantizers as Q

FACTOR_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
K_LAYOUTS = ("flat", "channel")


def padded_k(spec: dict) -> int:
    """Stored K (codes and scales per output channel) of a layer spec, padding included (module docstring)."""
    cin, g = spec["in_channels"], spec["group"]
    kk = math.prod(spec["kernel"])
    if spec.get("k_layout", "channel") == "flat":
        return kk * cin + (-kk * cin) % g
    return kk * (cin + (-cin) % g)


def layer_geometry(module: nn.Module) -> dict:
    """``{"kind", "in_channels", "out_channels", "kernel", "stride", "padding"}`` of a Linear or Conv2d."""
    if isinstance(module, nn.Linear):
        return {"kind": "linear", "in_channels": module.in_features, "out_channels": module.out_features,
                "kernel": [1, 1], "stride": [1, 1], "padding": [0, 0]}
    if isinstance(module, nn.Conv2d):
        if module.groups != 1 or tuple(module.dilation) != (1, 1) or module.padding_mode != "zeros":
            raise ValueError(f"only plain Conv2d (groups=1, dilation=1, zero padding) can be quantized, got {module}")
        if isinstance(module.padding, str):
            raise ValueError(f"Conv2d with padding={module.padding!r} is not supported; use explicit integers")
        return {"kind": "conv2d", "in_channels": module.in_channels, "out_channels": module.out_channels,
                "kernel": list(module.kernel_size), "stride": list(module.stride), "padding": list(module.padding)}
    raise TypeError(f"only nn.Linear and nn.Conv2d layers can be quantized, got {type(module).__name__}")


def weight_of(module: nn.Module) -> Tensor:
    """The float weight ``[n, cin]`` or ``[n, cin, kh, kw]`` (detached)."""
    return module.weight.detach()


def matrix(w: Tensor) -> Tensor:
    """``[n, cin(, kh, kw)] -> [n, cin*kh*kw]`` (PyTorch order; used for SVDs and LoRA products)."""
    return w.reshape(w.shape[0], -1)


class StoredFormat(nn.Module):
    """A quantized layer whose buffers keep their storage dtypes when the model is cast.

    ``model.to(torch.bfloat16)`` (or ``.half()``, ``.float()``) casts every floating-point buffer; for a quantized
    layer that would re-round its 16-bit scales and factors (fp16 -> bf16 drops three mantissa bits) and change the
    layer the calibration made. The storage dtypes are part of the quantized format, so a cast moves the buffers to
    the new device only; the layer computes in float32 and returns its input's dtype, so it serves a bf16 or fp16
    model as it is (nunchaku's and bitsandbytes' packed weights behave the same way).
    """

    def _apply(self, fn, recurse=True):
        before = dict(self._buffers)
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers.get(name)
            if old is not None and new is not None and new.dtype != old.dtype:
                self._buffers[name] = old.to(new.device)
        return self


class SVDQLayer(StoredFormat):
    """A W4A4 layer with optional smoothing, shift and low-rank branch; see the module docstring.

    Args:
        spec: JSON description: geometry (:func:`layer_geometry`) plus ``wfmt`` (``int4``, ``nvfp4``, or ``none``
            = float residual, for exactness checks), ``afmt`` (``int4``, ``nvfp4``, ``none``), ``group``, ``rank``,
            ``smooth`` (bool), ``shift`` (c; 0 = none), ``unsigned`` (UINT4 activations), ``factor_dtype``.
            Buffers are allocated empty from it; :meth:`set_weights` fills them.
    """

    def __init__(self, spec: dict):
        super().__init__()
        self.spec = dict(spec)
        s = self.spec
        n, cin = s["out_channels"], s["in_channels"]
        kh, kw = s["kernel"]
        self.kind, self.wfmt, self.afmt = s["kind"], s["wfmt"], s["afmt"]
        self.group = int(s["group"])
        self.rank = int(s["rank"])
        self.shift = float(s.get("shift", 0.0))
        self.unsigned = bool(s.get("unsigned", False))
        self.k_layout = s.get("k_layout", "channel")  # absent = written before the flat layout existed
        if self.k_layout not in K_LAYOUTS:
            raise ValueError(f"unknown k_layout {self.k_layout!r}; choose one of {K_LAYOUTS}")
        K = padded_k(s)
        # pad K to a multiple of the group (never a ragged last group) and record it: flat pads K, channel pads
        # cin per position
        s["pad"] = K - kh * kw * cin if self.k_layout == "flat" else (-cin) % self.group
        fdt = FACTOR_DTYPES[s.get("factor_dtype", "float16")]
        if self.wfmt == "int4":
            self.register_buffer("codes", torch.zeros(n, K // 2, dtype=torch.uint8))
            self.register_buffer("scales", torch.ones(n, K // self.group, dtype=torch.float16))
        elif self.wfmt == "nvfp4":
            self.register_buffer("codes", torch.zeros(n, K // 2, dtype=torch.uint8))
            self.register_buffer("scales", torch.ones(n, K // self.group, dtype=torch.float8_e4m3fn))
            self.register_buffer("tensor_scale", torch.ones((), dtype=torch.float32))
        elif self.wfmt == "none":
            self.register_buffer("residual", torch.zeros(n, K, dtype=torch.float32))
        else:
            raise ValueError(f"unknown weight format {self.wfmt!r}; choose int4, nvfp4 or none")
        if s.get("smooth", False):
            self.register_buffer("smooth_factor", torch.ones(cin, dtype=fdt))
        else:
            self.smooth_factor = None
        if self.rank:
            self.register_buffer("lora_down", torch.zeros(self.rank, cin * kh * kw, dtype=fdt))
            self.register_buffer("lora_up", torch.zeros(n, self.rank, dtype=fdt))
        if s.get("bias", True):
            self.register_buffer("bias", torch.zeros(n, dtype=torch.float32))
        else:
            self.bias = None
        self._cache: tuple | None = None

    # ------------------------------------------------------------------ weights

    def _to_k(self, w: Tensor) -> Tensor:
        """Original layout -> stored K layout ``[n, K_padded]`` (``[kh, kw, cin]`` order; see the module docstring)."""
        n = w.shape[0]
        w4 = w.reshape(n, self.spec["in_channels"], *self.spec["kernel"]).permute(0, 2, 3, 1)
        if self.k_layout == "channel":
            return F.pad(w4, (0, self.spec["pad"])).reshape(n, -1)
        flat = w4.reshape(n, -1)
        return F.pad(flat, (0, self.spec["pad"])) if self.spec["pad"] else flat

    def _k_matrix(self, wk: Tensor) -> Tensor:
        """Stored ``[n, K_padded]`` -> ``[n, kh*kw*cin]`` in ``[kh, kw, cin]`` order, pad dropped."""
        n, cin = wk.shape[0], self.spec["in_channels"]
        kk = math.prod(self.spec["kernel"])
        if self.k_layout == "channel":
            return wk.reshape(n, kk, -1)[..., :cin].reshape(n, kk * cin)
        return wk[:, : kk * cin]

    def _from_k(self, wk: Tensor) -> Tensor:
        n, cin = wk.shape[0], self.spec["in_channels"]
        kh, kw = self.spec["kernel"]
        w4 = self._k_matrix(wk).reshape(n, kh, kw, cin).permute(0, 3, 1, 2)
        return w4.reshape(n, cin) if self.kind == "linear" else w4.contiguous()

    def set_weights(self, residual: Tensor, smooth: Tensor | None, lora_down: Tensor | None,
                    lora_up: Tensor | None, bias: Tensor | None, pack: bool = True) -> None:
        """Quantize ``residual`` (original layout, float) and store every buffer (factors in the factor dtype).

        ``pack=False`` (INT4 only) leaves ``codes`` unwritten: the layer computes exactly as a packed one (its
        forward reads the cached ``Q_w(R)``) but its state cannot be saved; for the calibration's scoring-only
        candidates, which are discarded after their error is read."""
        rk = self._to_k(residual.float())
        with torch.no_grad():
            if self.wfmt == "int4":
                qg, sc = Q.int_codes(rk, self.group, signed=True)
                if pack:
                    self.codes.copy_(Q.pack_nibbles(qg.to(torch.int8).reshape(rk.shape)))
                self.scales.copy_(sc)
                wk = (qg * self.scales.float()[..., None]).reshape(rk.shape)  # dequantize_int of the same codes
            elif self.wfmt == "nvfp4":
                q, sg, st = Q.quantize_nvfp4_weight(rk, self.group)
                self.codes.copy_(Q.pack_nibbles(q))
                self.scales.copy_(sg)
                self.tensor_scale.copy_(st)
                wk = None
            else:
                self.residual.copy_(rk)
                wk = None
            if self.smooth_factor is not None:
                self.smooth_factor.copy_(smooth)
            if self.rank:
                self.lora_down.copy_(matrix(lora_down))
                self.lora_up.copy_(lora_up)
            if self.bias is not None:
                self.bias.copy_(bias)
        self._cache = None
        if wk is not None:
            # Q_w(R) from the codes before packing: equal to unpacking them (integer codes), without the unpack,
            # which every candidate of the smoothing search would otherwise pay once more
            self._cache = (self._cache_key(), self._from_k(wk))

    def _cache_key(self) -> tuple:
        bufs = [self.residual] if self.wfmt == "none" else [self.codes, self.scales]
        return tuple((b.data_ptr(), b._version, b.device) for b in bufs)

    def dequantized_residual(self) -> Tensor:
        """``Q_w(R)`` in float32, original layout (cached; the cache follows in-place edits of the buffers)."""
        key = self._cache_key()
        if self._cache is None or self._cache[0] != key:
            if self.wfmt == "int4":
                wk = Q.dequantize_int(Q.unpack_nibbles(self.codes, signed=True), self.scales, self.group)
            elif self.wfmt == "nvfp4":
                wk = Q.dequantize_nvfp4(Q.unpack_nibbles(self.codes, signed=False), self.scales,
                                        self.tensor_scale.float(), self.group)
            else:
                wk = self.residual.float()
            self._cache = (key, self._from_k(wk))
        return self._cache[1]

    def _load_from_state_dict(self, *args, **kwargs):
        self._cache = None
        return super()._load_from_state_dict(*args, **kwargs)

    # ------------------------------------------------------------------ forward

    def _channels_last_quant(self, x: Tensor) -> Tensor:
        if self.afmt == "none":
            return x
        if self.kind == "linear":
            return Q.fake_quant_act(x, self.afmt, self.unsigned)
        return Q.fake_quant_act(x.permute(0, 2, 3, 1), self.afmt, self.unsigned).permute(0, 3, 1, 2)

    def smoothed_input(self, x: Tensor) -> Tensor:
        """``x^ = (pad(x) + c) / lambda`` in float32 (what both branches read)."""
        x = x.float()
        if self.kind == "conv2d":
            ph, pw = self.spec["padding"]
            if ph or pw:
                x = F.pad(x, (pw, pw, ph, ph))  # zero padding first, then the shift (exact bias fold)
        if self.shift:
            x = x + self.shift
        if self.smooth_factor is not None:
            lam = self.smooth_factor.float()
            x = x / (lam if self.kind == "linear" else lam[:, None, None])
        return x

    def _op(self, x: Tensor, w: Tensor) -> Tensor:
        if self.kind == "linear":
            return F.linear(x, w)
        return F.conv2d(x, w, stride=self.spec["stride"])

    def _patch_groups(self) -> bool:
        """Whether activation groups span kernel positions (flat layout, ``g`` not dividing ``cin``)."""
        return (self.kind == "conv2d" and self.afmt != "none" and self.k_layout == "flat"
                and self.spec["in_channels"] % self.group != 0 and math.prod(self.spec["kernel"]) > 1)

    def _patch_quant_conv(self, xh: Tensor) -> Tensor:
        """Conv as im2col GEMM with activations fake-quantized per patch in groups of ``g`` along ``[kh, kw, cin]``."""
        b, cin, hp, wp = xh.shape
        (kh, kw), (sh, sw) = self.spec["kernel"], self.spec["stride"]
        cols = F.unfold(xh, (kh, kw), stride=(sh, sw))  # [B, cin*kh*kw, L], K in (cin, kh, kw) order
        cols = cols.reshape(b, cin, kh * kw, -1).permute(0, 3, 2, 1).reshape(b, -1, kh * kw * cin)
        cols = Q.fake_quant_act(cols, self.afmt, self.unsigned)
        w = self.dequantized_residual().permute(0, 2, 3, 1).reshape(self.spec["out_channels"], -1)
        ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
        return (cols @ w.t()).transpose(1, 2).reshape(b, -1, ho, wo)

    def forward(self, x: Tensor) -> Tensor:
        xh = self.smoothed_input(x)
        if self._patch_groups():
            y = self._patch_quant_conv(xh)
        else:
            y = self._op(self._channels_last_quant(xh), self.dequantized_residual())
        if self.rank:
            y = y + self.lowrank(xh)
        if self.bias is not None:
            y = y + (self.bias if self.kind == "linear" else self.bias[:, None, None])
        return y.to(x.dtype)

    def lowrank(self, xh: Tensor) -> Tensor:
        """``(x^ L_down^T) L_up^T`` from the unquantized smoothed input (float32 compute of 16-bit factors)."""
        n, cin = self.spec["out_channels"], self.spec["in_channels"]
        r = self.lora_down.shape[0]
        if self.kind == "linear":
            return F.linear(F.linear(xh, self.lora_down.float()), self.lora_up.float())
        down = self.lora_down.float().reshape(r, cin, *self.spec["kernel"])
        h = F.conv2d(xh, down, stride=self.spec["stride"])
        return F.conv2d(h, self.lora_up.float().reshape(n, r, 1, 1))

    def extra_repr(self) -> str:
        s = self.spec
        return (f"{s['kind']} {s['in_channels']}->{s['out_channels']} k={s['kernel']}, W={self.wfmt} A={self.afmt}"
                f"{' (uint)' if self.unsigned else ''}, g={self.group}, rank={self.rank}, smooth={s.get('smooth')}, "
                f"shift={self.shift}")


def build_svdq_layer(module: nn.Module, *, wfmt: str, afmt: str, rank: int, smooth: Tensor | None,
                     lora_down: Tensor | None, lora_up: Tensor | None, shift: float = 0.0, unsigned: bool = False,
                     factor_dtype: str = "float16", residual: Tensor | None = None,
                     work_dtype: torch.dtype = torch.float64, bias: Tensor | None = None,
                     pack: bool = True) -> SVDQLayer:
    """Build an :class:`SVDQLayer` from a float ``module`` and already-rounded factors.

    ``residual`` defaults to ``W diag(lambda) - L_up L_down`` (computed here in ``work_dtype``, float64 unless the
    fast calibration asks for float32, from the *stored* factor values, so their 16-bit rounding is absorbed into
    the quantized residual), on the module's device. The bias fold ``b - W c`` is computed in float64 (as
    deepcompressor's ``ShiftedLinear``); ``bias`` passes it precomputed (:func:`folded_bias`: it does not depend on
    the candidate, so a calibration search computes it once). ``pack=False``: a scoring-only layer
    (:meth:`SVDQLayer.set_weights`).
    """
    geo = layer_geometry(module)
    group = Q.GROUP[wfmt] if wfmt != "none" else 64  # wfmt "none" (exactness checks): any group works
    spec = {**geo, "k_layout": "flat", "wfmt": wfmt, "afmt": afmt, "group": group, "rank": rank,
            "smooth": smooth is not None,
            "shift": float(shift), "unsigned": bool(unsigned), "factor_dtype": factor_dtype,
            "bias": module.bias is not None or bool(shift)}
    layer = SVDQLayer(spec).to(module.weight.device)
    if residual is None:
        w = weight_of(module).to(work_dtype)
        wh = w * (smooth.to(work_dtype) if geo["kind"] == "linear" else smooth.to(work_dtype)[:, None, None]) \
            if smooth is not None else w
        if rank:
            lr = (lora_up.to(work_dtype) @ lora_down.to(work_dtype).reshape(rank, -1)).reshape(w.shape)
            wh = wh - lr
        residual = wh
    b = folded_bias(module, shift) if bias is None else bias
    layer.set_weights(residual, smooth, lora_down, lora_up, b.float() if spec["bias"] else None, pack=pack)
    return layer


def folded_bias(module: nn.Module, shift: float) -> Tensor:
    """``b - W c`` in float64 (``c = shift`` on every input entry; a zero bias when the module has none)."""
    w = weight_of(module).double()
    b = module.bias.detach().double() if module.bias is not None else \
        torch.zeros(w.shape[0], dtype=torch.float64, device=w.device)
    if shift:
        b = b - matrix(w).sum(1) * shift  # W c with c = shift * ones (over every input entry of the patch)
    return b


def bits_per_weight(spec: dict) -> float:
    """Stored bits per original weight: codes + scales + low-rank + lambda (+ bias excluded); docs/methods/svdquant.md,
    "Storage and bits per weight"."""
    n, cin = spec["out_channels"], spec["in_channels"]
    kk = math.prod(spec["kernel"])
    m = cin * kk
    g, r = spec["group"], spec["rank"]
    mp = padded_k(spec)
    scale_bits = {"int4": 16, "nvfp4": 8}.get(spec["wfmt"], 0)
    fb = 8 * FACTOR_DTYPES[spec.get("factor_dtype", "float16")].itemsize
    bits = 4 * n * mp + scale_bits * n * mp / g + fb * r * (n + m) + (fb * cin if spec.get("smooth") else 0)
    return bits / (n * m)
