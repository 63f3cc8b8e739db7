"""Exact references for linear-Gaussian inverse problems under a Gaussian-mixture prior (the G1 / G2
checks of docs/methods/inverse.md), and the analytic digits surrogate, prior (b) of its digits protocol.

For ``y = A x0 + sigma_y n`` and ``p(x0) = sum_k pi_k N(m_k, C_k)`` the posterior is the mixture computed by
:meth:`steerdiff.models.GaussianMixture.posterior_linear` (Kalman update per component, weights
``∝ pi_k N(y; A m_k, A C_k A^T + sigma_y^2 I)``). ``ImageMixture`` lets a mixture over flattened vectors act as a
denoiser of image-shaped samples, so image operators and solvers run on it unchanged.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from ..models.gmm import GaussianMixture
from .noise import real_scalar
from .operators import Operator, as_operator


class ImageMixture:
    """A :class:`GaussianMixture` over ``d = prod(shape)`` vectors as a denoiser of ``[B, *shape]`` samples."""

    def __init__(self, mixture: GaussianMixture, shape):
        shape = tuple(int(v) for v in shape)
        if math.prod(shape) != mixture.dim:
            raise ValueError(f"shape {shape} has {math.prod(shape)} entries but the mixture has dimension "
                             f"{mixture.dim}")
        self.mixture = mixture
        self.sample_shape = shape

    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        return self.mixture(x.flatten(1), sigma, cond).reshape(x.shape)

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        return self.mixture.sample(n, generator).reshape(n, *self.sample_shape)


def _mixture_of(prior) -> GaussianMixture:
    if isinstance(prior, ImageMixture):
        return prior.mixture
    if isinstance(prior, GaussianMixture):
        return prior
    raise TypeError(f"the exact posterior needs a GaussianMixture (or ImageMixture) prior, got {type(prior).__name__}")


def exact_posterior(prior, operator: Operator, y: Tensor, noise_std: float) -> list[GaussianMixture]:
    """The exact posterior mixture of each measurement row of ``y`` (``[M, m]`` or ``[m]``); ``operator`` takes the
    forms of :func:`~steerdiff.inverse.operators.as_operator` (a linear one).

    Raises:
        NoAdjointError: for a nonlinear operator (no matrix).
        ValueError: for a measurement of the wrong shape, NaN, or a negative noise level.
    """
    mixture = _mixture_of(prior)
    operator = as_operator(operator)
    if operator.shape is None:
        operator = operator.bind(getattr(prior, "sample_shape", (mixture.dim,)))
    A = operator.matrix(torch.float64)
    if A.shape[1] != mixture.dim:
        raise ValueError(f"{operator!r} acts on {A.shape[1]} unknowns but the prior has dimension {mixture.dim}")
    y = operator.check_y(y)
    noise_std = real_scalar(noise_std, "noise_std", low=0.0)
    return [mixture.posterior_linear(A, row, noise_std) for row in y.double()]


def posterior_mean(posterior: GaussianMixture) -> Tensor:
    """``sum_k w_k m_k`` ``[d]``."""
    return posterior.weights @ posterior.means


def posterior_trace_cov(posterior: GaussianMixture) -> float:
    """``tr Cov`` of the mixture: ``sum_k w_k (tr C_k + |m_k|^2) - |mean|^2``."""
    w, m = posterior.weights, posterior.means
    second = (w * (posterior.covs.diagonal(dim1=-2, dim2=-1).sum(-1) + m.square().sum(-1))).sum()
    return float(second - posterior_mean(posterior).square().sum())


@functools.lru_cache(maxsize=2)
def _fit_digits_surrogate(n_components: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    from sklearn.mixture import GaussianMixture as SkGaussianMixture

    from ..data.digits import load_digits

    x, _ = load_digits("train")
    gm = SkGaussianMixture(n_components, covariance_type="full", reg_covar=1e-3, random_state=seed)
    gm.fit(x.flatten(1).double().numpy())
    return (torch.from_numpy(gm.weights_), torch.from_numpy(gm.means_), torch.from_numpy(gm.covariances_))


def digits_surrogate(n_components: int = 20, seed: int = 0) -> ImageMixture:
    """Prior (b) of the digits protocol: scikit-learn ``GaussianMixture(20, 'full', reg_covar=1e-3,
    random_state=0)`` fit on our digits train split (1438 images), as an exact denoiser of ``[B, 1, 8, 8]`` images."""
    w, m, c = _fit_digits_surrogate(n_components, seed)
    return ImageMixture(GaussianMixture(w, m, c), (1, 8, 8))
