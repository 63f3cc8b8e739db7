"""The registries of :mod:`steerdiff.discrete`: noise schedules, forward processes, samplers and guiders.

One plug-in pattern (:class:`steerdiff.io.Registry`, as for the continuous samplers, guiders and aligners): each entry
registers itself where it is defined; listings, the CLI's choices and the error messages read the registries
(``docs/methods/discrete.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..io.plugins import Registry

SCHEDULES: Registry = Registry("discrete schedule", argument="schedule")
"""Named schedules: classes with ``alpha(t) -> float`` (the probability that a token is still clean at time ``t``,
``alpha(0) = 1``, decreasing) and its inverse ``t_of_alpha(a)``, both on host floats."""

PROCESSES: Registry = Registry("discrete process", argument="process")
"""Named forward processes: factories ``fn(num_classes, schedule=..., **options) -> Process``."""


@dataclass(frozen=True, eq=False)
class SamplerSpec:
    """A registered discrete sampler: a time grid and a step, run by one loop (:func:`steerdiff.discrete.sample`).

    Attributes:
        name: the registered name (``method=``).
        grid: ``grid(process, length, steps) -> list[Step]``: the host-side plan, one entry per denoiser evaluation.
        step: ``step(process, x, p0, step, rand, **options) -> x_next``: one reverse move from the state ``x [B, L]``
            given the denoiser's clean-token probabilities ``p0 [B, L, K]``.
        absorbing_only: whether it needs a mask token (unmasking samplers).
        note: a line for listings.
    """

    name: str
    grid: Callable
    step: Callable
    absorbing_only: bool = False
    note: str = ""


SAMPLERS: Registry[SamplerSpec] = Registry("discrete sampler", argument="method")


def register_sampler(name: str, grid: Callable, *, absorbing_only: bool = False, note: str = "") -> Callable:
    """Decorator registering a step function with its grid as the discrete sampler ``name``."""

    def decorate(step: Callable) -> Callable:
        SAMPLERS.add(name, SamplerSpec(name, grid, step, absorbing_only, note))
        return step

    return decorate


GUIDERS: Registry = Registry("discrete guider", argument="guidance")
"""Named guiders on discrete denoisers: classes ``G(scale, ...)`` with ``wrap(denoiser) -> denoiser``."""
