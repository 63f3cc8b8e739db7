"""What a ``--model`` name is, which commands can take it, and loading it with errors that say so: the model kinds.

A model kind is a registry entry (:data:`MODEL_KINDS`, :func:`register_model_kind`) with how to recognise it, what
to say about it to a command that cannot take it, and how to load it. A name is recognised in two stages: kinds
that are names rather than directories (the built-in mixtures) first, then every model directory is classified from
its files before anything is loaded: ``config.json``'s ``"class"`` names a denoiser (``EDMPrecond`` or a
flow-matching ``FlowModel``, or a ``QuantizedModel`` whose ``base`` is one), an image classifier
(``ImageClassifier``), a Dynamical Diffusion forecaster or, with a ``denoiser_fingerprint``, an OCM covariance head
for the model it names; a directory with ``namm.json`` is a NAMM bundle and one with ``model_index.json`` a diffusers
pipeline. The ``Available:`` list of a ``--model`` error shows what the command can take, and naming a model of
another kind says what it is instead of failing inside the sampler.

The registry lives in the application, not in :mod:`steerdiff.models`: recognising and loading NAMM bundles, OCM
heads, quantized models and pipelines needs the method packages above ``models`` (constrain, covariance, quant,
pipelines), and what a kind says ("sample it with steerdiff constrain sample") is advice about commands. A plugin
registers a kind of its own with :func:`register_model_kind` (CONTRIBUTING.md, "Plugins").
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import torch

from ...io import CONFIG_NAME, CheckpointError, Registry, read_json
from ...models.io import ASSETS_DIR

DENOISER_CLASSES = ("EDMPrecond", "FlowModel")  # an EDM-preconditioned network; a flow-matching one
QUANT_CLASS = "QuantizedModel"
CLASSIFIER_CLASS = "ImageClassifier"
FORECASTER_CLASS = "DyDiffDenoiser"  # steerdiff forecast, not sample: it needs context frames

# --model kinds quantize takes: fp denoiser weights only (the sampling commands take every samplable kind).
QUANTIZABLE = ("denoiser",)


@dataclass(frozen=True)
class ModelKind:
    """What a model name or directory holds: ``kind`` (a :data:`MODEL_KINDS` name, or ``"unknown"``), the
    ``config.json`` class, for a covariance head the denoiser it was trained for, for a quantized model its method."""

    kind: str
    cls: str | None = None
    for_model: str | None = None
    method: str | None = None


@dataclass(frozen=True)
class ModelKindSpec:
    """A registered model kind.

    Attributes:
        detect: ``detect(directory, config) -> ModelKind | None`` for a model directory; ``config`` is its parsed
            ``config.json`` (a dict), or None when the directory has none. Return None when it is not this kind.
        detect_name: ``detect_name(name) -> bool`` for kinds that are names, not directories (checked first, so such
            a name wins over a directory of the same name).
        describe: ``describe(name, kind) -> str``, what it is and which command takes it, for a command that does
            not (default: "NAME is not a denoiser").
        load: ``load(name, device) -> model``; default :func:`steerdiff.models.io.load`.
        samplable: the sampling commands (sample, restore, align) take it as a denoiser ``D(x, sigma, cond)``
            with a ``sample_shape``.
    """

    detect: Callable[[Path, dict | None], ModelKind | None] | None = None
    detect_name: Callable[[str], bool] | None = None
    describe: Callable[[str, ModelKind], str] | None = None
    load: Callable | None = None
    samplable: bool = False

    @property
    def fn(self) -> Callable | None:  # what the registry's duplicate check compares: the detector
        return self.detect or self.detect_name


MODEL_KINDS: Registry[ModelKindSpec] = Registry("model kind", argument="model kind")


def register_model_kind(name: str, *, detect: Callable | None = None, detect_name: Callable | None = None,
                        describe: Callable | None = None, load: Callable | None = None,
                        samplable: bool = False) -> ModelKindSpec:
    """Register the model kind ``name`` (fields as :class:`ModelKindSpec`); returns its spec.

    Raises:
        ValueError: neither ``detect`` nor ``detect_name`` given, or ``name`` taken by another kind.
    """
    if detect is None and detect_name is None:
        raise ValueError(f"model kind {name!r}: give detect (a model directory) or detect_name (a name)")
    spec = ModelKindSpec(detect, detect_name, describe, load, samplable)
    return MODEL_KINDS.add(name, spec)


def samplable_kinds() -> tuple[str, ...]:
    """The kinds the sampling commands take (read from the registry when a command runs)."""
    return tuple(name for name, spec in MODEL_KINDS.items() if spec.samplable)


def model_dir(name: str | os.PathLike) -> Path | None:
    """The directory ``--model name`` points at (a path, or a shipped name under ``steerdiff/assets``), or None."""
    path = Path(name)
    if path.exists():
        return path.parent if path.is_file() else path
    text = str(name)
    if text and "/" not in text and os.sep not in text and (ASSETS_DIR / text).is_dir():
        return ASSETS_DIR / text
    return None


def classify(directory: Path) -> ModelKind:
    """Classify a model directory from its ``config.json`` (or its other marker files) without loading weights:
    the first registered kind (in name order) whose ``detect`` claims it, else ``unknown``."""
    config = None
    if (directory / CONFIG_NAME).is_file():
        try:
            config = read_json(directory / CONFIG_NAME)
        except CheckpointError:
            return ModelKind("unknown")  # loading reports the corrupt file itself
        if not isinstance(config, dict):
            return ModelKind("unknown")
    for _name, spec in MODEL_KINDS.items():
        found = spec.detect(directory, config) if spec.detect is not None else None
        if found is not None:
            return found
    cls = config.get("class") if config is not None and isinstance(config.get("class"), str) else None
    return ModelKind("unknown", cls)


def name_kind(name: str | os.PathLike) -> str | None:
    """The kind that claims ``name`` as a name, not a directory (``"mixture"`` for a built-in mixture), or None."""
    for kind, spec in MODEL_KINDS.items():
        if spec.detect_name is not None and spec.detect_name(str(name)):
            return kind
    return None


def kind_of(name: str | os.PathLike) -> ModelKind | None:
    """What ``--model name`` is: a name kind (a built-in mixture), else its directory's kind; None when the name
    is neither (no such directory or shipped model)."""
    kind = name_kind(name)
    if kind is not None:
        return ModelKind(kind)
    directory = model_dir(name)
    return None if directory is None else classify(directory)


def describe(name: str, kind: ModelKind) -> str:
    """What ``name`` is, in words, for a model the command cannot take."""
    spec = MODEL_KINDS.get(kind.kind) if kind.kind in MODEL_KINDS else None
    if spec is not None and spec.describe is not None:
        return spec.describe(name, kind)
    return f"{name} is not a denoiser (config.json class {kind.cls!r})"


def load_kind(name: str, kind: str, device: torch.device | str = "cpu"):
    """``name`` loaded by its kind's loader (default :func:`steerdiff.models.io.load`)."""
    spec = MODEL_KINDS.get(kind)
    if spec.load is not None:
        return spec.load(name, device=device)
    from ...models.io import load

    return load(name, device=device)


