"""MLP backbone for low-dimensional data (the 2-D toy sets; guidance.md 6.4).

Raw network ``F(x_in, c_noise, cond)``, to be wrapped by :class:`~steerdiff.models.precond.EDMPrecond`:
input ``x_in = c_in x``, Fourier features of ``c_noise`` through a linear layer, one embedding per condition
slot (``K_i + 1`` rows, last = null), all concatenated and passed through SiLU hidden layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .embed import FourierFeatures, SlotEmbedding, check_cond, json_config, normalize_num_classes
from .io import register_model


@register_model()
class MLP(nn.Module):
    """Conditional MLP ``F(x_in [B, dim], c_noise [B], cond) -> [B, dim]``.

    Args:
        dim: data dimension.
        hidden: widths of the hidden layers (guidance.md 6.4: three layers of 256).
        num_classes: values per condition slot (int for one slot, list for several, None for unconditional).
        cond_dim: width of each slot embedding.
        fourier_dim: number of Fourier features of ``c_noise``.
        noise_dim: width of the linear layer on the Fourier features.
    """

    def __init__(
        self,
        dim: int = 2,
        hidden: Sequence[int] = (256, 256, 256),
        num_classes: int | Sequence[int] | None = None,
        cond_dim: int = 32,
        fourier_dim: int = 16,
        noise_dim: int = 64,
    ):
        super().__init__()
        self.config = json_config(
            dim=dim,
            hidden=hidden,
            num_classes=num_classes,
            cond_dim=cond_dim,
            fourier_dim=fourier_dim,
            noise_dim=noise_dim,
        )
        if dim < 1 or not hidden or min(hidden) < 1:
            raise ValueError(f"MLP needs dim >= 1 and non-empty positive hidden widths, got {dim}, {hidden}")
        self.num_classes = normalize_num_classes(num_classes)
        self.sample_shape = (dim,)
        self.fourier = FourierFeatures(fourier_dim)
        self.noise_proj = nn.Linear(fourier_dim, noise_dim)
        self.slots = SlotEmbedding(self.num_classes, cond_dim) if self.num_classes else None
        width = dim + noise_dim + cond_dim * len(self.num_classes)
        layers: list[nn.Module] = []
        for h in hidden:
            layers += [nn.Linear(width, h), nn.SiLU()]
            width = h
        self.body = nn.Sequential(*layers)
        self.out = nn.Linear(width, dim)
        # Zero output: the preconditioned denoiser starts as D = c_skip x, the EDM starting point.
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: Tensor, c_noise: Tensor, cond: Tensor | None = None) -> Tensor:
        if x.ndim != 2 or x.shape[1] != self.sample_shape[0]:
            raise ValueError(f"x must have shape [B, {self.sample_shape[0]}], got {tuple(x.shape)}")
        cond = check_cond(cond, self.num_classes, x.shape[0], x.device)
        parts = [x, self.noise_proj(self.fourier(c_noise).to(x.dtype))]
        if self.slots is not None:
            parts.append(self.slots(cond).flatten(1).to(x.dtype))
        return self.out(self.body(torch.cat(parts, dim=1)))
