"""Saving and loading models: ``config.json`` + ``model.safetensors`` (huggingface_hub mixin layout).

A saved model is a directory::

    config.json        {"class": "EDMPrecond", "config": {..., "net": {"class": "UNet", "config": {...}}},
                        "steerdiff_version": "0.1.0"}
    model.safetensors  the state dict

Model classes are registered by name with :func:`register_model` and built from their JSON config, never by
import path. :func:`load` reads ``config.json`` and hands the directory to the checkpoint format whose ``"class"``
it names (:func:`steerdiff.io.register_format`); :func:`save` hands a model to the format that handles it (a
quantized model to ``steerdiff.quant``'s format), so what ``save`` writes ``load`` reads back. This module
registers the default format, a plain registered model. Kinds that need more than a directory (an OCM head needs
its denoiser, a NAMM bundle its distance) are refused by both with a pointer to their own functions. Files are
written atomically and read as safetensors only (:mod:`steerdiff.io`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..io import (
    CONFIG_NAME,
    PICKLE_SUFFIXES,
    WEIGHTS_NAME,
    CheckpointError,
    Registry,
    __version__,
    atomic_dir,
    find_format,
    find_marked_format,
    load_directory,
    load_state_strict,
    load_tensors,
    read_json,
    register_format,
    save_object,
    save_tensors,
    write_json,
)

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"

MODEL_REGISTRY: Registry[type[nn.Module]] = Registry("model class", argument="class")
"""Registered model classes by name; :func:`build_model` looks classes up here (never by import path)."""


def register_model(name: str | None = None) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator registering a model under ``name`` (default: the class name) for :func:`build_model`.

    A registered class takes its config as constructor kwargs and exposes it as ``self.config`` (a JSON dict).
    """

    def decorate(cls: type[nn.Module]) -> type[nn.Module]:
        key = name or cls.__name__
        MODEL_REGISTRY.add(key, cls)
        cls.registered_name = key
        return cls

    return decorate


_BUILTIN_MODULES = ("precond", "mlp", "unet", "dit", "classifier", "frames", "icnn", "ocm_heads", "style_dit",
                    "sequence", "local_transformer", "motion_vq", "graph_transformer")


def _ensure_builtin_models() -> None:
    # Imported lazily: the model modules import this one for ``register_model``.
    for name in _BUILTIN_MODULES:
        importlib.import_module(f"{__package__}.{name}")


def model_spec(model: nn.Module) -> dict:
    """``{"class": <registered name>, "config": model.config}`` for a registered model."""
    name = getattr(type(model), "registered_name", None)
    if name is None or name not in MODEL_REGISTRY or MODEL_REGISTRY.get(name) is not type(model):
        raise TypeError(f"{type(model).__name__} is not a registered model (decorate it with @register_model())")
    return {"class": name, "config": dict(model.config)}


def build_model(spec: dict) -> nn.Module:
    """Build a model from ``{"class": name, "config": {...}}`` (as written in ``config.json``).

    Raises:
        CheckpointError: the spec is malformed, names an unknown class, or the config does not fit the class.
    """
    _ensure_builtin_models()
    if not isinstance(spec, dict) or not isinstance(spec.get("class"), str):
        raise CheckpointError(f'model config must be a dict {{"class": name, "config": {{...}}}}, got {spec!r}')
    name, config = spec["class"], spec.get("config", {})
    if name not in MODEL_REGISTRY:
        raise CheckpointError(f"unknown model class {name!r} in config; registered: {MODEL_REGISTRY.names()}")
    if not isinstance(config, dict):
        raise CheckpointError(f"config of {name!r} must be a JSON object, got {type(config).__name__}")
    try:
        return MODEL_REGISTRY.get(name)(**config)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:  # torch raises RuntimeError for bad sizes
        raise CheckpointError(f"invalid config for model class {name!r}: {e}") from e


