"""Training recipes of the two small digits generators the local-geometry claims use ("What Secrets Do Your Manifolds
Hold?", Humayun et al., ICLR 2025; the digits models of docs/methods/geometry.md "Validation").

* ``configs/geometry_digits.json``: an unconditional 3 x 256 ReLU MLP denoiser on all 1797 digits;
* ``configs/geometry_digits_mem.json``: the same network on 300 random digits of which 10 appear 100 times each
  (the memorising model of claim 6); its data name ``digits_duplicated`` is built here by :func:`duplicated_digits`.

Both are ordinary :func:`steerdiff.train.train` runs (resumable checkpoints under the recipe's ``out_dir``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...train import TrainResult, train_from_config
from ...train.recipes import register_dataset


@dataclass
class DuplicatedDigits:
    """The memorisation training set: ``x`` ``[N, 1, 8, 8]`` (shuffled rows), the ``unique`` images ``[n_unique,
    1, 8, 8]`` it was drawn from, and the ``duplicated`` ones ``[n_duplicated, 1, 8, 8]`` (a subset of ``unique``)."""

    x: Tensor
    unique: Tensor
    duplicated: Tensor


def duplicated_digits(n_unique: int = 300, n_duplicated: int = 10, copies: int = 100,
                      seed: int = 0) -> DuplicatedDigits:
    """``n_unique`` random digits (of all 1797) in which ``n_duplicated`` of them appear ``copies`` times each.

    The draw uses numpy's legacy ``RandomState(seed)`` (a stream numpy keeps frozen), so the set is the same on every
    machine. Rows: the ``n_unique - n_duplicated`` other images once each plus ``copies`` copies of each duplicated
    image, shuffled.

    Raises:
        ValueError: ``n_duplicated > n_unique``, ``n_unique`` above 1797, or a count below 1.
    """
    from ...data.digits import load_digits

    images, _ = load_digits("all")
    if min(n_unique, n_duplicated, copies) < 1 or n_duplicated > n_unique or n_unique > images.shape[0]:
        raise ValueError(f"need 1 <= n_duplicated <= n_unique <= {images.shape[0]} and copies >= 1, got "
                         f"n_unique={n_unique}, n_duplicated={n_duplicated}, copies={copies}")
    rs = np.random.RandomState(seed)
    pick = rs.permutation(images.shape[0])[:n_unique]
    unique = images[torch.from_numpy(pick)]
    dup = unique[:n_duplicated]
    rows = torch.cat([unique[n_duplicated:], dup.repeat_interleave(copies, dim=0)])
    rows = rows[torch.from_numpy(rs.permutation(rows.shape[0]))]
    return DuplicatedDigits(x=rows, unique=unique, duplicated=dup)


@register_dataset("digits_duplicated")
def duplicated_digits_data(**options) -> Tensor:
    """Recipe data ``digits_duplicated``: the images of :func:`duplicated_digits` (its keyword options), unlabelled."""
    return duplicated_digits(**options).x


def train_recipe(path: str | Path, resume: bool = False, out_dir: str | Path | None = None,
                 progress: bool = False) -> TrainResult:
    """Run a geometry recipe (``configs/geometry_digits*.json``, or a bare name) with
    :func:`steerdiff.train.train_from_config`; the EMA lands in ``out_dir/final``."""
    return train_from_config(path, resume=resume, out_dir=out_dir, progress=progress)
