"""EDM preconditioning of the sequence transformer: the sequence denoiser ``D(x [B, S, *frame], sigma [B],
SequenceCond)`` of the all-at-once generation (Cheng et al., "DAWN: Dynamic frame Avatar With Non-autoregressive
diffusion framework", 2025, Sec. 3; Karras et al., "Elucidating the Design Space of Diffusion-Based Generative Models",
NeurIPS 2022, Table 1; docs/methods/sequence.md, "The model").

Unlike :class:`steerdiff.models.EDMPrecond` it fixes the frame shape only, not the length ``S``, so every sampler of
:mod:`steerdiff.core` runs on sequences of any length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..core.denoiser import append_dims, as_sigma_batch
from ..models.io import build_model, model_spec, register_model
from ..models.precond import edm_scalings
from ..models.sequence import SequenceTransformer
from .cond import SequenceCond


@register_model()
class SequencePrecond(nn.Module):
    """EDM-preconditioned sequence denoiser ``D(x [B, S, *frame], sigma [B], cond: SequenceCond) -> x0_hat``.

    ``D = c_skip x + c_out F(c_in x, c_noise, signal, context / sigma_data)`` (Karras et al. 2022, Table 1, via
    :func:`steerdiff.models.precond.edm_scalings`); unlike :class:`~steerdiff.models.EDMPrecond` it fixes the frame
    shape only, not the length ``S`` (``sample_shape`` is None, so samplers accept any ``S``). The clean context is
    scaled as data at sigma 0 (``c_in = 1 / sigma_data``).

    Args:
        net: a :class:`SequenceTransformer` or its spec ``{"class", "config"}``.
        sigma_data: data standard deviation (0.5 for the driven trajectories).
    """

    sample_shape = None

    def __init__(self, net: nn.Module | dict, sigma_data: float = 0.5):
        super().__init__()
        if isinstance(net, dict):
            net = build_model(net)
        if not isinstance(net, SequenceTransformer):
            raise TypeError(f"net must be a SequenceTransformer or its config dict, got {type(net).__name__}")
        if not sigma_data > 0:
            raise ValueError(f"sigma_data must be positive, got {sigma_data}")
        self.net, self.sigma_data = net, float(sigma_data)
        self.frame_shape: tuple[int, ...] = net.frame_shape
        self.signal_dim: int = net.signal_dim

    @property
    def sigma_range(self) -> tuple[float, float]:
        """Every finite level (``c_noise = ln(sigma) / 4`` is infinite at ``sigma = inf``)."""
        return 0.0, torch.finfo(torch.float64).max

    @property
    def config(self) -> dict:
        return {"net": model_spec(self.net), "sigma_data": self.sigma_data}

    def check_inputs(self, x: Tensor, cond: object) -> SequenceCond:
        """Validate ``x`` against the frame shape and ``cond`` against ``x`` (same batch, length, frame shape)."""
        form = f"[B, S, {', '.join(map(str, self.frame_shape))}]"
        if not isinstance(x, Tensor) or x.ndim != 2 + len(self.frame_shape) or x.shape[1] < 1:
            raise ValueError(f"x must have shape {form} (frames on axis 1), got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        if tuple(x.shape[2:]) != self.frame_shape:
            raise ValueError(f"x has frame shape {tuple(x.shape[2:])} but the model's frames are {self.frame_shape} "
                             f"(x must be {form})")
        if isinstance(cond, dict):
            cond = SequenceCond(cond.get("signal"), cond.get("context"))
        if not isinstance(cond, SequenceCond):
            raise ValueError(f"cond must be a SequenceCond(signal, context) (or a dict with those keys), got "
                             f"{type(cond).__name__}")
        if cond.batch_size != x.shape[0]:
            raise ValueError(f"cond has {cond.batch_size} rows but x has B={x.shape[0]}")
        if cond.length != x.shape[1] or cond.signal.shape[2] != self.signal_dim:
            raise ValueError(f"cond.signal must be [B, S, signal_dim] = [{x.shape[0]}, {x.shape[1]}, {self.signal_dim}]"
                             f" (one signal row per frame of x), got {tuple(cond.signal.shape)}")
        if cond.context is not None and tuple(cond.context.shape[2:]) != self.frame_shape:
            raise ValueError(f"cond.context has frame shape {tuple(cond.context.shape[2:])} but the model's frames are "
                             f"{self.frame_shape} (context must be [B, k, {', '.join(map(str, self.frame_shape))}])")
        return cond

    def forward(self, x: Tensor, sigma: Tensor | float, cond: SequenceCond | dict | None = None) -> Tensor:
        cond = self.check_inputs(x, cond)
        sigma = as_sigma_batch(sigma, x)
        c_skip, c_out, c_in, c_noise = edm_scalings(sigma, self.sigma_data)
        dtype = next(self.net.parameters()).dtype
        ctx = None if cond.context is None else (cond.context / self.sigma_data).to(dtype)
        f = self.net((append_dims(c_in, x.ndim) * x).to(dtype), c_noise.to(dtype), cond.signal.to(dtype), ctx)
        return append_dims(c_skip, x.ndim) * x + append_dims(c_out, x.ndim) * f.to(x.dtype)


def sequence_model(frame_shape: Sequence[int] = (2,), signal_dim: int = 2, sigma_data: float = 0.5,
                   **net_options) -> SequencePrecond:
    """A fresh :class:`SequencePrecond` around a :class:`SequenceTransformer` (``net_options`` go to the latter)."""
    return SequencePrecond(SequenceTransformer(frame_shape, signal_dim, **net_options), sigma_data)
