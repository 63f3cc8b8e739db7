"""Bad input to the core gives clear errors naming the argument."""

import pytest
import torch

import steerdiff as sd
from steerdiff.models import GaussianMixture, builtin_mixture

SIG = sd.sigmas.karras(4, 0.01, 10.0)


@pytest.fixture(scope="module")
def gmm():
    return builtin_mixture("gmm2d")


def test_sigmas_not_decreasing(gmm):
    with pytest.raises(ValueError, match="strictly decreasing"):
        sd.sample(gmm, torch.randn(2, 2), torch.tensor([1.0, 2.0, 0.0]))


def test_sigmas_not_ending_at_zero(gmm):
    with pytest.raises(ValueError, match="end at 0"):
        sd.sample(gmm, torch.randn(2, 2), torch.tensor([2.0, 1.0]))


def test_sigmas_nonfinite_and_shape(gmm):
    with pytest.raises(ValueError, match="finite"):
        sd.sample(gmm, torch.randn(2, 2), torch.tensor([2.0, float("inf"), 0.0]))
    with pytest.raises(ValueError, match="1-D"):
        sd.sample(gmm, torch.randn(2, 2), torch.zeros(2, 2))


def test_noise_shape_mismatch(gmm):
    with pytest.raises(ValueError, match=r"noise has sample shape \(3,\).*expects \(2,\)"):
        sd.sample(gmm, torch.randn(2, 3), SIG)
    with pytest.raises(ValueError, match="noise must be"):
        sd.sample(gmm, torch.randn(2), SIG)


def test_unknown_method(gmm):
    with pytest.raises(ValueError, match="method must be one of"):
        sd.sample(gmm, torch.randn(2, 2), SIG, method="dpm++")


def test_wrong_output_shape():
    with pytest.raises(ValueError, match="denoiser returned shape"):
        sd.sample(lambda x, s, c=None: x[:, :1], torch.randn(2, 2), SIG)


def test_nonfinite_output_names_step_and_sigma():
    def bad(x, sigma, cond=None):
        out = x.clone()
        if float(sigma[0]) < 1.0:
            out[1] = float("nan")
        return out

    sig = torch.tensor([4.0, 2.0, 0.5, 0.1, 0.0])
    with pytest.raises(FloatingPointError, match=r"step 2 \(sigma=0.5\) for 1 of 3 samples"):
        sd.sample(bad, torch.randn(3, 2), sig, method="euler")


def test_eta_errors(gmm):
    with pytest.raises(ValueError, match="eta"):
        sd.sample(gmm, torch.randn(2, 2), SIG, method="heun", eta=0.5)
    with pytest.raises(ValueError, match=r"eta must lie in \[0, 1\]"):
        sd.sample(gmm, torch.randn(2, 2), SIG, method="ddim", eta=1.5)


def test_cond_errors(gmm):
    with pytest.raises(ValueError, match="cond must have shape"):
        sd.sample(gmm, torch.randn(2, 2), SIG, cond=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="integer tensor"):
        sd.sample(gmm, torch.randn(2, 2), SIG, cond=torch.tensor([1.0, 2.0]))


def test_generator_errors(gmm):
    with pytest.raises(ValueError, match="3 seeds for 2 samples"):
        sd.sample(gmm, torch.randn(2, 2), SIG, method="ddpm", generator=[1, 2, 3])
    with pytest.raises(TypeError, match="generator must be"):
        sd.sample(gmm, torch.randn(2, 2), SIG, method="ddpm", generator="seed")


def test_mixture_errors():
    with pytest.raises(ValueError, match=r"covs\[1\] is not positive definite"):
        GaussianMixture([1, 1], [[0.0, 0], [1, 1]], [[[1, 0], [0, 1]], [[1, 2], [2, 1]]])
    with pytest.raises(ValueError, match="sum to a positive number"):
        GaussianMixture([0, 0], [[0.0], [1.0]], 1.0)
    with pytest.raises(ValueError, match="sum to a positive number"):
        GaussianMixture([1, -1], [[0.0], [1.0]], 1.0)
    with pytest.raises(ValueError, match="means must be"):
        GaussianMixture([1, 1], [[0.0, 1.0]], 1.0)
    with pytest.raises(ValueError, match="symmetric"):
        GaussianMixture([1], [[0.0, 0]], [[[1, 0.5], [0, 1]]])
    with pytest.raises(ValueError, match="unknown mixture"):
        builtin_mixture("gmm3d")


def test_karras_errors():
    with pytest.raises(ValueError, match="steps"):
        sd.sigmas.karras(0)
    with pytest.raises(ValueError, match="sigma_min < sigma_max"):
        sd.sigmas.karras(5, 1.0, 0.5)
