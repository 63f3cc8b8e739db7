"""Training checkpoints: safetensors for tensors, JSON for everything else, written atomically; never pickled.

A checkpoint is a directory ``out_dir/checkpoints/step_<n>/``::

    model.safetensors       the trained (raw) weights
    ema.safetensors         the EMA weights
    optimizer.safetensors   optimizer state tensors, flattened to "state.<param index>.<name>"
    rng.safetensors         generator states as uint8 tensors
    state.json              step, data position, optimizer param groups and non-tensor state, configs, history

Each directory is built under a temporary name and renamed into place (:func:`steerdiff.io.atomic_dir`), so the
newest ``step_*`` directory is always complete; older ones are deleted only after the new one exists.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
from torch import Tensor

from ..io import (
    CheckpointError,
    atomic_dir,
    flatten_optimizer_state,
    load_tensors,
    read_json,
    save_tensors,
    unflatten_optimizer_state,
    write_json,
)

CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_FILES = ("model.safetensors", "ema.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json")


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``out_dir/checkpoints`` as ``(step, path)``, oldest first."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        match = _STEP_DIR.match(p.name)
        if match and p.is_dir() and all((p / f).is_file() for f in _FILES):
            found.append((int(match.group(1)), p))
    return sorted(found)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory, or ``None``."""
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def save_checkpoint(
    out_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    ema_tensors: dict[str, Tensor],
    optimizer: torch.optim.Optimizer,
    rng: dict[str, Tensor],
    state: dict,
    keep: int = 1,
) -> Path:
    """Write one checkpoint atomically and prune older ones, keeping the newest ``keep``.

    Args:
        out_dir: run directory.
        step: optimizer steps done.
        model: the trained model (raw weights).
        ema_tensors: EMA shadow weights.
        optimizer: the optimizer (its state dict is flattened, see :func:`steerdiff.io.flatten_optimizer_state`).
        rng: generator states as uint8 tensors.
        state: JSON-ready training state (step, data position, configs, history, ...).
        keep: number of checkpoints to keep (>= 1).
    """
    opt_tensors, opt_meta = flatten_optimizer_state(optimizer.state_dict())
    target = Path(out_dir) / CHECKPOINT_DIR / f"step_{step:08d}"
    with atomic_dir(target) as tmp:
        save_tensors(model.state_dict(), tmp / "model.safetensors")
        save_tensors(ema_tensors, tmp / "ema.safetensors")
        save_tensors(opt_tensors, tmp / "optimizer.safetensors")
        save_tensors(rng, tmp / "rng.safetensors")
        write_json(tmp / "state.json", {**state, "step": step, "optimizer": opt_meta})
    for _, old in list_checkpoints(out_dir)[: -max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_checkpoint(directory: str | Path) -> dict:
    """Read a checkpoint directory into ``{"model", "ema", "optimizer", "rng", "state"}`` (tensors and JSON)."""
    directory = Path(directory)
    state = read_json(directory / "state.json")
    opt_meta = state.pop("optimizer", None)
    if opt_meta is None:
        raise CheckpointError(f"{directory}/state.json: missing optimizer section")
    return {
        "model": load_tensors(directory / "model.safetensors"),
        "ema": load_tensors(directory / "ema.safetensors"),
        "optimizer": unflatten_optimizer_state(load_tensors(directory / "optimizer.safetensors"), opt_meta),
        "rng": load_tensors(directory / "rng.safetensors"),
        "state": state,
    }


def write_log(out_dir: str | Path, log: dict) -> None:
    """Write the human-readable run log ``out_dir/train_log.json`` (atomically)."""
    write_json(Path(out_dir) / "train_log.json", log)
