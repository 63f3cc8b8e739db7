"""Tensors on disk: safetensors only (never a pickle), strict state-dict loading, optimizer state as tensors + JSON.

Unpickling runs arbitrary code, so pickle-based files (``.pt``, ``.pth``, ``.ckpt``, ``.pkl``, ...) are refused
before a byte of them is parsed.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import Tensor, nn

from .errors import CheckpointError
from .files import atomic_write_bytes

PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".bin")


def save_tensors(tensors: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write a flat tensor dict as safetensors (tensors made contiguous and moved to CPU first), atomically (a
    temporary sibling file renamed into place), with ``metadata`` (strings) beside ``format: pt``."""
    from safetensors.torch import save

    meta = {"format": "pt", **(metadata or {})}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise TypeError("save_tensors: metadata must map strings to strings")
    atomic_write_bytes(path, save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=meta))


def load_tensors(path: str | os.PathLike) -> dict[str, Tensor]:
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


def _first(names: list[str], n: int = 10) -> str:
    return f"{names[:n]}{' ...' if len(names) > n else ''}"


def load_state_strict(model: nn.Module, tensors: dict[str, Tensor], source: str, *, check_dtype: bool = False,
                      mismatch: str = "do not match the model") -> None:
    """Load ``tensors`` into ``model`` after checking names and shapes (and dtypes with ``check_dtype``), with
    errors that name ``source``, say how the tensors differ (``mismatch``) and list the differences."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{source}: tensor names {mismatch}: missing {_first(missing)}, "
                              f"unexpected {_first(unexpected)}")
    wrong = [
        f"{k}: file {tuple(v.shape)} {v.dtype} vs expected {tuple(expected[k].shape)} {expected[k].dtype}"
        if check_dtype else f"{k}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in tensors.items()
        if v.shape != expected[k].shape or (check_dtype and v.dtype != expected[k].dtype)
    ]
    if wrong:
        what = "shapes or dtypes" if check_dtype else "shapes"
        raise CheckpointError(f"{source}: tensor {what} {mismatch}: {wrong[:10]}")
    model.load_state_dict(tensors, strict=True)


def flatten_optimizer_state(state_dict: dict, prefix: str = "state") -> tuple[dict[str, Tensor], dict]:
    """Split ``optimizer.state_dict()`` into flat tensors ``"<prefix>.<param index>.<name>"`` and a JSON-ready dict
    of everything else (param groups, non-tensor state)."""
    tensors: dict[str, Tensor] = {}
    other: dict[str, dict] = {}
    for pid, entries in state_dict["state"].items():
        for name, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"{prefix}.{pid}.{name}"] = value
            else:
                other.setdefault(str(pid), {})[name] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state_dict["param_groups"]]
    tuple_keys = sorted({k for g in state_dict["param_groups"] for k, v in g.items() if isinstance(v, tuple)})
    return tensors, {"param_groups": groups, "state": other, "tuple_keys": tuple_keys}


def unflatten_optimizer_state(tensors: dict[str, Tensor], meta: dict, prefix: str = "state") -> dict:
    """Inverse of :func:`flatten_optimizer_state` (tensors of other prefixes are an error)."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        head, pid, name = key.split(".", 2)
        if head != prefix:
            raise CheckpointError(f"unexpected optimizer tensor name {key!r}")
        state.setdefault(int(pid), {})[name] = value
    for pid, entries in meta.get("state", {}).items():
        state.setdefault(int(pid), {}).update(entries)
    tuple_keys = set(meta.get("tuple_keys", []))
    groups = [{k: (tuple(v) if k in tuple_keys else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}
