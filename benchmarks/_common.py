"""What the benchmark scripts share: their results folder, provenance, markdown tables and atomic writes.

Every script writes into ``benchmarks/results/<benchmark>/`` (:func:`results_dir`, ``<benchmark>`` = the script's
name); ``benchmarks/results/README.md`` indexes the current tables. A run records :func:`provenance` (command,
git commit, versions, machine, threads, date) in its JSON and puts :func:`provenance_line` under its markdown
title; :func:`markdown_table` formats every table. Scripts import this module as a sibling::

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import markdown_table, provenance, results_dir  # noqa: E402
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import steerdiff.io as sdio  # atomic_write_text, write_json

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

__all__ = ["RESULTS", "ROOT", "markdown_table", "provenance", "provenance_line", "results_dir", "write_json",
           "write_text"]


def results_dir(benchmark: str) -> Path:
    """``benchmarks/results/<benchmark>/``, created if missing."""
    path = RESULTS / benchmark
    path.mkdir(parents=True, exist_ok=True)
    return path


def _command(args: Sequence[str] | None, script: str | os.PathLike | None) -> tuple[str, list[str]]:
    script = Path(sys.argv[0] if script is None else script)
    try:
        shown = script.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(script)
    args = list(sys.argv[1:] if args is None else args)
    return " ".join(["python", shown, *map(shlex.quote, args)]), [shown, *args]


def _git() -> dict | None:
    """``{"commit", "dirty"}`` of the checkout (tracked files only), or None outside git. Read-only: status runs with
    ``--no-optional-locks`` so it never rewrites the index."""

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "--no-optional-locks", "-C", str(ROOT), *cmd], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return None


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def provenance(args: Sequence[str] | None = None, script: str | os.PathLike | None = None,
               packages: Sequence[str] = ()) -> dict:
    """Where a result comes from: the command (``args`` after the script, default ``sys.argv[1:]``; ``script``
    default ``sys.argv[0]``), git commit and whether tracked files differ from it, python / torch / numpy /
    steerdiff versions (and those of ``packages``), the machine, torch's intra-op threads and the date."""
    import numpy
    import torch

    import steerdiff

    command, argv = _command(args, script)
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
                "steerdiff": getattr(steerdiff, "__version__", None)} | {p: _version(p) for p in packages}
    return {"command": command, "argv": argv, "git": _git(), "versions": versions,
            "machine": {"platform": platform.platform(), "arch": platform.machine(), "cpu_count": os.cpu_count()},
            "threads": torch.get_num_threads(),
            "env": {k: os.environ[k] for k in THREAD_VARIABLES if k in os.environ},
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}


def provenance_line(meta: dict) -> str:
    """One markdown line for a provenance dict: date, commit, machine, torch, threads, then the command. Also reads
    the older ad-hoc records (``torch`` / ``machine`` / ``threads`` / ``command`` or ``argv`` at the top)."""
    parts = []
    if meta.get("date"):
        parts.append(str(meta["date"]))
    git = meta.get("git")
    if git:
        parts.append(f"commit {git['commit'][:10]}" + (" (uncommitted changes)" if git.get("dirty") else ""))
    machine = meta.get("machine")
    if isinstance(machine, dict):
        parts.append(f"{machine['platform']}, {machine['cpu_count']} CPUs")
    elif machine:
        parts.append(str(machine))
    torch_version = meta.get("versions", {}).get("torch", meta.get("torch"))
    if torch_version:
        parts.append(f"torch {torch_version}")
    if meta.get("threads") is not None:
        parts.append(f"{meta['threads']} thread(s)")
    command = meta.get("command") or ("python " + " ".join(meta["argv"]) if meta.get("argv") else None)
    return ". ".join(filter(None, [", ".join(parts), f"`{command}`" if command else ""]))


def markdown_table(header: Sequence[str], rows: Iterable[Sequence], align: str | None = None) -> str:
    """A markdown table: ``header`` cells, then one line per row (cells are ``str``-ed: format numbers first).
    ``align``: one letter per column, ``l`` (default), ``r`` or ``c``."""
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    align = align or "l" * len(header)
    if len(align) != len(header):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(header)} columns")
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def _plain(obj):
    """``obj`` with numpy scalars and 0-d tensors (anything with ``.item()``) turned into Python numbers."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomically write ``text`` (all or nothing); returns the path."""
    sdio.atomic_write_text(path, text)
    return Path(path)


def write_json(path: str | os.PathLike, obj) -> Path:
    """Atomically write ``obj`` as indented JSON (numpy / 0-d torch numbers as plain numbers); returns the path."""
    sdio.write_json(path, _plain(obj))
    return Path(path)
