"""Composition metrics of CoInD (Gaudi et al., ICLR 2025; official ``coind/metrics.py``; docs/methods/coind.md,
"Metrics").

* :func:`conformity`: the conformity score CS, the fraction of samples whose classifier-predicted labels satisfy
  every query term (positive weight: equal; negative weight: different; null slots ignored).
* :func:`composition_divergence`: the model's implicit posteriors over joint labels versus the product of its
  implicit posteriors over each attribute, from eps-MSEs at five fixed noise levels; reported as the official
  code's symmetric KL (``jsd_code``) and as the true Jensen-Shannon divergence (``jsd``), natural log.
* :func:`label_entropy`: diversity, the entropy in bits of the predicted uncontrolled attribute.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.denoiser import NULL, Denoiser, append_dims

JSD_STEPS = (300, 375, 450, 525, 600)  # DDPM timesteps of the official coind/metrics.py


def ddpm_sigma(t: int | Sequence[int], beta_start: float = 1e-4, beta_end: float = 0.02, n: int = 1000) -> Tensor:
    """EDM sigma ``sqrt((1 - abar_t) / abar_t)`` of DDPM timestep(s) ``t`` under linear betas (float64)."""
    betas = torch.linspace(beta_start, beta_end, n, dtype=torch.float64)
    abar = torch.cumprod(1.0 - betas, 0)
    idx = torch.as_tensor(t, dtype=torch.long)
    return ((1.0 - abar[idx]) / abar[idx]).sqrt()


def conformity(pred: Tensor, terms: Sequence[tuple[Sequence[int], float]]) -> float:
    """Conformity score CS (as the official ``coind/metrics.py``).

    Args:
        pred: predicted labels ``[N, m]`` (e.g. ``ImageClassifier.predict``).
        terms: query terms ``(label with -1 = null, weight)``, e.g. ``Compose(...).terms``: a sample conforms if
            every positive-weight term's non-null slots all equal the prediction and no negative-weight term's do.

    Returns:
        The fraction of conforming samples.
    """
    if pred.ndim != 2 or pred.shape[0] == 0:
        raise ValueError(f"pred must be a non-empty [N, m] label tensor, got shape {tuple(pred.shape)}")
    ok = torch.ones(pred.shape[0], dtype=torch.bool, device=pred.device)
    for label, weight in terms:
        lab = torch.as_tensor(list(label), device=pred.device)
        if lab.shape != (pred.shape[1],):
            raise ValueError(f"term label {list(label)} must have m={pred.shape[1]} slots")
        set_ = lab != NULL
        match = (pred[:, set_] == lab[set_]).all(1)
        if weight > 0:
            ok &= match
        elif weight < 0:
            ok &= ~match
    return float(ok.float().mean())


def label_entropy(labels: Tensor, num_classes: int) -> float:
    """Entropy in bits of the empirical distribution of integer ``labels`` over ``num_classes`` values
    (diversity of an uncontrolled attribute, as CoInD's evaluation; maximum ``log2 num_classes``)."""
    if labels.ndim != 1 or labels.numel() == 0:
        raise ValueError(f"labels must be a non-empty [N] tensor, got shape {tuple(labels.shape)}")
    p = torch.bincount(labels.long(), minlength=num_classes).double() / labels.numel()
    p = p[p > 0]
    return float(-(p * p.log2()).sum())


def _kl(p: Tensor, q: Tensor) -> Tensor:
    return (p * (p.clamp_min(1e-300).log() - q.clamp_min(1e-300).log())).sum(-1)


@torch.no_grad()
def implicit_posteriors(
    denoiser: Denoiser,
    x0: Tensor,
    num_classes: Sequence[int],
    generator: torch.Generator | None = None,
    steps: Sequence[int] = JSD_STEPS,
    chunk: int = 16,
) -> tuple[Tensor, list[Tensor]]:
    """Implicit posteriors ``softmax(-score)`` over joint labels ``[N, prod K]`` and over each slot ``[N, K_i]``.

    For each image and each noise level (one noise draw shared by all labels), the eps-MSE of every joint label
    and of every single-slot label (others null) is z-scored across all these labels, then summed over levels
    (as the official code). Joint labels are ordered as ``itertools.product(range(K_1), .., range(K_m))``.
    """
    ks = list(num_classes)
    m = len(ks)
    joint = list(itertools.product(*[range(k) for k in ks]))
    single = [tuple(v if j == i else NULL for j in range(m)) for i, k in enumerate(ks) for v in range(k)]
    labels = torch.tensor(joint + single, dtype=torch.long)
    n_lab = labels.shape[0]
    sig = ddpm_sigma(list(steps)).to(x0.dtype)
    n_sig = sig.numel()
    scores = []
    for xb in x0.split(chunk):
        b = xb.shape[0]
        eps = torch.randn((b, n_sig) + xb.shape[1:], generator=generator, dtype=xb.dtype).to(xb.device)
        s = sig.to(xb.device)
        xs = xb[:, None] + append_dims(s, eps.ndim - 1)[None] * eps  # [b, n_sig, ...]
        rows_x = xs[:, :, None].expand((b, n_sig, n_lab) + xb.shape[1:]).reshape((-1,) + xb.shape[1:])
        rows_s = s[None, :, None].expand(b, n_sig, n_lab).reshape(-1)
        rows_c = labels.to(xb.device)[None, None].expand(b, n_sig, n_lab, m).reshape(-1, m)
        d = denoiser(rows_x, rows_s, rows_c)
        eps_hat = (rows_x - d) / append_dims(rows_s, rows_x.ndim)
        target = eps[:, :, None].expand_as(xs[:, :, None].expand((b, n_sig, n_lab) + xb.shape[1:]))
        mse = (eps_hat - target.reshape(eps_hat.shape)).pow(2).flatten(1).mean(1).reshape(b, n_sig, n_lab)
        mse = mse.double()
        z = (mse - mse.mean(-1, keepdim=True)) / mse.std(-1, keepdim=True).clamp_min(1e-12)
        scores.append(z.sum(1))
    score = torch.cat(scores)
    p_joint = torch.softmax(-score[:, : len(joint)], -1)
    per_slot, start = [], len(joint)
    for k in ks:
        per_slot.append(torch.softmax(-score[:, start : start + k], -1))
        start += k
    return p_joint, per_slot


def posterior_divergence(p_joint: Tensor, per_slot: Sequence[Tensor]) -> dict[str, float]:
    """Mean over images of ``jsd_code = (KL(prod||joint) + KL(joint||prod)) / 2`` (the official code's value)
    and ``jsd`` (Jensen-Shannon), between ``p_joint`` and the product of the per-slot posteriors."""
    prod = per_slot[0]
    for p in per_slot[1:]:
        prod = (prod[:, :, None] * p[:, None, :]).flatten(1)
    if prod.shape != p_joint.shape:
        raise ValueError(f"joint posterior {tuple(p_joint.shape)} does not match the product {tuple(prod.shape)}")
    mix = 0.5 * (p_joint + prod)
    code = 0.5 * (_kl(prod, p_joint) + _kl(p_joint, prod))
    jsd = 0.5 * (_kl(p_joint, mix) + _kl(prod, mix))
    return {"jsd_code": float(code.mean()), "jsd": float(jsd.mean()), "jsd_max": math.log(2)}


def composition_divergence(
    denoiser: Denoiser,
    x0: Tensor,
    num_classes: Sequence[int],
    generator: torch.Generator | None = None,
    steps: Sequence[int] = JSD_STEPS,
) -> dict[str, float]:
    """``jsd_code`` (the official symmetric KL) and ``jsd`` (the true Jensen-Shannon divergence) on real images
    ``x0`` (see :func:`implicit_posteriors`)."""
    return posterior_divergence(*implicit_posteriors(denoiser, x0, num_classes, generator, steps))
