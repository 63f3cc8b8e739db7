"""Spatial frame-sequence backbone for forecasting 2-D fields on a periodic grid: per-frame circular conv stacks with
FiLM on the noise embedding and the global learned frame mixing of :class:`~steerdiff.models.frames.FrameMixer`
(Dynamical Diffusion, Guo et al., ICLR 2025; docs/methods/dydiff.md "The validation protocol" and "Results", with
the context conditioning of the official code, docs/methods/dydiff.md "API").

Raw network ``F(x_in, c_noise, cond)`` on a sequence ``x_in: [B, S, H, W]`` (frames on axis 1), to be wrapped by
:class:`~steerdiff.models.precond.EDMPrecond` exactly as ``FrameMixer``. Each frame is a 4-channel image
``[x_s, ctx_s, mask_s, first_future_s]`` (the official code's ``concat-video-mask-1st`` channels, the masks constant
over the frame): the noisy frame, the clean context frame (zeros on future frames), 1 on context frames, 1 on the first
future frame. A circular 3x3 convolution lifts it to ``channels`` feature maps (plus a learned per-frame bias, constant
in space), then one residual block per dilation acts per frame: {GroupNorm + FiLM(noise embedding) + dilated circular
3x3 conv + SiLU + 1x1 conv}, and after each block a learned ``S x S`` matrix mixes all frames pixel by pixel (then a 1x1
conv), so every future frame sees every context frame (a local temporal receptive field leaves late future frames blind
to the context).

Every spatial operation is a circular convolution, a per-channel normalisation over the whole frame or a pointwise
map, so the network commutes with circular shifts of all frames (the advection-diffusion process does too); the
FrameMixer's one Linear per 256-value frame has no such structure. Dilations ``[1, 2, 3]`` give a receptive field of
8 cells from each pixel (the advection moves a feature (4.5, 3) cells from the last context frame to the last future
frame) at the cost of 5 convolutions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .embed import FourierFeatures, json_config
from .frames import as_frame_context
from .io import register_model

CHUNK = 16  # sequences per forward pass (see FrameConv.forward)


def circular_pad(x: Tensor, p: int) -> Tensor:
    """``x: [..., H, W]`` padded by ``p`` cells on each side with its periodic continuation (``p <= H, W``)."""
    if p == 0:
        return x
    x = torch.cat([x[..., -p:], x, x[..., :p]], dim=-1)
    return torch.cat([x[..., -p:, :], x, x[..., :p, :]], dim=-2)


class _CircularConv(nn.Conv2d):
    """``kernel x kernel`` convolution (dilation ``d``) on a periodic grid: output size = input size."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1):
        super().__init__(c_in, c_out, kernel, dilation=dilation)
        self.pad = dilation * (kernel // 2)

    def forward(self, x: Tensor) -> Tensor:
        # an explicit wrap then a valid convolution: ~2x faster on CPU than padding_mode="circular"
        return super().forward(circular_pad(x, self.pad))


def _groups(channels: int) -> int:
    # GroupNorm over the whole frame keeps the shift equivariance; 8 groups where the width allows.
    return next(g for g in (8, 4, 2, 1) if channels % g == 0)


class _ConvBlock(nn.Module):
    """GroupNorm + FiLM(noise embedding) + circular conv (dilation ``d``) + SiLU + 1x1 conv on each frame, then
    global frame mixing."""

    def __init__(self, channels: int, emb_dim: int, frames: int, kernel: int, dilation: int):
        super().__init__()
        self.norm = nn.GroupNorm(_groups(channels), channels, affine=False)
        self.film = nn.Linear(emb_dim, 2 * channels)
        self.conv1 = _CircularConv(channels, channels, kernel, dilation)
        self.conv2 = nn.Conv2d(channels, channels, 1)
        self.act = nn.SiLU()
        self.mix_norm = nn.GroupNorm(_groups(channels), channels)
        self.time_mix = nn.Parameter(torch.full((frames, frames), 1.0 / frames))  # learned S x S frame mixing
        self.mix_out = nn.Conv2d(channels, channels, 1)

    def forward(self, h: Tensor, emb: Tensor, frames: int) -> Tensor:
        # h: [B * S, C, H, W] (frames of one sequence adjacent); emb: [B, emb_dim]
        bs, c, hh, ww = h.shape
        scale, shift = self.film(emb).repeat_interleave(frames, dim=0)[:, :, None, None].chunk(2, dim=1)
        h = h + self.conv2(self.act(self.conv1(self.norm(h) * (1 + scale) + shift)))
        mixed = torch.einsum("st,btchw->bschw", self.time_mix, self.mix_norm(h).reshape(-1, frames, c, hh, ww))
        return h + self.mix_out(mixed.reshape(bs, c, hh, ww))


@register_model()
class FrameConv(nn.Module):
    """Spatial forecasting backbone ``F(x_in [B, S, H, W], c_noise [B], cond) -> [B, S, H, W]`` on a periodic grid.

    Args:
        frames: sequence length ``S`` (context + future).
        frame_shape: ``[H, W]`` of one frame (e.g. ``[16, 16]``).
        n_context: number of context frames ``S_c`` (1 <= S_c < S); fixes the mask channels.
        channels: feature maps per frame.
        dilations: one residual conv block per entry (each followed by the frame mixing), its convolution's
            dilation; ``[1, 2, 3]`` with the 3x3 input and output convolutions reaches 8 cells from a pixel.
        kernel: odd convolution size.
        fourier_dim, emb_dim: Fourier features of ``c_noise`` and the width of the noise embedding.
    """

    def __init__(self, frames: int = 10, frame_shape: Sequence[int] = (16, 16), n_context: int = 4,
                 channels: int = 32, dilations: Sequence[int] = (1, 2, 3), kernel: int = 3, fourier_dim: int = 32,
                 emb_dim: int = 128):
        super().__init__()
        frame_shape = tuple(int(v) for v in frame_shape)
        if frames < 2:
            raise ValueError(f"frames must be >= 2, got {frames}")
        if len(frame_shape) != 2 or min(frame_shape) < 1:
            raise ValueError(f"frame_shape must be [H, W] with H, W >= 1 (a 2-D frame), got {list(frame_shape)}")
        if not 1 <= n_context < frames:
            raise ValueError(f"n_context must lie in [1, frames) = [1, {frames}), got {n_context}")
        dilations = [int(d) for d in dilations]
        if channels < 1 or not dilations or min(dilations) < 1:
            raise ValueError(f"channels must be >= 1 and dilations a non-empty list of ints >= 1, got {channels}, "
                             f"{dilations}")
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"kernel must be an odd int >= 1, got {kernel}")
        if max(dilations) * (kernel // 2) > min(frame_shape):
            raise ValueError(f"dilations: a dilation of {max(dilations)} wraps more than once around a "
                             f"{list(frame_shape)} frame")
        self.config = json_config(frames=frames, frame_shape=list(frame_shape), n_context=n_context,
                                  channels=channels, dilations=dilations, kernel=kernel, fourier_dim=fourier_dim,
                                  emb_dim=emb_dim)
        self.frames, self.frame_shape, self.n_context = frames, frame_shape, n_context
        self.sample_shape = (frames, *frame_shape)
        self.num_classes: tuple[int, ...] = ()
        self.fourier = FourierFeatures(fourier_dim)
        self.emb = nn.Sequential(nn.Linear(fourier_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.inp = _CircularConv(4, channels, kernel)
        self.pos = nn.Parameter(torch.zeros(frames, channels))  # per-frame bias, constant in space
        self.blocks = nn.ModuleList(_ConvBlock(channels, emb_dim, frames, kernel, d) for d in dilations)
        self.out_norm = nn.GroupNorm(_groups(channels), channels)
        self.out = _CircularConv(channels, 1, kernel)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def _context_channels(self, cond, batch: int, like: Tensor) -> Tensor:
        """``[B, S, 3, H, W]``: clean context frame (zeros on future frames), context mask, first-future mask."""
        ctx = as_frame_context(cond, batch, self.frame_shape)
        chans = like.new_zeros(batch, self.frames, 3, *self.frame_shape)
        if ctx is None:
            return chans
        if ctx.n_context != self.n_context:
            raise ValueError(f"cond: context has {ctx.n_context} frames but the model was built for "
                             f"n_context={self.n_context}")
        keep = (~ctx.null).to(like.dtype)[:, None, None, None, None]
        chans[:, : self.n_context, 0] = ctx.frames.to(like.dtype)
        chans[:, : self.n_context, 1] = 1.0
        chans[:, self.n_context, 2] = 1.0
        return chans * keep

    def forward(self, x: Tensor, c_noise: Tensor, cond=None) -> Tensor:
        if tuple(x.shape[1:]) != self.sample_shape:
            raise ValueError(f"x must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(x.shape)}")
        b = x.shape[0]
        c_noise = torch.as_tensor(c_noise, dtype=x.dtype, device=x.device)
        c_noise = c_noise.expand(b) if c_noise.ndim == 0 else c_noise
        chans = self._context_channels(cond, b, x)
        if b <= CHUNK:
            return self._forward(x, c_noise, chans)
        # rows are independent: chunks keep the feature maps in cache (on one CPU thread a batch of 1024 sequences
        # runs ~6x slower per row than chunks of 16)
        return torch.cat([self._forward(x[i: i + CHUNK], c_noise[i: i + CHUNK], chans[i: i + CHUNK])
                          for i in range(0, b, CHUNK)])

    def _forward(self, x: Tensor, c_noise: Tensor, chans: Tensor) -> Tensor:
        b, s = x.shape[0], self.frames
        inp = torch.cat([x[:, :, None], chans], dim=2)  # [B, S, 4, H, W]
        h = self.inp(inp.reshape(b * s, 4, *self.frame_shape))
        h = h + self.pos.repeat(b, 1)[:, :, None, None]
        emb = self.emb(self.fourier(c_noise).to(x.dtype))
        for block in self.blocks:
            h = block(h, emb, s)
        return self.out(self.out_norm(h)).reshape(x.shape)
