"""The guidance hook: conditional and null predictions from one doubled batch (docs/methods/conventions.md,
"Guidance hook"; the guiders' shared conventions are in docs/methods/guidance.md, "Conventions shared by every
guider").

Two kinds of guidance object plug into :func:`steerdiff.sample`:

* a *combiner*, any callable ``combine(d_cond, d_uncond, x, sigma) -> D`` - the sampler evaluates the
  conditional and the all-null condition as one doubled batch and hands both predictions over;
* a *guider*, an object with a method ``guide(denoiser, x, sigma, cond) -> D`` that builds its own stacked batch
  (for rules needing more than two predictions, or skipping the null branch).

Either may have a ``reset()`` method; samplers call it at the start of every trajectory (stateful guiders such as
APG's momentum rely on it). A guider with ``set_schedule(sigmas)`` is handed the trajectory's schedule first (for
``start``/``stop`` windows given as fractions of the schedule). A guider whose ``guide`` takes a ``step`` keyword is
told which sampler step each evaluation belongs to: a sampler with several evaluations per step (Heun) calls it
more than once with the same ``step``, so per-step state (APG's momentum) advances once per step, whatever the
sampler.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor

from .denoiser import Denoiser, null_cond_like

Combiner = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def cond_and_null(denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
    """``(D(x, sigma, cond), D(x, sigma, null))`` from one call on a doubled batch."""
    out = denoiser(torch.cat([x, x]), torch.cat([sigma, sigma]), torch.cat([cond, null_cond_like(cond)]))
    if out.shape[0] != 2 * x.shape[0]:
        raise ValueError(f"denoiser returned {out.shape[0]} rows for a doubled batch of {2 * x.shape[0]}")
    return out[: x.shape[0]], out[x.shape[0] :]


class GuidedDenoiser:
    """A denoiser ``x, sigma -> D_guided`` for a fixed condition, applying a combiner or a guider."""

    def __init__(self, denoiser: Denoiser, guidance: object, cond: Tensor | None):
        if cond is None:
            raise ValueError("guidance needs a condition: pass cond= (a [B] or [B, m] integer tensor)")
        if not (callable(guidance) or hasattr(guidance, "guide")):
            raise TypeError(
                "guidance must be a combiner f(d_cond, d_uncond, x, sigma) or an object with a guide() method, "
                f"got {type(guidance).__name__}"
            )
        self.denoiser = denoiser
        self.guidance = guidance
        self.cond = cond
        guide = getattr(guidance, "guide", None)
        self._takes_step = guide is not None and _accepts_keyword(guide, "step")

    def begin(self, sigmas) -> None:
        """Start a trajectory over ``sigmas``: hand the schedule to the guider, then reset its state."""
        set_schedule = getattr(self.guidance, "set_schedule", None)
        if set_schedule is not None:
            set_schedule(sigmas)
        self.reset()

    def reset(self) -> None:
        reset = getattr(self.guidance, "reset", None)
        if reset is not None:
            reset()

    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None, step: int | None = None) -> Tensor:
        cond = self.cond if cond is None else cond
        guide = getattr(self.guidance, "guide", None)
        if guide is not None:
            if self._takes_step:
                return guide(self.denoiser, x, sigma, cond, step=step)
            return guide(self.denoiser, x, sigma, cond)
        d_cond, d_uncond = cond_and_null(self.denoiser, x, sigma, cond)
        return self.guidance(d_cond, d_uncond, x, sigma)


def _accepts_keyword(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
