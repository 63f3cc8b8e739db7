"""LoRA merge without re-quantization (SVDQuant, Li et al., ICLR 2025: a LoRA joins the low-rank branch; the
in-smoothed convention of deepcompressor; docs/methods/svdquant.md, "LoRA merge").

A LoRA ``Delta W = alpha B A`` (``A [r', m]``, ``B [n, r']``) is concatenated onto the low-rank branch, whose
input is ``x^ = (x + c) / lambda``::

    L_down' = [A diag(lambda); L_down],   L_up' = [alpha B, L_up],   b' -= alpha B A c (shifted layers)

The 4-bit codes, their scales and lambda stay bit-identical. For convolutions ``A`` is ``[r', cin, kh, kw]``
(a KxK conv) and ``B`` a 1x1 conv ``[n, r']``. The branch is stored in the layer's factor dtype (fp16 by
default), so the merged update is exact up to that rounding (exact to float32 with ``factor_dtype="float32"``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .layers import SVDQLayer


def merge_lora(layer: SVDQLayer, A: Tensor, B: Tensor, alpha: float = 1.0) -> SVDQLayer:
    """Merge a LoRA into ``layer`` in place (rank r -> r + r'); returns the layer.

    Raises:
        TypeError: ``layer`` is not an :class:`SVDQLayer`.
        ValueError: ``A``/``B`` shapes do not fit the layer.
    """
    if not isinstance(layer, SVDQLayer):
        raise TypeError(f"layer must be an SVDQLayer (a W4A4 layer from quantize), got {type(layer).__name__}")
    s = layer.spec
    n, cin = s["out_channels"], s["in_channels"]
    kh, kw = s["kernel"]
    m = cin * kh * kw
    A = A.detach().double().reshape(A.shape[0], -1) if A.ndim in (2, 4) else A
    if A.ndim != 2 or A.shape[1] != m:
        raise ValueError(f"A must be [r', {cin}]" + (f" or [r', {cin}, {kh}, {kw}]" if kh * kw > 1 else "")
                         + f", got {tuple(A.shape)}")
    B = B.detach().double()
    if B.ndim != 2 or B.shape != (n, A.shape[0]):
        raise ValueError(f"B must be [{n}, {A.shape[0]}] (out_channels x LoRA rank), got {tuple(B.shape)}")
    fdt = layer.lora_down.dtype if layer.rank else {"float16": torch.float16, "bfloat16": torch.bfloat16,
                                                    "float32": torch.float32}[s.get("factor_dtype", "float16")]
    a_s = A
    if layer.smooth_factor is not None:
        lam = layer.smooth_factor.double()
        a_s = (A.reshape(-1, cin, kh * kw) * lam[None, :, None]).reshape(A.shape)
    new_down = a_s.to(fdt)
    new_up = (alpha * B).to(fdt)
    r_new = A.shape[0]
    with torch.no_grad():
        if layer.shift:
            if layer.bias is None:
                layer.register_buffer("bias", torch.zeros(n, dtype=torch.float32))
                s["bias"] = True
            # b' -= (alpha B A) c, c = shift * ones, from the stored (rounded) factors in float64; the stored
            # down-projection reads x^ = x' / lambda, so its action on x' is new_down diag(1 / lambda).
            down = new_down.double().reshape(r_new, cin, kh * kw)
            if layer.smooth_factor is not None:
                down = down / layer.smooth_factor.double()[None, :, None]
            delta = (new_up.double() @ down.reshape(r_new, -1)).sum(1) * layer.shift
            layer.bias.sub_(delta.float())
        if layer.rank:
            new_down = torch.cat([new_down, layer.lora_down], 0)
            new_up = torch.cat([new_up, layer.lora_up], 1)
    layer.register_buffer("lora_down", new_down.contiguous())
    layer.register_buffer("lora_up", new_up.contiguous())
    layer.rank = new_down.shape[0]
    s["rank"] = layer.rank
    s.setdefault("lora", []).append({"rank": int(A.shape[0]), "alpha": float(alpha)})
    return layer


def merge_loras(model, loras: dict[str, tuple[Tensor, Tensor]], alpha: float = 1.0):
    """Merge ``{layer path: (A, B)}`` into a quantized model (paths as in ``quant_info(model)["layers"]``)."""
    from .api import quant_info
    from .mapping import denoiser_root

    info = quant_info(model)
    root = denoiser_root(model)
    for path, (A, B) in loras.items():
        if path not in info["layers"]:
            raise ValueError(f"loras: {path!r} is not a quantized layer; quantized: {sorted(info['layers'])[:8]}")
        layer = merge_lora(root.get_submodule(path), A, B, alpha)
        info["layers"][path] = {"type": "SVDQLayer", **layer.spec}
    return model
