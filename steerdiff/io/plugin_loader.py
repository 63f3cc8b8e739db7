"""Plugins: a user's modules, imported so that what they register (guiders, samplers, solvers, ...) is offered.

A plugin is an ordinary Python module that registers entries in steerdiff's registries when it is imported (the
decorators of CONTRIBUTING.md, "One plug-in pattern"). Two ways name one, the conventions of pytest (``-p`` and the
``pytest11`` entry points) and of diffusers:

* the environment variable :data:`ENV_VAR` (``STEERDIFF_PLUGINS``): comma-separated module names, each imported
  with :func:`importlib.import_module`: an installed module, one on ``PYTHONPATH`` or, when neither has it, a
  ``NAME.py`` (or package) in the current directory (which is then searched last, after everything else);
* the entry-point group :data:`ENTRY_POINT_GROUP` (``steerdiff.plugins``) of any installed distribution, e.g. in
  its ``pyproject.toml``::

      [project.entry-points."steerdiff.plugins"]
      my_plugin = "my_plugin"            # a module: importing it registers
      other = "other_package:register"   # or a function, called with no arguments after loading

The ``steerdiff`` command calls :func:`load_plugins` before it builds its options, so its choices (``--guidance``,
``--method``, ``--task``, ...) include what the plugins registered. A plugin that fails to load is a
:class:`PluginError` naming the module and where it was named (the variable, or the entry point's distribution).

This module imports only the standard library (the bottom layer: it knows nothing of what the plugins register).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from importlib import metadata
from types import ModuleType

__all__ = ["ENTRY_POINT_GROUP", "ENV_VAR", "PluginError", "load_plugins", "plugin_names"]

ENV_VAR = "STEERDIFF_PLUGINS"
ENTRY_POINT_GROUP = "steerdiff.plugins"

_loaded: dict[str, object] = {}  # "env:NAME" or "entry point:NAME" -> what was loaded, so loading twice is a no-op


class PluginError(ImportError):
    """A plugin that could not be loaded: the message names the module and where it was named."""


def plugin_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The module names listed in ``STEERDIFF_PLUGINS`` (comma-separated; blanks ignored, order kept, no repeats).

    Raises:
        PluginError: a name that is not a dotted Python module name (``my_plugin``, ``pkg.sub``).
    """
    text = (os.environ if environ is None else environ).get(ENV_VAR, "")
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if not all(piece.isidentifier() for piece in name.split(".")):
            raise PluginError(f"{ENV_VAR}={text!r}: {name!r} is not a Python module name (give comma-separated "
                              "module names such as my_plugin or my_package.plugin, not file paths)")
    return list(dict.fromkeys(names))


def _why(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _missing(err: ModuleNotFoundError, name: str) -> bool:
    """Whether the plugin itself (or a package on its path) is missing, not a module the plugin imports."""
    return err.name is not None and (name == err.name or name.startswith(err.name + "."))


def _search_current_directory() -> bool:
    """Put the current directory at the end of ``sys.path`` (the ``steerdiff`` script, unlike ``python -m``, does
    not search it); False when it is searched already."""
    cwd = os.getcwd()
    if any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        return False
    sys.path.append(cwd)
    importlib.invalidate_caches()
    return True


def _import_env_plugin(name: str) -> ModuleType:
    try:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as err:
            if not (_missing(err, name) and _search_current_directory()):
                raise
            return importlib.import_module(name)  # a NAME.py in the current directory
    except ModuleNotFoundError as err:
        if _missing(err, name):
            raise PluginError(f"plugin module {name!r} named in {ENV_VAR} was not found: it must be importable "
                              "(installed, on PYTHONPATH, or a .py file in the current directory)") from err
        raise PluginError(f"plugin module {name!r} named in {ENV_VAR} failed to import: {_why(err)}") from err
    except Exception as err:  # noqa: BLE001 - any error a user's module raises is reported as that plugin's
        raise PluginError(f"plugin module {name!r} named in {ENV_VAR} failed to import: {_why(err)}") from err


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.name, ep.value))


def _load_entry_point(ep: metadata.EntryPoint) -> object:
    dist = getattr(ep, "dist", None)
    where = f"entry point {ep.name!r} = {ep.value!r} of the distribution " + (
        f"{dist.name!r}" if dist is not None else "(unknown)") + f" (group {ENTRY_POINT_GROUP!r})"
    try:
        obj = ep.load()
        if callable(obj) and not isinstance(obj, ModuleType):
            obj()  # "package:register": a function that registers when called
    except Exception as err:  # noqa: BLE001 - any error a user's module raises is reported as that plugin's
        raise PluginError(f"plugin {where} failed to load: {_why(err)}") from err
    return obj


def load_plugins(environ: Mapping[str, str] | None = None, entry_points: bool = True) -> list[str]:
    """Import every plugin: the ``steerdiff.plugins`` entry points (sorted by name), then the modules named in
    ``STEERDIFF_PLUGINS`` (in order). Each is loaded once per process; calling again loads only new ones.

    Args:
        environ: the environment to read ``STEERDIFF_PLUGINS`` from (default ``os.environ``).
        entry_points: also load the installed distributions' ``steerdiff.plugins`` entry points.

    Returns:
        What was loaded, as ``"entry point:NAME"`` and ``"env:MODULE"`` strings, in loading order.

    Raises:
        PluginError: a plugin that is not found or raises while it is imported (or, for an entry point naming a
            function, while it is called); the message names the module and the variable or the distribution.
    """
    done = []
    for ep in _entry_points() if entry_points else []:
        key = f"entry point:{ep.name}"
        if key not in _loaded:
            _loaded[key] = _load_entry_point(ep)
        done.append(key)
    for name in plugin_names(environ):
        key = f"env:{name}"
        if key not in _loaded:
            _loaded[key] = _import_env_plugin(name)
        done.append(key)
    return done
