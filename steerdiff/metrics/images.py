"""Image metrics in a classifier's feature space (docs/methods/conventions.md, "Measuring"; the shapes features as
in docs/methods/coind.md, "The coloured-shapes data").

* Frechet distance ``||mu_r - mu_g||^2 + Tr(S_r + S_g - 2 (S_r S_g)^(1/2))`` in float64 with
  ``scipy.linalg.sqrtm`` (real part), on the shipped classifier's penultimate features ("FID-digits").
* Precision and recall with k-NN manifolds (Kynkäänniemi et al. 2019, k = 3): precision is the share of generated
  features inside some real feature's ball (radius = distance to its k-th nearest real neighbour); recall swaps
  the roles.
* Class accuracy of conditional samples, and diversity as the mean pairwise feature distance.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch
from torch import Tensor, nn


def _f64(x, name: str) -> np.ndarray:
    a = x.detach().cpu().double().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ValueError(f"{name} must be [N, D] features with N >= 2, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains non-finite values")
    return a


def frechet_from_stats(mu1: np.ndarray, cov1: np.ndarray, mu2: np.ndarray, cov2: np.ndarray) -> float:
    """Frechet distance between ``N(mu1, cov1)`` and ``N(mu2, cov2)``."""
    covmean = scipy.linalg.sqrtm(cov1 @ cov2)
    if not np.isfinite(covmean).all():  # near-singular product: regularise both covariances slightly
        eps = 1e-6 * np.eye(cov1.shape[0])
        covmean = scipy.linalg.sqrtm((cov1 + eps) @ (cov2 + eps))
    covmean = np.real(covmean)
    return float(((mu1 - mu2) ** 2).sum() + np.trace(cov1) + np.trace(cov2) - 2 * np.trace(covmean))


def weighted_gaussian(features, log_weights) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean, covariance and effective sample size of ``features`` ``[N, D]`` under self-normalised weights
    ``∝ exp(log_weights)`` ``[N]``: the feature Gaussian of an importance-weighted pool, e.g. a reward-tilted law
    ``∝ p exp(r / alpha)`` from plain samples of ``p`` with ``log_weights = r / alpha``; the limit of many
    importance-resampled draws, so a Frechet distance to it needs no resampling noise. The covariance is the
    unbiased weighted one, ``sum w (f - mu)(f - mu)^T / (1 - sum w^2)``; ESS ``= 1 / sum w^2``."""
    f = _f64(features, "features")
    lw = torch.as_tensor(log_weights, dtype=torch.float64).flatten()
    if lw.shape[0] != f.shape[0]:
        raise ValueError(f"log_weights must have one entry per feature row ({f.shape[0]}), got {lw.shape[0]}")
    if not torch.isfinite(lw.max()):
        raise ValueError("log_weights must have a finite maximum")
    w = torch.softmax(lw, 0).numpy()
    ess = float(1.0 / (w**2).sum())
    if ess < 2 - 1e-9:
        raise ValueError(f"the weights put all their mass on one row (ESS {ess:.2f}): no covariance")
    mu = w @ f
    c = f - mu
    cov = (w[:, None] * c).T @ c / (1.0 - (w**2).sum())
    return mu, cov, ess


def frechet_distance(real_features, gen_features) -> float:
    """Frechet distance between the Gaussians fitted to two feature sets ``[N, D]``."""
    a, b = _f64(real_features, "real_features"), _f64(gen_features, "gen_features")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"feature widths differ: {a.shape[1]} vs {b.shape[1]}")
    return frechet_from_stats(a.mean(0), np.cov(a, rowvar=False), b.mean(0), np.cov(b, rowvar=False))


def _kth_neighbour_radius(x: Tensor, k: int) -> Tensor:
    d = torch.cdist(x, x)
    return d.kthvalue(k + 1, dim=1).values  # +1: the point itself is its own nearest neighbour


def _coverage(ref: Tensor, radius: Tensor, query: Tensor) -> float:
    inside = torch.zeros(query.shape[0], dtype=torch.bool)
    for chunk in range(0, query.shape[0], 1024):
        q = query[chunk : chunk + 1024]
        inside[chunk : chunk + 1024] = (torch.cdist(q, ref) <= radius[None]).any(1)
    return float(inside.double().mean())


def precision_recall(real_features, gen_features, k: int = 3) -> tuple[float, float]:
    """k-NN precision and recall (Kynkäänniemi et al. 2019) of generated against real features."""
    a = torch.as_tensor(_f64(real_features, "real_features"))
    b = torch.as_tensor(_f64(gen_features, "gen_features"))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"feature widths differ: {a.shape[1]} vs {b.shape[1]}")
    if not 1 <= k < min(a.shape[0], b.shape[0]):
        raise ValueError(f"k must be in [1, min(N) - 1], got {k}")
    precision = _coverage(a, _kth_neighbour_radius(a, k), b)
    recall = _coverage(b, _kth_neighbour_radius(b, k), a)
    return precision, recall


def feature_scores(real_features, gen_features, k: int = 3) -> dict[str, float]:
    """``{"fid", "precision", "recall"}`` of generated against real features: :func:`frechet_distance` and the
    k-NN :func:`precision_recall`, the image-quality triple every comparison reports."""
    precision, recall = precision_recall(real_features, gen_features, k=k)
    return {"fid": frechet_distance(real_features, gen_features), "precision": precision, "recall": recall}


def pairwise_diversity(features) -> float:
    """Mean Euclidean distance between distinct pairs of feature vectors."""
    f = torch.as_tensor(_f64(features, "features"))
    n = f.shape[0]
    return float(torch.cdist(f, f).sum() / (n * (n - 1)))


@torch.no_grad()
def classifier_features(classifier: nn.Module, images: Tensor, batch_size: int = 512) -> Tensor:
    """Penultimate features of ``images`` under ``classifier`` (eval mode), float64 ``[N, D]``."""
    was_training = classifier.training
    classifier.eval()
    try:
        feats = [classifier.features(chunk.float()) for chunk in images.split(batch_size)]
    finally:
        classifier.train(was_training)
    return torch.cat(feats).double()


@torch.no_grad()
def class_accuracy(classifier: nn.Module, images: Tensor, labels: Tensor) -> float:
    """Share of ``images`` the classifier assigns to ``labels`` (``[N]``, or ``[N, heads]`` counting all heads)."""
    pred = classifier.predict(images.float())
    if pred.shape != labels.shape:
        raise ValueError(f"labels must have shape {tuple(pred.shape)}, got {tuple(labels.shape)}")
    correct = pred == labels.to(pred.device)
    return float(correct.all(1).double().mean() if correct.ndim == 2 else correct.double().mean())
