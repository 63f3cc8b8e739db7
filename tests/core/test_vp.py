"""VP wrappers: eps-, v- and x0-networks built from the exact mixture give back the mixture's denoiser."""

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.core import VPDenoiser
from steerdiff.models import builtin_mixture

T = 1000


@pytest.fixture(scope="module")
def setup():
    betas = np.linspace(1e-4, 0.02, T)
    abar = torch.tensor(np.cumprod(1 - betas))
    table = np.sqrt((1 - abar.numpy()) / abar.numpy())
    return builtin_mixture("gmm2d"), abar, table


def _t_to_sigma(t, table):
    # Independent of the wrapper: numpy's linear interpolation of log sigma over the integer timesteps.
    return torch.tensor(np.exp(np.interp(t.double().numpy(), np.arange(T), np.log(table))))


def _vp_net(mixture, table, kind):
    """A VP network that predicts eps, v or x0 exactly, from the mixture, in VP units."""

    def net(x_vp, t, cond=None):
        sigma = _t_to_sigma(t, table)
        a = (1 / (1 + sigma**2)).sqrt()[:, None]  # sqrt(abar)
        x = x_vp / a
        x0 = mixture(x, sigma)
        eps = (x - x0) / sigma[:, None]
        if kind == "epsilon":
            return eps
        if kind == "v_prediction":
            return a * eps - (1 - a**2).sqrt() * x0
        return x0

    return net


@pytest.mark.parametrize("kind", ["epsilon", "v_prediction", "sample"])
def test_wrapper_recovers_mixture_denoiser(setup, kind):
    mixture, abar, table = setup
    d = VPDenoiser(_vp_net(mixture, table, kind), abar, kind, quantize=False)
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(64, 2, generator=g, dtype=torch.float64)
    sigma = torch.exp(torch.empty(64, dtype=torch.float64).uniform_(np.log(table[0]), np.log(table[-1]), generator=g))
    torch.testing.assert_close(d(x, sigma), mixture(x, sigma), rtol=1e-9, atol=1e-9)


def test_quantisation_exact_on_grid_and_bounded_off_grid(setup):
    mixture, abar, table = setup
    d = VPDenoiser(_vp_net(mixture, table, "epsilon"), abar, "epsilon", quantize=True)
    x = 2 * torch.randn(32, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    on_grid = torch.tensor(table[[10, 200, 500, 999]]).repeat_interleave(8)
    torch.testing.assert_close(d(x, on_grid), mixture(x, on_grid), rtol=1e-10, atol=1e-10)
    # Off the grid the network runs at the nearest training level sigma_q: D = x - sigma * eps(x, sigma_q).
    mid = torch.tensor(np.sqrt(table[[100, 300, 600, 900]] * table[[101, 301, 601, 901]])).repeat_interleave(8)
    t_q = torch.tensor([(np.abs(np.log(table) - np.log(float(s)))).argmin() for s in mid])
    sigma_q = torch.tensor(table[t_q.numpy()])
    x_q = x * ((1 + sigma_q**2) / (1 + mid**2)).sqrt()[:, None]  # the same VP input seen at sigma_q
    eps_q = (x_q - mixture(x_q, sigma_q)) / sigma_q[:, None]
    expected = x - mid[:, None] * eps_q
    torch.testing.assert_close(d(x, mid), expected, rtol=1e-10, atol=1e-10)
    assert (d(x, mid) - mixture(x, mid)).abs().max() > 1e-8  # quantisation is visible, and small:
    assert (d(x, mid) - mixture(x, mid)).abs().max() < 0.05


def test_sigma_t_round_trip(setup):
    _, abar, table = setup
    d = VPDenoiser(lambda x, t, c: x, abar, quantize=False)
    t = torch.tensor([0.0, 3.5, 250.25, 998.9])
    torch.testing.assert_close(d.sigma_to_t(d.t_to_sigma(t)), t.double(), rtol=1e-9, atol=1e-9)
    assert d.sigma_min == pytest.approx(table[0]) and d.sigma_max == pytest.approx(table[-1])


def test_sampling_through_wrapper_matches_mixture(setup):
    mixture, abar, table = setup
    d = VPDenoiser(_vp_net(mixture, table, "v_prediction"), abar, "v_prediction")
    sig = sd.sigmas.from_alphas_cumprod(abar, 25, spacing="trailing")
    noise = sd.randn((128, 2), seeds=0, dtype=torch.float64)
    torch.testing.assert_close(sd.sample(d, noise, sig, "ddim"), sd.sample(mixture, noise, sig, "ddim"),
                               rtol=1e-8, atol=1e-8)


def test_bad_prediction_type(setup):
    _, abar, _ = setup
    with pytest.raises(ValueError, match="prediction_type"):
        VPDenoiser(lambda x, t, c: x, abar, "flow")


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("quantize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_level_fast_path_equals_the_tensor_path(prediction_type, quantize, dtype):
    """The per-step path (one host level, conversions in numbers) computes what the tensor path computes: the same
    timesteps the network sees, and the same output up to the rounding of the input scale ``1 / sqrt(1 +
    sigma^2)`` (numbers round it correctly; torch's vectorised float32 ``sqrt`` is within 1 ulp of that); levels
    inside, between, below and above the training table, and 0."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    seen = []

    def net(x, t, cond=None):
        seen.append(t.clone())
        return torch.tanh(x * 1.3 + t.view(-1, *([1] * (x.ndim - 1))).to(x.dtype) / 500)

    den = VPDenoiser(net, torch.cumprod(1 - betas, 0), prediction_type=prediction_type, quantize=quantize)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 4, 4, generator=g, dtype=dtype)
    levels = [0.0, 1e-4, float(den.sigmas[0]), 0.0291, 0.5, 1.0, 3.7, 14.6146, float(den.sigmas[-1]), 200.0]
    levels += torch.rand(20, generator=g, dtype=torch.float64).mul(12).sub(6).exp().tolist()
    for level in levels:
        sigma = torch.full((3,), level, dtype=torch.float64)
        seen.clear()
        fast = den(x, sigma)
        slow = den(x, sigma.clone().requires_grad_(True))  # a gradient to sigma: the tensor path
        assert seen[0].dtype == seen[1].dtype == dtype
        assert torch.equal(seen[0], seen[1]), (level, seen)
        ulp = torch.finfo(dtype).eps
        torch.testing.assert_close(fast, slow.detach(), rtol=4 * ulp, atol=4 * ulp)
