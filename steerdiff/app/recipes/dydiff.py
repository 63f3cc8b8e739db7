"""Training recipes of DyDiff forecasters: a ``configs/*.json`` recipe run with another seed or mixing ratio
(Dynamical Diffusion, Guo et al., ICLR 2025; the equal-budget protocol of docs/methods/dydiff.md "The validation
protocol": identical network, seed, steps, data stream and sampler, only ``r`` differs).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from ...io import read_json
from ...models.io import build_model
from ...temporal.dydiff import DyDiffDenoiser, check_r
from ...train import TrainConfig, TrainResult, latest_checkpoint, train
from ...train.recipes import load_dataset, resolve_config


def read_recipe(recipe: str | Path | dict, *, seed: int | None = None, r: float | None = None) -> dict:
    """A forecaster recipe (path, bare name in ``configs/`` or dict) with ``seed`` (training and data stream) and
    ``r`` replaced when given.

    Raises:
        ValueError: the recipe's model is not a ``DyDiffDenoiser``, or a bad ``r``.
    """
    rec = copy.deepcopy(recipe) if isinstance(recipe, dict) else read_json(resolve_config(recipe))
    if rec.get("model", {}).get("class") != "DyDiffDenoiser":
        raise ValueError("recipe: its model must be a DyDiffDenoiser spec")
    if seed is not None:
        rec["train"]["seed"] = int(seed)
        data = rec["data"] if isinstance(rec["data"], dict) else {"name": rec["data"]}
        rec["data"] = {**data, "seed": int(seed)}
    if r is not None:
        rec["model"]["config"]["r"] = check_r(r)
    return rec


def train_forecaster(recipe: str | Path | dict, out_dir: str | Path | None = None, *, seed: int | None = None,
                     r: float | None = None, resume: bool = True, progress: bool = False,
                     stop_after: int | None = None) -> TrainResult:
    """Train (or resume, or just reload a finished run of) a DyDiff forecaster recipe; ``result.model`` is the
    :class:`~steerdiff.temporal.DyDiffDenoiser`. Initial weights depend only on the (possibly replaced) seed."""
    rec = read_recipe(recipe, seed=seed, r=r)
    cfg = TrainConfig.from_dict(rec["train"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = build_model(rec["model"])
    assert isinstance(model, DyDiffDenoiser)
    out = Path(out_dir or rec.get("out_dir") or Path("runs") / rec.get("name", "forecaster"))
    has_ckpt = latest_checkpoint(out) is not None
    return train(model, load_dataset(rec["data"]), cfg, out, resume=resume and has_ckpt, progress=progress,
                 stop_after=stop_after)
