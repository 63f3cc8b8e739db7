"""NAMM training losses and perturbation schedule (Feng, Baptista, Bouman, ICLR 2025; official ``losses.py``;
docs/methods/namm.md, "Loss").

All terms are L1 means (as in the code, not MSE), per batch ``x`` from the data::

    xt = g(x);  xc = f(xt)                       forward cycle
    sig_b ~ U(0, sigma_max)  (fixed: sigma_max)  perturbation levels, one per sample
    yt = xt + sig_b z   (finetune: yt = mdm_sample + sig_b z)
    yf = f(yt);  yc = g(yf)                      backward cycle on perturbed mirror points
    L_cyc = 0.5 mean|xc - x| + 0.5 mean|yc - yt|
    L_con = mean_b l(yf)
    L_reg = mean|(xt - α x) / (1 - α)|  ("sparse_icnn" = mean|∇Ψ|)   or  mean|xt - x|  ("fwdid")
    L     = λ_cyc L_cyc + λ_con L_con + λ_reg L_reg
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..core.denoiser import append_dims
from .distances import check_distance

REGULARIZERS = ("sparse_icnn", "fwdid")


def perturbation_levels(batch: int, sigma_max: float, fixed: bool = False,
                        generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Per-sample levels ``sig_b ~ U(0, sigma_max)`` (``fixed``: all ``sigma_max``); ``[batch]``."""
    if not sigma_max >= 0:
        raise ValueError(f"sigma_max must be >= 0, got {sigma_max!r}")
    if fixed:
        return torch.full((batch,), float(sigma_max), dtype=dtype)
    return torch.rand(batch, generator=generator, dtype=dtype) * sigma_max


def cycle_loss(x: Tensor, xc: Tensor, yt: Tensor, yc: Tensor) -> Tensor:
    """``0.5 mean|xc - x| + 0.5 mean|yc - yt|``."""
    return 0.5 * (xc - x).abs().mean() + 0.5 * (yc - yt).abs().mean()


def constraint_loss(distance: Callable[[Tensor], Tensor], yf: Tensor) -> Tensor:
    """``mean_b l(yf)``; the distance is checked (shape ``[B]``, finite, >= 0) with an error naming it."""
    return check_distance(distance, yf).mean()


def regularization(x: Tensor, xt: Tensor, alpha: float, kind: str = "sparse_icnn") -> Tensor:
    """``mean|(xt - α x)/(1 - α)|`` (``"sparse_icnn"``, i.e. ``mean|∇Ψ(x)|``) or ``mean|xt - x|`` (``"fwdid"``)."""
    if kind == "sparse_icnn":
        return ((xt - alpha * x) / (1.0 - alpha)).abs().mean()
    if kind == "fwdid":
        return (xt - x).abs().mean()
    raise ValueError(f"reg must be one of {REGULARIZERS}, got {kind!r}")


def namm_loss(forward, inverse, distance, x: Tensor, sig: Tensor, z: Tensor, *, lam_cyc: float = 1.0,
              lam_con: float = 1.0, lam_reg: float = 1e-3, reg: str = "sparse_icnn",
              mirror_base: Tensor | None = None) -> dict[str, Tensor]:
    """One evaluation of the NAMM loss (module docstring); returns ``{"loss", "cycle", "constraint", "reg"}``.

    Args:
        forward: ``g`` (an ICNN map with attribute ``alpha``).
        inverse: ``f``.
        distance: ``l``.
        x: data batch.
        sig: perturbation levels ``[B]``.
        z: standard normal, shaped like ``x``.
        mirror_base: finetuning: MDM samples used instead of ``g(x)`` as the centre of the perturbed points.
    """
    xt = forward(x)
    xc = inverse(xt)
    base = xt if mirror_base is None else mirror_base
    yt = base + append_dims(sig.to(x.dtype), x.ndim) * z
    yf = inverse(yt)
    yc = forward(yf)
    parts = {"cycle": cycle_loss(x, xc, yt, yc), "constraint": constraint_loss(distance, yf),
             "reg": regularization(x, xt, forward.alpha, reg)}
    parts["loss"] = lam_cyc * parts["cycle"] + lam_con * parts["constraint"] + lam_reg * parts["reg"]
    return parts
