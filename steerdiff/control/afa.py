"""Attention feature aggregation (AFA) for transformer denoisers with condition tokens (RB-Modulation, Rout et al.,
ICLR 2025; docs/methods/rb_modulation.md "Attention feature aggregation").

Stable Cascade attends over ``kv = [X ; T ; P ; Y]`` (self tokens, 77 text tokens, 4 pooled-text tokens, 4 style
tokens). With ``Ybar`` the style tokens replaced by their mean and ``A(K) = MHA(Q = X, K = V = K)`` (one set of
weights), RB-Modulation's code (``utils.py::Attention2D``) uses::

    AFA = 1/3 [ A([X; T; P]) + A([X; T; P; Ybar]) + A([X; T; Ybar]) ]     # third term: the P slots overwritten by Ybar

On steerdiff's in-context DiT (:class:`steerdiff.models.dit.DiT`) the condition tokens live *inside* the sequence
``[noise, cond_1..cond_m, img_1..img_N]`` and every token queries every token, so the whole sequence plays
``[X; T; P]`` and the three terms are self-attentions over: the sequence (text only), the sequence with ``Ybar``
appended (joint), and the sequence without the pooled slots ``P`` with ``Ybar`` appended (style; in Stable Cascade
``P`` and ``Ybar`` have 4 slots each, so "overwritten" and "removed, then appended" are the same keys, attention
being blind to key order). Which tokens are ``P`` is the caller's choice [ours]: ``pooled=None`` (the default, the
code's reading: the condition-slot tokens are the text ``T``, kept in every term, and the style term equals the
joint one) or a slice of condition slots (``slice(1, 1 + m)``: the paper's "style-only" reading, which drops the class
from the style term). Queries are the full sequence (the DiT's residual stream), so the block's shape is unchanged.
All three terms use the block's own ``qkv``; keys and values pass the block's ``norm1`` (a per-token LayerNorm, so
``LN([X; Y]) = [LN X; LN Y]``).

Only the mean of the style tokens enters (as in the code), so AFA is invariant to their order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.dit import Block, DiT


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
    """The three attentions of the official code's AFA on normed tokens: text only ``A([X;T;P])``, joint
    ``A([X;T;P;Ybar])`` and style ``A([X;T;Ybar])`` (the ``pooled`` slots removed; None: no pooled slots)."""
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
    terms = afa_terms(block, block.norm1(h), block.norm1(style.to(h.dtype)), pooled)
    h = h + block.proj((terms[0] + terms[1] + terms[2]) / 3)
    return h + block.mlp(block.norm2(h))


class AFADiT(nn.Module):
    """An in-context :class:`~steerdiff.models.dit.DiT` run with AFA in every block (the same weights).

    ``forward(x, c_noise, cond=None, style=None)``: the DiT's raw network with style tokens ``[B, k, width]``; with
    ``style=None`` it computes exactly what the DiT computes. ``pooled_cond=True`` treats the condition-slot tokens
    as the pooled slots ``P`` (removed from the style term); False (default) as text tokens kept in every term.
    """

    def __init__(self, dit: DiT, pooled_cond: bool = False):
        super().__init__()
        if not isinstance(dit, DiT):
            raise TypeError(f"AFADiT wraps a steerdiff.models.dit.DiT, got {type(dit).__name__}")
        self.dit = dit
        self.pooled_cond = bool(pooled_cond)

    def forward(self, x: Tensor, c_noise: Tensor, cond: Tensor | None = None, style: Tensor | None = None) -> Tensor:
        net = self.dit
        h = net.embed_tokens(x, c_noise, cond)
        n_ctx = 1 + len(net.num_classes)
        for block in net.blocks:
            h = afa_block(block, h, style, slice(1, n_ctx) if self.pooled_cond else None)
        return net.decode_tokens(h)
