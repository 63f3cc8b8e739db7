"""Re-runnable training recipes: a JSON file under ``configs/`` names the data, model and hyper-parameters.

Format::

    {
      "name": "digits_unet",
      "data": {"name": "digits", "split": "train"},
      "model": {"class": "EDMPrecond",
                "config": {"sigma_data": 0.5, "net": {"class": "UNet", "config": {...}}}},
      "train": {... TrainConfig fields ...},
      "out_dir": "runs/digits_unet"
    }

Data names:

* ``"digits"``: sklearn 8x8 digits; options ``split``, ``labels`` (``"class"``, the default, or ``"none"``);
* ``"toy2d:<name>"``: options ``n``, ``seed``, ``labels`` (``"none"``, or ``"signs"``: one slot per
  coordinate holding its sign);
* ``"shapes:<split>"``: options ``n``, ``part``, ``seed``, ``labels`` (``"pairs"``: (shape, colour) slots, or
  ``"joint"``: one class ``shape * 4 + colour``).

The data modules are imported when a recipe runs, not when this module is imported. A method package adds its own
data names with :func:`register_dataset` (e.g. ``digits_duplicated`` in :mod:`steerdiff.app.recipes.geometry`), so its
recipes run through :func:`train_from_config` (and ``steerdiff train``) like the built-in ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..io import read_json
from ..io.plugins import Registry
from ..models.io import build_model
from .trainer import TrainConfig, TrainResult, train

DATASETS: Registry[Callable[..., Any]] = Registry("dataset", argument="data")


def register_dataset(name: str) -> Callable:
    """Decorator registering ``loader(**options)`` as the recipe data name ``name``: it returns what
    :func:`steerdiff.train.train` takes (``(x, cond or None)``, ``x`` or a stream ``stream(step, batch_size)``); the
    recipe's ``data`` options are its keyword arguments."""
    return DATASETS.register(name)

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
_SHAPES_COLOURS = 4  # four colours (docs/methods/coind.md, "The coloured-shapes data")


def load_dataset(spec: str | dict) -> tuple[Tensor, Tensor | None] | Callable:
    """Load the training tensors ``(x, cond or None)`` named by a recipe's ``data`` entry; for a simulator
    (``advection:1d`` / ``advection:2d``, options ``seed``) a data stream ``stream(step, batch_size)`` instead.

    Raises:
        ValueError: unknown data name or option.
    """
    opts = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = opts.pop("name", None)
    if not isinstance(name, str):
        raise ValueError(f'data must be a name or {{"name": ..., options}}, got {spec!r}')
    if name in DATASETS:
        return DATASETS.get(name)(**opts)
    kind, _, arg = name.partition(":")
    if kind == "digits":
        from ..data.digits import load_digits

        x, y = load_digits(opts.pop("split", "train"))
        labels = opts.pop("labels", "class")
        _no_leftovers(name, opts)
        if labels not in ("class", "none"):
            raise ValueError(f"data {name!r}: labels must be 'class' or 'none', got {labels!r}")
        y = torch.as_tensor(y, dtype=torch.long) if labels == "class" else None
        return torch.as_tensor(x, dtype=torch.float32), y
    if kind == "toy2d" and arg:
        from ..data.toy2d import load_toy

        labels = opts.pop("labels", "none")
        x = torch.as_tensor(load_toy(arg, opts.pop("n", 20000), opts.pop("seed", 0)), dtype=torch.float32)
        _no_leftovers(name, opts)
        if labels == "none":
            return x, None
        if labels == "signs":
            return x, (x > 0).long()
        raise ValueError(f"data {name!r}: labels must be 'none' or 'signs', got {labels!r}")
    if kind == "shapes" and arg:
        from ..data.shapes import generate

        labels = opts.pop("labels", "pairs")
        x, y = generate(opts.pop("n", 20000), arg, opts.pop("part", "train"), opts.pop("seed", 0))
        _no_leftovers(name, opts)
        x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long)
        if labels == "pairs":
            return x, y
        if labels == "joint":
            return x, y[:, 0] * _SHAPES_COLOURS + y[:, 1]
        raise ValueError(f"data {name!r}: labels must be 'pairs' or 'joint', got {labels!r}")
    if kind == "advection" and arg in ("1d", "2d"):  # a stream of fresh sequences each step (steerdiff.data.advection)
        from ..data.advection import training_stream

        seed = opts.pop("seed", 0)
        _no_leftovers(name, opts)
        return training_stream(seed, dims=int(arg[0]))
    raise ValueError(f"unknown data {name!r}; expected 'digits', 'toy2d:<name>', 'shapes:<split>', "
                     f"'advection:1d|2d' or a registered name {DATASETS.names()}")


def _no_leftovers(name: str, opts: dict) -> None:
    if opts:
        raise ValueError(f"data {name!r}: unknown options {sorted(opts)}")


def resolve_config(path: str | Path) -> Path:
    """A recipe path, or a bare name looked up as ``configs/<name>.json`` (cwd first, then the repository)."""
    p = Path(path)
    if p.is_file():
        return p
    for root in (Path("configs"), REPO_CONFIGS):
        candidate = root / f"{path}.json"
        if candidate.is_file():
            return candidate
    names = sorted(q.stem for q in REPO_CONFIGS.glob("*.json")) if REPO_CONFIGS.is_dir() else []
    raise FileNotFoundError(f"training config {str(path)!r} not found; available recipes: {names}")


def train_from_config(
    path: str | Path,
    resume: bool = False,
    out_dir: str | Path | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    overrides: dict[str, Any] | None = None,
    prepare_model: Callable[[nn.Module], None] | None = None,
) -> TrainResult:
    """Run a recipe: load its data, build its model under its seed, train, save the EMA to ``out_dir/final``.

    Args:
        path: recipe JSON path or bare name (``"digits_unet"``).
        resume: continue from the newest checkpoint in the run directory.
        out_dir: run directory; default the recipe's ``out_dir``, else ``runs/<recipe name>``.
        progress: show a progress bar.
        stop_after: stop with a checkpoint after this many total steps (see :func:`train`).
        overrides: values replacing fields of the recipe's ``train`` section (``{"steps": 2000}``); an unknown
            field raises a ``ValueError`` listing the known ones. The run's log records the resulting config.
        prepare_model: called on the freshly built model before training (e.g. to fill a buffer from another
            shipped model, :mod:`steerdiff.app.recipes.rbmod`).
    """
    path = resolve_config(path)
    recipe = read_json(path)
    missing = [k for k in ("data", "model", "train") if k not in recipe]
    if missing:
        raise ValueError(f"{path}: recipe is missing {missing}")
    cfg = TrainConfig.from_dict({**recipe["train"], **(overrides or {})})
    data = load_dataset(recipe["data"])  # (x, cond) or a stream of fresh batches
    # The initial weights depend only on the recipe's seed, not on whatever ran before in this process.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = build_model(recipe["model"])
    if prepare_model is not None:
        prepare_model(model)
    out = Path(out_dir or recipe.get("out_dir") or Path("runs") / recipe.get("name", path.stem))
    return train(model, data, cfg, out, resume=resume, progress=progress, stop_after=stop_after)
