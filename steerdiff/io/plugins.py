"""The one plug-in pattern: a named registry with a decorator (samplers, guiders, solvers, formats, models, ...).

A registry maps names to entries. A package registers its entries where they are defined::

    SAMPLERS = Registry("sampler", argument="method")

    @SAMPLERS.register("euler")
    def sample_euler(...): ...

Listings, command-line choices and error messages ("method must be one of [...]") all read the same registry, so
adding an entry is one decorator and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one plug-in kind.

    Args:
        kind: what an entry is, for messages ("sampler", "guider", ...).
        argument: the argument name users pass an entry's name in (``"method"``); used in error messages.
    """

    def __init__(self, kind: str, argument: str | None = None):
        self.kind = kind
        self.argument = argument or kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def add(self, name: str, entry: T, aliases: tuple[str, ...] = ()) -> T:
        """Register ``entry`` under ``name`` (and ``aliases``); registering the same entry again is a no-op."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        for key in (name, *aliases):
            old = self._entries.get(key) if key == name else self._entries.get(self._aliases.get(key, ""))
            if old is not None and not _same(old, entry):
                raise ValueError(f"a different {self.kind} is already registered as {key!r}")
        self._entries[name] = entry
        for alias in aliases:
            self._aliases[alias] = name
        return entry

    def register(self, name: str, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator form of :meth:`add`: ``@REGISTRY.register("name")`` above a function or class."""

        def decorate(entry: T) -> T:
            self.add(name, entry, aliases)
            return entry

        return decorate

    def remove(self, name: str) -> None:
        """Unregister ``name`` and its aliases (a no-op if it is not registered)."""
        self._entries.pop(name, None)
        self._aliases = {a: n for a, n in self._aliases.items() if n != name}

    def get(self, name: str) -> T:
        """The entry registered as ``name`` (or an alias of it).

        Raises:
            ValueError: no such entry; the message lists the registered names.
        """
        key = self._aliases.get(name, name) if isinstance(name, str) else None
        if key not in self._entries:
            raise ValueError(f"{self.argument} must be one of {self.names()}, got {name!r}")
        return self._entries[key]

    def names(self) -> list[str]:
        """Registered names, sorted (aliases not included)."""
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._aliases.get(name, name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {self.names()})"


def _same(a: object, b: object) -> bool:
    # A module imported twice (e.g. by path in a test) re-registers an equal entry: same qualified name is enough.
    if a is b:
        return True
    fa, fb = getattr(a, "fn", a), getattr(b, "fn", b)
    return getattr(fa, "__qualname__", None) == getattr(fb, "__qualname__", None) and getattr(
        fa, "__module__", None) == getattr(fb, "__module__", None)
