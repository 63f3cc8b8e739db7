"""Negative ELBO of the DDPM-type Gaussian reverse process, the likelihood OCM (Ou et al., ICLR 2025) reports
beside sample quality (docs/methods/ocm.md, "Likelihood"; its gates under "Validation").

For a schedule ``sigma_K > ... > sigma_1 > 0`` (a sampling schedule ending in 0)::

    NELBO(x0) = KL(N(x0, sigma_K^2 I) || N(0, (1 + sigma_K^2) I))
              + sum_{i=2..K} E_{x_t = x0 + t eps} sum_dims
                    1/2 [log(Sigma/lam2) + (lam2 + a^2 (D(x_t) - x0)^2)/Sigma - 1]
              + E_{x_1}[-log N(x0; D(x_1), sigma_1^2 I)]

with ``t = sigma_i``, ``s = sigma_{i-1}``, ``lam2 = s^2 (t^2 - s^2)/t^2``, ``a = 1 - s^2/t^2`` and
``Sigma = lam2 + a^2 c`` (one noise draw per term). The decoder is a continuous Gaussian (the same fixed variance
for every method; the official code's discretised 8-bit decoder is for images). Reported in nats per dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.calls import host_copy
from ..core.denoiser import NFECounter, append_dims
from ..models.ocm_heads import cout2
from .kernel import as_covariance, clamp_covariance_counted, kernel_coefficients


@dataclass
class NELBOResult:
    """NELBO in nats/dim: ``mean`` over points, its standard error, per-term means, NFE per point."""

    mean: float
    stderr: float
    prior: float
    transitions: float
    decoder: float
    per_point: Tensor
    nfe: float
    n_negative: int = 0
    n_nonfinite: int = 0


@torch.no_grad()
def nelbo(
    denoiser, x0: Tensor, sigmas: Tensor, covariance="zero", *, cond: Tensor | None = None, seed: int = 0,
    floor_frac: float = 0.0, sigma_data: float | None = None, c_max: float | None = None, batch_size: int = 4000,
) -> NELBOResult:
    """NELBO (nats/dim) of ``x0: [N, *shape]`` under the DDPM-type reverse kernel with ``covariance``.

    Args:
        denoiser: ``D(x, sigma, cond)``.
        x0: test points.
        sigmas: decreasing schedule ending in 0, ``K + 1`` entries, ``K >= 1``.
        covariance: as :func:`~steerdiff.covariance.as_covariance` (``"zero"``: beta-tilde, ``"beta"``, a head, a
            mixture for the oracle, an :class:`~steerdiff.covariance.AnalyticDPM`).
        floor_frac: floor ``c >= floor_frac * c_out(t)^2`` (steerdiff, not OCM; 0.05 for likelihood with learned
            heads, because under-estimated ``c`` makes the NELBO explode; docs/methods/ocm.md, "Likelihood").
        sigma_data: the ``c_out`` scale of the floor (default: the head's, else 1).
        c_max: upper clamp of ``c`` (default: the source's).
    """
    sig = torch.as_tensor(sigmas, dtype=torch.float64).flatten().tolist()
    if len(sig) < 2 or sig[-1] != 0 or any(b >= a for a, b in zip(sig, sig[1:], strict=False)):
        raise ValueError("sigmas must be a strictly decreasing schedule ending in 0 with at least 2 entries")
    if not floor_frac >= 0:
        raise ValueError(f"floor_frac must be >= 0, got {floor_frac}")
    src = as_covariance(covariance)
    if sigma_data is None:
        sigma_data = float(getattr(getattr(src, "head", None), "sigma_data", 1.0))
    c_max = src.c_max if c_max is None else c_max
    g = torch.Generator().manual_seed(seed)
    n, d = x0.shape[0], x0[0].numel()
    counter = NFECounter(denoiser)
    levels = sig[:-1][::-1]  # sigma_1 < ... < sigma_K
    prior_t = trans_t = dec_t = None
    counts = None  # clamp counts [negative, non-finite], added up on the device and read once at the end
    per_point = []
    with src.bind(denoiser) as cov_fn:
        for start in range(0, n, batch_size):
            xb = x0[start : start + batch_size].double()
            cb = None if cond is None else cond[start : start + batch_size]
            b = xb.shape[0]
            sk2 = levels[-1] ** 2
            prior = 0.5 * (sk2 / (1 + sk2) + xb**2 / (1 + sk2) - 1 + math.log((1 + sk2) / sk2))
            trans = torch.zeros_like(xb)
            for i in range(1, len(levels)):
                t, s = levels[i], levels[i - 1]
                sigma_b = torch.full((b,), t, dtype=torch.float64)
                xt = xb + t * torch.randn(xb.shape, generator=g, dtype=torch.float64)
                dn = counter(xt, sigma_b, cb).double()
                c = cov_fn(xt, sigma_b, cb, dn).double()
                c, step_counts = clamp_covariance_counted(c, c_max)
                counts = step_counts if counts is None else counts + step_counts
                if floor_frac > 0:
                    c = torch.maximum(c, floor_frac * cout2(append_dims(sigma_b, xb.ndim), sigma_data))
                _, lam2, a = kernel_coefficients(t, s, "ddpm")
                var = lam2 + a**2 * c
                trans = trans + 0.5 * ((var / lam2).log() + (lam2 + a**2 * (dn - xb) ** 2) / var - 1)
            s1 = levels[0]
            x1 = xb + s1 * torch.randn(xb.shape, generator=g, dtype=torch.float64)
            d1 = counter(x1, torch.full((b,), s1, dtype=torch.float64), cb).double()
            dec = 0.5 * math.log(2 * math.pi * s1**2) + (xb - d1) ** 2 / (2 * s1**2)
            parts = [p.flatten(1).sum(1) / d for p in (prior, trans, dec)]
            per_point.append(parts[0] + parts[1] + parts[2])
            prior_t = parts[0] if prior_t is None else torch.cat([prior_t, parts[0]])
            trans_t = parts[1] if trans_t is None else torch.cat([trans_t, parts[1]])
            dec_t = parts[2] if dec_t is None else torch.cat([dec_t, parts[2]])
    total = torch.cat(per_point)
    n_neg, n_nan = (0, 0) if counts is None else host_copy(counts).tolist()
    return NELBOResult(
        mean=float(total.mean()), stderr=float(total.std() / math.sqrt(n)) if n > 1 else float("nan"),
        prior=float(prior_t.mean()), transitions=float(trans_t.mean()), decoder=float(dec_t.mean()),
        per_point=total, nfe=counter.nfe(n), n_negative=n_neg, n_nonfinite=n_nan,
    )
