"""Reward-gradient ("DPS-style") guidance baseline for reward alignment; das.md section 7.

Each chain follows the ancestral kernel with the gradient of the reward through the denoised estimate added to
the drift, ``x_{i+1} = mu_i(x_i) + scale tau_i^2 grad_x r(D(x_i, sigma_i)) / alpha + tau_i z``: with ``scale = 1`` the
naive Tweedie approximation of the tilted score. No weights, no resampling, so it is biased. ``scale_mode="const"``
adds ``scale grad_x r(D)`` without ``tau^2`` (the DAS notebooks' "approximate guidance", which diverges; kept for
reproduction only). The last step to ``sigma = 0``, if any, is ``x = D`` without guidance.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..core.noise import GeneratorLike, SampleNoise, make_generators
from ..core.sigmas import check_sigmas
from .result import AlignResult
from .rewards import as_reward
from .smc import NOISE_BLOCK, ModelCalls, ancestral_coeffs, check_common, expand_cond, row_finite


def reward_guidance(
    denoiser: Callable,
    reward: Callable | Sequence,
    noise: Tensor,
    sigmas: Tensor,
    *,
    alpha: float,
    scale: float = 1.0,
    scale_mode: str = "tau2",
    particles: int = 1,
    cond: Tensor | None = None,
    eta: float = 1.0,
    batch_size: int | None = 512,
    generator: GeneratorLike = None,
    progress: bool = False,
    callback: Callable[[dict], None] | None = None,
) -> AlignResult:
    """Guided ancestral chains, one output per row of ``noise`` (``samples [B, *shape]``).

    Args:
        denoiser, reward, noise, sigmas, alpha, cond, eta, batch_size, generator, progress, callback: as in
            :func:`steerdiff.align.das`.
        scale: multiplier rho of the guidance term (das.md sweeps 0.5, 1, 2).
        scale_mode: ``"tau2"`` (``rho tau^2 grad / alpha``) or ``"const"`` (``rho grad``, notebook baseline).
        particles: only groups the cost accounting (``nfe`` per group of this many chains); 1 = per chain.

    A chain whose reward or gradient is not finite gets no guidance at that step (counted in ``nonfinite``).
    """
    t0 = time.perf_counter()
    reward = as_reward(reward)
    groups, P = check_common(noise, particles, alpha, eta, batch_size)
    if scale_mode not in ("tau2", "const"):
        raise ValueError(f"scale_mode must be 'tau2' or 'const', got {scale_mode!r}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    sig = check_sigmas(sigmas, final="any").tolist()
    N = len(sig) - 1
    cond = expand_cond(cond, groups, P)
    gens = make_generators(generator, noise.shape[0], noise.device)
    sample_noise = SampleNoise(gens, block=NOISE_BLOCK)
    calls = ModelCalls(denoiser, reward, batch_size)
    bad_tr = torch.zeros(N + 1, noise.shape[0], dtype=torch.bool)
    x = noise * sig[0]
    for i in tqdm(range(N), disable=not progress, desc="reward_guidance", leave=False):
        s, s1 = sig[i], sig[i + 1]
        if s1 == 0:
            d = calls.denoise(x, s, cond)
            x = d
            continue
        d, rho, g = calls.twist(x, s, cond, True, i)
        bad = ~torch.isfinite(rho) | ~row_finite(g)
        bad_tr[i] = bad
        if bad.any():
            g[bad] = 0
        keep, s_up = ancestral_coeffs(s, s1, eta)
        step = scale * s_up**2 / alpha if scale_mode == "tau2" else scale
        if callback is not None:
            callback({"i": i, "sigma": s, "sigma_next": s1, "x": x, "denoised": d, "grad": g / alpha, "reward": rho})
        x = torch.lerp(d, x, keep) + step * g + s_up * sample_noise.randn_like(x)
    r = calls.rewards(x)
    bad_tr[N] = ~torch.isfinite(r)
    return AlignResult(
        samples=x, rewards=r, method="reward_guidance", groups=groups, particles=P,
        nfe=calls.denoiser.rows / groups, nfe_grad=calls.grad_rows / groups, reward_evals=calls.reward_rows / groups,
        nonfinite=bad_tr.view(N + 1, groups, P).sum(2), wall_time=time.perf_counter() - t0, model_time=calls.time,
        extras={"scale": scale, "scale_mode": scale_mode},
    )
