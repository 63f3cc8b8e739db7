"""Frame-sequence backbone for forecasting: frame tokens, FiLM MLP blocks and a global learned frame-mixing matrix
(Dynamical Diffusion, Guo et al., ICLR 2025; the network of docs/methods/dydiff.md "The validation protocol", with
the context conditioning of the official code, docs/methods/dydiff.md "API").

Raw network ``F(x_in, c_noise, cond)`` on a sequence ``x_in: [B, S, *frame]`` (frames on axis 1), to be wrapped by
:class:`~steerdiff.models.precond.EDMPrecond`. Each frame ``s`` becomes one token, a Linear map of
``[x_s, ctx_s, mask_s, first_future_s]`` (the official code's ``concat-video-mask-1st`` channels): the noisy frame,
the clean context frame (zeros on future frames), 1 on context frames, 1 on the first future frame. Three blocks of
{LayerNorm + FiLM(noise embedding) + MLP} act per token, and after each block a learned ``S x S`` matrix mixes all
frames (then a Linear), so every future frame sees every context frame: a local (±1 frame) temporal receptive field
makes late future frames blind to the context.

The condition is a :class:`FrameContext` (the clean context frames ``[B, n_context, *frame]``), a plain float
tensor of that shape, or None (no context: every mask is zero). :class:`FrameContext` is a structured condition in
the sense of :func:`steerdiff.core.denoiser.is_structured_cond`, so :func:`steerdiff.sample` passes it through
unchanged (its null is "no context"; the network declares no label classes, so the guiders refuse it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .embed import FourierFeatures, json_config
from .io import register_model


class FrameContext:
    """Clean context frames as a structured condition: ``frames: [B, n_context, *frame]`` (float).

    ``null=True`` marks rows without context (the null counterpart guiders build): the network then sees zero
    context frames and zero masks. Implements the structured-condition protocol of :mod:`steerdiff.core`
    (``batch_size``, ``null_like``, ``index``, ``cat``).

    Raises:
        ValueError: ``frames`` is not a float tensor with a batch axis, a context axis of length >= 1 and a frame.
    """

    is_structured_cond = True

    def __init__(self, frames: Tensor, null: Tensor | bool = False):
        if not isinstance(frames, Tensor) or not frames.is_floating_point() or frames.ndim < 3:
            raise ValueError("context must be a float tensor [B, n_context, *frame] with n_context >= 1, got "
                             f"{getattr(frames, 'shape', type(frames).__name__)}")
        if frames.shape[1] < 1:
            raise ValueError(f"context must hold at least one frame (n_context >= 1), got shape {tuple(frames.shape)}")
        self.frames = frames
        if isinstance(null, bool):
            null = torch.full((frames.shape[0],), null, dtype=torch.bool, device=frames.device)
        if null.shape != (frames.shape[0],):
            raise ValueError(f"null must be a bool or a bool tensor [B]={frames.shape[0]}, got {tuple(null.shape)}")
        self.null = null.to(torch.bool)

    @property
    def batch_size(self) -> int:
        return int(self.frames.shape[0])

    @property
    def n_context(self) -> int:
        return int(self.frames.shape[1])

    def null_like(self) -> FrameContext:
        return FrameContext(torch.zeros_like(self.frames), True)

    def index(self, rows) -> FrameContext:
        return FrameContext(self.frames[rows], self.null[rows])

    def repeat_interleave(self, k: int) -> FrameContext:
        """Each row repeated ``k`` times in place (ensemble members of one case side by side)."""
        return FrameContext(self.frames.repeat_interleave(k, dim=0), self.null.repeat_interleave(k, dim=0))

    def to(self, *args, **kwargs) -> FrameContext:
        frames = self.frames.to(*args, **kwargs)
        return FrameContext(frames, self.null.to(frames.device))

    @classmethod
    def cat(cls, conds: Sequence[FrameContext]) -> FrameContext:
        return cls(torch.cat([c.frames for c in conds]), torch.cat([c.null for c in conds]))

    def __repr__(self) -> str:
        return f"FrameContext(frames={tuple(self.frames.shape)}, null={int(self.null.sum())} rows)"


def as_frame_context(cond, batch: int, frame: tuple[int, ...]) -> FrameContext | None:
    """``cond`` as a :class:`FrameContext` (a float tensor is wrapped), checked against the batch and frame shape.

    Raises:
        ValueError: wrong type, batch size or frame shape (the message names ``cond``).
    """
    if cond is None:
        return None
    if isinstance(cond, Tensor):
        cond = FrameContext(cond)
    if not isinstance(cond, FrameContext):
        raise ValueError(f"cond must be a FrameContext, a float tensor [B, n_context, *frame] or None, got "
                         f"{type(cond).__name__}")
    if cond.batch_size != batch:
        raise ValueError(f"cond: context has {cond.batch_size} rows but x has B={batch}")
    if tuple(cond.frames.shape[2:]) != tuple(frame):
        raise ValueError(f"cond: context frames have shape {tuple(cond.frames.shape[2:])} but the sequence's frames "
                         f"have shape {tuple(frame)}")
    return cond


class _Block(nn.Module):
    """LayerNorm + FiLM(noise embedding) + MLP on each token, then global frame mixing ``Linear(T h)``."""

    def __init__(self, width: int, emb_dim: int, frames: int, hidden_mult: int = 2):
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.film = nn.Linear(emb_dim, 2 * width)
        hidden = hidden_mult * width
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, width))
        self.mix_norm = nn.LayerNorm(width)
        self.time_mix = nn.Parameter(torch.full((frames, frames), 1.0 / frames))  # learned S x S frame mixing
        self.mix_out = nn.Linear(width, width)

    def forward(self, h: Tensor, emb: Tensor) -> Tensor:
        scale, shift = self.film(emb)[:, None, :].chunk(2, dim=-1)
        h = h + self.mlp(self.norm(h) * (1 + scale) + shift)
        mixed = torch.einsum("st,btc->bsc", self.time_mix, self.mix_norm(h))
        return h + self.mix_out(mixed)


@register_model()
class FrameMixer(nn.Module):
    """Forecasting backbone ``F(x_in [B, S, *frame], c_noise [B], cond) -> [B, S, *frame]`` (the network of the
    validation protocol).

    Args:
        frames: sequence length ``S`` (context + future).
        frame_shape: shape of one frame, e.g. ``[32]`` (1-D field) or ``[16, 16]`` (2-D field).
        n_context: number of context frames ``S_c`` (1 <= S_c < S); fixes the mask channels.
        width: token width (128 in the validation protocol).
        blocks: number of FiLM MLP blocks (3 in the validation protocol).
        fourier_dim, emb_dim: Fourier features of ``c_noise`` and the width of the noise embedding.
    """

    def __init__(self, frames: int = 10, frame_shape: Sequence[int] = (32,), n_context: int = 4, width: int = 128,
                 blocks: int = 3, fourier_dim: int = 32, emb_dim: int = 128):
        super().__init__()
        frame_shape = tuple(int(v) for v in frame_shape)
        if frames < 2 or not frame_shape or min(frame_shape) < 1:
            raise ValueError(f"frames must be >= 2 and frame_shape non-empty and positive, got {frames}, "
                             f"{list(frame_shape)}")
        if not 1 <= n_context < frames:
            raise ValueError(f"n_context must lie in [1, frames) = [1, {frames}), got {n_context}")
        if width < 1 or blocks < 1:
            raise ValueError(f"width and blocks must be >= 1, got {width}, {blocks}")
        self.config = json_config(frames=frames, frame_shape=list(frame_shape), n_context=n_context, width=width,
                                  blocks=blocks, fourier_dim=fourier_dim, emb_dim=emb_dim)
        self.frames, self.frame_shape, self.n_context = frames, frame_shape, n_context
        self.sample_shape = (frames, *frame_shape)
        self.num_classes: tuple[int, ...] = ()
        d = math.prod(frame_shape)
        self.d = d
        self.fourier = FourierFeatures(fourier_dim)
        self.emb = nn.Sequential(nn.Linear(fourier_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.tokens = nn.Linear(2 * d + 2, width)
        self.pos = nn.Parameter(torch.zeros(frames, width))
        self.blocks = nn.ModuleList(_Block(width, emb_dim, frames) for _ in range(blocks))
        self.out_norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, d)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def _context_channels(self, cond, batch: int, like: Tensor) -> Tensor:
        """``[B, S, d + 2]``: clean context frame (zeros on future frames), context mask, first-future mask."""
        ctx = as_frame_context(cond, batch, self.frame_shape)
        chans = like.new_zeros(batch, self.frames, self.d + 2)
        if ctx is None:
            return chans
        if ctx.n_context != self.n_context:
            raise ValueError(f"cond: context has {ctx.n_context} frames but the model was built for "
                             f"n_context={self.n_context}")
        keep = (~ctx.null).to(like.dtype)[:, None, None]
        chans[:, : self.n_context, : self.d] = ctx.frames.reshape(batch, self.n_context, self.d).to(like.dtype)
        chans[:, : self.n_context, self.d] = 1.0
        chans[:, self.n_context, self.d + 1] = 1.0
        return chans * keep

    def forward(self, x: Tensor, c_noise: Tensor, cond=None) -> Tensor:
        if tuple(x.shape[1:]) != self.sample_shape:
            raise ValueError(f"x must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(x.shape)}")
        b = x.shape[0]
        flat = x.reshape(b, self.frames, self.d)
        h = self.tokens(torch.cat([flat, self._context_channels(cond, b, flat)], dim=-1)) + self.pos
        emb = self.emb(self.fourier(c_noise).to(x.dtype))
        for block in self.blocks:
            h = block(h, emb)
        return self.out(self.out_norm(h)).reshape(x.shape)
