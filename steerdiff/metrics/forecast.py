"""Ensemble forecast scores: the fair CRPS and the MSE of the ensemble mean (Dynamical Diffusion's evaluation, Guo et
al., ICLR 2025; docs/methods/dydiff.md "Scores" and "The validation protocol").

Fair CRPS of an ``m``-member ensemble ``x_1..x_m`` against an observation ``y`` (per element, then averaged):
``mean_i |x_i - y| - sum_{i,j} |x_i - x_j| / (2 m (m - 1))``, unbiased for the CRPS of the ensemble's distribution.
The official evaluation computes it by probability-weighted moments: with the members sorted ascending,
``mean_i |x_i - y| + beta0 - 2 beta1``, ``beta0 = mean(x)``, ``beta1 = sum_i i x_(i) / (m (m - 1))`` (``i`` from 0);
both forms are implemented and agree. The non-fair ("ensemble") CRPS of ``properscoring.crps_ensemble`` divides the
spread term by ``2 m^2`` instead, so ``fair = nonfair - spread / (2 m^2 (m - 1))`` with ``spread = sum |x_i - x_j|``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _move_members(ensemble: Tensor, obs: Tensor, member_dim: int, minimum: int) -> tuple[Tensor, Tensor]:
    """``ensemble`` with its members on the last axis, and ``obs`` as float; shapes checked."""
    if not isinstance(ensemble, Tensor) or not isinstance(obs, Tensor):
        raise ValueError("ensemble and obs must be tensors")
    if ensemble.ndim < 1 or not -ensemble.ndim <= member_dim < ensemble.ndim:
        raise ValueError(f"member_dim={member_dim} is not an axis of ensemble with shape {tuple(ensemble.shape)}")
    m = ensemble.shape[member_dim]
    if m < minimum:
        raise ValueError(f"ensemble must have at least {minimum} members along member_dim={member_dim}, got {m}")
    x = ensemble.movedim(member_dim, -1)
    if tuple(obs.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"obs must have the ensemble's shape without the member axis, {tuple(x.shape[:-1])}, got "
                         f"{tuple(obs.shape)}")
    dtype = torch.promote_types(torch.promote_types(x.dtype, obs.dtype), torch.float32)
    return x.to(dtype), obs.to(dtype)


def _reduce(values: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return values.mean()
    if reduction == "none":
        return values
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def crps_fair(ensemble: Tensor, obs: Tensor, member_dim: int = 1, reduction: str = "mean",
              method: str = "pwm") -> Tensor:
    """Fair CRPS of an ensemble against observations.

    Args:
        ensemble: members along ``member_dim`` (e.g. ``[B, members, S_f, *frame]`` with ``member_dim=1``).
        obs: the observations, the ensemble's shape without the member axis.
        member_dim: the member axis of ``ensemble``.
        reduction: ``"mean"`` (a scalar over every element) or ``"none"`` (per element, ``obs``'s shape).
        method: ``"pwm"`` (probability-weighted moments, the official form, ``O(m log m)``) or ``"pairwise"``.

    Raises:
        ValueError: fewer than 2 members (the fair CRPS divides by ``m - 1``), shapes that do not fit, unknown
            ``reduction`` or ``method``.
    """
    x, y = _move_members(ensemble, obs, member_dim, 2)
    m = x.shape[-1]
    skill = (x - y[..., None]).abs().mean(-1)
    if method == "pwm":
        xs = x.sort(dim=-1).values
        i = torch.arange(m, dtype=x.dtype, device=x.device)
        beta0 = xs.mean(-1)
        beta1 = (i * xs).sum(-1) / (m * (m - 1))
        return _reduce(skill + beta0 - 2 * beta1, reduction)
    if method == "pairwise":
        spread = (x[..., :, None] - x[..., None, :]).abs().sum((-1, -2))
        return _reduce(skill - spread / (2 * m * (m - 1)), reduction)
    raise ValueError(f"method must be 'pwm' or 'pairwise', got {method!r}")


def ensemble_mse(ensemble: Tensor, obs: Tensor, member_dim: int = 1, reduction: str = "mean") -> Tensor:
    """Squared error of the ensemble mean: ``(mean_i x_i - y)^2``, averaged (``"mean"``) or per element
    (``"none"``). One member is allowed (a deterministic forecast)."""
    x, y = _move_members(ensemble, obs, member_dim, 1)
    return _reduce((x.mean(-1) - y) ** 2, reduction)


def member_rmse(ensemble: Tensor, obs: Tensor, member_dim: int = 1) -> Tensor:
    """``sqrt(mean over members and elements of (x_i - y)^2)``: the official evaluation's ``MSE`` class (an RMSE
    of the members, not of the ensemble mean); a scalar."""
    x, y = _move_members(ensemble, obs, member_dim, 1)
    return ((x - y[..., None]) ** 2).mean().sqrt()
