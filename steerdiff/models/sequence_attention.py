"""Banded relative-position attention over frame tokens, dense and block-local, for the sequence transformer
(:class:`steerdiff.models.sequence.SequenceTransformer`; the all-at-once generation of Cheng et al., "DAWN: Dynamic
frame Avatar With Non-autoregressive diffusion framework", 2025; docs/methods/sequence.md, "The model" and "Speed at
long sequences").

A token attends only to tokens within ``window`` of it, with a learned bias per head and relative offset (no absolute
position), so the same weights apply to any sequence length. Long sequences run the block-local form
(:func:`blocked_attention`, the same outputs without the full score matrix); optional global context tokens are seen by
every frame at any distance (:func:`global_context_bias`). The banded relative attention is our choice for length
extrapolation at CPU scale, not the paper's exact module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def relative_band(n: int, window: int, device=None) -> tuple[Tensor, Tensor]:
    """Offsets ``j - i`` clipped into ``[0, 2 window]`` (as bias-table indices) and the band mask ``|j - i| <= window``
    for ``n`` tokens, each ``[n, n]``."""
    pos = torch.arange(n, device=device)
    offset = pos[None, :] - pos[:, None]
    return (offset.clamp(-window, window) + window), offset.abs() <= window


def band_bias(n: int, window: int, rel_bias: Tensor) -> Tensor:
    """Additive attention bias ``[heads, n, n]`` of the banded relative attention: ``rel_bias [heads, 2 window + 1]``
    at offset ``j - i`` where ``|j - i| <= window``, ``-inf`` elsewhere."""
    index, band = relative_band(n, window, rel_bias.device)
    return rel_bias[:, index].masked_fill(~band, float("-inf"))


def dense_band_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, window: int) -> Tensor:
    """Attention of ``q, k, v [B, heads, n, d]`` restricted to ``|j - i| <= window``, plus ``rel_bias [heads, 2 window
    + 1]`` at offset ``j - i``, over the full ``n x n`` score matrix (masked): time and memory grow as ``n^2``."""
    bias = band_bias(q.shape[2], window, rel_bias).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])


#: Smallest block of the block-local attention: blocks of a few tokens make many tiny matrix products, slower on a
#: CPU than fewer larger ones that score a few more keys.
MIN_ATTENTION_BLOCK = 16


def attention_block(window: int) -> int:
    """The block length of the block-local attention for ``window``: ``max(window, MIN_ATTENTION_BLOCK)``."""
    return max(int(window), MIN_ATTENTION_BLOCK)


def local_band_bias(n: int, window: int, block: int, rel_bias: Tensor, n_ctx: int = 0,
                    ctx_bias: Tensor | None = None) -> Tensor:
    """Bias of :func:`blocked_attention` for ``n`` tokens in blocks of ``block``: ``[heads, n_blocks, block, L]``
    with ``L = block + 2 window``, query ``u`` of block ``i`` (token ``i block + u``) against key ``t`` of its window
    (token ``i block - window + t``); ``rel_bias`` at offset ``j - i`` inside the band, ``-inf`` outside it and at
    keys past either end. Query rows past ``n`` (padding, dropped from the output) see every key, so no row is
    all ``-inf``.

    With ``ctx_bias [heads]`` the first ``n_ctx`` tokens are global context (:func:`global_context_bias`): the
    bias gets ``n_ctx`` more keys in front, the context tokens, holding ``ctx_bias`` for a frame query farther
    than ``window`` from them (nearer ones are scored in the window already), and context queries see no frame."""
    w, dev = int(window), rel_bias.device
    blocks = -(-n // block)
    query = torch.arange(blocks, device=dev)[:, None] * block + torch.arange(block, device=dev)  # [blocks, block]
    key = torch.arange(blocks, device=dev)[:, None] * block - w + torch.arange(block + 2 * w, device=dev)
    offset = key[:, None, :] - query[:, :, None]  # [blocks, block, L]
    allowed = (offset.abs() <= w) & ((key >= 0) & (key < n))[:, None, :]
    if ctx_bias is not None:
        allowed &= ~((query < n_ctx)[:, :, None] & (key >= n_ctx)[:, None, :])
    padding = (query >= n)[:, :, None]
    bias = rel_bias[:, offset.clamp(-w, w) + w].masked_fill(~(allowed | padding), float("-inf"))
    if ctx_bias is None:
        return bias
    far = (torch.arange(n_ctx, device=dev) - query[:, :, None]).abs() > w  # [blocks, block, n_ctx]
    frame_query = ((query >= n_ctx) & (query < n))[:, :, None]
    ctx = ctx_bias[:, None, None, None].expand(-1, blocks, block, n_ctx).to(bias.dtype)
    return torch.cat([ctx.masked_fill(~(far & frame_query), float("-inf")), bias], dim=-1)


def blocked_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, window: int, block: int,
                      n_ctx: int = 0) -> Tensor:
    """Attention of ``q, k, v [B, heads, n, d]`` block-locally with the bias of :func:`local_band_bias` (same
    ``window``, ``block`` and ``n_ctx``): the queries are cut into blocks of ``block`` tokens and each block scores
    only the ``block + 2 window`` keys around it (windows of the keys, one strided view; and the ``n_ctx`` context
    keys in front when the bias has them). Time and memory grow as ``n (block + 2 window)`` instead of ``n^2``."""
    b, h, n, d = q.shape
    w = int(window)
    blocks = -(-n // block)
    pad = blocks * block - n
    span = block + 2 * w
    if tuple(bias.shape[-3:]) != (blocks, block, n_ctx + span):
        raise ValueError(f"bias must end in [{blocks}, {block}, {n_ctx + span}] (local_band_bias of {n} tokens, block "
                         f"{block}, window {w}, n_ctx {n_ctx}), got {tuple(bias.shape)}")
    keys = F.pad(k, (0, 0, w, pad + w)).unfold(2, span, block)  # [B, heads, blocks, d, L]
    values = F.pad(v, (0, 0, w, pad + w)).unfold(2, span, block).transpose(-1, -2)  # [B, heads, blocks, L, d]
    if n_ctx:
        keys = torch.cat([k[:, :, None, :n_ctx].transpose(-1, -2).expand(-1, -1, blocks, -1, -1), keys], dim=-1)
        values = torch.cat([v[:, :, None, :n_ctx].expand(-1, -1, blocks, -1, -1), values], dim=-2)
    queries = F.pad(q * d**-0.5, (0, 0, 0, pad)).reshape(b, h, blocks, block, d)
    scores = torch.matmul(queries, keys)
    scores += bias
    return torch.matmul(scores.softmax(-1), values).reshape(b, h, blocks * block, d)[:, :, :n]


def local_band_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, window: int,
                         block: int | None = None) -> Tensor:
    """The same attention as :func:`dense_band_attention` (``|j - i| <= window``, ``rel_bias`` at offset ``j - i``),
    computed block-locally (:func:`blocked_attention`) in blocks of ``block >= 1`` tokens (default
    :func:`attention_block`). Equal to the dense form up to float rounding."""
    w = int(window)
    block = attention_block(w) if block is None else block
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1 (tokens per block), got {block!r}")
    bias = local_band_bias(q.shape[2], w, block, rel_bias).to(q.dtype)
    return blocked_attention(q, k, v, bias, w, block)


#: From this many tokens the banded attention runs block-locally (:func:`use_local_attention`), for
#: ``window <= MIN_ATTENTION_BLOCK``; measured on one CPU thread (docs/methods/sequence.md).
LOCAL_ATTENTION_FROM = 192


def use_local_attention(n: int, window: int) -> bool:
    """Whether ``n`` tokens run the block-local form by default: from ``LOCAL_ATTENTION_FROM`` tokens, scaled by
    ``attention_block(window) / MIN_ATTENTION_BLOCK`` for wider windows."""
    return n >= LOCAL_ATTENTION_FROM * attention_block(window) // MIN_ATTENTION_BLOCK


def band_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, window: int,
                   local: bool | None = None) -> Tensor:
    """Banded relative attention, block-local (:func:`local_band_attention`) or one dense call (the same output up to
    float rounding). ``local`` None picks by length (:func:`use_local_attention`); True / False force either form."""
    if use_local_attention(q.shape[2], window) if local is None else local:
        return local_band_attention(q, k, v, rel_bias, window)
    return dense_band_attention(q, k, v, rel_bias, window)


def global_context_bias(n: int, k: int, window: int, rel_bias: Tensor, ctx_bias: Tensor) -> Tensor:
    """Additive attention bias ``[heads, n, n]`` for ``k`` context tokens followed by ``n - k`` frames, with the
    context as global tokens: a frame attends to the frames within ``window`` (bias ``rel_bias`` at offset ``j - i``)
    and to *every* context token (``rel_bias`` at its offset when within ``window``, else the position-free
    ``ctx_bias [heads]``); a context token attends to the context tokens only (banded, relative), so the context is
    encoded independently of the frames and a frame's dependence on other frames stays within the band."""
    index, band = relative_band(n, window, rel_bias.device)
    bias = rel_bias[:, index]
    is_ctx = torch.arange(n, device=rel_bias.device) < k
    far_ctx = is_ctx[None, :] & ~is_ctx[:, None] & ~band  # frame query, context key beyond the window
    bias = torch.where(far_ctx[None], ctx_bias[:, None, None].to(bias.dtype), bias)
    allowed = band | far_ctx
    allowed &= ~(is_ctx[:, None] & ~is_ctx[None, :])  # context queries never see frames
    return bias.masked_fill(~allowed, float("-inf"))
