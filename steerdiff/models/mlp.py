"""MLP backbone for low-dimensional data (the 2-D toy sets of the learned CoInD test, docs/methods/coind.md, "The
learned 2-D test (C1-C3)"; the 8x8-digits prior (a) of docs/methods/inverse.md, "The digits protocol").

Raw network ``F(x_in, c_noise, cond)``, to be wrapped by :class:`~steerdiff.models.precond.EDMPrecond`:
input ``x_in = c_in x``, the noise level (Fourier features of ``c_noise`` through a linear layer, or ``c_noise =
log(sigma)/4`` itself), one embedding per condition slot (``K_i + 1`` rows, last = null), all concatenated and
passed through SiLU hidden layers (or ReLU / leaky-ReLU ones: ``activation=``, for continuous piecewise-linear
networks, docs/methods/geometry.md). With ``image_shape`` the network takes images and flattens them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .embed import FourierFeatures, SlotEmbedding, check_cond, json_config, normalize_num_classes
from .io import register_model

_ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU, "leaky_relu": nn.LeakyReLU}


@register_model()
class MLP(nn.Module):
    """Conditional MLP ``F(x_in [B, dim], c_noise [B], cond) -> [B, dim]``.

    Args:
        dim: data dimension.
        hidden: widths of the hidden layers (three layers of 256 in the learned 2-D CoInD test's full recipe).
        num_classes: values per condition slot (int for one slot, list for several, None for unconditional).
        cond_dim: width of each slot embedding.
        fourier_dim: number of Fourier features of ``c_noise``.
        noise_dim: width of the linear layer on the Fourier features.
        noise_input: ``"fourier"`` (the default above) or ``"raw"``: ``c_noise`` as one input column
            (the inverse-problem digits prior (a): input ``[c_in x, log(sigma)/4]``).
        image_shape: if given (e.g. ``[1, 8, 8]``), inputs are images of this shape, flattened inside
            (``dim`` must equal their size).
        activation: hidden-layer nonlinearity, ``"silu"`` (default), ``"relu"`` or ``"leaky_relu"`` (slope 0.01);
            with ReLU / leaky-ReLU the network is continuous piecewise-linear in ``x`` (the local-geometry
            descriptors of docs/methods/geometry.md count its region boundaries exactly).
    """

    def __init__(
        self,
        dim: int = 2,
        hidden: Sequence[int] = (256, 256, 256),
        num_classes: int | Sequence[int] | None = None,
        cond_dim: int = 32,
        fourier_dim: int = 16,
        noise_dim: int = 64,
        noise_input: str = "fourier",
        image_shape: Sequence[int] | None = None,
        activation: str = "silu",
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
        if noise_input != "fourier":  # only recorded when used, so older configs read back unchanged
            self.config["noise_input"] = noise_input
        if image_shape is not None:
            self.config["image_shape"] = [int(v) for v in image_shape]
        if activation != "silu":  # likewise recorded only when not the default
            self.config["activation"] = activation
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        if dim < 1 or not hidden or min(hidden) < 1:
            raise ValueError(f"MLP needs dim >= 1 and non-empty positive hidden widths, got {dim}, {hidden}")
        if noise_input not in ("fourier", "raw"):
            raise ValueError(f"noise_input must be 'fourier' or 'raw', got {noise_input!r}")
        if image_shape is not None and math.prod(image_shape) != dim:
            raise ValueError(f"image_shape {list(image_shape)} has {math.prod(image_shape)} entries, dim is {dim}")
        self.num_classes = normalize_num_classes(num_classes)
        self.sample_shape = tuple(int(v) for v in image_shape) if image_shape is not None else (dim,)
        self.dim = dim
        self.noise_input = noise_input
        if noise_input == "fourier":
            self.fourier = FourierFeatures(fourier_dim)
            self.noise_proj = nn.Linear(fourier_dim, noise_dim)
        noise_width = noise_dim if noise_input == "fourier" else 1
        self.slots = SlotEmbedding(self.num_classes, cond_dim) if self.num_classes else None
        width = dim + noise_width + cond_dim * len(self.num_classes)
        layers: list[nn.Module] = []
        for h in hidden:
            layers += [nn.Linear(width, h), _ACTIVATIONS[activation]()]
            width = h
        self.body = nn.Sequential(*layers)
        self.out = nn.Linear(width, dim)
        # Zero output: the preconditioned denoiser starts as D = c_skip x, the EDM starting point.
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: Tensor, c_noise: Tensor, cond: Tensor | None = None) -> Tensor:
        if tuple(x.shape[1:]) != self.sample_shape:
            raise ValueError(f"x must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(x.shape)}")
        cond = check_cond(cond, self.num_classes, x.shape[0], x.device)
        flat = x.reshape(x.shape[0], self.dim)
        if self.noise_input == "fourier":
            noise = self.noise_proj(self.fourier(c_noise).to(x.dtype))
        else:
            noise = c_noise.to(x.dtype).reshape(-1, 1).expand(x.shape[0], 1)
        parts = [flat, noise]
        if self.slots is not None:
            parts.append(self.slots(cond).flatten(1).to(x.dtype))
        return self.out(self.body(torch.cat(parts, dim=1))).reshape(x.shape)
