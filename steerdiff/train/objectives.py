"""Training objectives the generic loop can run: registered by name, chosen from the training config.

The loop (:func:`steerdiff.train.train`) draws a batch, applies condition dropout and asks the objective for the
loss. ``edm`` (:mod:`.edm`) is the default; a method package registers its own objective where it is defined (the
CoInD objective lives in ``steerdiff.guidance.coind_objective``) with ``applies(config)``, the rule that selects it
(e.g. its weight in the config is positive)::

    @register_objective("coind", applies=lambda cfg: cfg.coind_lambda > 0)
    def coind_objective(model, x0, cond, cond_dropped, generator, cfg) -> tuple[Tensor, Tensor | None]: ...

An objective returns ``(loss, extra)``: the loss to back-propagate and an optional detached auxiliary term that the
loop averages into the history as ``extra_name`` (e.g. CoInD's ``l_ci``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..io.plugins import Registry


@dataclass(frozen=True)
class Objective:
    """A registered objective ``fn(model, x0, cond, cond_dropped, generator, cfg) -> (loss, extra or None)``."""

    name: str
    fn: Callable
    applies: Callable[[object], bool] | None
    extra_name: str | None = None


OBJECTIVES: Registry[Objective] = Registry("training objective", argument="objective")


def register_objective(name: str, *, applies: Callable[[object], bool] | None = None,
                       extra_name: str | None = None) -> Callable[[Callable], Callable]:
    """Register a training objective; ``applies=None`` marks the default (only ``edm``)."""

    def decorate(fn: Callable) -> Callable:
        OBJECTIVES.add(name, Objective(name, fn, applies, extra_name))
        return fn

    return decorate


def objective_for(config) -> Objective:
    """The objective a training config selects: the one whose ``applies(config)`` holds, else the default.

    Raises:
        ValueError: more than one objective applies.
    """
    chosen = [obj for _, obj in OBJECTIVES.items() if obj.applies is not None and obj.applies(config)]
    if len(chosen) > 1:
        raise ValueError(f"the training config selects several objectives: {[o.name for o in chosen]}")
    wanted = getattr(config, "objective", None)
    if wanted not in (None, "edm") and (not chosen or chosen[0].name != wanted):
        raise ValueError(f"objective={wanted!r} is not selected by any registered objective (import the package "
                         "that registers it before training)")
    if chosen:
        return chosen[0]
    defaults = [obj for _, obj in OBJECTIVES.items() if obj.applies is None]
    if len(defaults) != 1:
        raise LookupError(f"expected one default training objective, found {[o.name for o in defaults]}")
    return defaults[0]
