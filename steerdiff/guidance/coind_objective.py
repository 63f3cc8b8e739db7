"""CoInD training objective: Gaudi, Sreekumar, Boddeti, "CoInD: Enabling Logical Compositions in Diffusion
Models" (ICLR 2025), the conditional-independence objective of the official trainer (``coind/score/trainer.py``),
in steerdiff's EDM form; see docs/methods/coind.md, "The CI training objective".

The conditional-independence (CI) term is the Fisher divergence between the model's joint conditional and the
product of its marginals, enforced "one attribute versus the rest" (official code: one random slot ``i`` per
sample). With ``y^(-i)`` (slot ``i`` null, others kept), ``y^(i)`` (only slot ``i`` kept) and ``∅`` (all null),
evaluated on the same ``(x_sigma, sigma)`` as the score term:

    r_D  = D(y^(-i)) + D(y^(i)) - D(∅) - D(y)            (coefficients sum to 0, so r_eps = -r_D / sigma)
    L    = E[λ(σ) ||D(y_drop) - x0||²] + lambda · E[λ(σ) ||r_D||²],   λ(σ) = (σ² + σ_d²) / (σ σ_d)²

where ``y_drop`` is the condition after dropout and the CI term uses the **undropped** ``y`` and the same draws
as the score term (as in the official trainer).
``ci_fraction`` applies the CI term to the first ``round(ci_fraction * B)`` rows of the (already shuffled)
batch, to fit CPU budgets (official value 1.0). The objective is registered with the training loop as ``coind``
and selected by ``coind_lambda > 0`` in the training config; ``lambda = 0`` is the vanilla model, trained with the
plain EDM objective, so a vanilla run is identical to one without this module.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.denoiser import NULL, Denoiser, append_dims
from ..train.edm import edm_weight, sample_sigmas
from ..train.objectives import register_objective


def ci_labels(y: Tensor, slot: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The four conditions of the CI estimator (official ``ComposableDiffusion``), for one chosen slot per row.

    Args:
        y: undropped labels ``[n, m]`` (``m >= 2``; values ``>= 0``; a ``-1`` already present stays null).
        slot: ``[n]`` integer slot index ``i`` per row, in ``[0, m)``.

    Returns:
        ``(y_minus_i, y_only_i, y_null, y)``: slot ``i`` nulled; only slot ``i`` kept; all slots null; ``y``.

    Raises:
        ValueError: ``y`` is not ``[n, m]`` with ``m >= 2``, or ``slot`` has the wrong shape or range.
    """
    if y.ndim != 2 or y.shape[1] < 2:
        raise ValueError(f"y must have shape [n, m] with m >= 2 attribute slots, got {tuple(y.shape)}")
    if slot.shape != (y.shape[0],):
        raise ValueError(f"slot must have shape [n]=[{y.shape[0]}], got {tuple(slot.shape)}")
    if slot.numel() and (int(slot.min()) < 0 or int(slot.max()) >= y.shape[1]):
        raise ValueError(f"slot values must lie in [0, {y.shape[1]}), got range [{int(slot.min())}, {int(slot.max())}]")
    rows = torch.arange(y.shape[0], device=y.device)
    slot = slot.to(y.device)
    y_minus = y.clone()
    y_minus[rows, slot] = NULL
    y_only = torch.full_like(y, NULL)
    y_only[rows, slot] = y[rows, slot]
    return y_minus, y_only, torch.full_like(y, NULL), y


def ci_residual(model: Denoiser, x: Tensor, sigma: Tensor, y: Tensor, slot: Tensor) -> Tensor:
    """``r_D = D(y^(-i)) + D(y^(i)) - D(∅) - D(y)`` from one stacked call of ``4n`` rows."""
    n = x.shape[0]
    conds = torch.cat(ci_labels(y, slot), dim=0)
    out = model(x.repeat((4,) + (1,) * (x.ndim - 1)), sigma.repeat(4), conds)
    d_minus, d_only, d_null, d_full = out.split(n, dim=0)
    return d_minus + d_only - d_null - d_full


