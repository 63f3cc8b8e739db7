"""Which layers SVDQuant (Li et al., ICLR 2025) quantizes, in which input-sharing groups, evaluated on which module
(docs/methods/svdquant.md, "Layer mapping"; the skip lists follow deepcompressor's model configs).

A :class:`Group` is a set of layers that read the same input (q/k/v: one lambda, one L_down), the shift ``c`` of
that input (UINT4 activations for post-GELU/SiLU inputs) and the evaluation function ``f`` of the output-error
objective of the smoothing search: the attention core ``softmax(QK^T/sqrt(d)) V`` for q/k/v, the layer output
otherwise.

Mappings (everything not listed stays floating point, in the model's dtype: embeddings, first and last layers,
norms, attention math):

* steerdiff ``DiT`` (a steerdiff mapping of the official transformer rules): per block ``qkv`` (one fused linear;
  eval = attention core), ``proj``,
  ``mlp.0`` (fc1), ``mlp.3`` (fc2, input after GELU-tanh: shift 0.171875).
* steerdiff ``UNet`` (a steerdiff mapping): each ResBlock's ``conv1`` and ``conv2`` (inputs after SiLU: shift
  0.2734375). The 1x1 shortcut, time projection (``emb``), ``conv_in``/``conv_out`` and down/up-sampling convs stay
  float, as in deepcompressor. The digits UNet has no attention and no 1x1 conv other than shortcuts, so under the
  official rules (low rank only on linears and 1x1 convs) nothing would be quantized; its 3x3 ResBlock convs carry
  the compute, so they are quantized with the conv extension of :mod:`steerdiff.quant.layers`
  (docs/methods/svdquant.md, "Errata and measured deviations").
* steerdiff ``MLP`` (a steerdiff mapping): the hidden ``body`` Linears (inputs after SiLU shifted, the first one,
  reading ``[x, noise embedding, condition embeddings]``, unshifted); the noise projection ``noise_proj`` (an
  embedding) and the output layer ``out`` stay float, as the first and last layers elsewhere (this also keeps a
  float parameter in every quantized MLP, from which the denoiser reads the network's dtype).
* diffusers ``UNet2DModel``: ``ResnetBlock2D.conv1``/``conv2`` (after SiLU: shifted) and self-attention
  ``to_q``/``to_k``/``to_v`` (one group, eval = attention core) and ``to_out.0``; ``conv_shortcut``,
  ``time_emb_proj``, embeddings, ``conv_in``/``conv_out``, down/up-samplers and cross-attention K/V stay float.
* any other ``nn.Module``: every ``nn.Linear`` on its own, unshifted, eval = its output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SHIFT = {"gelu": 0.171875, "silu": 0.2734375, "mish": 0.31640625}
"""Lower-bound shifts ``c = -l`` of the UINT4 activation inputs (deepcompressor:nn/struct/attn.py). SiLU's true
minimum is -0.27846, so a shifted SiLU output can be -0.005; the unsigned quantizer clamps it to 0
(docs/methods/svdquant.md, "Errata and measured deviations")."""


@dataclass
class Group:
    """Layers sharing one input (deepcompressor's ``exclusive: false``), their shift and their evaluation module."""

    name: str
    paths: list[str]
    shift: float = 0.0
    eval_fn: Callable[[list[Tensor]], Tensor] | None = None  # None: the single layer's output
    tokens: bool = True  # inputs may be subsampled row-wise (False: keep whole samples, e.g. attention)
    extra: dict = field(default_factory=dict)


def attention_core(heads: int, split: bool) -> Callable[[list[Tensor]], Tensor]:
    """``f([q, k, v])`` (or ``f([qkv])`` fused) -> ``softmax(q k^T / sqrt(d)) v``, heads merged: q/k/v are scored
    after the softmax, as deepcompressor does (scoring at the q/k outputs picks a different lambda)."""

    def f(outs: list[Tensor]) -> Tensor:
        if split:
            q, k, v = outs
        else:
            q, k, v = outs[0].chunk(3, dim=-1)
        b, n, w = q.shape

        def h(t: Tensor) -> Tensor:
            return t.reshape(b, -1, heads, w // heads).transpose(1, 2)

        return F.scaled_dot_product_attention(h(q), h(k), h(v)).transpose(1, 2).reshape(b, n, w)

    return f


def denoiser_root(model) -> nn.Module:
    """The ``nn.Module`` holding the network's layers: the model itself, or a diffusers adapter's UNet."""
    unet = getattr(getattr(model, "net", None), "unet", None)
    if isinstance(unet, nn.Module) and not isinstance(model, nn.Module):
        return unet
    if isinstance(model, nn.Module):
        return model
    raise TypeError(
        f"model must be an nn.Module or a from_diffusers denoiser (with .net.unet), got {type(model).__name__}"
    )


def _is(module: nn.Module, name: str) -> bool:
    return type(module).__name__ == name


def select_groups(root: nn.Module) -> list[Group]:
    """The quantization groups of ``root`` (see the module docstring for the mapping)."""
    from ..models.dit import Block
    from ..models.mlp import MLP
    from ..models.unet import ResBlock

    groups: list[Group] = []
    known = False
    for path, mod in root.named_modules():
        p = f"{path}." if path else ""
        if isinstance(mod, Block):
            known = True
            groups += [
                Group(f"{p}qkv", [f"{p}qkv"], eval_fn=attention_core(mod.heads, split=False), tokens=False),
                Group(f"{p}proj", [f"{p}proj"]),
                Group(f"{p}mlp.0", [f"{p}mlp.0"]),
                Group(f"{p}mlp.3", [f"{p}mlp.3"], shift=SHIFT["gelu"]),
            ]
        elif isinstance(mod, MLP):
            known = True
            for i, layer in enumerate(mod.body):
                if isinstance(layer, nn.Linear):
                    after_silu = i > 0 and isinstance(mod.body[i - 1], nn.SiLU)
                    groups.append(Group(f"{p}body.{i}", [f"{p}body.{i}"], shift=SHIFT["silu"] if after_silu else 0.0))
        elif isinstance(mod, ResBlock):
            known = True
            groups += [Group(f"{p}conv1", [f"{p}conv1"], shift=SHIFT["silu"]),
                       Group(f"{p}conv2", [f"{p}conv2"], shift=SHIFT["silu"])]
        elif _is(mod, "ResnetBlock2D"):
            known = True
            shift = SHIFT["silu"] if isinstance(mod.nonlinearity, nn.SiLU) else 0.0
            groups += [Group(f"{p}conv1", [f"{p}conv1"], shift=shift),
                       Group(f"{p}conv2", [f"{p}conv2"], shift=shift)]
        elif _is(mod, "Attention"):
            known = True
            if not getattr(mod, "is_cross_attention", False):
                groups.append(Group(f"{p}qkv", [f"{p}to_q", f"{p}to_k", f"{p}to_v"],
                                    eval_fn=attention_core(mod.heads, split=True), tokens=False))
            groups.append(Group(f"{p}to_out.0", [f"{p}to_out.0"]))
    if not known:
        groups = [Group(path, [path]) for path, mod in root.named_modules() if isinstance(mod, nn.Linear)]
    if not groups:
        raise ValueError(f"no quantizable layers (nn.Linear, or known blocks) in {type(root).__name__}")
    return groups


def set_module(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, new)


def input_shape_check(root: nn.Module, calib: Tensor) -> None:
    """Generic modules: the calibration tensor's last dim must match the first Linear's ``in_features``, and its
    dtype the Linear's (the fp model runs on it as given)."""
    first = next((m for m in root.modules() if isinstance(m, nn.Linear)), None)
    if first is None or not isinstance(calib, torch.Tensor):
        return
    if calib.ndim == 0 or calib.shape[-1] != first.in_features:
        raise ValueError(
            f"calib has shape {tuple(calib.shape)} but the model's first Linear expects [..., {first.in_features}]"
        )
    if calib.dtype != first.weight.dtype:
        raise ValueError(f"calib has dtype {calib.dtype} but the model's layers are {first.weight.dtype}: pass "
                         "calibration inputs in the model's dtype")
