"""Checkpoint I/O: ``config.json`` + ``model.safetensors`` (huggingface_hub mixin layout; DESIGN.md "Errors").

A saved model is a directory::

    config.json        {"class": "EDMPrecond", "config": {..., "net": {"class": "UNet", "config": {...}}},
                        "steerdiff_version": "0.1.0"}
    model.safetensors  the state dict

Only safetensors are read: pickle-based files (``.pt``, ``.pth``, ``.ckpt``, ``.pkl``, ...) are refused before
a single byte of them is parsed, because unpickling runs arbitrary code. Writes are atomic: files go to a
temporary sibling first and are moved into place with ``os.replace``, so a crash never leaves a half-written
model.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".bin")
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"

MODEL_REGISTRY: dict[str, type[nn.Module]] = {}
"""Registered model classes by name; ``build_model`` looks classes up here (never by import path)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read safely or does not match its config."""


def register_model(name: str | None = None) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator registering a model under ``name`` (default: the class name) for :func:`build_model`.

    A registered class takes its config as constructor kwargs and exposes it as ``self.config`` (a JSON dict).
    """

    def decorate(cls: type[nn.Module]) -> type[nn.Module]:
        key = name or cls.__name__
        if key in MODEL_REGISTRY and MODEL_REGISTRY[key] is not cls:
            raise ValueError(f"a different model class is already registered as {key!r}")
        MODEL_REGISTRY[key] = cls
        cls.registered_name = key
        return cls

    return decorate


_BUILTIN_MODULES = ("precond", "mlp", "unet", "dit", "classifier")


def _ensure_builtin_models() -> None:
    # Imported lazily: the model modules import this one for ``register_model``.
    for name in _BUILTIN_MODULES:
        importlib.import_module(f"{__package__}.{name}")


def model_spec(model: nn.Module) -> dict:
    """``{"class": <registered name>, "config": model.config}`` for a registered model."""
    name = getattr(type(model), "registered_name", None)
    if name is None or MODEL_REGISTRY.get(name) is not type(model):
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
        raise CheckpointError(f"unknown model class {name!r} in config; registered: {sorted(MODEL_REGISTRY)}")
    if not isinstance(config, dict):
        raise CheckpointError(f"config of {name!r} must be a JSON object, got {type(config).__name__}")
    try:
        return MODEL_REGISTRY[name](**config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"invalid config for model class {name!r}: {e}") from e


# ---------------------------------------------------------------------------------------------- atomic writes


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``target``; it replaces ``target`` on success, vanishes on error.

    An existing ``target`` is first renamed aside and removed only once the new directory is in place, so at
    every moment one complete version exists on disk.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Flush file contents before the rename publishes them (a rename can outlive unflushed data on power loss).
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / "previous")
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary sibling file and ``os.replace`` (all or nothing)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def save_tensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Write a flat tensor dict as safetensors (tensors made contiguous and moved to CPU first)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a safetensors file; anything else (a pickle, a truncated or corrupt file) is a :class:`CheckpointError`."""
    from safetensors.torch import load_file

    path = Path(path)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(
            f"{path}: only safetensors files are accepted (pickle-based checkpoints are never loaded)"
        )
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own SafetensorError (not a ValueError) for bad headers
        raise CheckpointError(f"{path}: not a valid safetensors file (corrupt or truncated?): {e}") from e


def read_json(path: str | os.PathLike) -> dict:
    """Read a JSON object; a missing file or invalid JSON is a :class:`CheckpointError`."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: file not found") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: invalid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


# ---------------------------------------------------------------------------------------------- save / load


def _version() -> str:
    import steerdiff

    return getattr(steerdiff, "__version__", "unknown")


def save(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Save a registered model as ``directory/config.json`` + ``directory/model.safetensors`` (atomically).

    Args:
        model: a registered model (e.g. ``EDMPrecond`` wrapping a backbone).
        directory: target folder; replaced as a whole if it exists.

    Returns:
        The directory path.
    """
    spec = model_spec(model)
    spec["steerdiff_version"] = _version()
    with atomic_dir(directory) as tmp:
        write_json(tmp / CONFIG_NAME, spec)
        save_tensors(model.state_dict(), tmp / WEIGHTS_NAME)
    return Path(directory)


def shipped_models() -> list[str]:
    """Names of the models shipped in ``steerdiff/assets/`` (loadable with ``load(name)``)."""
    if not ASSETS_DIR.is_dir():
        return []
    return sorted(p.name for p in ASSETS_DIR.iterdir() if (p / CONFIG_NAME).is_file())


def _resolve(name_or_dir: str | os.PathLike) -> Path:
    path = Path(name_or_dir)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(f"{path}: only safetensors checkpoints are accepted; pickle files are never unpickled")
    if path.exists():
        return path.parent if path.is_file() else path
    if isinstance(name_or_dir, str) and os.sep not in name_or_dir and "/" not in name_or_dir:
        if (ASSETS_DIR / name_or_dir / CONFIG_NAME).is_file():
            return ASSETS_DIR / name_or_dir
        available = shipped_models()
        raise CheckpointError(
            f"unknown model {name_or_dir!r}: not a directory and not a shipped model; "
            f"shipped models: {available if available else 'none'}"
        )
    raise CheckpointError(f"{path}: no such checkpoint directory")


def _first(names: list[str], n: int = 10) -> str:
    return f"{names[:n]}{' ...' if len(names) > n else ''}"


def load_state_strict(model: nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Load ``tensors`` into ``model`` after checking names and shapes, with errors that list the differences."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: tensor names do not match the model: missing {_first(missing)}, unexpected {_first(unexpected)}"
        )
    wrong = [
        f"{k}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in tensors.items()
        if v.shape != expected[k].shape
    ]
    if wrong:
        raise CheckpointError(f"{source}: tensor shapes do not match the model: {wrong[:10]}")
    model.load_state_dict(tensors, strict=True)


def load(name_or_dir: str | os.PathLike, device: str | torch.device = "cpu") -> nn.Module:
    """Load a model saved with :func:`save`, or a shipped model by name; returned in eval mode.

    Args:
        name_or_dir: a checkpoint directory (or its ``config.json`` / ``model.safetensors``), or the bare
            name of a model in ``steerdiff/assets/``.
        device: where to put the model.

    Raises:
        CheckpointError: unknown name, pickle checkpoint, corrupt files, unknown class, mismatching tensors.
    """
    directory = _resolve(name_or_dir)
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        hint = f" (found pickle-based files {pickles}, which are never unpickled)" if pickles else ""
        raise CheckpointError(f"{directory}: no {WEIGHTS_NAME}; only safetensors checkpoints are accepted{hint}")
    spec = read_json(directory / CONFIG_NAME)
    if spec.get("class") == "QuantizedModel":  # a steerdiff.quant checkpoint (imported lazily: no import cycle)
        from ..quant.serialize import load as load_quantized

        return load_quantized(directory, device=device)
    model = build_model(spec)
    load_state_strict(model, load_tensors(weights), str(weights))
    return model.to(device).eval()
