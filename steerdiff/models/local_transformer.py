"""A masked-token transformer with sliding-window local attention (MotionDreamer's generator, Wang et al., ICLR 2025,
"MotionDreamer: One-to-Many Motion Synthesis with Localized Generative Masked Transformer", Sec. 3.2;
``docs/methods/motiondreamer.md``, "The generator").

``LocalMaskedTransformer(x [B, L] long, cond) -> logits [B, L, K]``: tokens ``0..K-1`` and the mask ``K`` are
embedded, pass ``depth`` pre-norm blocks whose self-attention is restricted to a band ``|j - i| <= window`` (a boolean
attention mask), and a head returns the logits of the clean token at every position. A token's output depends only on
the tokens within ``depth * window`` of it (its receptive field); ``window=None`` is full attention (baseline (a) of
the paper's ablation). Positions enter as a learned bias per head and relative offset, clipped to ``+-rel_range``
(no absolute position, so a local model is translation-equivariant and cannot memorise where a pattern sits), and
optionally an absolute sinusoidal code (``absolute=True``; what a full-attention model uses to locate tokens).

Conditions (``docs/methods/conventions.md``, "Conditions", ``-1`` = null): ``cond_kind="label"``: ``[B]`` ints in
``0..cond_values-1`` (a style label) added to every token; ``"frames"``: ``[B, L]`` ints per token (a beat flag,
``cond_values = 2``) added at each position. The masked-token objective ignores the diffusion time, so ``t`` is not
an input (the discrete denoiser wrapper drops it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.denoiser import NULL
from .embed import json_config
from .io import register_model

COND_KINDS = (None, "label", "frames")


def band_mask(n: int, window: int | None, device=None) -> Tensor | None:
    """``[n, n]`` bool: True where key ``j`` is within ``window`` of query ``i`` (None: full attention)."""
    if window is None:
        return None
    pos = torch.arange(n, device=device)
    return (pos[None, :] - pos[:, None]).abs() <= window


def sinusoidal(n: int, dim: int, device=None, dtype=torch.float32) -> Tensor:
    """``[n, dim]`` the sine/cosine position code of Vaswani et al. (2017), Sec. 3.5."""
    pos = torch.arange(n, device=device, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)
    out = torch.zeros(n, dim, device=device, dtype=torch.float64)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return out.to(dtype)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, h: Tensor, bias: Tensor) -> Tensor:
        b, n, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None].to(q.dtype))
        h = h + self.drop(self.proj(a.transpose(1, 2).reshape(b, n, d)))
        return h + self.drop(self.mlp(self.norm2(h)))


@register_model()
class LocalMaskedTransformer(nn.Module):
    """Masked-token transformer with banded (sliding-window) self-attention (see the module docstring).

    Args:
        num_tokens: ``K`` codebook entries; the mask is token ``K``.
        dim: model width (a multiple of ``heads``).
        depth: blocks.
        heads: attention heads.
        window: ``w``: each token attends to ``|j - i| <= w``; None: full attention.
        rel_range: relative offsets beyond ``+-rel_range`` share the edge bias.
        absolute: add a sinusoidal absolute position code to the input.
        cond_kind: None, ``"label"`` (``[B]``) or ``"frames"`` (``[B, L]``, per token).
        cond_values: values of the condition (its table has one more row: the null).
        mlp_ratio: MLP width over ``dim``.
        dropout: dropout in the blocks (training only).
    """

    def __init__(self, num_tokens: int, dim: int = 64, depth: int = 2, heads: int = 4, window: int | None = 4,
                 rel_range: int = 16, absolute: bool = False, cond_kind: str | None = None, cond_values: int = 0,
                 mlp_ratio: float = 2.0, dropout: float = 0.0):
        super().__init__()
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 2:
            raise ValueError(f"num_tokens must be an integer >= 2, got {num_tokens!r}")
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
            raise ValueError(f"window must be None (full attention) or an integer >= 0, got {window!r}")
        if cond_kind not in COND_KINDS:
            raise ValueError(f"cond_kind must be one of {COND_KINDS}, got {cond_kind!r}")
        if cond_kind is not None and cond_values < 1:
            raise ValueError(f"cond_values must be >= 1 with cond_kind={cond_kind!r}, got {cond_values!r}")
        self.config = json_config(num_tokens=num_tokens, dim=dim, depth=depth, heads=heads, window=window,
                                  rel_range=rel_range, absolute=absolute, cond_kind=cond_kind,
                                  cond_values=cond_values, mlp_ratio=mlp_ratio, dropout=dropout)
        self.num_tokens, self.window, self.rel_range, self.absolute = num_tokens, window, rel_range, absolute
        self.cond_kind, self.cond_values, self.heads = cond_kind, cond_values, heads
        self.embed = nn.Embedding(num_tokens + 1, dim)
        self.cond_embed = nn.Embedding(cond_values + 1, dim) if cond_kind else None
        self.rel_bias = nn.Parameter(torch.zeros(depth, heads, 2 * rel_range + 1))
        self.blocks = nn.ModuleList(_Block(dim, heads, mlp_ratio, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_tokens)
        nn.init.normal_(self.embed.weight, std=0.02)

    @property
    def receptive_field(self) -> int | None:
        """Tokens each side that can change a position's output: ``depth * window`` (None: all)."""
        return None if self.window is None else len(self.blocks) * self.window

    def _cond(self, cond: Tensor | None, b: int, n: int, device) -> Tensor | None:
        if self.cond_embed is None:
            if cond is not None and bool((cond != NULL).any()):
                raise ValueError("cond: this model is unconditional (cond_kind=None); only null (-1) entries allowed")
            return None
        want = (b,) if self.cond_kind == "label" else (b, n)
        if cond is None:
            cond = torch.full(want, NULL, dtype=torch.long, device=device)
        if not isinstance(cond, Tensor) or tuple(cond.shape) != want or cond.dtype.is_floating_point:
            got = tuple(cond.shape) if isinstance(cond, Tensor) else type(cond).__name__
            raise ValueError(f"cond must be an integer tensor {list(want)} for cond_kind={self.cond_kind!r} "
                             f"(-1 = null), got {got}")
        idx = torch.where(cond == NULL, torch.full_like(cond, self.cond_values), cond.long())
        e = self.cond_embed(idx.clamp(0, self.cond_values))
        return e[:, None] if self.cond_kind == "label" else e

    def forward(self, x: Tensor, cond: Tensor | None = None, window: int | None = -1) -> Tensor:
        """Logits ``[B, L, K]`` of the clean tokens; ``window`` overrides the configured one (``-1``: keep it)."""
        if x.dim() != 2 or x.dtype != torch.long:
            raise ValueError(f"x must be a long tensor [B, L], got {x.dtype} of shape {tuple(x.shape)}")
        b, n = x.shape
        w = self.window if window == -1 else window
        h = self.embed(x)
        if self.absolute:
            h = h + sinusoidal(n, h.shape[-1], h.device, h.dtype)
        c = self._cond(cond, b, n, x.device)
        if c is not None:
            h = h + c
        pos = torch.arange(n, device=x.device)
        rel = (pos[None, :] - pos[:, None]).clamp(-self.rel_range, self.rel_range) + self.rel_range
        band = band_mask(n, w, x.device)
        for i, block in enumerate(self.blocks):
            bias = self.rel_bias[i][:, rel]  # [heads, n, n]
            if band is not None:
                bias = bias.masked_fill(~band, float("-inf"))
            h = block(h, bias)
        return self.head(self.norm(h))

    def denoiser(self, window: int | None = -1):
        """The discrete denoiser ``D(x, t, cond) -> softmax(logits)`` of ``docs/methods/discrete.md`` (``t`` unused:
        the masked-token model reads the noise level off the mask count)."""

        def d(x: Tensor, t: Tensor, cond=None) -> Tensor:
            logits = self(x, cond, window)
            return torch.softmax(logits.float(), -1).to(logits.dtype)

        return d
