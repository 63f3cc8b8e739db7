"""Embedding helpers shared by the backbones: noise-level features, condition slots, 2-D position codes.

Conditions follow docs/methods/conventions.md ("Conditions"): an integer tensor ``[B]`` (one slot) or ``[B, m]``
(m slots), ``-1`` = null in any slot, ``cond=None`` = all null. Every slot ``i`` with ``K_i`` values owns a table of
``K_i + 1`` rows whose last row is the learned null embedding, so a null never collides with a real value (a shared
"0" null would; the per-slot null tokens of the official CoInD code, docs/methods/coind.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..core.denoiser import NULL


def normalize_num_classes(num_classes: int | Sequence[int] | None) -> tuple[int, ...]:
    """``None`` -> ``()`` (unconditional), ``K`` -> ``(K,)``, ``[K_1, .., K_m]`` -> tuple; each ``K_i >= 1``."""
    if num_classes is None:
        return ()
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, Sequence)):
        raise TypeError(f"num_classes must be None, an int or a list of ints, got {num_classes!r}")
    values = (num_classes,) if isinstance(num_classes, int) else tuple(num_classes)
    if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in values):
        raise ValueError(f"num_classes must hold positive ints (values per slot), got {num_classes!r}")
    return values


def check_cond(cond: Tensor | None, num_classes: tuple[int, ...], batch: int, device=None) -> Tensor:
    """Validate a condition and return it as a ``[B, m]`` int64 tensor (``-1`` = null).

    Args:
        cond: ``None``, ``[B]`` (single-slot models) or ``[B, m]`` integer tensor.
        num_classes: values per slot ``(K_1, .., K_m)``; ``()`` for an unconditional model.
        batch: expected batch size ``B``.
        device: device of the returned tensor when ``cond`` is ``None``.

    Raises:
        TypeError: ``cond`` is not a tensor.
        ValueError: wrong dtype, shape, or a value outside ``[-1, K_i - 1]`` (the message names the slot).
    """
    m = len(num_classes)
    if cond is None:
        return torch.full((batch, m), NULL, dtype=torch.long, device=device)
    if not isinstance(cond, Tensor):
        raise TypeError(f"cond must be None or an integer tensor [B] or [B, m], got {type(cond).__name__}")
    if cond.dtype.is_floating_point or cond.dtype.is_complex or cond.dtype == torch.bool:
        raise ValueError(f"cond must be an integer tensor (-1 = null), got dtype {cond.dtype}")
    if cond.ndim == 0 or cond.shape[0] != batch:
        raise ValueError(f"cond must have batch size B={batch} in its first dimension, got shape {tuple(cond.shape)}")
    if m == 0:
        # An unconditional model accepts an all-null condition of any width (guiders build null batches).
        if cond.numel() and bool((cond != NULL).any()):
            raise ValueError("cond: this model is unconditional (num_classes=None); only null (-1) entries allowed")
        return torch.empty((batch, 0), dtype=torch.long, device=cond.device)
    if cond.ndim == 1 and m == 1:
        cond = cond[:, None]
    if cond.ndim != 2 or cond.shape[1] != m:
        form = "[B] or [B, 1]" if m == 1 else f"[B, {m}]"
        raise ValueError(f"cond must have shape {form} for a model with {m} condition slot(s), got {tuple(cond.shape)}")
    cond = cond.long()
    upper = torch.tensor(num_classes, device=cond.device)
    bad = (cond < NULL) | (cond >= upper)
    if bool(bad.any()):
        row, slot = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"cond[{row}, {slot}] = {int(cond[row, slot])} is out of range: slot {slot} takes values "
            f"0..{num_classes[slot] - 1} or -1 (null)"
        )
    return cond


class SlotEmbedding(nn.Module):
    """One table per condition slot with ``K_i + 1`` rows; row ``K_i`` (addressed by ``-1``) is the null.

    The tables are stored as one ``nn.Embedding`` with per-slot row offsets.

    Args:
        num_classes: values per slot ``(K_1, .., K_m)``.
        dim: embedding width.
    """

    def __init__(self, num_classes: Sequence[int], dim: int):
        super().__init__()
        self.num_classes = tuple(num_classes)
        rows = [k + 1 for k in self.num_classes]
        offsets = [sum(rows[:i]) for i in range(len(rows))]
        self.table = nn.Embedding(max(sum(rows), 1), dim)
        nn.init.normal_(self.table.weight, std=0.02)
        self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.long), persistent=False)
        self.register_buffer("null_index", torch.tensor(self.num_classes, dtype=torch.long), persistent=False)

    def forward(self, cond: Tensor) -> Tensor:
        """Embed a validated ``[B, m]`` condition (see :func:`check_cond`) to ``[B, m, dim]``."""
        idx = torch.where(cond == NULL, self.null_index, cond) + self.offsets
        return self.table(idx)


class FourierFeatures(nn.Module):
    """Fixed sinusoidal features ``[cos(f_k c), sin(f_k c)]`` of the noise level ``c_noise = ln(sigma) / 4``.

    Frequencies are log-spaced in ``[min_freq, max_freq]`` (deterministic, so a config fully defines the
    model). ``c_noise`` spans about ``[-1.6, 1.1]`` for ``sigma`` in ``[0.002, 80]``, so frequencies from 1 to
    ~64 resolve both the coarse and the fine structure of the noise level.
    """

    def __init__(self, dim: int, min_freq: float = 1.0, max_freq: float = 64.0):
        super().__init__()
        if dim < 2 or dim % 2:
            raise ValueError(f"fourier dim must be an even int >= 2, got {dim}")
        freqs = torch.exp(torch.linspace(math.log(min_freq), math.log(max_freq), dim // 2))
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, c: Tensor) -> Tensor:
        arg = c.reshape(-1, 1).to(self.freqs.dtype) * self.freqs
        return torch.cat([arg.cos(), arg.sin()], dim=1)


def sincos_2d(height: int, width: int, dim: int) -> Tensor:
    """Fixed 2-D sin-cos position embedding ``[height * width, dim]`` (row-major tokens, as MAE/DiT).

    Half of the channels encode the row, half the column; each half is ``[sin(w_k p), cos(w_k p)]`` with
    ``w_k = 10000^(-k / (dim/4))``.
    """
    if dim % 4:
        raise ValueError(f"position embedding width must be divisible by 4, got {dim}")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))

    def encode(pos: Tensor) -> Tensor:
        arg = pos[:, None].double() * omega[None]
        return torch.cat([arg.sin(), arg.cos()], dim=1)

    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    emb = torch.cat([encode(rows.reshape(-1)), encode(cols.reshape(-1))], dim=1)
    return emb.float()


def json_config(**kwargs) -> dict:
    """Constructor kwargs as a JSON-ready dict (tuples become lists) so a model can be rebuilt from JSON."""

    def plain(v):
        if isinstance(v, (tuple, list)):
            return [plain(u) for u in v]
        return v

    return {k: plain(v) for k, v in kwargs.items()}
