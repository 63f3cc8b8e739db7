"""The sequence transformer: the raw network of the all-at-once sequence denoiser (Cheng et al., "DAWN: Dynamic frame
Avatar With Non-autoregressive diffusion framework", 2025, Sec. 3, at CPU scale; docs/methods/sequence.md, "The model").

A small transformer over frame tokens with banded relative attention (:mod:`steerdiff.models.sequence_attention`) and
adaLN-Zero noise conditioning (DiT), so one set of weights denoises sequences of any length. Its EDM preconditioning
(the denoiser ``D``) is :class:`steerdiff.temporal.SequencePrecond`; the generators are in
:mod:`steerdiff.temporal.generate`. The registered class name ``SequenceTransformer`` is the ``"class"`` of saved
checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embed import FourierFeatures, json_config
from .io import register_model
from .sequence_attention import (
    attention_block,
    band_bias,
    blocked_attention,
    global_context_bias,
    local_band_bias,
    use_local_attention,
)


class _Block(nn.Module):
    """Pre-LN block with adaLN-Zero noise conditioning (DiT): banded relative attention, then an MLP."""

    def __init__(self, width: int, heads: int, window: int, mlp_ratio: float, global_context: bool = False):
        super().__init__()
        self.heads, self.window, self.global_context = heads, window, bool(global_context)
        if self.global_context:  # bias per head for a context token beyond the window (no position: any distance)
            self.ctx_bias = nn.Parameter(torch.zeros(heads))
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.rel_bias = nn.Parameter(torch.zeros(heads, 2 * window + 1))  # one bias per head and offset j - i
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, width))
        self.ada = nn.Linear(width, 6 * width)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, h: Tensor, emb: Tensor, n_ctx: int = 0, local: bool | None = None) -> Tensor:
        b, n, w = h.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(emb)[:, None].chunk(6, dim=-1)
        z = self.norm1(h) * (1 + scale1) + shift1
        q, k, v = self.qkv(z).reshape(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        n_ctx = n_ctx if self.global_context else 0
        local = use_local_attention(n, self.window) if local is None else local
        bias = self._bias(n, n_ctx, local, q.dtype)
        if local:
            attn = blocked_attention(q, k, v, bias, self.window, attention_block(self.window), n_ctx)
        else:
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])
        h = h + gate1 * self.proj(attn.transpose(1, 2).reshape(b, n, w))
        return h + gate2 * self.mlp(self.norm2(h) * (1 + scale2) + shift2)

    def _bias(self, n: int, n_ctx: int, local: bool, dtype: torch.dtype) -> Tensor:
        """The attention bias of ``n`` tokens (``n_ctx`` of them global context), for the block-local or the dense
        form. Without gradient it is kept between calls: a sampler calls the network with the same ``n`` at every
        step, and building the bias cost a quarter of the attention at 132 tokens. The key holds the parameters'
        storage and version counters, so an optimizer step or ``load_state_dict`` (both in place) rebuilds it."""
        params = (self.rel_bias, self.ctx_bias) if n_ctx else (self.rel_bias,)
        ctx_bias = self.ctx_bias if n_ctx else None

        def build() -> Tensor:
            if local:
                return local_band_bias(n, self.window, attention_block(self.window), self.rel_bias, n_ctx, ctx_bias)
            if n_ctx:
                return global_context_bias(n, n_ctx, self.window, self.rel_bias, self.ctx_bias)
            return band_bias(n, self.window, self.rel_bias)

        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return build().to(dtype)
        key = (n, n_ctx, local, dtype, *((p.device, p.data_ptr(), p._version) for p in params))
        cache = self.__dict__.setdefault("_bias_cache", {})
        if key not in cache:
            if len(cache) >= 8:  # lengths change rarely within a run; keep a few
                cache.clear()
            cache[key] = build().to(dtype)
        return cache[key]


@register_model()
class SequenceTransformer(nn.Module):
    """Raw network ``F(x_in [B, S, *frame], c_noise [B], signal [B, S, c], context_in [B, k, *frame]) -> like x_in``.

    Tokens: the ``k`` context frames (clean) then the ``S`` noisy frames, each ``Linear([frame, signal, is_context])``
    (the context tokens carry a zero signal). Attention is restricted to ``|i - j| <= window`` with a learned bias per
    head and offset; a frame therefore sees ``depth * window`` frames either way, whatever ``S`` is. With
    ``global_context=True`` the context tokens are global (DAWN conditions every frame on its source frame): every
    frame attends to every context token at any distance (the relative bias within ``window``, one learned bias per
    head beyond it, so no absolute position enters), and the context tokens attend to each other only; frame-frame
    attention keeps the band. The noise level
    enters every block by adaLN-Zero, and the zero-initialised output layer makes the preconditioned denoiser start as
    ``c_skip x`` (EDM's start).

    Args:
        frame_shape: shape of one frame (``[2]`` for a 2-D point).
        signal_dim: channels of the driving signal per frame.
        width: token width. depth: blocks. heads: attention heads (divide ``width``).
        window: attention reach in frames. mlp_ratio: MLP hidden width over ``width``.
        fourier_dim: Fourier features of ``c_noise``.
        global_context: make the context tokens global (see above); False keeps the banded attention everywhere.
            The key enters ``config`` only when True, so configs and checkpoints written before it load unchanged.
    """

    def __init__(self, frame_shape: Sequence[int] = (2,), signal_dim: int = 2, width: int = 64, depth: int = 4,
                 heads: int = 4, window: int = 8, mlp_ratio: float = 4.0, fourier_dim: int = 32,
                 global_context: bool = False):
        super().__init__()
        frame_shape = tuple(int(v) for v in frame_shape)
        self.config = json_config(frame_shape=frame_shape, signal_dim=signal_dim, width=width, depth=depth,
                                  heads=heads, window=window, mlp_ratio=mlp_ratio, fourier_dim=fourier_dim)
        if not isinstance(global_context, bool):
            raise ValueError(f"global_context must be a bool, got {global_context!r}")
        self.global_context = global_context
        if global_context:
            self.config["global_context"] = True
        if not frame_shape or min(frame_shape) < 1 or signal_dim < 1 or depth < 1 or window < 1:
            raise ValueError(f"SequenceTransformer needs a non-empty positive frame_shape and signal_dim, depth, "
                             f"window >= 1, got {self.config}")
        if width < 1 or heads < 1 or width % heads:
            raise ValueError(f"width must be a positive multiple of heads, got width={width}, heads={heads}")
        self.frame_shape, self.signal_dim, self.window, self.depth = frame_shape, int(signal_dim), int(window), depth
        self.frame_dim = math.prod(frame_shape)
        self.inp = nn.Linear(self.frame_dim + signal_dim + 1, width)
        self.fourier = FourierFeatures(fourier_dim)
        self.noise = nn.Sequential(nn.Linear(fourier_dim, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU())
        self.blocks = nn.ModuleList(_Block(width, heads, window, mlp_ratio, global_context) for _ in range(depth))
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.ada = nn.Linear(width, 2 * width)
        self.out = nn.Linear(width, self.frame_dim)
        for layer in (self.ada, self.out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    @property
    def receptive_field(self) -> int:
        """Frames on either side that can influence a frame's output: ``depth * window`` (with ``global_context``,
        the context frames influence every frame besides)."""
        return self.depth * self.window

    #: Inference runs at most this many tokens (rows x (k + S)) through the network at once, splitting the batch into
    #: groups of rows (exact: rows are independent). On a CPU a long sequence's activations at batch 64 outgrow the
    #: cache and cost about 25% more per token than groups of ~16 rows (measured at S = 128). Not a config entry (it
    #: changes no weights nor outputs); None: never split. Gradient-tracking calls (training) are never split.
    max_tokens: int | None = 2048
    #: The form of the attention: None picks by the number of tokens (:func:`use_local_attention`), True forces the
    #: block-local form (:func:`blocked_attention`), False the masked dense one (same outputs; for timing them
    #: against each other), with or without ``global_context``. Not a config entry, like ``max_tokens``.
    local_attention: bool | None = None

    def forward(self, x_in: Tensor, c_noise: Tensor, signal: Tensor, context_in: Tensor | None = None) -> Tensor:
        b, s = x_in.shape[:2]
        n = s + (0 if context_in is None else context_in.shape[1])
        if self.max_tokens is not None and b > 1 and b * n > self.max_tokens and not torch.is_grad_enabled():
            rows = max(1, self.max_tokens // n)
            c_noise = c_noise.reshape(-1).expand(b) if c_noise.numel() in (1, b) else c_noise
            return torch.cat([self._forward(x_in[i:i + rows], c_noise[i:i + rows], signal[i:i + rows],
                                            None if context_in is None else context_in[i:i + rows])
                              for i in range(0, b, rows)])
        return self._forward(x_in, c_noise, signal, context_in)

    def _forward(self, x_in: Tensor, c_noise: Tensor, signal: Tensor, context_in: Tensor | None) -> Tensor:
        b, s = x_in.shape[:2]
        frames = x_in.reshape(b, s, self.frame_dim)
        tokens = torch.cat([frames, signal.to(frames.dtype), frames.new_zeros(b, s, 1)], dim=2)
        k = 0 if context_in is None else context_in.shape[1]
        if k:
            ctx = context_in.reshape(b, k, self.frame_dim).to(frames.dtype)
            tokens = torch.cat([torch.cat([ctx, ctx.new_zeros(b, k, self.signal_dim), ctx.new_ones(b, k, 1)], 2),
                                tokens], dim=1)
        h = self.inp(tokens)
        emb = self.noise(self.fourier(c_noise).to(h.dtype))
        for block in self.blocks:
            h = block(h, emb, k, self.local_attention)
        shift, scale = self.ada(emb)[:, None].chunk(2, dim=-1)
        return self.out(self.norm(h[:, k:]) * (1 + scale) + shift).reshape(x_in.shape)
