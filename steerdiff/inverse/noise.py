"""Measurement noise models (docs/methods/inverse.md, "Noise models"); Poisson as in DPS (Chung et al., ICLR 2023).

* Gaussian: ``y = A(x0) + std * n``, ``std`` in **model units** (a sigma quoted for [0, 1] images is ``2 sigma`` here;
  the published codes differ in this, so steerdiff takes model units only).
* Poisson (DPS ``measurements.py`` style): ``k ~ Pois(255 r (clip(A(x0), -1, 1) + 1) / 2)``, ``y = 2k / (255 r) - 1``.
  Its likelihood surrogate (DPS paper) is the weighted residual ``||y - A(x)||_Lambda`` with
  ``Lambda_jj = 1 / (2 max(k_j, 1))`` in count units, i.e. per-entry weights ``(255 r / 2)^2 / (2 max(k_j, 1))`` on
  the model-unit residual (:meth:`PoissonNoise.weights`). Only DPS uses the weights; DR/CR/HR follow
  HRDIS' code, whose loss has no noise model.

Draws are per row (one generator per measurement), so a measurement does not depend on its batch.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from ..core.noise import GeneratorLike, make_generators
from .operators import as_operator


def real_scalar(value, name: str, low: float | None = None) -> float:
    """``value`` as a float: a finite real number (Python, numpy, or a one-element tensor; not a bool) ``>= low``."""
    if isinstance(value, Tensor) and value.numel() == 1 and not value.dtype.is_complex and value.dtype != torch.bool:
        value = value.item()
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (low is not None and value < low):
        bound = "" if low is None else f" >= {low:g}"
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return float(value)


def _rows(generator: GeneratorLike, n: int) -> list:
    gens = make_generators(generator, n)
    return [None] * n if gens is None else gens


class GaussianNoise:
    """Additive white Gaussian noise of standard deviation ``std`` (model units)."""

    name = "gaussian"

    def __init__(self, std: float):
        self.std = real_scalar(std, "noise_std", low=0.0)

    def sample(self, clean: Tensor, generator: GeneratorLike = None) -> Tensor:
        """``clean + std * n`` for clean measurements ``[M, m]``."""
        n = torch.stack([torch.randn(row.shape, generator=g, dtype=clean.dtype) for row, g in
                         zip(clean, _rows(generator, clean.shape[0]), strict=True)]).to(clean.device)
        return clean + self.std * n

    def weights(self, y: Tensor) -> Tensor | None:
        """Per-entry residual weights of the likelihood surrogate: None (uniform)."""
        return None

    def __repr__(self):
        return f"GaussianNoise(std={self.std:g})"


class PoissonNoise:
    """Poisson counts at ``rate`` r on images in [-1, 1] (DPS); ``std`` is the typical model-unit noise at mid-grey."""

    name = "poisson"

    def __init__(self, rate: float = 1.0):
        self.rate = real_scalar(rate, "rate")
        if not self.rate > 0:
            raise ValueError(f"rate must be a positive number, got {rate!r}")
        self.scale = 255.0 * self.rate / 2  # model units -> counts: k = scale * (y + 1)
        self.std = 1 / math.sqrt(self.scale)  # sqrt(k) / scale at k = scale (mid-grey)

    def sample(self, clean: Tensor, generator: GeneratorLike = None) -> Tensor:
        lam = self.scale * (clean.clamp(-1, 1) + 1)
        k = torch.stack([torch.poisson(row.double().cpu(), generator=g) for row, g in
                         zip(lam, _rows(generator, clean.shape[0]), strict=True)])
        return (k / self.scale - 1).to(clean)

    def counts(self, y: Tensor) -> Tensor:
        return torch.round(self.scale * (y + 1))

    def weights(self, y: Tensor) -> Tensor:
        """``Lambda_jj = 1 / (2 max(k_j, 1))`` in counts, as weights on the model-unit residual."""
        return self.scale**2 / (2 * self.counts(y).clamp_min(1))

    def __repr__(self):
        return f"PoissonNoise(rate={self.rate:g})"


def noise_model(noise: str | GaussianNoise | PoissonNoise, std: float) -> GaussianNoise | PoissonNoise:
    """``"gaussian"`` (with ``std``), ``"poisson"`` or a noise-model instance."""
    if isinstance(noise, (GaussianNoise, PoissonNoise)):
        return noise
    if noise == "gaussian":
        return GaussianNoise(std)
    if noise == "poisson":
        return PoissonNoise()
    raise ValueError(f"noise must be 'gaussian', 'poisson' or a noise model, got {noise!r}")


def measure(operator, x0: Tensor, noise_std: float = 0.0, noise: str | GaussianNoise | PoissonNoise = "gaussian",
            generator: GeneratorLike = None) -> Tensor:
    """Simulate measurements ``y = A(x0) + noise`` for clean samples ``x0: [M, *shape]``; returns ``[M, m]``.

    ``operator`` takes the forms :func:`steerdiff.inverse.solve` accepts (an operator, a ``[m, d]`` matrix, a pair
    ``(forward, adjoint)`` or a forward function)."""
    model = noise_model(noise, noise_std)
    if not isinstance(x0, Tensor) or x0.ndim < 2 or not x0.is_floating_point():
        raise ValueError(f"x0 must be a floating-point batch tensor [M, *shape], got "
                         f"{tuple(x0.shape) if isinstance(x0, Tensor) else type(x0).__name__}")
    if not torch.isfinite(x0).all():
        raise ValueError("x0 contains NaN or infinite values")
    operator = as_operator(operator)
    if operator.shape is None:
        operator = operator.bind(tuple(x0.shape[1:]))
    with torch.no_grad():
        return model.sample(operator.forward(x0), generator)
