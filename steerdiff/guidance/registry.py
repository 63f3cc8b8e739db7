"""The guider registry: every guider that is built as ``cls(scale, **options)`` registers here by name.

The CLI, the demo and the benchmarks build guiders from it (:func:`build_guider`), so a new guider is one decorated
class and appears everywhere guiders are listed::

    @register_guider("apg")
    class APG(Guider): ...

    build_guider("apg", 7.5, eta=0.0)   # == APG(7.5, eta=0.0)
"""

from __future__ import annotations

from collections.abc import Callable

from ..io.plugins import Registry
from .base import check_options

GUIDERS: Registry[type] = Registry("guider", argument="guidance")


def register_guider(name: str, aliases: tuple[str, ...] = ()) -> Callable[[type], type]:
    """Class decorator registering a guider under ``name`` (and ``aliases``, e.g. the CLI's spelling)."""
    return GUIDERS.register(name, aliases)


def build_guider(name: str, scale, **options):
    """The guider registered as ``name`` at guidance scale ``scale``: ``GUIDERS.get(name)(scale, **options)``.

    Raises:
        ValueError: an unknown ``name`` (the message lists the registered ones).
        TypeError: an option the guider does not take (the message lists those it takes).
    """
    cls = GUIDERS.get(name)
    check_options(cls, (scale,), options, f"guider {name!r}")
    return cls(scale, **options)
