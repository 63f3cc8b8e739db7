"""The Dynamical Diffusion training objective for the generic loop (Guo et al., ICLR 2025; docs/methods/dydiff.md
"What it does" and the training bullet of "API").

Selected by ``TrainConfig(objective="dydiff")``; the model trained is a :class:`~steerdiff.temporal.DyDiffDenoiser`
(its ``r`` and ``n_context`` are part of the model, so a checkpoint records them and a resume with another ``r`` is
refused as a different model). Per sample: ``sigma ~ logN(p_mean, p_std^2)``, ``theta_bar = theta_bar(sigma, r)``,
``x_sigma = mix(x0 + sigma eps, theta_bar)`` (the noise is mixed too, ``use_x_ema``), target ``mix(x0, theta_bar)``,
the wrapped network ``D~`` sees ``x_sigma`` and the clean context frames ``x0[:, :n_context]``, and the loss is
``lambda(sigma) mean((D~ - target)^2)`` with the EDM weight ``lambda = (sigma^2 + sd^2) / (sigma sd)^2`` (our
choice of weighting; the paper's eps-MSE is the weight ``1 / sigma^2``). ``r = 0`` is the standard conditional EDM
loss on the same code path. Context dropout: each row's context is nulled with probability ``p_uncond``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.denoiser import append_dims
from ..models.frames import FrameContext
from ..train.edm import edm_weight, sample_sigmas
from ..train.objectives import register_objective
from .dydiff import DyDiffDenoiser, mix, theta_bar


def dydiff_loss(model: DyDiffDenoiser, x0: Tensor, generator: torch.Generator | None = None, p_mean: float = -1.2,
                p_std: float = 1.2, p_uncond: float = 0.0) -> Tensor:
    """The DyDiff loss of ``model`` on clean sequences ``x0: [B, S, *frame]`` (context first); a scalar.

    Raises:
        ValueError: ``model`` is not a DyDiffDenoiser, or ``x0`` does not match its shape.
    """
    if not isinstance(model, DyDiffDenoiser):
        raise ValueError(f"model must be a DyDiffDenoiser for the dydiff objective, got {type(model).__name__}")
    if model.sample_shape is not None and tuple(x0.shape[1:]) != model.sample_shape:
        raise ValueError(f"x0 must have shape [B, {', '.join(map(str, model.sample_shape))}], got {tuple(x0.shape)}")
    net = model.denoiser
    sigma_data = getattr(net, "sigma_data", None)
    if sigma_data is None:
        raise ValueError("model: the wrapped network has no sigma_data (wrap the backbone in EDMPrecond)")
    gen_device = generator.device if generator is not None else "cpu"
    sigma = sample_sigmas(x0.shape[0], generator, p_mean, p_std, x0.device, x0.dtype)
    noise = torch.randn(x0.shape, generator=generator, device=gen_device, dtype=x0.dtype).to(x0.device)
    null = torch.zeros(x0.shape[0], dtype=torch.bool)
    if p_uncond > 0:
        null = torch.rand(x0.shape[0], generator=generator, device=gen_device) < p_uncond
    tb = theta_bar(sigma, model.r)
    x_sigma = mix(x0 + append_dims(sigma, x0.ndim) * noise, tb)
    target = mix(x0, tb)
    ctx = FrameContext(x0[:, : model.n_context], null.to(x0.device))
    denoised = net(x_sigma, sigma, ctx)
    per_sample = (denoised - target).pow(2).flatten(1).mean(dim=1)
    return (edm_weight(sigma, sigma_data) * per_sample).mean()


@register_objective("dydiff", applies=lambda cfg: getattr(cfg, "objective", "edm") == "dydiff")
def dydiff_objective(model, x0: Tensor, cond, cond_dropped, generator: torch.Generator | None,
                     cfg) -> tuple[Tensor, None]:
    """The loop's ``objective: "dydiff"``: :func:`dydiff_loss` (the data are whole sequences; no label condition)."""
    if cond is not None:
        raise ValueError("the dydiff objective takes whole sequences x0 only (the context is x0[:, :n_context]); "
                         "data must not carry labels")
    return dydiff_loss(model, x0, generator, cfg.p_mean, cfg.p_std, cfg.p_uncond), None