def _shipped() -> list[tuple[str, ModelKind]]:
    if not ASSETS_DIR.is_dir():
        return []
    return [(p.name, classify(p)) for p in sorted(ASSETS_DIR.iterdir()) if p.is_dir()]


@functools.cache
def _config_shape(name: str) -> tuple[int, ...] | None:
    """A shipped denoiser's ``sample_shape``, from its config (the network is built, no weights are read)."""
    from ...models.io import build_model

    try:
        spec = read_json(ASSETS_DIR / name / CONFIG_NAME)
        if spec.get("class") == QUANT_CLASS:
            spec = spec["base"]
        return tuple(build_model(spec).sample_shape)
    except (CheckpointError, KeyError, AttributeError, TypeError):
        return None


def is_greyscale_image(shape: Sequence[int] | None) -> bool:
    """A ``[1, H, W]`` sample shape (what ``restore`` and image inputs take)."""
    return shape is not None and len(shape) == 3 and shape[0] == 1


def available(kinds: Sequence[str], extra: Sequence[str] = (), shape_ok: Callable | None = None) -> str:
    """The names a command's ``--model`` takes: ``extra`` first, then the shipped models of the given kinds (and,
    with ``shape_ok``, whose sample shape passes it)."""
    names = [n for n, k in _shipped() if k.kind in kinds and (shape_ok is None or shape_ok(_config_shape(n)))]
    return ", ".join(dict.fromkeys([*extra, *names]))


