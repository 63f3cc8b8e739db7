"""EDM training objective (Karras et al. 2022, Table 1 / Sec. 5; docs/methods/conventions.md, "Training recipes").

``ln sigma ~ N(p_mean, p_std^2)``, ``x = x0 + sigma eps``, loss ``lambda(sigma) ||D(x, sigma, cond) - x0||^2``
with ``lambda(sigma) = (sigma^2 + sd^2) / (sigma sd)^2``, which makes the effective target of the raw network
unit variance at every noise level.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.denoiser import Denoiser, append_dims
from .objectives import register_objective


def sample_sigmas(
    n: int,
    generator: torch.Generator | None = None,
    p_mean: float = -1.2,
    p_std: float = 1.2,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Log-normal training noise levels ``exp(p_mean + p_std * N(0, 1))``, shape ``[n]``.

    Drawn on the generator's device (CPU by default) and moved to ``device``, so the draw is the same
    wherever the model runs.
    """
    gen_device = generator.device if generator is not None else "cpu"
    z = torch.randn(n, generator=generator, device=gen_device, dtype=dtype)
    return (p_mean + p_std * z).exp().to(device)


def edm_weight(sigma: Tensor, sigma_data: float) -> Tensor:
    """EDM loss weight ``(sigma^2 + sd^2) / (sigma sd)^2``."""
    return (sigma**2 + sigma_data**2) / (sigma * sigma_data) ** 2


def edm_loss(
    model: Denoiser,
    x0: Tensor,
    cond: Tensor | None = None,
    generator: torch.Generator | None = None,
    p_mean: float = -1.2,
    p_std: float = 1.2,
    sigma_data: float | None = None,
) -> Tensor:
    """Weighted denoising loss of a denoiser on clean data ``x0: [B, *shape]`` (mean over batch and elements).

    Args:
        model: a denoiser ``D(x, sigma, cond)``, typically an ``EDMPrecond``.
        x0: clean data.
        cond: ``[B]`` / ``[B, m]`` (``-1`` = null) or ``None``; condition dropout is the caller's job.
        generator: source of the sigma and noise draws (CPU generator; draws are moved to ``x0``'s device).
        p_mean, p_std: parameters of ``ln sigma`` (EDM: -1.2, 1.2).
        sigma_data: data standard deviation for the weight; defaults to ``model.sigma_data``.

    Returns:
        A scalar loss tensor.
    """
    if sigma_data is None:
        sigma_data = getattr(model, "sigma_data", None)
        if sigma_data is None:
            raise ValueError("sigma_data: pass it explicitly, the model has no sigma_data attribute")
    sigma = sample_sigmas(x0.shape[0], generator, p_mean, p_std, x0.device, x0.dtype)
    gen_device = generator.device if generator is not None else "cpu"
    noise = torch.randn(x0.shape, generator=generator, device=gen_device, dtype=x0.dtype).to(x0.device)
    denoised = model(x0 + append_dims(sigma, x0.ndim) * noise, sigma, cond)
    per_sample = (denoised - x0).pow(2).flatten(1).mean(dim=1)
    return (edm_weight(sigma, sigma_data) * per_sample).mean()


@register_objective("edm")
def edm_objective(model: Denoiser, x0: Tensor, cond: Tensor | None, cond_dropped: Tensor | None,
                  generator: torch.Generator | None, cfg) -> tuple[Tensor, None]:
    """The default objective of the training loop: :func:`edm_loss` on the dropped-out condition."""
    return edm_loss(model, x0, cond_dropped, generator, cfg.p_mean, cfg.p_std), None
