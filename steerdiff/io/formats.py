"""Checkpoint formats: how a saved directory is laid out, which loader reads it and which saver writes it
(``register_format``).

A checkpoint is a directory with ``config.json`` (whose ``"class"`` names what was saved) and
``model.safetensors``. A format registers its loader under a name, with what marks its directories: the
``"class"`` value in ``config.json`` (``config_class``), a test of the whole ``config.json`` (``matches``), or a
file other than ``config.json`` that only its directories hold (``marker``). The format marked by none of these is
the default (a plain registered model class). :func:`steerdiff.models.load` reads ``config.json`` and hands the
directory to the matching format's loader.

A format may also register its saver, with a test that recognises the objects it writes (``handles``):
:func:`steerdiff.models.save` hands an object to the format that handles it (the default format's saver when none
does), so that ``save`` writes exactly what ``load`` reads back::

    @register_format("quantized", config_class="QuantizedModel", save=save_quantized, handles=is_quantized)
    def load_quantized(directory, spec, device="cpu"): ...

A kind of object that needs more than a directory to be used (an OCM head needs its denoiser, a NAMM bundle its
distance) registers a format whose saver and loader refuse with a pointer to that kind's own functions, and with
``loadable=False`` so that listings of loadable models leave its directories out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .files import replace_refusal
from .plugins import Registry

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class Format:
    """A registered checkpoint format (see the module docstring for how one is recognised).

    Attributes:
        name: the format's name.
        load: ``load(directory, spec, device) -> model`` (``spec`` is the parsed ``config.json``, ``{}`` for a
            directory recognised by its ``marker``).
        config_class: the ``"class"`` in ``config.json`` that marks the format's directories.
        save: ``save(obj, directory) -> Path``, or None (the format is read-only).
        handles: ``handles(obj) -> bool``: whether ``save`` writes ``obj`` (None for the default format).
        matches: ``matches(spec) -> bool``: a test of ``config.json`` for formats not told apart by ``"class"``.
        marker: a file (other than ``config.json``) whose presence marks the format's directories.
        loadable: whether :func:`steerdiff.models.load` returns a model for its directories (False for formats
            that only refuse with a pointer to their own loader).
    """

    name: str
    load: Callable
    config_class: str | None
    save: Callable | None = None
    handles: Callable[[object], bool] | None = None
    matches: Callable[[dict], bool] | None = None
    marker: str | None = None
    loadable: bool = True

    @property
    def fn(self) -> Callable:  # the registry's duplicate check compares the loader
        return self.load

    @property
    def is_default(self) -> bool:
        return self.config_class is None and self.matches is None and self.marker is None


FORMATS: Registry[Format] = Registry("checkpoint format", argument="format")


def register_format(name: str, *, config_class: str | None, save: Callable | None = None,
                    handles: Callable[[object], bool] | None = None, matches: Callable[[dict], bool] | None = None,
                    marker: str | None = None, loadable: bool = True) -> Callable[[Callable], Callable]:
    """Register ``load(directory: Path, spec: dict, device) -> model`` as checkpoint format ``name``.

    Args:
        name: the format's name.
        config_class: the value of ``"class"`` in ``config.json`` that marks this format; None for the default
            format (any other class), unless ``matches`` or ``marker`` marks it.
        save: ``save(obj, directory) -> Path`` writing what ``load`` reads (:func:`save_object` calls it).
        handles: ``handles(obj) -> bool``, which objects ``save`` writes; required with ``save`` except for the
            default format, whose saver takes every object no other format handles.
        matches: ``matches(spec) -> bool`` on the parsed ``config.json``, for a format not told apart by its class.
        marker: a file name marking the format's directories when they have no ``config.json``.
        loadable: False for a format whose loader only refuses (its directories are then not listed as models).

    Raises:
        ValueError: a second default format, or ``save`` and ``handles`` not given together.
    """
    default = config_class is None and matches is None and marker is None
    if default and handles is not None:
        raise ValueError("the default checkpoint format saves every object no other format handles: no handles=")
    if not default and (save is None) != (handles is None):
        raise ValueError(f"checkpoint format {name!r}: save= and handles= go together (handles says what save writes)")

    def decorate(load: Callable) -> Callable:
        fmt = Format(name, load, config_class, save, handles, matches, marker, loadable)
        if fmt.is_default and any(f.is_default and f.name != name for _, f in FORMATS.items()):
            raise ValueError("a default checkpoint format (config_class=None) is already registered")
        FORMATS.add(name, fmt)
        return load

    return decorate


def _default() -> Format:
    for _, fmt in FORMATS.items():
        if fmt.is_default:
            return fmt
    raise LookupError("no default checkpoint format is registered (import steerdiff.models)")


def find_format(spec: dict) -> Format:
    """The format of a directory whose ``config.json`` is ``spec`` (the default format when no other matches)."""
    cls = spec.get("class") if isinstance(spec, dict) else None
    for _, fmt in FORMATS.items():
        if fmt.is_default:
            continue
        if (fmt.config_class is not None and fmt.config_class == cls) or (
                fmt.matches is not None and isinstance(spec, dict) and fmt.matches(spec)):
            return fmt
    return _default()


def find_marked_format(directory: str | os.PathLike) -> Format | None:
    """The format whose ``marker`` file ``directory`` holds (None when it holds none)."""
    directory = Path(directory)
    for _, fmt in FORMATS.items():
        if fmt.marker is not None and (directory / fmt.marker).is_file():
            return fmt
    return None


def find_saver(obj) -> Format:
    """The format that saves ``obj``: the one whose ``handles(obj)`` is true, else the default format.

    Raises:
        LookupError: two formats claim ``obj`` (their ``handles`` tests overlap), or no format saves it.
    """
    claims = [fmt for _, fmt in FORMATS.items() if fmt.handles is not None and fmt.handles(obj)]
    if len(claims) > 1:
        raise LookupError(f"checkpoint formats {[f.name for f in claims]} all claim a {type(obj).__name__}")
    fmt = claims[0] if claims else _default()
    if fmt.save is None:
        raise LookupError(f"checkpoint format {fmt.name!r} registers no saver")
    return fmt


def check_save_target(directory: str | os.PathLike) -> Path:
    """Refuse a save target whose replacement would destroy something that is not a checkpoint steerdiff wrote.

    Savers replace their target directory as a whole (:func:`steerdiff.io.atomic_dir`), so the target must be
    absent, an empty directory, or a checkpoint this library wrote with nothing added (its
    :data:`steerdiff.io.MARKER_NAME` lists every file in it; a ``config.json`` alone proves nothing), and must not
    lie inside the installed package (docs/methods/conventions.md, "Errors").

    Raises:
        TypeError: ``directory`` is not a path.
        ValueError: it is (or lies under) an existing file, lies inside the installed package, or is a non-empty
            directory that is not such a checkpoint (the message says which).
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path (str or os.PathLike), got {type(directory).__name__}")
    path = Path(directory)
    if str(directory) == "":
        raise ValueError("directory: an empty path names no directory; give the directory to save to")
    blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise ValueError(f"directory: {path} lies under {blocked}, an existing file, so it cannot be created")
    why = replace_refusal(path)
    if why is not None:
        raise ValueError(f"directory: {why}")
    return path


def save_object(obj, directory: str | os.PathLike) -> Path:
    """Save ``obj`` to ``directory`` with the format that handles it (:func:`find_saver`)."""
    check_save_target(directory)
    return find_saver(obj).save(obj, directory)


def load_directory(directory: Path, spec: dict, device="cpu"):
    """Load ``directory`` (with its parsed ``config.json``, ``spec``) with the matching format's loader."""
    return find_format(spec).load(directory, spec, device=device)
