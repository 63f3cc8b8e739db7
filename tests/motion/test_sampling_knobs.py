"""The sampling knobs the equal-fidelity sweep of benchmarks/motiondreamer.py --frontier turns: the generator's token
temperature and attention window at sampling, and the SinMDM baseline's starting-noise scale."""

from __future__ import annotations

import math

import pytest
import torch

from steerdiff.models.local_transformer import LocalMaskedTransformer
from steerdiff.models.precond import EDMPrecond
from steerdiff.motion.generator import _tempered, generate
from steerdiff.motion.sinmdm import TemporalConvNet, sample_sinmdm


def _model():
    torch.manual_seed(0)
    return LocalMaskedTransformer(7, dim=16, depth=2, heads=2, window=1).eval()


def test_tempered_denoiser_is_the_softmax_of_scaled_logits():
    model = _model()
    x = torch.randint(0, 8, (3, 10), generator=torch.Generator().manual_seed(1))
    t = torch.ones(3)
    with torch.no_grad():
        for temp in (0.3, 2.5):
            want = torch.softmax(model(x) / temp, -1)
            torch.testing.assert_close(_tempered(model.denoiser(), temp)(x, t), want, rtol=1e-5, atol=1e-6)


def test_sampling_window_override_and_temperature_change_the_draws_and_refuse_bad_values():
    model = _model()
    base = generate(model, 12, 4, steps=6, seed=0)
    assert torch.equal(generate(model, 12, 4, steps=6, seed=0, temperature=1.0, window=-1), base)
    # a near-zero temperature draws each revealed token at its argmax: the same sequence for every seed
    cold = [generate(model, 12, 1, steps=12, seed=s, temperature=1e-4, choice_temperature=0.0) for s in range(3)]
    assert all(torch.equal(c, cold[0]) for c in cold)
    # window=None at sampling is full attention: the model's own full-attention forward, not the banded one
    with torch.no_grad():
        x = torch.full((1, 12), 7)
        x[0, 0] = 3
        assert not torch.allclose(model(x, window=None)[0, -1], model(x)[0, -1])
        torch.testing.assert_close(model.denoiser(None)(x, torch.ones(1)), torch.softmax(model(x, window=None), -1))
    with pytest.raises(ValueError, match="temperature"):
        generate(model, 12, 1, temperature=0.0)


def test_sinmdm_noise_scale_scales_the_linear_ode_of_an_untrained_denoiser():
    # a fresh TemporalConvNet outputs 0 (zero-initialised head), so D(x, sigma) = c_skip x and the probability-flow
    # ODE dx/dsigma = x sigma / (sigma^2 + sigma_d^2) is linear: x(0) = x(sigma_max) sigma_d / sqrt(sigma_max^2 + 1)
    model = EDMPrecond(TemporalConvNet(3, 16, hidden=8, layers=1, kernel=3), sigma_data=1.0)
    one = sample_sinmdm(model, 16, 2, steps=40, seed=5)
    half = sample_sinmdm(model, 16, 2, steps=40, seed=5, noise_scale=0.5)
    torch.testing.assert_close(half, 0.5 * one, rtol=1e-5, atol=1e-6)
    noise = torch.stack([torch.randn(3, 16, generator=torch.Generator().manual_seed(5 + i)) for i in range(2)])
    torch.testing.assert_close(one, (noise * 80.0 / math.sqrt(80.0**2 + 1)).transpose(1, 2), rtol=2e-2, atol=2e-3)
    with pytest.raises(ValueError, match="noise_scale"):
        sample_sinmdm(model, 16, 1, noise_scale=-1.0)
