"""Attention of an in-context DiT block over extra style tokens: plain joint attention (the style tokens appended to the
keys and values) and attention feature aggregation, AFA (Rout et al., "RB-Modulation: Training-Free Stylization using
Reference-Based Modulation", ICLR 2025, its attention feature aggregation and the official code's
``utils.py::Attention2D``; docs/methods/rb_modulation.md, "Attention feature aggregation"). The method's explanation and
its wrapper :class:`~steerdiff.control.afa.AFADiT` are in :mod:`steerdiff.control.afa`; the functions live here so that
the network that uses them (:class:`~steerdiff.models.style_dit.StyleTokenDiT`) sits in ``steerdiff.models``.

AFA on the in-context DiT: with ``Ybar`` the style tokens replaced by their mean and ``A(K)`` the block's attention with
queries the sequence and keys/values ``K``, the block adds ``proj(1/3 [A(seq) + A([seq; Ybar]) + A([seq without the
pooled slots; Ybar])])``. All three terms use the block's own ``qkv``; keys and values pass the block's ``norm1`` (a
per-token LayerNorm, so ``LN([X; Y]) = [LN X; LN Y]``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .dit import Block, FusedSelfAttention


def _check_plain(block: Block) -> None:
    # these attentions use the block's weights directly: a swapped processor (PAG / SEG) would be silently ignored
    if not isinstance(block.attn.processor, FusedSelfAttention):
        raise ValueError(f"a DiT block with style tokens runs its own attention; its processor "
                         f"{type(block.attn.processor).__name__} (a perturbation guider's) does not apply there")


def block_attention(block: Block, queries: Tensor, keys: Tensor) -> Tensor:
    """``MHA(Q = queries, K = V = keys)`` with the block's ``qkv`` weights, heads merged, before ``proj``.

    ``queries`` ``[B, n, w]`` and ``keys`` ``[B, m, w]`` are already layer-normed tokens.
    """
    b, n, w = queries.shape
    m = keys.shape[1]
    heads, d = block.heads, w // block.heads
    weight, bias = block.qkv.weight, block.qkv.bias
    q = F.linear(queries, weight[:w], bias[:w]).reshape(b, n, heads, d).transpose(1, 2)
    k = F.linear(keys, weight[w:2 * w], bias[w:2 * w]).reshape(b, m, heads, d).transpose(1, 2)
    v = F.linear(keys, weight[2 * w:], bias[2 * w:]).reshape(b, m, heads, d).transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, w)


def afa_terms(block: Block, h_norm: Tensor, style_norm: Tensor, pooled: slice | None = None) -> list[Tensor]:
    """The three attentions of AFA on normed tokens: text only ``A([X;T;P])``, joint ``A([X;T;P;Ybar])`` and style
    ``A([X;T;Ybar])`` (the ``pooled`` slots removed; None: no pooled slots)."""
    ybar = style_norm.mean(dim=1, keepdim=True).expand(-1, style_norm.shape[1], -1)
    joint = torch.cat([h_norm, ybar], dim=1)
    if pooled is None or pooled.start == pooled.stop:
        style_keys = joint
    else:
        style_keys = torch.cat([h_norm[:, :pooled.start], h_norm[:, pooled.stop:], ybar], dim=1)
    return [block_attention(block, h_norm, h_norm), block_attention(block, h_norm, joint),
            block_attention(block, h_norm, style_keys)]


def afa_block(block: Block, h: Tensor, style: Tensor | None = None, pooled: slice | None = None) -> Tensor:
    """One DiT block with AFA: ``h + proj(mean of the three terms)``, then the block's MLP. ``style`` ``[B, k, w]``
    are the style tokens in the model's width, ``pooled`` the sequence positions of the pooled slots ``P`` (None:
    none); with ``style=None`` this is the block itself (plain attention)."""
    if style is None:
        return block(h)
    if style.ndim != 3 or style.shape[0] != h.shape[0] or style.shape[2] != h.shape[2]:
        raise ValueError(f"style tokens must have shape [B={h.shape[0]}, k, {h.shape[2]}], got {tuple(style.shape)}")
    _check_plain(block)
    terms = afa_terms(block, block.norm1(h), block.norm1(style.to(h.dtype)), pooled)
    h = h + block.proj((terms[0] + terms[1] + terms[2]) / 3)
    return h + block.mlp(block.norm2(h))


def joint_block(block: Block, h: Tensor, style: Tensor, has_style: Tensor) -> Tensor:
    """A DiT block whose attention keys/values are ``[sequence; style tokens]`` (style keys masked out in rows
    without a style)."""
    _check_plain(block)
    b, n, w = h.shape
    k = style.shape[1]
    tokens = block.norm1(torch.cat([h, style.to(h.dtype)], dim=1))
    heads, d = block.heads, w // block.heads
    qkv = block.qkv(tokens).reshape(b, n + k, 3, heads, d).permute(2, 0, 3, 1, 4)
    q, kk, v = qkv[0][:, :, :n], qkv[1], qkv[2]
    mask = torch.ones(b, 1, 1, n + k, dtype=torch.bool, device=h.device)
    mask[:, :, :, n:] = has_style.reshape(b, 1, 1, 1)
    attn = F.scaled_dot_product_attention(q, kk, v, attn_mask=mask)
    h = h + block.proj(attn.transpose(1, 2).reshape(b, n, w))
    return h + block.mlp(block.norm2(h))
