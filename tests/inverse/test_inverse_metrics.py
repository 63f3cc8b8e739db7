"""PSNR / SSIM against scikit-image, chain diversity, and the G1 / G2 posterior metrics on exact samples."""

import math

import pytest
import torch

from steerdiff.inverse import Matrix, chain_diversity, exact_posterior, posterior_metrics, psnr, ssim
from steerdiff.models import GaussianMixture


def _pairs():
    g = torch.Generator().manual_seed(0)
    ref = torch.rand(6, 1, 8, 8, generator=g, dtype=torch.float64) * 2 - 1
    x = (ref + 0.3 * torch.randn(6, 1, 8, 8, generator=g, dtype=torch.float64)).clamp(-1, 1)
    return x, ref


def test_psnr_and_ssim_match_scikit_image():
    metrics = pytest.importorskip("skimage.metrics")
    x, ref = _pairs()
    for i in range(x.shape[0]):
        a, b = x[i, 0].numpy(), ref[i, 0].numpy()
        assert math.isclose(float(psnr(x[i:i + 1], ref[i:i + 1])), metrics.peak_signal_noise_ratio(b, a, data_range=2),
                            rel_tol=1e-10)
        want = metrics.structural_similarity(b, a, win_size=3, data_range=2, use_sample_covariance=False,
                                             gaussian_weights=False)
        assert math.isclose(float(ssim(x[i:i + 1], ref[i:i + 1])), want, rel_tol=1e-9)


def test_ssim_of_identical_images_is_one_and_psnr_definition():
    _, ref = _pairs()
    torch.testing.assert_close(ssim(ref, ref), torch.ones(6, dtype=torch.float64))
    x = ref + 0.1
    torch.testing.assert_close(psnr(x, ref), torch.full((6,), 10 * math.log10(4 / 0.01), dtype=torch.float64))
    with pytest.raises(ValueError, match="equal shapes"):
        psnr(ref, ref[:3])


def test_chain_diversity_is_mean_std_and_skips_nan_chains():
    s = torch.zeros(2, 3, 1, 2, 2, dtype=torch.float64)
    s[0, 1] = 1.0
    s[0, 2] = float("nan")  # a guarded chain is left out
    torch.testing.assert_close(chain_diversity(s), torch.tensor([0.5, 0.0], dtype=torch.float64))


def test_posterior_metrics_of_exact_samples_are_near_zero():
    prior = GaussianMixture([0.4, 0.1, 0.3, 0.2], [[2, 2], [2, -2], [-2, 2], [-2, -2]], 0.3)
    op = Matrix(torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    post = exact_posterior(prior, op, torch.tensor([[1.9]], dtype=torch.float64), 0.2)[0]
    assert math.isclose(float(post.weights[0] + post.weights[1]), 1.0, rel_tol=1e-6)  # only the x1 = +2 modes
    x = post.sample(1000, generator=torch.Generator().manual_seed(1))
    m = posterior_metrics(x, post, seed=0)
    assert m["mean_err"] < 0.05 and m["tv"] < 0.04 and 0.9 < m["diversity"] < 1.1
    assert m["sw2"] < 0.3  # the sampling floor: 1000 vs 2000 draws of a bimodal law (mode shares move mass 4 apart)
    x[0] = float("nan")
    assert posterior_metrics(x, post)["nonfinite"] == 1