def load_model(name: str, kinds: Sequence[str] | None = None, extra: Sequence[str] = (),
               loader: Callable | None = None, device: torch.device | str = "cpu", shape_ok: Callable | None = None):
    """A shipped model's name or a model directory, checked to be of one of ``kinds`` (default: the samplable
    kinds) before any weights are read, then loaded by ``loader(name, device=device)`` (default: its kind's
    loader; :func:`steerdiff.models.io.load` for a directory of unknown kind, which reports what is wrong with it).

    A missing, unreadable or wrong-kind model is a ``--model`` error that says what it is and lists what the
    command takes (``extra`` names first: the names it accepts besides the shipped models).
    """
    from ...models.io import load

    kinds = samplable_kinds() if kinds is None else tuple(kinds)
    directory = model_dir(name)
    listing = f"Available: {available(kinds, extra, shape_ok)}"
    kind = None
    if directory is not None:
        kind = classify(directory)
        if kind.kind not in kinds and kind.kind != "unknown":
            raise click.BadParameter(f"{describe(name, kind)}. {listing}", param_hint="--model")
    if loader is None and kind is not None and kind.kind in MODEL_KINDS:
        loader = functools.partial(load_kind, kind=kind.kind)
    try:
        model = (loader or load)(name, device=device)
    except (CheckpointError, FileNotFoundError) as err:
        raise click.BadParameter(f"{err}. {listing}", param_hint="--model") from err
    if not hasattr(model, "sample_shape"):
        raise click.BadParameter(f"{name} is not a denoiser ({type(model).__name__} has no sample_shape). {listing}",
                                 param_hint="--model")
    return model


# ----------------------------------------------------------------------------------------------- the shipped kinds
def _config_class(config: dict | None) -> str | None:
    cls = config.get("class") if config is not None else None
    return cls if isinstance(cls, str) else None


def _load_mixture(name: str, device: torch.device | str = "cpu"):
    from ...models.gmm import builtin_mixture

    return builtin_mixture(name)  # exact, float64 on the CPU; returns its output on the input's device


def _is_mixture(name: str) -> bool:
    from ...models.gmm import BUILTIN_MIXTURES

    return name in BUILTIN_MIXTURES


register_model_kind("mixture", detect_name=_is_mixture, load=_load_mixture, samplable=True)
register_model_kind(
    "denoiser", samplable=True,
    detect=lambda _d, config: ModelKind("denoiser", _config_class(config))
    if _config_class(config) in DENOISER_CLASSES else None)


def _detect_quantized(_directory: Path, config: dict | None) -> ModelKind | None:
    if _config_class(config) != QUANT_CLASS:
        return None
    quant = config.get("quantization")
    method = quant.get("method") if isinstance(quant, dict) else None
    base = config.get("base")
    if not (isinstance(base, dict) and base.get("class") in DENOISER_CLASSES):
        return None  # a quantized model of something else: unknown
    return ModelKind("quantized", QUANT_CLASS, method=method)


register_model_kind(
    "quantized", detect=_detect_quantized, samplable=True,
    describe=lambda name, kind: f"{name} is already quantized ({kind.cls}, method {kind.method}); quantize the "
                                "unquantized model it was made from instead")
register_model_kind(
    "classifier",
    detect=lambda _d, config: ModelKind("classifier", CLASSIFIER_CLASS)
    if _config_class(config) == CLASSIFIER_CLASS else None,
    describe=lambda name, kind: f"{name} is an image classifier ({kind.cls}), not a denoiser; it scores samples "
                                "(the class:K reward, the image metrics)")
register_model_kind(
    "forecaster",
    detect=lambda _d, config: ModelKind("forecaster", FORECASTER_CLASS)
    if _config_class(config) == FORECASTER_CLASS else None,
    describe=lambda name, kind: f"{name} is a Dynamical Diffusion forecaster ({kind.cls}), whose samples need "
                                f"context frames; use steerdiff forecast --model {name} --context FILE")


def _detect_head(_directory: Path, config: dict | None) -> ModelKind | None:
    known = (*DENOISER_CLASSES, QUANT_CLASS, CLASSIFIER_CLASS, FORECASTER_CLASS)
    if config is None or _config_class(config) in known or not isinstance(config.get("denoiser_fingerprint"), str):
        return None
    return ModelKind("covariance head", _config_class(config), for_model=config.get("denoiser") or None)


register_model_kind(
    "covariance head", detect=_detect_head,
    describe=lambda name, kind: f"{name} is an OCM covariance head ({kind.cls}) for the model "
                                f"{kind.for_model or 'its denoiser'}, not a denoiser; sample with it through steerdiff "
                                f"sample --model {kind.for_model or 'its denoiser'} --covariance ocm")
register_model_kind(
    "namm",
    detect=lambda directory, config: ModelKind("namm")
    if config is None and (directory / "namm.json").is_file() and not (directory / "model_index.json").is_file()
    else None,
    describe=lambda name, _kind: f"{name} is a NAMM bundle (mirror maps and a mirror-space model), not a plain "
                                 f"denoiser; sample it with steerdiff constrain sample --model {name}")
register_model_kind(
    "pipeline",
    detect=lambda directory, config: ModelKind("pipeline")
    if config is None and (directory / "model_index.json").is_file() else None,
    describe=lambda name, _kind: f"{name} is a diffusers text-to-image pipeline, not a steerdiff model; use it with "
                                 f"--pipeline {name} --prompt \"...\"")
