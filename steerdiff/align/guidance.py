"""Reward-gradient ("DPS-style") guidance baseline for reward alignment (``docs/methods/das.md``, "Baselines").

Each chain follows the ancestral kernel with the gradient of the reward through the denoised estimate added to
the drift, ``x_{i+1} = mu_i(x_i) + scale tau_i^2 grad_x r(D(x_i, sigma_i)) / alpha + tau_i z``: with ``scale = 1`` the
naive Tweedie approximation of the tilted score. No weights, no resampling, so it is biased. ``scale_mode="const"``
adds ``scale grad_x r(D)`` without ``tau^2`` (the DAS notebooks' "approximate guidance", which diverges; kept for
reproduction only). The last step to ``sigma = 0``, if any, is ``x = D`` without guidance. The move is
:func:`.smc.propose` with a shift and no weight.

The gradient ``grad_x r(D(x_i, sigma_i))`` comes from :func:`steerdiff.guidance.reward.reward_gradient` (through
``RewardCalls.twist``), the one reward-gradient routine steerdiff has; the sampling-time guider
:class:`steerdiff.guidance.RewardGuidance` (``kind="clean"``) uses the same routine inside :func:`steerdiff.sample`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..core.flow_sde import FlowSDE
from ..core.noise import GeneratorLike
from .registry import register_aligner
from .result import AlignResult
from .run_setup import Callback, Reward, prepare
from .smc import propose, row_finite, start_state, use_sde


def _check(scale, scale_mode):
    def check(_particles: int) -> None:
        if scale_mode not in ("tau2", "const"):
            raise ValueError(f"scale_mode must be 'tau2' or 'const', got {scale_mode!r}")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
            raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")

    return check


def _guidance_cost(steps: int, particles: int = 1, **_) -> dict:
    """One denoiser call and one VJP per chain and step (none into ``sigma = 0``), per group of ``particles`` chains
    (``docs/methods/das.md``, "Cost in NFE")."""
    return {"nfe": particles * steps, "nfe_grad": particles * steps}


@register_aligner("reward_guidance", aliases=("guidance",), cost=_guidance_cost, particles=False,
                  note="reward-gradient (DPS-style) guidance of one chain per output; biased, no weights")
def reward_guidance(
    denoiser: Callable, reward: Reward, noise: Tensor, sigmas: Tensor, *, alpha: float, scale: float = 1.0,
    scale_mode: str = "tau2", particles: int = 1, cond: Tensor | None = None, eta: float = 1.0,
    batch_size: int | None = 512, generator: GeneratorLike = None, progress: bool = False,
    callback: Callback | None = None, sde: str | FlowSDE | None = None,
) -> AlignResult:
    """Guided ancestral chains, one output per row of ``noise`` (``samples [B, *shape]``).

    Args:
        denoiser, reward, noise, sigmas, alpha, cond, eta, batch_size, generator, progress, callback: as in
            :func:`steerdiff.align.das` (the callback's ``reward`` is ``[G, P]``, ``grad`` is ``grad / alpha``).
        scale: multiplier rho of the guidance term (the validation sweeps 0.5, 1, 2).
        scale_mode: ``"tau2"`` (``rho tau^2 grad / alpha``) or ``"const"`` (``rho grad``, notebook baseline).
        sde: instead of ``eta``, a flow SDE's moves (``docs/methods/flow_sde.md``).
        particles: only groups the cost accounting (``nfe`` per group of this many chains); 1 = per chain.

    A chain whose reward or gradient is not finite gets no guidance at that step (counted in ``nonfinite``).
    """
    run = prepare("reward_guidance", denoiser, reward, noise, sigmas, particles=particles, alpha=alpha, cond=cond,
                  eta=eta, batch_size=batch_size, generator=generator, progress=progress, callback=callback,
                  check=_check(scale, scale_mode))
    run = use_sde(run, sde)
    eta = run.eta
    groups, P, N, sig, calls = run.groups, run.particles, run.steps, run.sigmas, run.calls
    sample_noise = run.sample_noise()
    bad_tr = torch.zeros(N + 1, noise.shape[0], dtype=torch.bool, device=noise.device)  # no host read per step
    x = start_state(noise, sig[0])
    for i in run.bar():
        s, s1 = sig[i], sig[i + 1]
        if s1 == 0 or math.isinf(s):  # no guidance into sigma = 0, nor at sigma = inf (d/dx of D is 0 there)
            d = calls.denoise(x, s, run.cond, i)
            run.emit(i, x, d)
            x, _ = propose(x, d, s, s1, eta, sample_noise)
            continue
        d, rho, g = calls.twist(x, s, run.cond, True, i)
        bad = ~torch.isfinite(rho) | ~row_finite(g)
        bad_tr[i] = bad
        g = torch.where(bad.view(-1, *([1] * (g.ndim - 1))), torch.zeros_like(g), g)
        run.emit(i, x, d, grad=g / alpha, reward=rho.view(groups, P))
        x, _ = propose(x, d, s, s1, eta, sample_noise, shift=lambda tau, g=g: (
            scale * tau**2 / alpha if scale_mode == "tau2" else scale) * g, log_ratio=False)
    r = calls.rewards(x)
    bad_tr[N] = ~torch.isfinite(r)
    return AlignResult(samples=x, rewards=r, method="reward_guidance", groups=groups, particles=P,
                       nonfinite=bad_tr.view(N + 1, groups, P).sum(2),
                       extras={"scale": scale, "scale_mode": scale_mode}, **run.costs())
