"""What several subcommands share: ``--out`` checks, ``metrics.json``, loading ``--model``, and plots.

Subcommand modules import this module and library packages only, never the group (:mod:`steerdiff.cli`), so the
command line has no import cycle.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import click
import torch

from ..io import CheckpointError, write_json
from ..models.gmm import BUILTIN_MIXTURES, builtin_mixture


def check_out(out: str) -> Path:
    """``--out`` as a path; an existing non-directory is an error (checked before any expensive work)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    return path


def prepare_out(out: str) -> Path:
    """Create the ``--out`` directory (and its parents); it must be a writable directory."""
    path = check_out(out)
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK):
        raise click.BadParameter(f"{out} is not writable", param_hint="--out")
    return path


def write_metrics(out_dir: Path, result: dict) -> Path:
    """Atomically write ``out_dir/metrics.json`` (numpy scalars and 0-d tensors written as floats)."""
    path = out_dir / "metrics.json"
    write_json(path, result, default=float)
    return path


def available_models(extra: Sequence[str] = ()) -> str:
    """The names ``--model`` accepts besides a directory: ``extra`` first, then the shipped models."""
    from ..models.io import shipped_models

    return ", ".join(dict.fromkeys([*extra, *shipped_models()]))


def load_model(name: str, extra: Sequence[str] = (), loader: Callable | None = None):
    """``loader(name)`` (default :func:`steerdiff.models.io.load`): a shipped model's name or a model directory.

    A missing or unreadable model is a ``--model`` error that lists what exists (``extra`` names first, for the
    names a command accepts besides the shipped models).
    """
    from ..models.io import load

    try:
        return (loader or load)(name)
    except (CheckpointError, FileNotFoundError) as err:
        raise click.BadParameter(f"{err}. Available: {available_models(extra)}", param_hint="--model") from err


def load_denoiser(name: str):
    """``(model, is_mixture)``: a built-in Gaussian mixture (exact denoiser) or a network loaded by name or path."""
    if name in BUILTIN_MIXTURES:
        return builtin_mixture(name), True
    return load_model(name, extra=sorted(BUILTIN_MIXTURES)), False


def plot(draw: Callable, path: Path) -> None:
    """``draw(steerdiff.viz)``, which writes ``path``; without matplotlib, warn and skip the plot."""
    try:
        from .. import viz

        draw(viz)
    except ImportError as err:
        click.echo(f"warning: {err}; skipped {path.name}", err=True)


def plot_samples(samples: torch.Tensor, path: Path, title: str = "", reference: torch.Tensor | None = None,
                 max_images: int | None = None) -> None:
    """An image grid of ``[N, C, H, W]`` samples (the first ``max_images``), else a scatter over ``reference``."""
    if samples.ndim == 4:
        plot(lambda viz: viz.image_grid(samples[:max_images], path), path)
    else:
        plot(lambda viz: viz.scatter(samples, path, reference=reference, title=title), path)
