"""The OCM objective's regression target (Ou et al., "Improving Probabilistic Diffusion Models With Optimal
Diagonal Covariance Matching", ICLR 2025, Sec. 3: an unbiased regression onto the diagonal of the posterior
covariance; docs/methods/ocm.md, "Second-order Tweedie" and "OCM objective").

By second-order Tweedie ``Cov[x0 | x] = sigma^2 dD/dx``, so the target is the single-probe Hutchinson estimate
``tau = v * (J^T v)`` with a Rademacher probe ``v`` (unbiased for ``diag J``), mapped to the head's output space by
:func:`ocm_target` (per parameterisation, docs/methods/ocm.md, "Parameterisations"). The heads themselves are
networks: :mod:`steerdiff.models.ocm_heads`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.denoiser import append_dims
from ..models.ocm_heads import cout2


def rademacher_like(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """A ``{-1, +1}`` probe of ``x``'s shape (drawn on CPU from ``generator``, then moved)."""
    v = torch.randint(0, 2, x.shape, generator=generator, dtype=torch.int8)
    return (v.to(x.dtype) * 2 - 1).to(x.device)


def hutchinson_diag(
    denoised: Tensor, x: Tensor, n_probes: int = 1, generator: torch.Generator | None = None
) -> Tensor:
    """Mean over ``n_probes`` Rademacher probes of ``v * (J^T v)``, ``J = d denoised / d x`` (OCM's target).

    ``denoised`` must come from ``x`` (with ``requires_grad``) through autograd; the graph is kept (the caller
    may need it). Returns a detached tensor of ``x``'s shape, unbiased for ``diag J``.
    """
    if not isinstance(n_probes, int) or n_probes < 1:
        raise ValueError(f"n_probes must be an integer >= 1, got {n_probes!r}")
    tau = torch.zeros_like(x)
    for _ in range(n_probes):
        v = rademacher_like(x, generator)
        (w,) = torch.autograd.grad(denoised, x, grad_outputs=v, retain_graph=True)  # J^T v
        tau = tau + v * w
    return (tau / n_probes).detach()


def ocm_target(tau: Tensor, sigma: Tensor, param: str, sigma_data: float) -> Tensor:
    """Regression target of the head from a Hutchinson estimate ``tau`` of ``diag J`` (per parameterisation; for
    ``softplus`` the same as ``direct``: it is compared with ``regression_output`` of the head)."""
    s = append_dims(sigma.to(tau.dtype), tau.ndim)
    if param == "hess":
        return tau - 1
    return s**2 * tau / cout2(s, sigma_data)
