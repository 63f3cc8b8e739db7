"""Schedules against their defining formulas, computed independently with numpy."""

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.core.sigmas import check_sigmas, vp_timesteps


def test_karras_matches_eq5():
    s = sd.sigmas.karras(10, 0.002, 80.0, rho=7.0)
    assert s.shape == (11,) and s.dtype == torch.float64 and s[-1] == 0
    i = np.arange(10)
    ref = (80.0 ** (1 / 7) + i / 9 * (0.002 ** (1 / 7) - 80.0 ** (1 / 7))) ** 7
    np.testing.assert_allclose(s[:-1].numpy(), ref, rtol=1e-12)
    assert torch.all(s[1:] < s[:-1])


def test_karras_one_step():
    s = sd.sigmas.karras(1, 0.1, 5.0)
    assert s.tolist() == [5.0, 0.0]
    check_sigmas(s)


def _linear_abar(T=1000):
    betas = np.linspace(1e-4, 0.02, T)
    return torch.tensor(np.cumprod(1 - betas))


@pytest.mark.parametrize("spacing", ["leading", "trailing", "linspace"])
def test_vp_timesteps_follow_diffusers_formulas(spacing):
    T, n = 1000, 30
    if spacing == "leading":
        ref = (np.arange(n) * (T // n)).round()[::-1] + 1
        ts = vp_timesteps(T, n, spacing, offset=1)
    elif spacing == "trailing":
        ref = np.round(np.arange(T, 0, -T / n)) - 1
        ts = vp_timesteps(T, n, spacing)
    else:
        ref = np.linspace(0, T - 1, n).round()[::-1]
        ts = vp_timesteps(T, n, spacing)
    np.testing.assert_array_equal(ts.numpy(), ref.astype(np.int64))


def test_from_alphas_cumprod():
    abar = _linear_abar()
    s = sd.sigmas.from_alphas_cumprod(abar, 20, spacing="trailing")
    ts = vp_timesteps(1000, 20, "trailing")
    ref = np.sqrt((1 - abar.numpy()[ts.numpy()]) / abar.numpy()[ts.numpy()])
    np.testing.assert_allclose(s[:-1].numpy(), ref, rtol=1e-12)
    assert s[-1] == 0
    full = sd.sigmas.from_alphas_cumprod(abar)
    assert full.shape == (1001,)
    check_sigmas(full)


def test_from_alphas_cumprod_errors():
    with pytest.raises(ValueError, match="non-increasing"):
        sd.sigmas.from_alphas_cumprod(torch.tensor([0.5, 0.9]))
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        sd.sigmas.from_alphas_cumprod(torch.tensor([1.5, 0.9]))
    with pytest.raises(ValueError, match="spacing"):
        sd.sigmas.from_alphas_cumprod(_linear_abar(), 10, spacing="cosine")
