"""Measurements of the digits claims about the local descriptors ("What Secrets Do Your Manifolds Hold?", Humayun et
al., ICLR 2025; claims 5-9 of docs/methods/geometry.md "Validation").

* :func:`spread_volume`: ``1/2 logdet Cov(G(z + eps u)) - k log eps`` (claim 5: a Monte Carlo volume change that
  should rank latents as psi does);
* :func:`memorised`: a sample is memorised when its L2 distance to a duplicated training image is below a fraction of
  the median nearest-neighbour distance within the training set (claim 6);
* :func:`laplacian_energy`: the detail proxy of claim 7;
* :func:`auroc`, :func:`spearman`, :func:`ks_test`: thin wrappers of scikit-learn / scipy;
* :func:`pixel_classifier` / :func:`confident_fraction`: the pixel logistic-regression digit classifier of claim 9;
* :func:`mean_pairwise_l2`: the diversity of claim 9.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor


@torch.no_grad()
def spread_volume(fmap: Callable, z: Tensor, eps: float = 1e-3, probes: int = 128, seed: int = 0,
                  batch_size: int = 8) -> Tensor:
    """``[N]`` ``1/2 logdet Cov_u(G(z + eps u)) - k log eps``, ``u ~ N(0, I)``, ``probes`` draws per latent.

    For a map that is linear on the probe ball this is ``1/2 log det(J J^T)`` = psi when ``J`` is square and of full
    rank; it is computed from outputs only (no Jacobian). Needs ``probes > D`` for a non-singular covariance.
    """
    gen = torch.Generator().manual_seed(seed)
    n, k = z.shape[0], z[0].numel()
    out = []
    for lo in range(0, n, batch_size):
        zc = z[lo:lo + batch_size]
        u = torch.randn(zc.shape[0], probes, *zc.shape[1:], generator=gen, dtype=torch.float64).to(zc.dtype)
        x = fmap((zc[:, None] + eps * u).reshape(-1, *zc.shape[1:])).reshape(zc.shape[0], probes, -1).double()
        xc = x - x.mean(1, keepdim=True)
        cov = xc.transpose(1, 2) @ xc / (probes - 1)
        out.append(0.5 * torch.linalg.slogdet(cov)[1] - k * math.log(eps))
    return torch.cat(out)


def laplacian_energy(x: Tensor) -> Tensor:
    """``[N]`` sum of squares of the 5-point discrete Laplacian over the interior pixels of images ``[N, C, H, W]``
    (no padding: the border has no full stencil)."""
    lap = (x[..., 1:-1, :-2] + x[..., 1:-1, 2:] + x[..., :-2, 1:-1] + x[..., 2:, 1:-1] - 4 * x[..., 1:-1, 1:-1])
    return lap.double().pow(2).flatten(1).sum(1)


def memorised(samples: Tensor, duplicated: Tensor, train_unique: Tensor, fraction: float = 0.3
              ) -> tuple[Tensor, Tensor, float]:
    """``(is_memorised [N], distance to the nearest duplicated image [N], threshold)``.

    ``threshold = fraction * median_i min_{j != i} |x_i - x_j|`` over the distinct training images ``train_unique``.
    """
    flat = train_unique.flatten(1).double()
    d = torch.cdist(flat, flat)
    d.fill_diagonal_(math.inf)
    threshold = fraction * float(d.min(1).values.median())
    dist = torch.cdist(samples.flatten(1).double(), duplicated.flatten(1).double()).min(1).values
    return dist < threshold, dist, threshold


def auroc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve of ``scores`` predicting the boolean ``labels`` (scikit-learn); NaN when one class
    is empty."""
    from sklearn.metrics import roc_auc_score

    y = labels.cpu().numpy().astype(bool)
    if y.all() or not y.any():
        return float("nan")
    return float(roc_auc_score(y, scores.detach().double().cpu().numpy()))


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation (scipy)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy())[0])


def ks_test(a: Tensor, b: Tensor) -> dict[str, float]:
    """Two-sample Kolmogorov-Smirnov test (scipy): ``{"statistic", "p"}``."""
    from scipy.stats import ks_2samp

    res = ks_2samp(a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy())
    return {"statistic": float(res.statistic), "p": float(res.pvalue)}


def pixel_classifier(images: Tensor, labels: Tensor, seed: int = 0):
    """A multinomial logistic regression on raw pixels (scikit-learn), the independent digit classifier of claim 9."""
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=2000, C=1.0, random_state=seed)
    clf.fit(images.flatten(1).double().numpy(), labels.numpy())
    return clf


def confident_fraction(clf, images: Tensor, level: float = 0.9) -> float:
    """Share of ``images`` whose top class probability under ``clf`` is at least ``level``."""
    p = clf.predict_proba(images.flatten(1).double().clamp(-1, 1).numpy())
    return float(np.mean(p.max(1) >= level))


def mean_pairwise_l2(x: Tensor) -> float:
    """Mean L2 distance between distinct pairs of samples."""
    f = x.flatten(1).double()
    n = f.shape[0]
    return float(torch.cdist(f, f).sum() / (n * (n - 1)))
