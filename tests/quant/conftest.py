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


def search_problem(kind: str):
    """(module, calibration rows) for the search-mode tests: a linear on 1024 token rows (half of
    :func:`outlier_problem`'s 2048) or a 3x3 conv on 6 16x16 maps (1536 pixels), both with outlier input channels,
    so the 512-row subsample is a real subsample."""
    if kind == "linear":
        lin, xc, _ = outlier_problem(128, 96, 2048)
        return lin[0], xc
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 48, 3, padding=1)
    xc = torch.randn(6, 32, 16, 16)
    xc[:, :3] *= 20
    return conv, xc


def calibrate_one(module, x, search: str, num_iters: int, **kw):
    """One layer calibrated alone (rank 8): ``(calibrator, layers, info)``."""
    from steerdiff.quant.calibrate import GroupCalibrator, SearchConfig
    from steerdiff.quant.mapping import Group

    cal = GroupCalibrator(Group("0", ["0"]), [module], x,
                          SearchConfig(rank=8, num_iters=num_iters, search=search, **kw))
    layers, info = cal.run()
    return cal, layers, info


def same_layers(a, b) -> bool:
    """The first layers of ``a`` and ``b`` hold the same tensors, bit for bit."""
    sa, sb = a[0].state_dict(), b[0].state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def tiny_dit():
    """A one-block class-conditional DiT denoiser on 8x8 images (its zero-initialised output layer made random, so
    the network's output is not 0)."""
    from steerdiff.models import DiT, EDMPrecond

    torch.manual_seed(0)
    model = EDMPrecond(DiT(img_size=8, patch_size=2, width=32, depth=1, heads=2, num_classes=10))
    nn.init.normal_(model.net.patch_out.weight, std=0.05)
    return model.eval().requires_grad_(False)


def tiny_unet():
    """A two-level class-conditional UNet denoiser on 8x8 images (output conv made random, as in :func:`tiny_dit`)."""
    from steerdiff.models import EDMPrecond, UNet

    torch.manual_seed(0)
    model = EDMPrecond(UNet(img_size=8, in_channels=1, channels=[8, 16], num_res_blocks=1, num_classes=10,
                            emb_dim=16, fourier_dim=8, norm_groups=4))
    nn.init.normal_(model.net.conv_out.weight, std=0.05)
    return model.eval().requires_grad_(False)


def tiny_mlp():
    """An unconditional MLP denoiser on 2-d data (output layer made random)."""
    from steerdiff.models import MLP, EDMPrecond

    torch.manual_seed(0)
    model = EDMPrecond(MLP(dim=2, hidden=[32, 32], fourier_dim=8, noise_dim=8))
    nn.init.normal_(model.net.out.weight, std=0.05)
    return model.eval().requires_grad_(False)


def denoiser_inputs(model, n: int, seed: int, cond: bool = True):
    """``(x, sigma, cond)`` calls of ``model``: noisy inputs at log-normal noise levels (cond None if not ``cond``)."""
    g = torch.Generator().manual_seed(seed)
    sigma = torch.exp(torch.randn(n, generator=g))
    x = torch.randn(n, *model.sample_shape, generator=g) * (1 + sigma.reshape(-1, *[1] * len(model.sample_shape)))
    return x, sigma, (torch.arange(n) % 10 if cond else None)


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
