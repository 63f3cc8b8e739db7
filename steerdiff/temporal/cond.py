"""The condition of a sequence denoiser: the per-frame driving signal and the known frames before the first one (the
all-at-once generation of Cheng et al., "DAWN: Dynamic frame Avatar With Non-autoregressive diffusion framework", 2025,
Sec. 3; docs/methods/sequence.md, "The model").

:class:`SequenceCond` is a structured condition (a batch axis, ``index``, ``cat``, ``null_like``), so guiders and
samplers treat it as they treat a pipeline's condition.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


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
