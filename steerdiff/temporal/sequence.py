"""All-at-once (non-autoregressive) sequence generation: DAWN (Cheng et al. 2025, "DAWN: Dynamic frame Avatar With
Non-autoregressive diffusion framework"), at CPU scale.

DAWN's claim (Sec. 1, Introduction; Sec. 3, the Audio-to-Video Flow Diffusion Model) is that a diffusion model can
denoise *all* frames of a sequence of any length at once, conditioned on a per-frame driving signal (audio) and a
known source frame, instead of the autoregressive or semi-autoregressive strategy (generate a chunk conditioned on the
last generated frames, then the next) whose context stops at the chunk, whose errors accumulate and whose chunks run
one after the other. This module has both strategies over one network:

* :class:`SequenceTransformer`, a small transformer over frame tokens whose attention sees only frames within
  ``window`` of each other and adds a learned bias per relative offset (no absolute position anywhere), so the same
  weights apply to any sequence length and a frame far from the ends is computed the same way at any time. The
  banded relative attention is our choice for length extrapolation at this scale, not the paper's exact module.
* :class:`SequencePrecond`, EDM preconditioning (``steerdiff.models.precond.edm_scalings``) for a sequence whose
  length varies from call to call; it is the denoiser ``D(x [B, S, *frame], sigma [B], cond)``.
* :class:`SequenceCond`, the condition: the driving signal ``[B, S, signal_dim]`` aligned with the frames and the
  known past frames ``[B, k, *frame]`` (clean, given as extra tokens just before the first frame).
* :func:`generate_sequence` (all S frames jointly, one sampler run) and :func:`generate_autoregressive` (the
  baseline: chunks of ``chunk`` frames, each conditioned on the last ``overlap`` frames generated before it).

Training lives in :mod:`steerdiff.temporal.sequence_train`; the task in :mod:`steerdiff.data.driven`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.denoiser import append_dims, as_sigma_batch
from ..core.noise import randn
from ..core.sampling import sample
from ..core.sigmas import karras
from ..models.embed import FourierFeatures, json_config
from ..models.io import build_model, model_spec, register_model
from ..models.precond import edm_scalings


def _check_float(t: object, name: str, ndim: int | None = None) -> Tensor:
    if not isinstance(t, Tensor) or not t.is_floating_point():
        got = f"dtype {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a floating-point tensor, got {got}")
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite (it holds NaN or inf)")
    return t


class SequenceCond:
    """Condition of a sequence denoiser: a driving signal per frame and optional known past frames.

    A structured condition in the sense of :func:`steerdiff.core.denoiser.is_structured_cond` (tensors with a batch
    axis), so ``steerdiff.sample`` passes it through to the denoiser.

    Args:
        signal: ``[B, S, signal_dim]``, row ``t`` driving frame ``t`` of the frames to generate.
        context: ``[B, k, *frame]`` clean frames just before frame 0 (DAWN's source frame; the autoregressive
            baseline's last generated frames), or None (``k = 0``).
    """

    is_structured_cond = True

    def __init__(self, signal: Tensor, context: Tensor | None = None):
        self.signal = _check_float(signal, "signal (the driving signal [B, S, signal_dim])", 3)
        if context is not None:
            context = _check_float(context, "context (the known frames [B, k, *frame])")
            if context.ndim < 3 or context.shape[0] != signal.shape[0]:
                raise ValueError(f"context must be [B, k, *frame] with B={signal.shape[0]} (the signal's batch), got "
                                 f"shape {tuple(context.shape)}")
        self.context = context

    @property
    def batch_size(self) -> int:
        return int(self.signal.shape[0])

    @property
    def length(self) -> int:
        """Number of frames the signal drives, ``S``."""
        return int(self.signal.shape[1])

    def null_like(self) -> SequenceCond:
        raise ValueError("a SequenceCond has no null condition: sequence models are trained without signal dropout, "
                         "so guidance (CFG/APG) does not apply to them")

    def index(self, rows: Tensor | Sequence[int]) -> SequenceCond:
        rows = torch.as_tensor(rows, dtype=torch.long)
        return SequenceCond(self.signal[rows], None if self.context is None else self.context[rows])

    @classmethod
    def cat(cls, conds: Sequence[SequenceCond]) -> SequenceCond:
        if any(c.context is None for c in conds) and not all(c.context is None for c in conds):
            raise ValueError("cannot concatenate SequenceConds with and without context")
        ctx = None if conds[0].context is None else torch.cat([c.context for c in conds])
        return cls(torch.cat([c.signal for c in conds]), ctx)


def relative_band(n: int, window: int, device=None) -> tuple[Tensor, Tensor]:
    """Offsets ``j - i`` clipped into ``[0, 2 window]`` (as bias-table indices) and the band mask ``|j - i| <= window``
    for ``n`` tokens, each ``[n, n]``."""
    pos = torch.arange(n, device=device)
    offset = pos[None, :] - pos[:, None]
    return (offset.clamp(-window, window) + window), offset.abs() <= window


def band_bias(n: int, window: int, rel_bias: Tensor) -> Tensor:
    """Additive attention bias ``[heads, n, n]`` of the banded relative attention: ``rel_bias [heads, 2 window + 1]``
    at offset ``j - i`` where ``|j - i| <= window``, ``-inf`` elsewhere."""
    index, band = relative_band(n, window, rel_bias.device)
    return rel_bias[:, index].masked_fill(~band, float("-inf"))


def dense_band_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, window: int) -> Tensor:
    """Attention of ``q, k, v [B, heads, n, d]`` restricted to ``|j - i| <= window``, plus ``rel_bias [heads, 2 window
    + 1]`` at offset ``j - i``, over the full ``n x n`` score matrix (masked): time and memory grow as ``n^2``."""
    bias = band_bias(q.shape[2], window, rel_bias).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])


#: Smallest block of the block-local attention: blocks of a few tokens make many tiny matrix products, slower on a
#: CPU than fewer larger ones that score a few more keys.
MIN_ATTENTION_BLOCK = 16


def attention_block(window: int) -> int:
    """The block length of the block-local attention for ``window``: ``max(window, MIN_ATTENTION_BLOCK)``."""
    return max(int(window), MIN_ATTENTION_BLOCK)


def local_band_bias(n: int, window: int, block: int, rel_bias: Tensor, n_ctx: int = 0,
                    ctx_bias: Tensor | None = None) -> Tensor:
    """Bias of :func:`blocked_attention` for ``n`` tokens in blocks of ``block``: ``[heads, n_blocks, block, L]``
    with ``L = block + 2 window``, query ``u`` of block ``i`` (token ``i block + u``) against key ``t`` of its window
    (token ``i block - window + t``); ``rel_bias`` at offset ``j - i`` inside the band, ``-inf`` outside it and at
    keys past either end. Query rows past ``n`` (padding, dropped from the output) see every key, so no row is
    all ``-inf``.

    With ``ctx_bias [heads]`` the first ``n_ctx`` tokens are global context (:func:`global_context_bias`): the
    bias gets ``n_ctx`` more keys in front, the context tokens, holding ``ctx_bias`` for a frame query farther
    than ``window`` from them (nearer ones are scored in the window already), and context queries see no frame."""
    w, dev = int(window), rel_bias.device
    blocks = -(-n // block)
    query = torch.arange(blocks, device=dev)[:, None] * block + torch.arange(block, device=dev)  # [blocks, block]
    key = torch.arange(blocks, device=dev)[:, None] * block - w + torch.arange(block + 2 * w, device=dev)
    offset = key[:, None, :] - query[:, :, None]  # [blocks, block, L]
    allowed = (offset.abs() <= w) & ((key >= 0) & (key < n))[:, None, :]
    if ctx_bias is not None:
        allowed &= ~((query < n_ctx)[:, :, None] & (key >= n_ctx)[:, None, :])
    padding = (query >= n)[:, :, None]
    bias = rel_bias[:, offset.clamp(-w, w) + w].masked_fill(~(allowed | padding), float("-inf"))
    if ctx_bias is None:
        return bias
    far = (torch.arange(n_ctx, device=dev) - query[:, :, None]).abs() > w  # [blocks, block, n_ctx]
    frame_query = ((query >= n_ctx) & (query < n))[:, :, None]
    ctx = ctx_bias[:, None, None, None].expand(-1, blocks, block, n_ctx).to(bias.dtype)
    return torch.cat([ctx.masked_fill(~(far & frame_query), float("-inf")), bias], dim=-1)


def blocked_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, window: int, block: int,
                      n_ctx: int = 0) -> Tensor:
    """Attention of ``q, k, v [B, heads, n, d]`` block-locally with the bias of :func:`local_band_bias` (same
    ``window``, ``block`` and ``n_ctx``): the queries are cut into blocks of ``block`` tokens and each block scores
    only the ``block + 2 window`` keys around it (windows of the keys, one strided view; and the ``n_ctx`` context
    keys in front when the bias has them). Time and memory grow as ``n (block + 2 window)`` instead of ``n^2``."""
    b, h, n, d = q.shape
    w = int(window)
    blocks = -(-n // block)
    pad = blocks * block - n
    span = block + 2 * w
    if tuple(bias.shape[-3:]) != (blocks, block, n_ctx + span):
        raise ValueError(f"bias must end in [{blocks}, {block}, {n_ctx + span}] (local_band_bias of {n} tokens, block "
                         f"{block}, window {w}, n_ctx {n_ctx}), got {tuple(bias.shape)}")
    keys = F.pad(k, (0, 0, w, pad + w)).unfold(2, span, block)  # [B, heads, blocks, d, L]
    values = F.pad(v, (0, 0, w, pad + w)).unfold(2, span, block).transpose(-1, -2)  # [B, heads, blocks, L, d]
    if n_ctx:
        keys = torch.cat([k[:, :, None, :n_ctx].transpose(-1, -2).expand(-1, -1, blocks, -1, -1), keys], dim=-1)
        values = torch.cat([v[:, :, None, :n_ctx].expand(-1, -1, blocks, -1, -1), values], dim=-2)
    queries = F.pad(q * d**-0.5, (0, 0, 0, pad)).reshape(b, h, blocks, block, d)
    scores = torch.matmul(queries, keys)
    scores += bias
    return torch.matmul(scores.softmax(-1), values).reshape(b, h, blocks * block, d)[:, :, :n]


def local_band_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, window: int,
                         block: int | None = None) -> Tensor:
    """The same attention as :func:`dense_band_attention` (``|j - i| <= window``, ``rel_bias`` at offset ``j - i``),
    computed block-locally (:func:`blocked_attention`) in blocks of ``block >= 1`` tokens (default
    :func:`attention_block`). Equal to the dense form up to float rounding."""
    w = int(window)
    block = attention_block(w) if block is None else block
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1 (tokens per block), got {block!r}")
    bias = local_band_bias(q.shape[2], w, block, rel_bias).to(q.dtype)
    return blocked_attention(q, k, v, bias, w, block)


#: From this many tokens the banded attention runs block-locally (:func:`use_local_attention`), for
#: ``window <= MIN_ATTENTION_BLOCK``; measured on one CPU thread (docs/methods/sequence.md).
LOCAL_ATTENTION_FROM = 192


def use_local_attention(n: int, window: int) -> bool:
    """Whether ``n`` tokens run the block-local form by default: from ``LOCAL_ATTENTION_FROM`` tokens, scaled by
    ``attention_block(window) / MIN_ATTENTION_BLOCK`` for wider windows."""
    return n >= LOCAL_ATTENTION_FROM * attention_block(window) // MIN_ATTENTION_BLOCK


def band_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, window: int,
                   local: bool | None = None) -> Tensor:
    """Banded relative attention, block-local (:func:`local_band_attention`) or one dense call (the same output up to
    float rounding). ``local`` None picks by length (:func:`use_local_attention`); True / False force either form."""
    if use_local_attention(q.shape[2], window) if local is None else local:
        return local_band_attention(q, k, v, rel_bias, window)
    return dense_band_attention(q, k, v, rel_bias, window)


def global_context_bias(n: int, k: int, window: int, rel_bias: Tensor, ctx_bias: Tensor) -> Tensor:
    """Additive attention bias ``[heads, n, n]`` for ``k`` context tokens followed by ``n - k`` frames, with the
    context as global tokens: a frame attends to the frames within ``window`` (bias ``rel_bias`` at offset ``j - i``)
    and to *every* context token (``rel_bias`` at its offset when within ``window``, else the position-free
    ``ctx_bias [heads]``); a context token attends to the context tokens only (banded, relative), so the context is
    encoded independently of the frames and a frame's dependence on other frames stays within the band."""
    index, band = relative_band(n, window, rel_bias.device)
    bias = rel_bias[:, index]
    is_ctx = torch.arange(n, device=rel_bias.device) < k
    far_ctx = is_ctx[None, :] & ~is_ctx[:, None] & ~band  # frame query, context key beyond the window
    bias = torch.where(far_ctx[None], ctx_bias[:, None, None].to(bias.dtype), bias)
    allowed = band | far_ctx
    allowed &= ~(is_ctx[:, None] & ~is_ctx[None, :])  # context queries never see frames
    return bias.masked_fill(~allowed, float("-inf"))


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


def _sample_seeds(seed: int, batch: int, part: int) -> list[int]:
    """One torch seed per sample and chunk, hashed from ``(seed, row, part)`` (rows and chunks never collide)."""
    return [int(np.random.SeedSequence([seed, i, part]).generate_state(1, np.uint64)[0] >> 1) for i in range(batch)]


def _frame_shape(model, context: Tensor | None) -> tuple[int, ...]:
    shape = getattr(model, "frame_shape", None)
    if shape is None and context is not None:
        shape = tuple(context.shape[2:])
    if shape is None:
        raise ValueError("model has no frame_shape attribute: pass context= (its frames give the frame shape)")
    return tuple(shape)


def _check_request(signal: Tensor, length: int | None, context: Tensor | None) -> int:
    _check_float(signal, "signal (the driving signal [B, S, signal_dim])", 3)
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be an int >= 1 (frames to generate), got {length!r}")
        if length != signal.shape[1]:
            raise ValueError(f"signal has {signal.shape[1]} frames but length={length} frames were requested: the "
                             f"driving signal must give one row per generated frame ([B, {length}, signal_dim])")
    if signal.shape[1] < 1:
        raise ValueError("signal must have at least one frame")
    if context is not None:
        SequenceCond(signal, context)  # validates its form and batch
    return int(signal.shape[1])


def generate_sequence(model, signal: Tensor, context: Tensor | None = None, *, length: int | None = None,
                      steps: int = 16, sigma_min: float = 0.002, sigma_max: float = 80.0, method: str = "heun",
                      seed: int = 0, return_stats: bool = False):
    """Generate all ``S`` frames jointly (DAWN's non-autoregressive strategy): one sampler run over the whole sequence.

    Args:
        model: a sequence denoiser ``D(x [B, S, *frame], sigma, SequenceCond)`` (a :class:`SequencePrecond`).
        signal: ``[B, S, signal_dim]`` driving signal, one row per frame to generate.
        context: ``[B, k, *frame]`` known frames before the first one, or None.
        length: the number of frames wanted; must equal ``signal.shape[1]`` when given (a check, not a crop).
        steps, sigma_min, sigma_max: the Karras schedule (``steerdiff.sigmas.karras``).
        method: a registered sampler (``heun`` by default).
        seed: sample ``i`` draws its noise from a seed hashed from ``(seed, i)``, independent of the batch.
        return_stats: also return ``{"nfe", "calls", "wall_time", "frames"}``.

    Returns:
        Frames ``[B, S, *frame]`` (and the stats).
    """
    s = _check_request(signal, length, context)
    shape = (signal.shape[0], s, *_frame_shape(model, context))
    start = time.perf_counter()
    noise = randn(shape, _sample_seeds(seed, shape[0], 0), dtype=signal.dtype, device=signal.device)
    sigmas = karras(steps, sigma_min, sigma_max).to(signal.dtype)
    out, st = sample(model, noise, sigmas, method=method, cond=SequenceCond(signal, context), return_stats=True)
    stats = {"nfe": st.nfe, "calls": st.calls, "wall_time": time.perf_counter() - start, "frames": s}
    return (out, stats) if return_stats else out


def generate_autoregressive(model, signal: Tensor, context: Tensor | None = None, *, chunk: int = 16,
                            overlap: int = 4, length: int | None = None, steps: int = 16, sigma_min: float = 0.002,
                            sigma_max: float = 80.0, method: str = "heun", seed: int = 0, return_stats: bool = False):
    """The autoregressive baseline DAWN replaces: chunks of ``chunk`` frames generated one after another, each
    conditioned on the last ``overlap`` frames before it (the given context for the first chunk, generated frames
    after) and on its own window of the signal.

    Args:
        model: a sequence denoiser trained on windows of ``chunk`` frames after ``overlap`` context frames.
        signal: ``[B, S, signal_dim]``.
        context: ``[B, k, *frame]`` known frames before frame 0 (``k >= overlap``), or None when ``overlap = 0``.
        chunk: frames per chunk (the last chunk may be shorter). overlap: conditioning frames per chunk.
        length, steps, sigma_min, sigma_max, method, seed, return_stats: as in :func:`generate_sequence`
            (chunk ``j`` of sample ``i`` draws from a seed hashed from ``(seed, i, j + 1)``).

    Returns:
        Frames ``[B, S, *frame]`` (and the stats, NFE summed over the chunks).
    """
    s = _check_request(signal, length, context)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1 (frames per chunk), got {chunk!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
        raise ValueError(f"overlap must be an int >= 0 (conditioning frames per chunk), got {overlap!r}")
    have = 0 if context is None else context.shape[1]
    if have < overlap:
        raise ValueError(f"overlap={overlap} needs at least {overlap} context frames before the first chunk, got "
                         f"{have}")
    frame_shape = _frame_shape(model, context)
    sigmas = karras(steps, sigma_min, sigma_max).to(signal.dtype)
    start = time.perf_counter()
    history, outs = context, []
    nfe, calls = 0.0, 0
    for j, t in enumerate(range(0, s, chunk)):
        n = min(chunk, s - t)
        ctx = history[:, history.shape[1] - overlap:] if overlap else None  # the last `overlap` frames so far
        noise = randn((signal.shape[0], n, *frame_shape), _sample_seeds(seed, signal.shape[0], j + 1),
                      dtype=signal.dtype, device=signal.device)
        out, st = sample(model, noise, sigmas, method=method, cond=SequenceCond(signal[:, t:t + n], ctx),
                         return_stats=True)
        outs.append(out)
        history = out if history is None else torch.cat([history, out], dim=1)
        nfe, calls = nfe + st.nfe, calls + st.calls
    result = torch.cat(outs, dim=1)
    stats = {"nfe": nfe, "calls": calls, "wall_time": time.perf_counter() - start, "frames": s}
    return (result, stats) if return_stats else result
