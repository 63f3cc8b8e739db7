"""NAMM forward map (Feng, Baptista, Bouman, ICLR 2025; official ``icnn.py``): the gradient of an input-convex
network; docs/methods/namm.md, "Forward map".

``g(x) = (1 - α) ∇_x Ψ(x) + α x``: the gradient of the α-strongly convex potential ``(1 - α) Ψ + (α/2)‖x‖²``, hence
strictly monotone and invertible. ``Ψ`` is an ICNN (code ``icnn.py``), leaky-ReLU slope 0.2, ``L`` layers::

    z_0     = lrelu((W^q_0 x)² + W^l_0 x + b_0)
    z_{k+1} = lrelu(W^z_k z_k + (W^q_{k+1} x)² + W^l_{k+1} x + b_{k+1}),   k = 0 .. L-1
    Ψ(x)    = W^out z_L                      (dense; conv: Σ_channels mean_space(W^out * z_L))

Convexity needs ``W^z, W^out >= 0`` (a convex non-decreasing activation of a non-negative combination of convex
functions is convex): they start at ``U(0, 1e-3)`` and :meth:`clamp_` projects them back after every optimizer step
(``optax.keep_params_nonnegative`` in the code; forgetting it breaks invertibility). ``W^q``, ``W^l`` are
unconstrained (``(W^q x)²`` is convex for any ``W^q``).

``g`` is computed with autograd; under grad mode the graph is kept (``create_graph``), so losses that go through
``g`` train ``Ψ`` by double back-propagation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embed import json_config
from .io import register_model

NEGATIVE_SLOPE = 0.2  # code: leaky ReLU slope of the ICNN
NONNEG_INIT = 1e-3  # code: W^z, W^out ~ U(0, 1e-3)


def _shape(dim: int | None, shape: Sequence[int] | None) -> tuple[int, ...]:
    if shape is not None:
        s = tuple(int(v) for v in shape)
    elif dim is not None:
        s = (int(dim),)
    else:
        raise ValueError("give dim (vectors) or shape (the per-sample shape)")
    if not s or min(s) < 1:
        raise ValueError(f"shape must be a non-empty tuple of positive ints, got {s}")
    return s


class _GradientMap(nn.Module):
    """Shared ``g = (1 - α) ∇Ψ + α x`` and the non-negativity projection; subclasses define ``potential``."""

    alpha: float
    sample_shape: tuple[int, ...]

    def potential(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _nonneg(self) -> list[Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def clamp_(self) -> None:
        """Project ``W^z`` and ``W^out`` onto ``>= 0`` (call after every optimizer step)."""
        for w in self._nonneg():
            w.clamp_(min=0.0)

    def is_convex(self) -> bool:
        """Whether every weight that convexity needs non-negative is non-negative."""
        return all(bool((w >= 0).all()) for w in self._nonneg())

    def forward(self, x: Tensor) -> Tensor:
        """``g(x)`` for ``x: [B, *sample_shape]`` (differentiable when grad mode is on)."""
        if x.ndim < 2 or tuple(x.shape[1:]) != self.sample_shape:
            raise ValueError(f"x must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(x.shape)}")
        keep_graph = torch.is_grad_enabled()
        with torch.enable_grad():
            xi = x if (keep_graph and x.requires_grad) else x.detach().requires_grad_(True)
            psi = self.potential(xi)
            (grad,) = torch.autograd.grad(psi.sum(), xi, create_graph=keep_graph)
        out = (1.0 - self.alpha) * grad + self.alpha * xi
        return out if keep_graph else out.detach()


@register_model()
class ICNNMap(_GradientMap):
    """Dense ICNN forward map for vectors, or images flattened (N1: hidden 32, L=2; N2: hidden 128, L=2).

    Args:
        dim: data dimension (vectors); or give ``shape``.
        shape: per-sample shape (e.g. ``[1, 8, 8]``); flattened inside, ``g`` returns the same shape.
        hidden: width of every ICNN layer.
        layers: ``L`` (the number of ``W^z`` layers; code ``fwd_icnn_n_layers``).
        alpha: strong-convexity weight α (code ``fwd_strong_convexity`` = 0.9).
        negative_slope: leaky-ReLU slope (0.2).
    """

    def __init__(self, dim: int | None = None, shape: Sequence[int] | None = None, hidden: int = 32, layers: int = 2,
                 alpha: float = 0.9, negative_slope: float = NEGATIVE_SLOPE):
        super().__init__()
        self.sample_shape = _shape(dim, shape)
        if hidden < 1 or layers < 0:
            raise ValueError(f"hidden must be >= 1 and layers >= 0, got {hidden}, {layers}")
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must lie in [0, 1), got {alpha}")
        self.config = json_config(dim=None, shape=list(self.sample_shape), hidden=hidden, layers=layers,
                                  alpha=alpha, negative_slope=negative_slope)
        self.alpha, self.slope = float(alpha), float(negative_slope)
        d = math.prod(self.sample_shape)
        self.wq = nn.ModuleList([nn.Linear(d, hidden, bias=False) for _ in range(layers + 1)])
        self.wl = nn.ModuleList([nn.Linear(d, hidden) for _ in range(layers + 1)])
        self.wz = nn.ParameterList([nn.Parameter(torch.rand(hidden, hidden) * NONNEG_INIT) for _ in range(layers)])
        self.wout = nn.Parameter(torch.rand(hidden) * NONNEG_INIT)

    def _nonneg(self) -> list[Tensor]:
        return [*self.wz, self.wout]

    def potential(self, x: Tensor) -> Tensor:
        """``Ψ(x)``: ``[B, *shape] -> [B]``."""
        v = x.flatten(1)
        z = F.leaky_relu(self.wq[0](v) ** 2 + self.wl[0](v), self.slope)
        for k, wz in enumerate(self.wz):
            z = F.leaky_relu(z @ wz.T + self.wq[k + 1](v) ** 2 + self.wl[k + 1](v), self.slope)
        return z @ self.wout


@register_model()
class ConvICNNMap(_GradientMap):
    """Convolutional ICNN forward map for images ``[C, H, W]`` (the paper's: 3x3 convs, circular padding).

    Args:
        shape: per-sample shape ``[C, H, W]``.
        filters: channels of every layer (code ``fwd_icnn_n_filters`` = 32; N3: 16).
        layers: ``L``.
        kernel_size: odd conv size (3).
        alpha: strong-convexity weight α (0.9).
        negative_slope: leaky-ReLU slope (0.2).
    """

    def __init__(self, shape: Sequence[int] = (1, 8, 8), filters: int = 32, layers: int = 2, kernel_size: int = 3,
                 alpha: float = 0.9, negative_slope: float = NEGATIVE_SLOPE):
        super().__init__()
        self.sample_shape = _shape(None, shape)
        if len(self.sample_shape) != 3:
            raise ValueError(f"shape must be [C, H, W], got {self.sample_shape}")
        if filters < 1 or layers < 0 or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"need filters >= 1, layers >= 0, odd kernel_size; got {filters}, {layers}, {kernel_size}")
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must lie in [0, 1), got {alpha}")
        self.config = json_config(shape=list(self.sample_shape), filters=filters, layers=layers,
                                  kernel_size=kernel_size, alpha=alpha, negative_slope=negative_slope)
        self.alpha, self.slope = float(alpha), float(negative_slope)
        c, k = self.sample_shape[0], kernel_size

        def conv(cin: int, cout: int, bias: bool) -> nn.Conv2d:
            return nn.Conv2d(cin, cout, k, padding=k // 2, padding_mode="circular", bias=bias)

        self.wq = nn.ModuleList([conv(c, filters, False) for _ in range(layers + 1)])
        self.wl = nn.ModuleList([conv(c, filters, True) for _ in range(layers + 1)])
        self.wz = nn.ModuleList([conv(filters, filters, False) for _ in range(layers)])
        self.wout = conv(filters, c, False)
        with torch.no_grad():
            for m in [*self.wz, self.wout]:
                m.weight.uniform_(0.0, NONNEG_INIT)

    def _nonneg(self) -> list[Tensor]:
        return [m.weight for m in [*self.wz, self.wout]]

    def potential(self, x: Tensor) -> Tensor:
        z = F.leaky_relu(self.wq[0](x) ** 2 + self.wl[0](x), self.slope)
        for k, wz in enumerate(self.wz):
            z = F.leaky_relu(wz(z) + self.wq[k + 1](x) ** 2 + self.wl[k + 1](x), self.slope)
        return self.wout(z).mean(dim=(2, 3)).sum(dim=1)
