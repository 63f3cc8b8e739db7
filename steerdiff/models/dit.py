"""Small in-context conditional DiT (Hu et al., ICLR 2025, "On Statistical Rates of Conditional Diffusion
Transformers": condition embeddings as extra input tokens; DiT, Peebles & Xie 2023, its in-context variant;
docs/methods/coind.md, "Backbone: the in-context DiT").

Raw network ``F(x_in, c_noise, cond)``, wrapped by :class:`~steerdiff.models.precond.EDMPrecond`:

* patchify ``(C, H, W)`` with patch ``p`` into ``N = HW / p^2`` tokens, linear to width ``h``, fixed
  2-D sin-cos position embedding on the image tokens only;
* context tokens: one noise token ``MLP(fourier(c_noise))`` and one token per condition slot from a table with
  ``K_i + 1`` rows (last row = null) plus a learned slot-type embedding;
* sequence ``[noise, cond_1..cond_m, img_1..img_N]``, pre-LN blocks (MHSA + MLP ratio 4), final LN, context
  tokens dropped, linear to ``p^2 C``, unpatchify; the output layer is zero-initialised.

In-context conditioning gives every attribute slot its own token, which per-slot null tokens in composition
need; DiT found adaLN-Zero better than in-context conditioning at ImageNet scale, but adaLN sums the slots into
one embedding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embed import FourierFeatures, SlotEmbedding, check_cond, json_config, normalize_num_classes, sincos_2d
from .io import register_model


class FusedSelfAttention:
    """The block's self-attention ``proj(MHSA(h))`` from its fused ``qkv`` projection: the default processor of
    :class:`DiTAttention` (perturbation guiders swap in others, :mod:`steerdiff.models.perturb`)."""

    def __call__(self, attn: DiTAttention, h: Tensor, qkv: nn.Linear, proj: nn.Linear) -> Tensor:
        b, n, w = h.shape
        q, k, v = qkv(h).reshape(b, n, 3, attn.heads, w // attn.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return proj(out.transpose(1, 2).reshape(b, n, w))


class DiTAttention(nn.Module):
    """The hookable self-attention of a :class:`Block`: no parameters of its own (the block keeps ``qkv`` and
    ``proj``, so checkpoints keep their keys), a swappable ``processor(attn, h, qkv, proj)`` as diffusers' attention
    modules have, and the image-token ``grid`` (the last ``grid[0] * grid[1]`` tokens of the sequence, set by the
    :class:`DiT`) that SEG's query blur needs."""

    fused_qkv = True  # marks a fused-projection attention for steerdiff.models.perturb (duck-typed there)

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads
        self.grid: tuple[int, int] | None = None
        self.processor = FusedSelfAttention()

    def forward(self, h: Tensor, qkv: nn.Linear, proj: nn.Linear) -> Tensor:
        return self.processor(self, h, qkv, proj)


class Block(nn.Module):
    """Pre-LN transformer block: ``x + MHSA(LN(x))``, then ``x + MLP(LN(x))``; the attention runs through the
    parameter-free :class:`DiTAttention` module ``attn`` (named ``blocks.<i>.attn``), the weights stay the block's."""

    def __init__(self, width: int, heads: int, mlp_ratio: float, dropout: float):
        super().__init__()
        self.heads = heads
        self.attn = DiTAttention(heads)
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(width, hidden),
            nn.GELU(approximate="tanh"),
            nn.Dropout(dropout),
            nn.Linear(hidden, width),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), self.qkv, self.proj)
        return x + self.mlp(self.norm2(x))


