"""Online black-box reward optimisation with DAS (Kim, Kim, Park, ICLR 2025, Algorithm 5 in Appendix A; the
SEIKO setting of Uehara et al. 2024; ``docs/methods/das.md``, "Multi-objective and online rewards").

The true reward (the *oracle*) is only queried, never differentiated. Each round fits an optimistic surrogate to
every (x, r(x)) queried so far and runs DAS on it to choose the next queries; the first round queries the plain
model. The surrogate here is ridge regression on fixed features with a LinUCB bonus,
``r_hat(x) = phi(x)^T theta + c sqrt(phi(x)^T (Phi^T Phi + lambda I)^-1 phi(x))`` (the Gram form; the official
code uses the feature covariance instead), differentiable in x so that DAS can use its gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..core.noise import make_generators
from ..core.sigmas import check_sigmas
from .best_of_n import plain_chains
from .das import das
from .run_setup import RewardCalls


def quadratic_features(x: Tensor) -> Tensor:
    """``(1, x_i, x_i x_j for i <= j)`` of flattened samples (for 2-D: 1, x1, x2, x1^2, x1 x2, x2^2)."""
    v = x.flatten(1)
    i, j = torch.triu_indices(v.shape[1], v.shape[1])
    return torch.cat([torch.ones_like(v[:, :1]), v, v[:, i] * v[:, j]], 1)


class LinUCBSurrogate:
    """Ridge regression on ``features(x)`` plus a LinUCB exploration bonus.

    Args:
        features: ``phi(x) -> [B, m]``, differentiable.
        ridge: lambda of ``Phi^T Phi + lambda I``.
        bonus: c, the weight of the uncertainty bonus (0 = plain ridge).
        clip: optional cap on the bonus (``osm_clipping``).
    """

    def __init__(self, features: Callable[[Tensor], Tensor] = quadratic_features, ridge: float = 1e-3,
                 bonus: float = 0.1, clip: float | None = None):
        if not ridge > 0 or bonus < 0:
            raise ValueError(f"need ridge > 0 and bonus >= 0, got ridge={ridge}, bonus={bonus}")
        self.features, self.ridge, self.bonus, self.clip = features, ridge, bonus, clip
        self.theta: Tensor | None = None
        self.gram_inv: Tensor | None = None

    def fit(self, x: Tensor, y: Tensor) -> LinUCBSurrogate:
        with torch.no_grad():
            phi = self.features(x.double())
            y = torch.as_tensor(y, dtype=torch.float64).flatten()
            if phi.shape[0] != y.shape[0]:
                raise ValueError(f"{phi.shape[0]} inputs but {y.shape[0]} rewards")
            gram = phi.T @ phi + self.ridge * torch.eye(phi.shape[1], dtype=torch.float64)
            self.gram_inv = torch.linalg.inv(gram)
            self.theta = self.gram_inv @ (phi.T @ y)
        return self

    def copy(self) -> LinUCBSurrogate:
        """A snapshot (same features and settings, the current fit)."""
        c = LinUCBSurrogate(self.features, self.ridge, self.bonus, self.clip)
        c.theta, c.gram_inv = self.theta, self.gram_inv
        return c

    def mean(self, x: Tensor) -> Tensor:
        if self.theta is None:
            raise RuntimeError("fit the surrogate before calling it")
        return self.features(x.double()) @ self.theta

    def uncertainty(self, x: Tensor) -> Tensor:
        phi = self.features(x.double())
        return ((phi @ self.gram_inv) * phi).sum(1).clamp_min(1e-30).sqrt()

    def __call__(self, x: Tensor) -> Tensor:
        b = self.bonus * self.uncertainty(x)
        if self.clip is not None:
            b = b.clamp(max=self.clip)
        return (self.mean(x) + b).to(x.dtype)


@dataclass
class OnlineResult:
    """Queries and oracle rewards of each round, the surrogate each round sampled with (None for round 1, the
    plain model), and the surrogate refitted to all data after the last round."""

    queries: list[Tensor] = field(default_factory=list)
    rewards: list[Tensor] = field(default_factory=list)
    round_surrogates: list[LinUCBSurrogate | None] = field(default_factory=list)
    surrogate: LinUCBSurrogate | None = None
    nfe: float = 0.0
    nfe_grad: float = 0.0

    @property
    def mean_rewards(self) -> list[float]:
        return [float(r[torch.isfinite(r)].mean()) for r in self.rewards]


def _oracle(oracle: Callable, x: Tensor) -> Tensor:
    with torch.no_grad():
        y = oracle(x.detach())
    y = torch.as_tensor(y, dtype=torch.float64).flatten()
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"oracle must return one reward per sample ({x.shape[0]}), got {y.shape[0]}")
    return y


def online_das(
    denoiser: Callable,
    oracle: Callable,
    sigmas: Tensor,
    shape: tuple[int, ...],
    *,
    alpha: float,
    surrogate: LinUCBSurrogate | None = None,
    rounds: int = 8,
    queries: int = 16,
    particles: int = 16,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **das_kwargs,
) -> OnlineResult:
    """Run ``rounds`` rounds of ``queries`` oracle queries: round 1 from the plain model, later rounds from DAS on
    the optimistic surrogate refitted to all data so far. ``oracle(x) -> [B]`` is called without gradients."""
    if rounds < 1 or queries < 1:
        raise ValueError(f"rounds and queries must be >= 1, got {rounds}, {queries}")
    surrogate = surrogate or LinUCBSurrogate()
    sig = check_sigmas(sigmas, final="any", allow_inf_start=True).tolist()
    from ..core.noise import randn

    out = OnlineResult(surrogate=surrogate)
    for k in range(rounds):
        base = seed + k * 10**6
        if k == 0:
            calls = RewardCalls(denoiser, lambda v: v.new_zeros(v.shape[0]), das_kwargs.get("batch_size", 512))
            noise = randn((queries, *shape), seeds=base, dtype=dtype)
            x = plain_chains(calls, noise, sig, None, 1.0, make_generators(base + 5 * 10**5, queries), False, None,
                             "online")
            out.nfe += calls.denoiser.rows / queries
            out.round_surrogates.append(None)
        else:
            surrogate.fit(torch.cat(out.queries), torch.cat(out.rewards))
            noise = randn((queries * particles, *shape), seeds=base, dtype=dtype)
            res = das(denoiser, surrogate, noise, sig, alpha=alpha, particles=particles,
                      generator=base + 5 * 10**5, **das_kwargs)
            x = res.samples
            out.round_surrogates.append(surrogate.copy())
            out.nfe += res.nfe
            out.nfe_grad += res.nfe_grad
        out.queries.append(x.detach())
        out.rewards.append(_oracle(oracle, x))
    surrogate.fit(torch.cat(out.queries), torch.cat(out.rewards))
    return out
