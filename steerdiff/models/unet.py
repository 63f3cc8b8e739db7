"""Small UNet backbone for tiny images (8x8x1 digits, 12x12x3 shapes), in the spirit of DDPM++ / EDM's nets.

Raw network ``F(x_in, c_noise, cond)``, wrapped by :class:`~steerdiff.models.precond.EDMPrecond`. A few
resolutions, residual blocks (GroupNorm, SiLU, 3x3 conv) receiving an embedding of the noise level plus the
sum of the condition-slot embeddings (each slot with a null row), skip connections between the down and up
paths, and a zero-initialised output conv (so the denoiser starts at ``D = c_skip x``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embed import FourierFeatures, SlotEmbedding, check_cond, json_config, normalize_num_classes
from .io import register_model


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(channels, groups), channels)


class ResBlock(nn.Module):
    """``x + conv(silu(norm(conv(silu(norm(x))) + W emb)))`` with a 1x1 skip when the width changes."""

    def __init__(self, cin: int, cout: int, emb_dim: int, groups: int, dropout: float):
        super().__init__()
        self.norm1 = _norm(cin, groups)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, cout)
        self.norm2 = _norm(cout, groups)
        self.drop = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
        # The residual branch starts small so that a deep stack begins close to the identity (as DDPM++/EDM).
        nn.init.zeros_(self.conv2.bias)
        with torch.no_grad():
            self.conv2.weight.mul_(0.1)

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(emb)[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return self.skip(x) + h


@register_model()
class UNet(nn.Module):
    """Conditional UNet ``F(x_in [B, C, H, W], c_noise [B], cond) -> [B, C, H, W]``.

    Args:
        img_size: image height = width; must be divisible by ``2 ** (len(channels) - 1)``.
        in_channels: image channels ``C``.
        channels: width of each resolution level (one level per entry; each level but the last halves H, W).
        num_res_blocks: residual blocks per level on the down path (the up path has one more, as DDPM).
        num_classes: values per condition slot (int for one slot, list for several, None for unconditional).
        emb_dim: width of the noise + condition embedding (default ``4 * channels[0]``).
        fourier_dim: number of Fourier features of ``c_noise``.
        norm_groups: GroupNorm groups (reduced to a divisor of each width).
        dropout: dropout inside the residual blocks.
    """

    def __init__(
        self,
        img_size: int = 8,
        in_channels: int = 1,
        channels: Sequence[int] = (32, 64),
        num_res_blocks: int = 2,
        num_classes: int | Sequence[int] | None = None,
        emb_dim: int | None = None,
        fourier_dim: int = 64,
        norm_groups: int = 8,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.config = json_config(
            img_size=img_size,
            in_channels=in_channels,
            channels=channels,
            num_res_blocks=num_res_blocks,
            num_classes=num_classes,
            emb_dim=emb_dim,
            fourier_dim=fourier_dim,
            norm_groups=norm_groups,
            dropout=dropout,
        )
        channels = list(channels)
        if not channels or min(channels) < 1 or num_res_blocks < 1:
            raise ValueError(f"UNet needs positive channels and num_res_blocks >= 1, got {channels}, {num_res_blocks}")
        if img_size % 2 ** (len(channels) - 1):
            raise ValueError(
                f"img_size={img_size} must be divisible by 2**(len(channels)-1)={2 ** (len(channels) - 1)}"
            )
        self.num_classes = normalize_num_classes(num_classes)
        self.sample_shape = (in_channels, img_size, img_size)
        emb_dim = emb_dim or 4 * channels[0]

        self.fourier = FourierFeatures(fourier_dim)
        self.noise_mlp = nn.Sequential(nn.Linear(fourier_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.slots = SlotEmbedding(self.num_classes, emb_dim) if self.num_classes else None

        def block(cin: int, cout: int) -> ResBlock:
            return ResBlock(cin, cout, emb_dim, norm_groups, dropout)

        self.conv_in = nn.Conv2d(in_channels, channels[0], 3, padding=1)
        self.down = nn.ModuleList()
        skips, ch = [channels[0]], channels[0]
        for level, width in enumerate(channels):
            for _ in range(num_res_blocks):
                self.down.append(block(ch, width))
                ch = width
                skips.append(ch)
            if level < len(channels) - 1:
                self.down.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1))
                skips.append(ch)
        self.mid = nn.ModuleList([block(ch, ch), block(ch, ch)])
        self.up = nn.ModuleList()
        for level in reversed(range(len(channels))):
            for _ in range(num_res_blocks + 1):
                self.up.append(block(ch + skips.pop(), channels[level]))
                ch = channels[level]
            if level > 0:
                self.up.append(
                    nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(ch, ch, 3, padding=1))
                )
        self.norm_out = _norm(ch, norm_groups)
        self.conv_out = nn.Conv2d(ch, in_channels, 3, padding=1)
        nn.init.zeros_(self.conv_out.weight)
        nn.init.zeros_(self.conv_out.bias)

    def forward(self, x: Tensor, c_noise: Tensor, cond: Tensor | None = None) -> Tensor:
        if tuple(x.shape[1:]) != self.sample_shape or x.ndim != 4:
            raise ValueError(f"x must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(x.shape)}")
        cond = check_cond(cond, self.num_classes, x.shape[0], x.device)
        emb = self.noise_mlp(self.fourier(c_noise).to(x.dtype))
        if self.slots is not None:
            emb = emb + self.slots(cond).sum(dim=1).to(x.dtype)
        emb = F.silu(emb)

        h = self.conv_in(x)
        hs = [h]
        for layer in self.down:
            h = layer(h, emb) if isinstance(layer, ResBlock) else layer(h)
            hs.append(h)
        for layer in self.mid:
            h = layer(h, emb)
        for layer in self.up:
            h = layer(torch.cat([h, hs.pop()], dim=1), emb) if isinstance(layer, ResBlock) else layer(h)
        return self.conv_out(F.silu(self.norm_out(h)))
