"""Metrics of the inverse-problem checks of docs/methods/inverse.md: PSNR, SSIM and chain diversity on images (the
digits protocol); posterior-mean error, mode-weight TV, diversity ratio and sliced W2 against an exact posterior
mixture (G1, G2).

SSIM is written here (batched torch, the protocol's exact variant: 3x3 uniform window, ``L = 2``, ``C1 = (0.01 L)^2``,
``C2 = (0.03 L)^2``, population statistics, mean over the valid windows, 36 on 8x8) and tested against
scikit-image's ``structural_similarity(win_size=3, data_range=2, use_sample_covariance=False)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..metrics.distributions import mode_weight_error, sliced_wasserstein
from .reference import posterior_mean, posterior_trace_cov


def _pair(x: Tensor, ref: Tensor) -> tuple[Tensor, Tensor]:
    x, ref = torch.as_tensor(x).double(), torch.as_tensor(ref).double()
    if x.shape != ref.shape or x.ndim < 3:
        raise ValueError(f"images must be [N, ..., H, W] of equal shapes, got {tuple(x.shape)} and {tuple(ref.shape)}")
    return x, ref


def psnr(x: Tensor, ref: Tensor, data_range: float = 2.0) -> Tensor:
    """Per-image ``10 log10(L^2 / MSE)`` ``[N]`` (``L = 2`` for images in [-1, 1])."""
    x, ref = _pair(x, ref)
    mse = (x - ref).square().flatten(1).mean(1)
    return 10 * torch.log10(data_range**2 / mse)


def ssim(x: Tensor, ref: Tensor, data_range: float = 2.0, window: int = 3) -> Tensor:
    """Per-image SSIM ``[N]``: uniform ``window x window`` windows, population statistics, mean over valid windows
    (and channels)."""
    x, ref = _pair(x, ref)
    h, w = x.shape[-2:]
    a, b = x.reshape(-1, 1, h, w), ref.reshape(-1, 1, h, w)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2

    def mean(t):
        return F.avg_pool2d(t, window, stride=1)

    mu_a, mu_b = mean(a), mean(b)
    var_a = mean(a * a) - mu_a**2
    var_b = mean(b * b) - mu_b**2
    cov = mean(a * b) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.reshape(x.shape[0], -1).mean(1)


def chain_diversity(samples: Tensor) -> Tensor:
    """Per measurement, the mean over entries of the std (ddof 0) across chains: ``[M, K, ...] -> [M]``; guarded
    (NaN) chains are left out."""
    s = torch.as_tensor(samples).double()
    dev = s - torch.nanmean(s, 1, keepdim=True)
    return torch.nanmean(dev.square(), 1).sqrt().flatten(1).mean(1)


def posterior_metrics(samples: Tensor, posterior, n_exact: int = 2000, n_projections: int = 200,
                      seed: int = 0) -> dict:
    """The G1 / G2 metrics of one chain per row of ``samples`` ``[N, d]`` against the exact posterior mixture.

    ``mean_err = ||xbar - E[x | y]|| / sqrt(d)``; ``tv``: half the L1 distance between the share of samples whose most
    likely posterior component is k and the posterior weights; ``diversity = tr Cov(samples) / tr Cov(posterior)``
    (the exact trace, not that of exact samples); ``sw2``: sliced W2 (``n_projections`` directions) to ``n_exact``
    exact posterior samples. Non-finite rows are counted in ``nonfinite`` and left out of the others.
    """
    x = torch.as_tensor(samples).double().flatten(1)
    ok = torch.isfinite(x).all(1)
    x = x[ok]
    d = x.shape[1]
    exact = posterior.sample(n_exact, generator=torch.Generator().manual_seed(seed))
    centred = x - x.mean(0)
    return {
        "mean_err": float((x.mean(0) - posterior_mean(posterior)).norm() / d**0.5),
        "tv": mode_weight_error(x, posterior),
        "diversity": float(centred.square().sum(1).mean() / posterior_trace_cov(posterior)),
        "sw2": sliced_wasserstein(x, exact, n_projections=n_projections, seed=seed),
        "nonfinite": int((~ok).sum()),
    }
