"""What every training-config dataclass and learning-rate schedule in steerdiff shares.

One strict JSON round trip (an unknown key is an error: a typo must not fall back to a default) and one cosine
schedule, used by the denoiser trainer, the classifier trainer, the OCM covariance heads and the NAMM maps.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

T = TypeVar("T")


def config_from_dict(cls: type[T], values: dict[str, Any], what: str = "config") -> T:
    """``cls(**values)`` for a dataclass ``cls``; unknown keys raise a ``ValueError`` listing the known ones."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {what} keys {unknown}; known: {sorted(known)}")
    return cls(**values)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a dataclass instance (tuples become lists, so a JSON round trip compares equal)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def cosine_lr(lr: float, step: int, steps: int, *, warmup_steps: int = 0, min_lr_ratio: float = 0.05) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up from ``lr / warmup_steps`` to ``lr`` over
    ``warmup_steps`` steps, then a half cosine from ``lr`` down to ``lr * min_lr_ratio`` at step ``steps`` (held
    there beyond it). A function of the step alone, so a resumed run continues the schedule exactly."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    frac = min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * (0.5 * (1.0 + math.cos(math.pi * frac))))