def ci_loss(
    model: Denoiser, x: Tensor, sigma: Tensor, y: Tensor, slot: Tensor, sigma_data: float
) -> Tensor:
    """Weighted CI loss ``mean_b λ(σ_b) mean(r_D,b²)`` (per-element mean, as the base EDM loss)."""
    r = ci_residual(model, x, sigma, y, slot)
    return (edm_weight(sigma, sigma_data) * r.pow(2).flatten(1).mean(dim=1)).mean()


def coind_loss(
    model: Denoiser,
    x0: Tensor,
    y: Tensor,
    y_drop: Tensor,
    lam: float,
    generator: torch.Generator | None = None,
    ci_fraction: float = 1.0,
    p_mean: float = -1.2,
    p_std: float = 1.2,
    sigma_data: float | None = None,
) -> tuple[Tensor, Tensor]:
    """CoInD objective ``L_score + lam * L_CI`` on one batch (EDM form; docs/methods/coind.md).

    The sigma and noise draws are made in the same order as :func:`steerdiff.train.edm.edm_loss` (sigmas,
    then noise), then one slot index per CI row; all from ``generator``.

    Args:
        model: the denoiser being trained.
        x0: clean data ``[B, *shape]``.
        y: undropped labels ``[B, m]``, ``m >= 2``.
        y_drop: labels after condition dropout (used by the score term).
        lam: weight ``lambda`` of the CI term (``> 0``; for ``0`` use the plain EDM loss).
        generator: CPU generator for sigma, noise and slot draws.
        ci_fraction: fraction of the batch (first rows) that gets the CI term, in ``(0, 1]``.
        p_mean, p_std: ``ln sigma ~ N(p_mean, p_std^2)``.
        sigma_data: defaults to ``model.sigma_data``.

    Returns:
        ``(loss, l_ci)``: the total loss (with gradients) and the detached CI term.
    """
    if not 0.0 < ci_fraction <= 1.0:
        raise ValueError(f"ci_fraction must be in (0, 1], got {ci_fraction}")
    if y.ndim != 2 or y.shape[1] < 2:
        raise ValueError(f"CoInD needs labels with m >= 2 attribute slots [B, m], got shape {tuple(y.shape)}")
    if sigma_data is None:
        sigma_data = getattr(model, "sigma_data", None)
        if sigma_data is None:
            raise ValueError("sigma_data: pass it explicitly, the model has no sigma_data attribute")
    gen_device = generator.device if generator is not None else "cpu"
    sigma = sample_sigmas(x0.shape[0], generator, p_mean, p_std, x0.device, x0.dtype)
    noise = torch.randn(x0.shape, generator=generator, device=gen_device, dtype=x0.dtype).to(x0.device)
    xs = x0 + append_dims(sigma, x0.ndim) * noise
    weight = edm_weight(sigma, sigma_data)
    l_score = (weight * (model(xs, sigma, y_drop) - x0).pow(2).flatten(1).mean(dim=1)).mean()
    n = max(1, round(ci_fraction * x0.shape[0]))
    slot = torch.randint(y.shape[1], (n,), generator=generator, device=gen_device).to(x0.device)
    l_ci = ci_loss(model, xs[:n], sigma[:n], y[:n], slot, sigma_data)
    return l_score + lam * l_ci, l_ci.detach()


@register_objective("coind", applies=lambda cfg: cfg.coind_lambda > 0, extra_name="l_ci")
def coind_objective(model: Denoiser, x0: Tensor, cond: Tensor | None, cond_dropped: Tensor | None,
                    generator: torch.Generator | None, cfg) -> tuple[Tensor, Tensor]:
    """:func:`coind_loss` with the training config's ``coind_lambda``, ``ci_fraction``, ``p_mean`` and ``p_std``."""
    if cond is None or cond.ndim != 2:
        raise ValueError("coind_lambda > 0 needs multi-attribute labels cond [N, m] (m >= 2)")
    return coind_loss(model, x0, cond, cond_dropped, cfg.coind_lambda, generator, cfg.ci_fraction, cfg.p_mean,
                      cfg.p_std)