@register_model()
class DiT(nn.Module):
    """In-context conditional DiT ``F(x_in [B, C, H, W], c_noise [B], cond) -> [B, C, H, W]``.

    Args:
        img_size: image side (int) or ``[H, W]``; each divisible by ``patch_size``.
        in_channels: image channels ``C``.
        patch_size: patch side ``p`` (digits 8x8: 2; shapes 12x12: 3 -> 16 tokens).
        width: token width ``h`` (64..96 at the CPU sizes); divisible by 4 and by ``heads``.
        depth: number of transformer blocks (4).
        heads: attention heads (4).
        mlp_ratio: MLP hidden width over ``h`` (4).
        num_classes: values per condition slot (int for one slot, list for several, None for unconditional).
        fourier_dim: number of Fourier features of ``c_noise`` for the noise token.
        dropout: dropout inside the MLPs.
    """

    def __init__(
        self,
        img_size: int | Sequence[int] = 8,
        in_channels: int = 1,
        patch_size: int = 2,
        width: int = 96,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        num_classes: int | Sequence[int] | None = None,
        fourier_dim: int = 64,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.config = json_config(
            img_size=img_size,
            in_channels=in_channels,
            patch_size=patch_size,
            width=width,
            depth=depth,
            heads=heads,
            mlp_ratio=mlp_ratio,
            num_classes=num_classes,
            fourier_dim=fourier_dim,
            dropout=dropout,
        )
        height, wide = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if height % patch_size or wide % patch_size:
            raise ValueError(f"img_size {img_size} must be divisible by patch_size={patch_size}")
        if width % 4 or width % heads:
            raise ValueError(f"width={width} must be divisible by 4 (position code) and by heads={heads}")
        self.num_classes = normalize_num_classes(num_classes)
        self.sample_shape = (in_channels, height, wide)
        self.patch = patch_size
        self.grid = (height // patch_size, wide // patch_size)

        self.patch_in = nn.Linear(patch_size * patch_size * in_channels, width)
        self.register_buffer("pos", sincos_2d(*self.grid, width), persistent=False)
        self.fourier = FourierFeatures(fourier_dim)
        self.noise_mlp = nn.Sequential(nn.Linear(fourier_dim, width), nn.SiLU(), nn.Linear(width, width))
        m = len(self.num_classes)
        self.slots = SlotEmbedding(self.num_classes, width) if m else None
        self.slot_type = nn.Parameter(torch.zeros(m, width))
        self.blocks = nn.ModuleList([Block(width, heads, mlp_ratio, dropout) for _ in range(depth)])
        for block in self.blocks:
            block.attn.grid = self.grid
        self.norm_out = nn.LayerNorm(width)
        self.patch_out = nn.Linear(width, patch_size * patch_size * in_channels)
        self._init_weights()

    def _init_weights(self) -> None:
        # DiT init: xavier-uniform linears with zero bias, small normal embeddings, zero output layer.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.slot_type, std=0.02)
        nn.init.zeros_(self.patch_out.weight)
        nn.init.zeros_(self.patch_out.bias)

    def patchify(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, N, p*p*C]`` (row-major patches, channels last within a patch)."""
        b, c, _, _ = x.shape
        (gh, gw), p = self.grid, self.patch
        return x.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1).reshape(b, gh * gw, p * p * c)

    def unpatchify(self, t: Tensor) -> Tensor:
        """Inverse of :meth:`patchify`."""
        b = t.shape[0]
        (gh, gw), p, c = self.grid, self.patch, self.sample_shape[0]
        return t.reshape(b, gh, gw, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, gh * p, gw * p)

    def embed_tokens(self, x: Tensor, c_noise: Tensor, cond: Tensor | None = None) -> Tensor:
        """The input token sequence ``[noise token, one token per condition slot, patch tokens]`` (before the blocks);
        the first ``1 + len(num_classes)`` tokens are the in-context conditioning."""
        if tuple(x.shape[1:]) != self.sample_shape or x.ndim != 4:
            raise ValueError(f"x must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(x.shape)}")
        cond = check_cond(cond, self.num_classes, x.shape[0], x.device)
        tokens = [self.noise_mlp(self.fourier(c_noise).to(x.dtype))[:, None]]
        if self.slots is not None:
            tokens.append(self.slots(cond).to(x.dtype) + self.slot_type)
        tokens.append(self.patch_in(self.patchify(x)) + self.pos.to(x.dtype))
        return torch.cat(tokens, dim=1)

    def decode_tokens(self, h: Tensor) -> Tensor:
        """The output image from the last block's tokens (the conditioning tokens dropped)."""
        n_ctx = 1 + len(self.num_classes)
        return self.unpatchify(self.patch_out(self.norm_out(h)[:, n_ctx:]))

    def forward(self, x: Tensor, c_noise: Tensor, cond: Tensor | None = None) -> Tensor:
        h = self.embed_tokens(x, c_noise, cond)
        for block in self.blocks:
            h = block(h)
        return self.decode_tokens(h)
