"""Quality report of a class-conditional image denoiser: accuracy, feature FID, precision/recall, diversity.

Used by the shipped-model recipe (``scripts/make_assets.py``), the demo and the benchmarks. Classes are spread
evenly over the ``n`` samples; guidance ``scale`` is classifier-free guidance :class:`steerdiff.guidance.CFG`,
``D = D_u + scale (D_c - D_u)`` (``scale = 1`` is the plain conditional model and skips the null branch); any
other guider can be passed as ``guidance``.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from ...core import randn, sample, sigmas
from ...guidance import CFG
from ...metrics.images import class_accuracy, classifier_features, feature_scores, pairwise_diversity


@torch.no_grad()
def sample_classes(
    denoiser: nn.Module,
    labels: Tensor,
    shape: tuple[int, ...],
    steps: int = 30,
    scale: float = 1.0,
    method: str = "heun",
    seed: int = 0,
    batch_size: int = 500,
    sigma_min: float = 0.002,
    sigma_max: float = 80.0,
    guidance: object | None = None,
) -> tuple[Tensor, float]:
    """Conditional samples for ``labels`` (sample ``i`` from seed ``seed + i``) and their NFE per sample.

    ``guidance`` (a guider such as :class:`steerdiff.guidance.APG`) replaces ``CFG(scale)`` when given; it is
    reset by the sampler for every batch.
    """
    if guidance is not None and scale != 1.0:
        raise ValueError("give either scale (CFG) or guidance, not both")
    sig = sigmas.karras(steps, sigma_min, sigma_max)
    out, nfe = [], 0.0
    for start in range(0, labels.shape[0], batch_size):
        lab = labels[start : start + batch_size]
        noise = randn((lab.shape[0], *shape), seeds=seed + start)
        guider = guidance if guidance is not None else (None if scale == 1.0 else CFG(scale))
        x, stats = sample(denoiser, noise, sig, method=method, cond=lab, guidance=guider, return_stats=True,
                          generator=seed + start + 10**9)
        out.append(x)
        nfe = stats.nfe
    return torch.cat(out), nfe


def evaluate_conditional(
    denoiser: nn.Module,
    classifier: nn.Module,
    real_images: Tensor,
    num_classes: int,
    n: int = 2000,
    steps: int = 30,
    scale: float = 1.0,
    seed: int = 0,
) -> dict:
    """Sample ``n`` images (classes evenly spread) and score them against ``real_images``."""
    labels = torch.arange(n) % num_classes
    start = time.perf_counter()
    images, nfe = sample_classes(denoiser, labels, tuple(real_images.shape[1:]), steps=steps, scale=scale, seed=seed)
    wall = time.perf_counter() - start
    images = images.clamp(-1, 1)
    real_f = classifier_features(classifier, real_images)
    gen_f = classifier_features(classifier, images)
    scores = feature_scores(real_f, gen_f)
    return {
        "n": n,
        "steps": steps,
        "scale": scale,
        "nfe": nfe,
        "wall_time_s": wall,
        "class_accuracy": class_accuracy(classifier, images, labels),
        "fid_features": scores["fid"],
        "precision": scores["precision"],
        "recall": scores["recall"],
        "diversity": pairwise_diversity(gen_f[:1000]),
    }
