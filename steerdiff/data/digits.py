"""scikit-learn's bundled 8x8 handwritten digits with a fixed stratified train/test split.

The class-conditional digits of docs/methods/conventions.md ("Embedded data and models"); the digits half of the APG
image test (docs/methods/guidance.md, "Image test (A1-A5)"). The 1797 images ship inside scikit-learn, so nothing is
downloaded. The split is made here rather than with ``train_test_split``: it uses numpy's legacy ``RandomState``, whose
stream numpy keeps frozen across versions (NEP 19), so the split is the same on every machine and numpy/scikit-learn
version. Per class, ``round(0.2 * count)`` images go to test: 1438 train and 359 test images in all.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from sklearn.datasets import load_digits as _sklearn_load_digits
from torch import Tensor

SPLITS = ("train", "test", "all")
TEST_FRACTION = 0.2
SPLIT_SEED = 0
N_TRAIN, N_TEST = 1438, 359


@functools.lru_cache(maxsize=1)
def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Images ``[1797, 1, 8, 8]`` in [-1, 1], labels, sorted train and test indices (cached, read-only)."""
    bunch = _sklearn_load_digits()
    # Pixel values are integers 0..16; x / 8 - 1 maps them onto [-1, 1] exactly.
    images = (bunch.images.astype(np.float32) / 8.0 - 1.0).reshape(-1, 1, 8, 8)
    labels = bunch.target.astype(np.int64)
    rs = np.random.RandomState(SPLIT_SEED)
    test = []
    for c in range(10):  # classes in a fixed order, so the RandomState draws are consumed in a fixed order
        idx = np.flatnonzero(labels == c)
        n_test = int(round(TEST_FRACTION * len(idx)))
        test.append(idx[rs.permutation(len(idx))[:n_test]])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(labels)), test_idx)
    for a in (images, labels, test_idx, train_idx):
        a.setflags(write=False)  # the cache is shared; callers only ever get copies
    return images, labels, train_idx, test_idx


def split_indices(split: str) -> np.ndarray:
    """Sorted int64 indices (in sklearn's ``load_digits()`` order) of the images in ``split``; a copy."""
    _check_split(split)
    _, labels, train_idx, test_idx = _arrays()
    idx = {"train": train_idx, "test": test_idx, "all": np.arange(len(labels))}[split]
    return np.array(idx, dtype=np.int64)


def load_digits(split: str = "train") -> tuple[Tensor, Tensor]:
    """The 8x8 digits of one split.

    Args:
        split: ``"train"`` (1438 images), ``"test"`` (359) or ``"all"`` (1797, sklearn's order). Train and
            test are disjoint, cover the whole set, and hold each class in proportion (80/20 per class).

    Returns:
        ``(images, labels)``: float32 ``[N, 1, 8, 8]`` in [-1, 1] (ink is +1) and int64 ``[N]`` in 0..9.
        Both are fresh tensors: changing them does not change later calls.

    Raises:
        ValueError: for a split name other than those above.
    """
    idx = split_indices(split)
    images, labels, _, _ = _arrays()
    # Fancy indexing copies, so the returned tensors never alias the cache.
    return torch.from_numpy(images[idx]), torch.from_numpy(labels[idx])


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(repr(s) for s in SPLITS)}; got {split!r}")
