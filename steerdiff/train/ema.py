"""Exponential moving average of model weights (what gets shipped: it samples better than the raw net)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


class EMA:
    """EMA of every floating-point entry of a model's state dict (parameters and float buffers).

    ``shadow = d * shadow + (1 - d) * current`` after each optimizer step, with
    ``d = min(decay, (1 + n) / (10 + n))`` when ``warmup`` is on (``n`` = number of updates so far), so the
    early average is not stuck at the random init. Non-float entries (integer buffers) are copied.

    Args:
        model: the model being trained; the shadow starts as a copy of its weights.
        decay: the EMA decay (0.999 for the small shipped models).
        warmup: use the ``(1 + n) / (10 + n)`` ramp.
    """

    def __init__(self, model: nn.Module, decay: float = 0.999, warmup: bool = True):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.warmup = warmup
        self.num_updates = 0
        self.shadow: dict[str, Tensor] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def current_decay(self) -> float:
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the shadow towards the model's current weights."""
        d = self.current_decay()
        for k, v in model.state_dict().items():
            s = self.shadow[k]
            if s.is_floating_point():
                s.lerp_(v.detach().to(s.dtype), 1.0 - d)
            else:
                s.copy_(v)
        self.num_updates += 1

    def state_dict(self) -> dict[str, Tensor]:
        """The shadow weights (keys are the model's state-dict names, so they load into the model directly)."""
        return dict(self.shadow)

    def load_state_dict(self, tensors: dict[str, Tensor], num_updates: int) -> None:
        """Restore the shadow and the update counter (the counter drives the warmup ramp)."""
        if set(tensors) != set(self.shadow):
            raise ValueError("EMA state does not match the model's state-dict names")
        for k, v in tensors.items():
            self.shadow[k].copy_(v)
        self.num_updates = int(num_updates)

    def copy_to(self, model: nn.Module) -> nn.Module:
        """Load the EMA weights into ``model`` (in place) and return it."""
        model.load_state_dict(self.shadow, strict=True)
        return model

    def averaged_model(self, model: nn.Module) -> nn.Module:
        """A deep copy of ``model`` carrying the EMA weights, in eval mode."""
        return self.copy_to(copy.deepcopy(model)).eval()
