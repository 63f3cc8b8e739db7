"""Checkpoint formats: how a saved directory is laid out and which loader reads it (``register_format``).

A checkpoint is a directory with ``config.json`` (whose ``"class"`` names what was saved) and
``model.safetensors``. A format registers its loader under a name, with the ``"class"`` value that marks its
directories; the format registered with ``config_class=None`` is the default (a plain registered model class).
:func:`steerdiff.models.load` reads ``config.json`` and hands the directory to the matching format's loader::

    @register_format("quantized", config_class="QuantizedModel")
    def load_quantized(directory, spec, device="cpu"): ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .registry import Registry

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class Format:
    """A registered checkpoint format: ``load(directory, spec, device) -> model``; ``config_class`` marks it."""

    name: str
    load: Callable
    config_class: str | None

    @property
    def fn(self) -> Callable:  # the registry's duplicate check compares the loader
        return self.load


FORMATS: Registry[Format] = Registry("checkpoint format", argument="format")


def register_format(name: str, *, config_class: str | None) -> Callable[[Callable], Callable]:
    """Register ``load(directory: Path, spec: dict, device) -> model`` as checkpoint format ``name``.

    Args:
        name: the format's name.
        config_class: the value of ``"class"`` in ``config.json`` that marks this format; None for the default
            format (any other class).
    """

    def decorate(load: Callable) -> Callable:
        if config_class is None and any(f.config_class is None and f.name != name for _, f in FORMATS.items()):
            raise ValueError("a default checkpoint format (config_class=None) is already registered")
        FORMATS.add(name, Format(name, load, config_class))
        return load

    return decorate


def find_format(spec: dict) -> Format:
    """The format of a directory whose ``config.json`` is ``spec`` (the default format when no other matches)."""
    cls = spec.get("class") if isinstance(spec, dict) else None
    default = None
    for _, fmt in FORMATS.items():
        if fmt.config_class is None:
            default = fmt
        elif fmt.config_class == cls:
            return fmt
    if default is None:
        raise LookupError("no default checkpoint format is registered (import steerdiff.models)")
    return default


def load_directory(directory: Path, spec: dict, device="cpu"):
    """Load ``directory`` (with its parsed ``config.json``, ``spec``) with the matching format's loader."""
    return find_format(spec).load(directory, spec, device=device)