def check_device(device: str | int | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device`` (None: the CPU), checked to exist on this machine (before any file is read).

    Raises:
        TypeError: ``device`` is not a string, an int, a ``torch.device`` or None.
        ValueError: not a device name (``"gpu"``), or a device this machine lacks (``"cuda"`` without CUDA).
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device must be a torch.device or a string such as 'cpu' or 'cuda:0', got "
                        f"{type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError(f"device must be a device such as 'cpu', 'cuda' or 'cuda:0', got {device!r} ({e})") from e
    try:
        torch.empty(0, device=dev)  # the one reliable availability test (CUDA, MPS, a device index out of range)
    except (RuntimeError, AssertionError, ValueError) as e:
        raise ValueError(f"device {device!r} is not available on this machine: {e}") from e
    return dev


def save(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Save a model as ``directory/config.json`` + ``directory/model.safetensors`` (atomically), in the format
    :func:`load` reads back: a registered model as itself, a quantized model (:func:`steerdiff.quant.quantize`) in
    the quantized format.

    Args:
        model: a registered model (e.g. ``EDMPrecond`` wrapping a backbone), or a quantized one.
        directory: target folder; replaced as a whole if it holds a checkpoint (an existing file, or a non-empty
            folder without ``config.json``, is refused rather than destroyed).

    Returns:
        The directory path.

    Raises:
        TypeError: ``model`` is not a kind ``load`` can rebuild from a directory alone (an unregistered module, a
            diffusers-wrapped denoiser, an OCM head or a NAMM bundle: the message names what to use instead).
        ValueError: ``directory`` is an existing file or a non-empty folder that holds no checkpoint.
    """
    return save_object(model, directory)


def _unsaveable(model) -> str:
    """Why the default format cannot save ``model`` and what to do instead."""
    unet = getattr(getattr(model, "net", None), "unet", None)
    if not isinstance(model, nn.Module) and hasattr(unet, "save_pretrained"):
        return ("model is a diffusers UNet wrapped by steerdiff.models.from_diffusers: save the UNet and its scheduler "
                "with unet.save_pretrained(dir) and scheduler.save_pretrained(dir), and wrap them again with "
                "from_diffusers after loading them with diffusers")
    from .gmm import GaussianMixture  # lazily: gmm is a sibling module, not needed to save a network

    if isinstance(model, GaussianMixture):
        return ("model is an analytic GaussianMixture, which has no weights file: rebuild it from its weights, means "
                "and covs (or steerdiff.models.builtin_mixture(name))")
    if not isinstance(model, nn.Module):
        return (f"model must be a registered steerdiff model (an nn.Module whose class is decorated with "
                f"@steerdiff.models.register_model()), got {type(model).__name__}")
    return (f"model is a {type(model).__name__}, which is not a registered steerdiff model: decorate its class with "
            "@steerdiff.models.register_model() (its constructor kwargs as self.config) to save it")


def _save_model(model: nn.Module, directory: str | os.PathLike) -> Path:
    """The default format's saver: a registered model's spec and state dict."""
    try:
        spec = model_spec(model)
    except TypeError as e:
        raise TypeError(_unsaveable(model)) from e
    spec["steerdiff_version"] = __version__
    with atomic_dir(directory) as tmp:
        write_json(tmp / CONFIG_NAME, spec)
        save_tensors(model.state_dict(), tmp / WEIGHTS_NAME)
    return Path(directory)


def shipped_models() -> list[str]:
    """Names of the models shipped in ``steerdiff/assets/`` (loadable with ``load(name)``)."""
    if not ASSETS_DIR.is_dir():
        return []
    names = []
    for p in sorted(ASSETS_DIR.iterdir()):
        if not (p / CONFIG_NAME).is_file():
            continue
        try:
            loadable = find_format(read_json(p / CONFIG_NAME)).loadable
        except CheckpointError:
            loadable = True  # listed, so that loading it reports what is wrong with it
        if loadable:
            names.append(p.name)  # not OCM heads, whose loading needs their denoiser (steerdiff.covariance)
    return names


def _resolve(name_or_dir: str | os.PathLike) -> Path:
    path = Path(name_or_dir)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(f"{path}: only safetensors checkpoints are accepted; pickle files are never unpickled")
    if path.exists():
        return path.parent if path.is_file() else path
    if isinstance(name_or_dir, str) and os.sep not in name_or_dir and "/" not in name_or_dir:
        asset = ASSETS_DIR / name_or_dir
        if (asset / CONFIG_NAME).is_file() or (asset.is_dir() and find_marked_format(asset) is not None):
            return asset
        available = shipped_models()
        raise CheckpointError(
            f"unknown model {name_or_dir!r}: not a directory and not a shipped model; "
            f"shipped models: {available if available else 'none'}"
        )
    raise CheckpointError(f"{path}: no such checkpoint directory")


def load(name_or_dir: str | os.PathLike, device: str | torch.device = "cpu") -> nn.Module:
    """Load a model saved with :func:`save` (or any registered checkpoint format), or a shipped model by name;
    returned in eval mode.

    Args:
        name_or_dir: a checkpoint directory (or its ``config.json`` / ``model.safetensors``), or the bare
            name of a model in ``steerdiff/assets/``.
        device: where to put the model (checked to exist before any file is read).

    Raises:
        CheckpointError: unknown name, pickle checkpoint, corrupt files, unknown class, mismatching tensors, or a
            directory of a kind that needs its own loader (an OCM head, a NAMM bundle: the message names it).
        TypeError: ``name_or_dir`` is not a str or path.
        TypeError, ValueError: ``device`` is not a device name, or names one this machine lacks.
    """
    if not isinstance(name_or_dir, (str, os.PathLike)):
        raise TypeError(f"name_or_dir must be a shipped model's name or a checkpoint directory (a str or path), got "
                        f"{type(name_or_dir).__name__}; shipped models: {shipped_models()}")
    if not str(name_or_dir).strip():  # Path("") is the working directory
        raise CheckpointError(f"name_or_dir is empty; give a checkpoint directory or a shipped model's name: "
                              f"{shipped_models()}")
    check_device(device)
    directory = _resolve(name_or_dir)
    if not (directory / CONFIG_NAME).is_file():
        marked = find_marked_format(directory)
        if marked is not None:
            return marked.load(directory, {}, device=device)
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        hint = f" (found pickle-based files {pickles}, which are never unpickled)" if pickles else ""
        raise CheckpointError(f"{directory}: no {WEIGHTS_NAME}; only safetensors checkpoints are accepted{hint}")
    return load_directory(directory, read_json(directory / CONFIG_NAME), device=device)


@register_format("model", config_class=None, save=_save_model)
def _load_model(directory: Path, spec: dict, device: str | torch.device = "cpu") -> nn.Module:
    """The default format: a registered model class, its config and its state dict."""
    model = build_model(spec)
    weights = directory / WEIGHTS_NAME
    load_state_strict(model, load_tensors(weights), str(weights))
    return model.to(device).eval()
