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

Only the mean of the style tokens enters (as in the code), so AFA is invariant to their order. The block functions
(:func:`afa_block`, :func:`afa_terms`, :func:`block_attention`) live in :mod:`steerdiff.models.style_attention`,
beside the network that uses them; they are re-exported here.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..models.dit import DiT
from ..models.style_attention import afa_block, afa_terms, block_attention

__all__ = ["AFADiT", "afa_block", "afa_terms", "block_attention"]


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
