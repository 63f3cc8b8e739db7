"""NAMM inverse map ``f_ψ: R^d -> M`` (Feng, Baptista, Bouman, ICLR 2025; docs/methods/namm.md, "Inverse map").

The paper's images use a CycleGAN ResNet with ``bwd_residual`` (input added to the output); for vectors and on CPU
steerdiff uses a residual MLP: ``f(y) = y + MLP(y)``, three SiLU hidden layers (N1: 128 wide; N2: 256). Images
are flattened and reshaped back. The last layer starts at zero, so ``f`` starts as the identity. ``activation=
"softplus"`` applies the code's final softplus for non-negative data (off by default: the N1 / N2 recipes use none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from ..models.embed import json_config
from ..models.io import register_model

ACTIVATIONS = ("none", "softplus")


@register_model()
class ResidualMLP(nn.Module):
    """``f(y) = act(y + MLP(y))`` on flattened samples.

    Args:
        dim: data dimension (vectors); or give ``shape``.
        shape: per-sample shape (e.g. ``[1, 8, 8]``).
        hidden: width of each hidden layer.
        layers: number of hidden layers (3).
        activation: ``"none"`` or ``"softplus"`` (code ``bwd_activation`` for non-negative images).
    """

    def __init__(self, dim: int | None = None, shape: Sequence[int] | None = None, hidden: int = 128,
                 layers: int = 3, activation: str = "none"):
        super().__init__()
        if shape is not None:
            self.sample_shape = tuple(int(v) for v in shape)
        elif dim is not None:
            self.sample_shape = (int(dim),)
        else:
            raise ValueError("give dim (vectors) or shape (the per-sample shape)")
        if not self.sample_shape or min(self.sample_shape) < 1 or hidden < 1 or layers < 1:
            raise ValueError(f"need a positive shape, hidden >= 1 and layers >= 1; got {self.sample_shape}, "
                             f"{hidden}, {layers}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.config = json_config(dim=None, shape=list(self.sample_shape), hidden=hidden, layers=layers,
                                  activation=activation)
        self.activation = activation
        d = math.prod(self.sample_shape)
        mods: list[nn.Module] = []
        width = d
        for _ in range(layers):
            mods += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        self.body = nn.Sequential(*mods)
        self.out = nn.Linear(width, d)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, y: Tensor) -> Tensor:
        if y.ndim < 2 or tuple(y.shape[1:]) != self.sample_shape:
            raise ValueError(f"y must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(y.shape)}")
        v = y.flatten(1)
        out = v + self.out(self.body(v))
        if self.activation == "softplus":
            out = F.softplus(out)
        return out.reshape(y.shape)
