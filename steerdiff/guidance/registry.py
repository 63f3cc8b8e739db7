"""The guider registry: every guider that is built as ``cls(scale, **options)`` registers here by name.

The CLI, the demo and the benchmarks build guiders from it (:func:`build_guider`), so a new guider is one decorated
class and appears everywhere guiders are listed::

    @register_guider("apg")
    class APG(Guider): ...

    build_guider("apg", 7.5, eta=0.0)   # == APG(7.5, eta=0.0)
"""

from __future__ import annotations

from collections.abc import Callable

from ..io.registry import Registry

GUIDERS: Registry[type] = Registry("guider", argument="guidance")


def register_guider(name: str, aliases: tuple[str, ...] = ()) -> Callable[[type], type]:
    """Class decorator registering a guider under ``name`` (and ``aliases``, e.g. the CLI's spelling)."""
    return GUIDERS.register(name, aliases)


def build_guider(name: str, scale: float, **options):
    """The guider registered as ``name`` at guidance scale ``scale``: ``GUIDERS.get(name)(scale, **options)``."""
    return GUIDERS.get(name)(scale, **options)
