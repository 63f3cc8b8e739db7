"""Rectified-flow training objective (Liu et al. 2023, "Flow Straight and Fast", Sec. 2; Esser et al. 2024,
"Scaling Rectified Flow Transformers" (SD3), Sec. 3 and 3.1 "Tailored SNR Samplers for RF models").

``x_t = (1 - t) x0 + t eps`` with ``eps ~ N(0, I)``, the network predicts the velocity ``v = eps - x0`` and the loss
is ``||v_hat(x_t, t, cond) - (eps - x0)||^2`` (mean over elements, then over the batch). The time ``t`` is drawn
logit-normal, ``t = sigmoid(m + s z)`` with ``z ~ N(0, 1)`` (SD3's default ``m = 0, s = 1``, its best rectified-flow
variant, "rf/lognorm(0.00, 1.00)"), or uniform on ``[0, 1)`` (Liu et al.).

Which loss the issue asked for ("loss on the velocity, or on D with the flow weighting"): it is the same loss. In
the one convention (``sigma = t / (1 - t)``, ``x = x_t / (1 - t)``, ``D = x_t - t v``),
``v_hat - v = ((x_t - D_hat) - (x_t - x0)) / t = (x0 - D_hat) / t``, so
``||v_hat - v||^2 = ||D_hat - x0||^2 / t^2``: the EDM denoising loss with the weight ``1 / t^2 = ((1 + sigma) /
sigma)^2`` and noise levels drawn as ``t``. steerdiff computes it on the velocity (the network's own output: no
division by ``t`` or ``1 - t``), and checks the equality in ``tests/train/test_flow_objective.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.denoiser import append_dims
from .objectives import register_objective

T_SAMPLINGS = ("logit_normal", "uniform")


def sample_flow_times(
    n: int,
    generator: torch.Generator | None = None,
    sampling: str = "logit_normal",
    mean: float = 0.0,
    std: float = 1.0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Training times ``t`` in ``[0, 1)``, shape ``[n]``: ``sigmoid(mean + std z)`` (logit-normal) or uniform.

    Drawn on the generator's device (CPU by default) and moved to ``device``, so the draw is the same wherever the
    model runs.

    Raises:
        ValueError: unknown ``sampling``, or a non-positive ``std``.
    """
    if sampling not in T_SAMPLINGS:
        raise ValueError(f"sampling must be one of {list(T_SAMPLINGS)}, got {sampling!r}")
    if not std > 0:
        raise ValueError(f"std must be positive (logit t ~ N(mean, std^2)), got {std}")
    gen_device = generator.device if generator is not None else "cpu"
    if sampling == "uniform":
        return torch.rand(n, generator=generator, device=gen_device, dtype=dtype).to(device)
    z = torch.randn(n, generator=generator, device=gen_device, dtype=dtype)
    return torch.sigmoid(mean + std * z).to(device)


def predict_velocity(model, x_t: Tensor, t: Tensor, cond: Tensor | None = None) -> Tensor:
    """The model's velocity ``v_hat(x_t, t)`` at flow times ``t: [B]``.

    A velocity-predicting flow denoiser (``sd.core.FlowDenoiser`` with ``prediction="velocity"``) is asked directly:
    ``net(x_t, t * t_scale, cond)``, the quantity it was built to predict. Any other denoiser goes through the one
    convention, ``v_hat = (x_t - D(x_t / (1 - t), t / (1 - t))) / t`` (``t`` must then lie in ``(0, 1)``).
    """
    net = getattr(model, "net", None)
    if getattr(model, "prediction", None) == "velocity" and net is not None and hasattr(model, "t_scale"):
        return net(x_t, t * model.t_scale, cond)
    one_minus = append_dims(1.0 - t, x_t.ndim)
    denoised = model(x_t / one_minus, t / (1.0 - t), cond)
    return (x_t - denoised) / append_dims(t, x_t.ndim)


def flow_loss(
    model,
    x0: Tensor,
    cond: Tensor | None = None,
    generator: torch.Generator | None = None,
    sampling: str = "logit_normal",
    mean: float = 0.0,
    std: float = 1.0,
) -> Tensor:
    """Rectified-flow velocity loss ``mean_b mean_i (v_hat(x_t, t) - (eps - x0))^2`` of a model on ``x0: [B, *shape]``.

    Args:
        model: a velocity-predicting ``FlowDenoiser`` (or any denoiser, see :func:`predict_velocity`).
        x0: clean data.
        cond: ``[B]`` / ``[B, m]`` (``-1`` = null) or ``None``; condition dropout is the caller's job.
        generator: source of the time and noise draws (CPU generator; draws are moved to ``x0``'s device).
        sampling, mean, std: the law of ``t`` (:func:`sample_flow_times`; SD3: logit-normal, 0, 1).

    Returns:
        A scalar loss tensor; equal to ``mean_b ||D_hat - x0||^2 / t^2`` (module docstring).
    """
    t = sample_flow_times(x0.shape[0], generator, sampling, mean, std, x0.device, x0.dtype)
    gen_device = generator.device if generator is not None else "cpu"
    noise = torch.randn(x0.shape, generator=generator, device=gen_device, dtype=x0.dtype).to(x0.device)
    tb = append_dims(t, x0.ndim)
    x_t = (1.0 - tb) * x0 + tb * noise
    v_hat = predict_velocity(model, x_t, t, cond)
    return (v_hat.to(x0.dtype) - (noise - x0)).pow(2).flatten(1).mean(dim=1).mean()


@register_objective("flow", applies=lambda cfg: getattr(cfg, "objective", "edm") == "flow")
def flow_objective(model, x0: Tensor, cond: Tensor | None, cond_dropped: Tensor | None,
                   generator: torch.Generator | None, cfg) -> tuple[Tensor, None]:
    """The loop's ``objective: "flow"``: :func:`flow_loss` on the dropped-out condition, ``t`` from the config."""
    return flow_loss(model, x0, cond_dropped, generator, cfg.flow_t_sampling, cfg.flow_t_mean, cfg.flow_t_std), None
