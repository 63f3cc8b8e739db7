"""Shared fixtures for the quantization tests (tiny models; one thread, see tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def outlier_problem(m: int, n: int, tokens: int, seed: int = 0):
    """T2 (docs/methods/svdquant.md, "Validation"): X ~ N(0,1) with 8 channels x30, W ~ N(0, 1/m) with 4 columns
    x10; zero bias."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, m, generator=g)
    x[:, :8] *= 30
    w = torch.randn(n, m, generator=g) / m**0.5
    w[:, 8:12] *= 10
    lin = nn.Sequential(nn.Linear(m, n))
    with torch.no_grad():
        lin[0].weight.copy_(w)
        lin[0].bias.zero_()
    return lin, x[: tokens // 2], x[tokens // 2:]


def rel_err(model, x, ref_model) -> float:
    with torch.no_grad():
        y = ref_model(x)
        return float((model(x) - y).pow(2).sum() / y.pow(2).sum())


@pytest.fixture(scope="session")
def digits():
    from steerdiff.models.io import load

    return load("digits").requires_grad_(False)


@pytest.fixture(scope="session")
def digits_calib(digits):
    from steerdiff.quant import trajectory_calibration

    return trajectory_calibration(digits, num_samples=32, n_trajectories=8, steps=6)
