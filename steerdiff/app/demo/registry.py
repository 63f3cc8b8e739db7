"""The demo's section registry: one decorated function per method, discovered from ``steerdiff.app.demo.sections``.

A section is a function ``run(ctx: DemoContext) -> SectionResult`` decorated with :func:`section`::

    @section("guidance", "Guidance: CFG vs CFG-rescale vs APG", requires=("steerdiff.guidance",), order=10)
    def run(ctx): ...

``requires`` names the modules the experiment needs; when one of them cannot be found, the section is not run and
the report shows it as *not available*, naming the missing module; so is a section module that fails to import
because a steerdiff module it needs is missing. A section that finds at run time that it cannot run (a shipped model
it needs is missing) raises :class:`SectionUnavailable` with the reason. Sections live in :data:`SECTIONS`, a
:class:`steerdiff.io.Registry` like every other plug-in kind.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

from ...io.plugins import Registry

SECTIONS_PACKAGE = "steerdiff.app.demo.sections"


@dataclass(frozen=True)
class SectionSpec:
    """A registered section (or a section module that could not be imported: ``run`` is None).

    Attributes:
        key: short identifier, used on the command line (``--only``) and as the key in ``results.json``.
        title: heading of the section in the report.
        requires: importable module names the experiment needs.
        order: position in the report (ascending).
        run: the experiment, ``run(ctx) -> SectionResult``; None when its module could not be imported.
        note: why the section is unavailable when it is (filled in by :func:`available_sections`).
    """

    key: str
    title: str
    requires: tuple[str, ...] = ()
    order: int = 100
    run: Callable | None = field(default=None, compare=False, repr=False)
    note: str = ""

    @property
    def fn(self) -> Callable | None:  # the registry's duplicate check compares the experiment
        return self.run

    def missing(self) -> list[str]:
        """The required modules that cannot be imported here."""
        return [name for name in self.requires if not _module_exists(name)]


class SectionUnavailable(Exception):  # noqa: N818 - a state, not an error: the report shows it as a note
    """Raised by a section that cannot run here (e.g. its shipped model is missing); the report shows the message
    as "not available: <message>" and the other sections still run. Raise it before writing any image."""


SECTIONS: Registry[SectionSpec] = Registry("demo section", argument="section")


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package
        return False


def section(key: str, title: str, requires: tuple[str, ...] = (), order: int = 100) -> Callable:
    """Register ``run(ctx) -> SectionResult`` as the demo section ``key`` (a decorator).

    Args:
        key: identifier (letters, digits, ``_``), unique among sections.
        title: heading in the report.
        requires: modules the experiment imports; the section is skipped, with a note, when one is missing.
        order: position in the report (ascending; the landed sections use 10, 20, 30).
    """
    if not key or not key.replace("_", "").isalnum():
        raise ValueError(f"key must be a non-empty identifier of letters, digits and '_', got {key!r}")

    def register(fn: Callable) -> Callable:
        if key in SECTIONS and SECTIONS.get(key).run.__module__ != fn.__module__:
            raise ValueError(f"demo section {key!r} is registered twice ({SECTIONS.get(key).run.__module__}, "
                             f"{fn.__module__})")
        SECTIONS.remove(key)  # a module re-imported (e.g. reloaded) replaces its own section
        SECTIONS.add(key, SectionSpec(key, title, tuple(requires), order, fn))
        return fn

    return register


def discover() -> dict[str, str]:
    """Import every module of :data:`SECTIONS_PACKAGE` (each registers its sections).

    Returns ``{module's short name: missing module}`` for the section modules that could not be imported because
    a ``steerdiff`` module they import is missing; any other import error propagates.
    """
    package = importlib.import_module(SECTIONS_PACKAGE)
    skipped = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        try:
            importlib.import_module(f"{SECTIONS_PACKAGE}.{info.name}")
        except ModuleNotFoundError as err:  # a method module that has not landed: only that section is lost
            if not (err.name or "").startswith("steerdiff"):
                raise
            skipped[info.name] = err.name
    return skipped


def all_sections() -> list[SectionSpec]:
    """Registered sections plus the section modules that failed to import, in report order, each with ``note`` set
    when it cannot run here."""
    skipped = discover()
    specs = dict(SECTIONS.items())
    for name, module in skipped.items():  # a section module that failed to import: show what it needs
        base = specs.get(name) or SectionSpec(name, f"{name} (steerdiff.app.demo.sections.{name})", (), 1000)
        specs[name] = SectionSpec(name, base.title, (*base.requires, module), base.order)
    out = []
    for spec in sorted(specs.values(), key=lambda s: (s.order, s.key)):
        missing = spec.missing()
        note = f"not available: {', '.join(missing)} is not installed in this version of steerdiff" if missing else ""
        out.append(SectionSpec(spec.key, spec.title, spec.requires, spec.order, spec.run, note))
    return out


def section_keys() -> list[str]:
    """Keys of every known section, in report order."""
    return [s.key for s in all_sections()]
