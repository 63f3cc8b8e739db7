"""The result every inverse solver returns: the samples, the cost of the run and the guarded (non-finite) chains."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class InverseResult:
    """Posterior samples of one :func:`steerdiff.inverse.solve` run, several chains per measurement.

    Attributes:
        samples: ``[M, K, *shape]``: ``K`` chains for each of ``M`` measurements. A chain that turned non-finite
            (DPS divergence) is all-NaN here and flagged in ``dead_at``; it is never dropped.
        method: ``"dps"``, ``"dr"``, ``"cr"`` or ``"hr"``.
        options: the hyperparameters used (defaults filled in).
        sigmas: the noise levels visited, float64 ``[N]`` (descending, positive); ``levels`` is its deprecated
            name (warns).
        nfe: denoiser evaluations per chain.
        nfe_vjp: vector-Jacobian products through the denoiser per chain (DPS: one per level; DR/CR/HR: 0).
        wall_time: seconds for the whole run.
        dead_at: ``[M, K]`` int64, the level at which a chain turned non-finite, -1 for healthy chains.
        noise_std: the measurement noise level given to the solver (model units).
    """

    samples: Tensor
    method: str
    options: dict
    sigmas: Tensor
    nfe: float
    nfe_vjp: float
    wall_time: float
    dead_at: Tensor
    noise_std: float
    extras: dict = field(default_factory=dict)

    @property
    def levels(self) -> Tensor:
        """Deprecated name of :attr:`sigmas`."""
        warnings.warn("InverseResult.levels is deprecated: use result.sigmas", DeprecationWarning, stacklevel=2)
        return self.sigmas

    @property
    def n_measurements(self) -> int:
        return self.samples.shape[0]

    @property
    def chains(self) -> int:
        return self.samples.shape[1]

    @property
    def nonfinite(self) -> Tensor:
        """``[M, K]`` bool: guarded (non-finite) chains."""
        return self.dead_at >= 0

    @property
    def n_nonfinite(self) -> int:
        return int(self.nonfinite.sum())

    def flat(self) -> Tensor:
        """All chains as one batch ``[M * K, *shape]`` (measurement-major)."""
        return self.samples.flatten(0, 1)

    def mean(self) -> Tensor:
        """Posterior mean per measurement over its finite chains, ``[M, *shape]`` (NaN if none is finite)."""
        return torch.nanmean(self.samples, dim=1)

    def std(self) -> Tensor:
        """Per-entry standard deviation across finite chains (population, ``ddof = 0``), ``[M, *shape]``."""
        dev = self.samples - self.mean()[:, None]
        return torch.nanmean(dev.square(), dim=1).sqrt()

    def residual(self, operator, y: Tensor) -> Tensor:
        """``||y - A(x)||^2`` per chain, ``[M, K]`` float64 (NaN for guarded chains); ``operator`` in any form
        :func:`~steerdiff.inverse.solve` accepts."""
        from .operators import as_operator

        operator = as_operator(operator)
        if operator.shape is None:
            operator = operator.bind(tuple(self.samples.shape[2:]))
        y = operator.check_y(y)
        if y.shape[0] != self.n_measurements:
            raise ValueError(f"y has {y.shape[0]} measurements, the result {self.n_measurements}")
        with torch.no_grad():
            ax = operator.forward(self.flat().to(y)).reshape(self.n_measurements, self.chains, -1)
        return (y[:, None] - ax).double().square().sum(-1)

    def chi2(self, operator, y: Tensor) -> Tensor:
        """``||y - A(x)||^2 / (m sigma_y^2)`` per chain: about 1 for samples of the exact posterior (marginally over
        ``y`` drawn from the model), far below 1 for over-fitted samples and above 1 for under-fitted ones."""
        if not self.noise_std > 0:
            raise ValueError("chi2 needs noise_std > 0")
        r = self.residual(operator, y)
        m = y.shape[-1] if isinstance(y, Tensor) else len(y[0])
        return r / (m * self.noise_std**2)

    def summary(self) -> dict:
        """JSON-ready costs and counts."""
        return {"method": self.method, "options": dict(self.options), "measurements": self.n_measurements,
                "chains": self.chains, "levels": len(self.sigmas), "nfe": self.nfe, "nfe_vjp": self.nfe_vjp,
                "wall_time_s": self.wall_time, "nonfinite_chains": self.n_nonfinite, "noise_std": self.noise_std}
