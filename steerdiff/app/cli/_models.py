"""What a ``--model`` name is, which commands can take it, and loading it with errors that say so.

Each model directory is classified from its files before anything is loaded: ``config.json``'s ``"class"`` names a
denoiser (``EDMPrecond`` or a flow-matching ``FlowModel``, or a ``QuantizedModel`` whose ``base`` is one), an
image classifier (``ImageClassifier``) or, with a ``denoiser_fingerprint``, an OCM covariance head for the model it
names; a directory with ``namm.json`` is a NAMM bundle. The ``Available:`` list of a ``--model`` error shows what
the command can take, and naming a model of another kind says what it is instead of failing inside the sampler.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import torch

from ...io import CONFIG_NAME, CheckpointError, read_json
from ...models.io import ASSETS_DIR

DENOISER_CLASSES = ("EDMPrecond", "FlowModel")  # an EDM-preconditioned network; a flow-matching one
QUANT_CLASS = "QuantizedModel"
CLASSIFIER_CLASS = "ImageClassifier"
FORECASTER_CLASS = "DyDiffDenoiser"  # steerdiff forecast, not sample: it needs context frames

# --model kinds each command takes: "denoiser" (fp weights) and "quantized" (a quantized denoiser).
SAMPLABLE = ("denoiser", "quantized")
QUANTIZABLE = ("denoiser",)


@dataclass(frozen=True)
class ModelKind:
    """What a model directory holds: ``kind`` (denoiser, quantized, classifier, covariance head, namm, unknown),
    the ``config.json`` class and, for a covariance head, the denoiser it was trained for."""

    kind: str
    cls: str | None = None
    for_model: str | None = None
    method: str | None = None


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
    """Classify a model directory from its ``config.json`` (or ``namm.json``) without loading any weights."""
    config = directory / CONFIG_NAME
    if not config.is_file():
        if (directory / "model_index.json").is_file():
            return ModelKind("pipeline")
        return ModelKind("namm") if (directory / "namm.json").is_file() else ModelKind("unknown")
    try:
        spec = read_json(config)
    except CheckpointError:
        return ModelKind("unknown")  # loading reports the corrupt file itself
    if not isinstance(spec, dict):
        return ModelKind("unknown")
    cls = spec.get("class") if isinstance(spec.get("class"), str) else None
    if cls in DENOISER_CLASSES:
        return ModelKind("denoiser", cls)
    if cls == QUANT_CLASS:
        base = spec.get("base")
        method = (spec.get("quantization") or {}).get("method") if isinstance(spec.get("quantization"), dict) else None
        base_cls = base.get("class") if isinstance(base, dict) else None
        return ModelKind("quantized" if base_cls in DENOISER_CLASSES else "unknown", cls, method=method)
    if cls == CLASSIFIER_CLASS:
        return ModelKind("classifier", cls)
    if cls == FORECASTER_CLASS:
        return ModelKind("forecaster", cls)
    if isinstance(spec.get("denoiser_fingerprint"), str):
        return ModelKind("covariance head", cls, for_model=spec.get("denoiser") or None)
    return ModelKind("unknown", cls)


def describe(name: str, kind: ModelKind) -> str:
    """What ``name`` is, in words, for a model the command cannot take."""
    if kind.kind == "classifier":
        return (f"{name} is an image classifier ({kind.cls}), not a denoiser; it scores samples (the class:K "
                "reward, the image metrics)")
    if kind.kind == "covariance head":
        target = kind.for_model or "its denoiser"
        return (f"{name} is an OCM covariance head ({kind.cls}) for the model {target}, not a denoiser; sample "
                f"with it through steerdiff sample --model {target} --covariance ocm")
    if kind.kind == "namm":
        return (f"{name} is a NAMM bundle (mirror maps and a mirror-space model), not a plain denoiser; sample it "
                f"with steerdiff constrain sample --model {name}")
    if kind.kind == "forecaster":
        return (f"{name} is a Dynamical Diffusion forecaster ({kind.cls}), whose samples need context frames; use "
                f"steerdiff forecast --model {name} --context FILE")
    if kind.kind == "pipeline":
        return (f"{name} is a diffusers text-to-image pipeline, not a steerdiff model; use it with --pipeline "
                f"{name} --prompt \"...\"")
    if kind.kind == "quantized":
        return (f"{name} is already quantized ({kind.cls}, method {kind.method}); quantize the unquantized "
                "model it was made from instead")
    return f"{name} is not a denoiser (config.json class {kind.cls!r})"


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


def load_model(name: str, kinds: Sequence[str] = SAMPLABLE, extra: Sequence[str] = (), loader: Callable | None = None,
               device: torch.device | str = "cpu", shape_ok: Callable | None = None):
    """``loader(name, device=device)`` (default :func:`steerdiff.models.io.load`): a shipped model's name or a
    model directory, checked to be of one of ``kinds`` before any weights are read.

    A missing, unreadable or wrong-kind model is a ``--model`` error that says what it is and lists what the
    command takes (``extra`` names first: the names it accepts besides the shipped models).
    """
    from ...models.io import load

    directory = model_dir(name)
    listing = f"Available: {available(kinds, extra, shape_ok)}"
    if directory is not None:
        kind = classify(directory)
        if kind.kind not in kinds and kind.kind != "unknown":
            raise click.BadParameter(f"{describe(name, kind)}. {listing}", param_hint="--model")
    try:
        model = (loader or load)(name, device=device)
    except (CheckpointError, FileNotFoundError) as err:
        raise click.BadParameter(f"{err}. {listing}", param_hint="--model") from err
    if not hasattr(model, "sample_shape"):
        raise click.BadParameter(f"{name} is not a denoiser ({type(model).__name__} has no sample_shape). {listing}",
                                 param_hint="--model")
    return model
