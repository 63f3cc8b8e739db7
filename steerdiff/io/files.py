"""Atomic writes and JSON: a crash never leaves a half-written file or directory (docs/methods/conventions.md,
"Errors").

Files go to a temporary sibling first, are flushed to disk, and are moved into place with ``os.replace``, so every
reader sees either the old version or the new one. They get the permissions ``open()`` would give them (the user's
umask; an existing file keeps its mode), never the private 0600/0700 of ``tempfile``.

A directory is replaced only when it is, provably, a checkpoint this library wrote: :func:`atomic_dir` writes a
marker, :data:`MARKER_NAME`, listing every file it wrote, and replaces an existing directory only when that marker
is there and the directory holds nothing else (:func:`replace_refusal`). Nothing is ever written under the installed
package (its shipped checkpoints, ``steerdiff/assets/``, need no marker to load).
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
from .version import __version__

MARKER_NAME = ".steerdiff-checkpoint"
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _umask() -> int:
    """The process umask (read from /proc where it can be; else set and restored at once)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def inside_package(path: str | os.PathLike) -> Path | None:
    """The installed package directory if ``path`` is (or lies under) it, else None."""
    resolved = Path(os.path.abspath(path)).resolve()
    return PACKAGE_DIR if resolved == PACKAGE_DIR or PACKAGE_DIR in resolved.parents else None


def _listed(directory: Path) -> set[str] | None:
    """The files the marker of ``directory`` lists (relative POSIX paths), or None without a valid marker."""
    try:
        obj = json.loads((directory / MARKER_NAME).read_text())
        files = obj["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files)


def replace_refusal(directory: str | os.PathLike, what: str = "checkpoint") -> str | None:
    """Why replacing ``directory`` as a whole would destroy something, or None when it is safe.

    Safe: an absent path, an empty directory, or a directory whose :data:`MARKER_NAME` lists every file in it (a
    checkpoint this library wrote, nothing added since). Anything else is refused, and so is a path under the
    installed package. ``what`` names the kind of directory in the reason ("checkpoint", "demo report").
    """
    path = Path(directory)
    if inside_package(path) is not None:
        return (f"{path} lies inside the installed steerdiff package ({PACKAGE_DIR}), which is never written to "
                "(its shipped models are read-only); choose a path outside it")
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink():
        return (f"{path} is a symbolic link (to {os.readlink(path)}); replacing it would not write where it points, "
                "so give the directory itself or a new path")
    if not path.is_dir():
        return f"{path} is an existing file; a {what} is a directory (choose another path)"
    entries = list(path.rglob("*"))
    if not entries:
        return None
    listed = _listed(path)
    if listed is None:
        return (f"{path} is a non-empty directory that holds no {what} written by steerdiff (no {MARKER_NAME} "
                "marker); writing replaces the directory as a whole, so choose a new or empty one")
    others = sorted(rel for e in entries
                    if (rel := e.relative_to(path).as_posix()) != MARKER_NAME and rel not in listed
                    and not (e.is_dir() and not e.is_symlink() and any(f.startswith(rel + "/") for f in listed)))
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        return (f"{path} is a steerdiff {what} that also holds files steerdiff did not write ({shown}); writing "
                "replaces the directory as a whole, so move them or choose a new or empty directory")
    return None


def write_marker(directory: str | os.PathLike) -> None:
    """Write :data:`MARKER_NAME` into ``directory``, listing every file in it: the proof that steerdiff wrote it all
    (:func:`atomic_dir` does this; a writer that moves its own directory into place calls it last)."""
    directory = Path(directory)
    files = sorted(rel for f in directory.rglob("*")
                   if not f.is_dir() and (rel := f.relative_to(directory).as_posix()) != MARKER_NAME)
    atomic_write_text(directory / MARKER_NAME,
                      json.dumps({"steerdiff_version": __version__, "files": files}, indent=2) + "\n")


def add_to_checkpoint(directory: str | os.PathLike, name: str, text: str) -> Path:
    """Atomically write ``text`` to ``directory/name`` in a checkpoint :func:`atomic_dir` wrote, and list it in the
    marker, so that the checkpoint stays replaceable (the file is the library's, not the user's)."""
    directory = Path(directory)
    listed = _listed(directory)
    if listed is None:
        raise ValueError(f"directory: {directory} is not a checkpoint steerdiff wrote (no {MARKER_NAME})")
    atomic_write_text(directory / name, text)
    atomic_write_text(directory / MARKER_NAME, json.dumps(
        {"steerdiff_version": __version__, "files": sorted(listed | {Path(name).as_posix()})}, indent=2) + "\n")
    return directory / name


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``target``; it replaces ``target`` on success, vanishes on error.

    An existing ``target`` is first renamed aside and removed only once the new directory is in place, so at
    every moment one complete version exists on disk. The new directory gets a :data:`MARKER_NAME` listing its
    files, and the user's umask (as ``mkdir`` would).

    Raises:
        ValueError: ``target`` exists and is not a checkpoint this library wrote, or lies in the installed package
            (:func:`replace_refusal`; checked before and again just before the swap).
    """
    target = Path(target)
    why = replace_refusal(target)
    if why is not None:
        raise ValueError(f"directory: {why}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private (0700)
        yield tmp
        write_marker(tmp)
        why = replace_refusal(target)  # the user may have put files there while we wrote
        if why is not None:
            raise ValueError(f"directory: {why}")
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
    try:
        mode = path.stat().st_mode & 0o7777  # an existing file keeps its mode, as open() would
    except OSError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp makes it private (0600)
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
