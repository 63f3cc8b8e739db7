"""Tests for steerdiff.data.digits: shapes, ranges, the pinned stratified split, copies, errors."""

import numpy as np
import pytest
import sklearn.datasets
import torch

from steerdiff.data import load_digits
from steerdiff.data.digits import N_TEST, N_TRAIN, split_indices


@pytest.mark.parametrize(("split", "n"), [("train", 1438), ("test", 359), ("all", 1797)])
def test_shapes_dtypes_ranges(split, n):
    images, labels = load_digits(split)
    assert images.shape == (n, 1, 8, 8) and images.dtype == torch.float32
    assert labels.shape == (n,) and labels.dtype == torch.int64
    assert images.min() == -1 and images.max() == 1
    # 0..16 maps to k / 8 - 1: every value is a multiple of 1/8.
    assert torch.equal(images * 8, (images * 8).round())
    assert set(labels.tolist()) == set(range(10))


def test_sizes_match_constants():
    assert (N_TRAIN, N_TEST) == (1438, 359)
    assert N_TRAIN + N_TEST == 1797


def test_all_matches_sklearn_order():
    bunch = sklearn.datasets.load_digits()
    images, labels = load_digits("all")
    assert np.array_equal(labels.numpy(), bunch.target)
    assert np.allclose((images.numpy()[:, 0] + 1) * 8, bunch.images)


def test_split_disjoint_and_complete():
    train, test = split_indices("train"), split_indices("test")
    assert len(np.intersect1d(train, test)) == 0
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(1797))
    all_images, all_labels = load_digits("all")
    test_images, test_labels = load_digits("test")
    assert torch.equal(test_images, all_images[torch.from_numpy(test)])
    assert torch.equal(test_labels, all_labels[torch.from_numpy(test)])


def test_split_is_stratified():
    _, all_labels = load_digits("all")
    _, test_labels = load_digits("test")
    total = torch.bincount(all_labels, minlength=10)
    held = torch.bincount(test_labels, minlength=10)
    assert torch.equal(held, (0.2 * total.double()).round().long())


def test_split_is_pinned():
    # The split must be the same on every machine and version; these numbers fix it.
    test = split_indices("test")
    assert test[:10].tolist() == [3, 7, 13, 19, 36, 38, 43, 48, 53, 55]
    assert int(test.sum()) == 311827


def test_returns_copies():
    images, labels = load_digits("train")
    images.fill_(5.0)
    labels.fill_(-3)
    split_indices("train")[:] = 0
    again_images, again_labels = load_digits("train")
    assert again_images.max() == 1 and again_labels.min() == 0
    assert split_indices("train")[1] != 0


def test_bad_split_names_valid_ones():
    with pytest.raises(ValueError) as err:
        load_digits("val")
    for name in ("train", "test", "all"):
        assert name in str(err.value)
