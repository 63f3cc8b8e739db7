"""Starting from an image (``x_start``, ``strength``), the denoiser's noise range, and the denoiser's call shape.

From ``x_sigma = x_start + sigma * eps`` the ancestral (DDPM) sampler draws from the exact denoiser's posterior
``p(x0 | x_sigma)``; for a Gaussian mixture that posterior is the mixture's linear-Gaussian posterior with ``A = I``
and noise ``sigma`` (``GaussianMixture.posterior_linear``), an independent closed form.
"""

import math
import warnings

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.core import VPDenoiser, nfe_of
from steerdiff.metrics import sliced_wasserstein
from steerdiff.models import builtin_mixture

N = 3000


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")


def _posterior_run(gmm, strength, steps=200, seed=0):
    sig = sd.sigmas.karras(steps, 0.002, 80.0)
    run = min(int(steps * strength), steps)
    s_start = float(sig[steps - run])
    x_start = torch.tensor([[1.0, 0.5]], dtype=torch.float64).expand(N, 2)
    eps = sd.randn((1, 2), seeds=seed, dtype=torch.float64).expand(N, 2)  # one noisy input, N posterior draws
    x, stats = sd.sample(gmm, eps, sig, method="ddpm", x_start=x_start, strength=strength, generator=1000,
                         return_stats=True)
    z = x_start[:1] + s_start * eps[:1]
    return x, z, s_start, stats, run


@pytest.mark.parametrize("strength", [0.45, 0.6])
def test_ddpm_from_x_start_draws_the_exact_posterior_at_that_sigma(gmm2d, strength):
    x, z, s_start, stats, run = _posterior_run(gmm2d, strength)
    assert stats.nfe == nfe_of("ddpm", run)
    exact = gmm2d.posterior_linear(torch.eye(2, dtype=torch.float64), z[0], s_start)
    ref = exact.sample(N, generator=torch.Generator().manual_seed(3))
    floor = sliced_wasserstein(ref, exact.sample(N, generator=torch.Generator().manual_seed(4)))
    assert sliced_wasserstein(x, ref) <= 2 * floor + 0.01, (sliced_wasserstein(x, ref), floor, s_start)
    # the mean is the denoiser at (z, s_start): E[x0 | x_sigma = z]
    torch.testing.assert_close(x.mean(0), gmm2d(z, torch.tensor([s_start]))[0], atol=0.1, rtol=0)


def test_strength_follows_the_img2img_rule_and_bad_values_are_refused(gmm2d):
    sig = sd.sigmas.karras(10, 0.002, 80.0)
    noise = sd.randn((4, 2), seeds=0, dtype=torch.float64)
    x0 = torch.zeros(4, 2, dtype=torch.float64)
    seen = []
    sd.sample(gmm2d, noise, sig, method="euler", x_start=x0, strength=0.35, callback=lambda d: seen.append(d["sigma"]))
    assert seen == sig[10 - 3:-1].tolist()  # int(10 * 0.35) = 3 steps, the last three of the schedule
    full = []
    sd.sample(gmm2d, noise, sig, method="euler", x_start=x0, callback=lambda d: full.append(d["sigma"]))
    assert full == sig[:-1].tolist()  # strength defaults to 1: the whole schedule, from x_start + sigma_max noise
    with pytest.raises(ValueError, match="strength applies with x_start"):
        sd.sample(gmm2d, noise, sig, strength=0.5)
    for bad in (0.0, 1.5, -0.1, math.nan, True):
        with pytest.raises(ValueError, match=r"strength must be a number in \(0, 1\]"):
            sd.sample(gmm2d, noise, sig, x_start=x0, strength=bad)
    with pytest.raises(ValueError, match="runs no step"):
        sd.sample(gmm2d, noise, sig, x_start=x0, strength=0.05)
    with pytest.raises(ValueError, match="x_start must be a tensor of the noise's shape"):
        sd.sample(gmm2d, noise, sig, x_start=x0[:2])
    with pytest.raises(ValueError, match="finite"):
        sd.sample(gmm2d, noise, sig, x_start=torch.full((4, 2), math.nan, dtype=torch.float64))


def _vp_identity():
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    abar = torch.cumprod(1 - betas, 0)
    return VPDenoiser(lambda x, t, c: torch.zeros_like(x), abar)  # eps = 0: D = x / sqrt(1 + s^2) * ... (any)


def test_a_schedule_above_the_models_range_is_refused_unless_allowed():
    d = _vp_identity()
    lo, hi = d.sigma_range
    noise = sd.randn((2, 2), seeds=0, dtype=torch.float64)
    too_high = sd.sigmas.karras(3, 0.02, 2 * hi)
    with pytest.raises(ValueError, match=r"above the denoiser's sigma_max .*allow_out_of_range=True"):
        sd.sample(d, noise, too_high, method="euler")
    with pytest.warns(RuntimeWarning, match="above the denoiser's sigma_max"):
        sd.sample(d, noise, too_high, method="euler", allow_out_of_range=True)
    with pytest.warns(RuntimeWarning, match="below the denoiser's sigma_min"):
        sd.sample(d, noise, sd.sigmas.karras(3, lo / 5, hi), method="euler")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the model's own schedule: no warning at all
        sd.sample(d, noise, sd.sigmas.from_alphas_cumprod(torch.cumprod(1 - torch.linspace(
            1e-4, 0.02, 1000, dtype=torch.float64), 0), 10, spacing="trailing"), method="euler")


def test_a_start_far_below_the_noise_level_of_pure_noise_warns():
    d = _vp_identity()
    noise = sd.randn((2, 2), seeds=0, dtype=torch.float64)
    t_grid = torch.linspace(1, 0, 11, dtype=torch.float64)[1:]  # a flow t-grid mistaken for sigmas
    with pytest.warns(RuntimeWarning, match="not the model's pure-noise prior"):
        sd.sample(d, noise, torch.cat([t_grid[:-1], t_grid.new_zeros(1)]), method="euler")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same start is fine from an image
        sd.sample(d, noise, sd.sigmas.karras(5, 0.02, 1.0), method="euler", x_start=torch.zeros_like(noise))


def test_a_denoiser_that_cannot_take_cond_is_named():
    def two_args(x, sigma):
        return x

    with pytest.raises(TypeError, match=r"denoiser must accept \(x, sigma, cond\).*two_args\(x, sigma\)"):
        sd.sample(two_args, torch.zeros(2, 2), sd.sigmas.karras(3))

    class Net(torch.nn.Module):
        def forward(self, x, sigma):
            return x

    with pytest.raises(TypeError, match="add a cond=None parameter"):
        sd.sample(Net(), torch.zeros(2, 2), sd.sigmas.karras(3))
    ok = sd.sample(lambda x, s, c=None: torch.zeros_like(x), torch.ones(2, 2), sd.sigmas.karras(3), method="euler")
    assert torch.equal(ok, torch.zeros(2, 2)) and np.isfinite(ok.numpy()).all()
