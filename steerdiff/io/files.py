"""Atomic writes and JSON: a crash never leaves a half-written file or directory (docs/methods/conventions.md,
"Errors").

Files go to a temporary sibling first, are flushed to disk, and are moved into place with ``os.replace``, so every
reader sees either the old version or the new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import CheckpointError


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
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary sibling file and ``os.replace`` (all or nothing)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj, default: Callable | None = None) -> None:
    """Atomically write ``obj`` as indented JSON.

    ``default`` converts values JSON has no type for (``float`` writes numpy scalars and 0-d tensors as numbers).
    """
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=default) + "\n")


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
