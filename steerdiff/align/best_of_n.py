"""Best-of-N and importance resampling (SIR) baselines for reward alignment; das.md section 7.

Both run K plain ancestral chains per group (the same grid and kernel as DAS, no reward gradient) and score the
final samples once. Best-of-N returns ``argmax_k r(x^k)`` (it targets max r, not the tilted law); SIR returns
``x^k`` with probability ``∝ exp(r(x^k) / alpha)``, consistent for ``p exp(r / alpha)`` as K grows (DAS with
``lambda = 0`` and no gradient). At equal cost with DAS, ``K = P (1 + c_b)``.
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
from .smc import (
    NOISE_BLOCK,
    ModelCalls,
    ancestral_coeffs,
    check_common,
    expand_cond,
    group_uniforms,
    resample,
)


def plain_chains(calls: ModelCalls, noise: Tensor, sig: list[float], cond, eta: float, gens, progress: bool,
                 callback, desc: str) -> Tensor:
    """The ancestral chain from ``noise * sigma_0`` over ``sig`` (last step ``x = D`` when the grid ends in 0)."""
    sample_noise = SampleNoise(gens, block=NOISE_BLOCK)
    x = noise * sig[0]
    for i in tqdm(range(len(sig) - 1), disable=not progress, desc=desc, leave=False):
        s, s1 = sig[i], sig[i + 1]
        d = calls.denoise(x, s, cond)
        if callback is not None:
            callback({"i": i, "sigma": s, "sigma_next": s1, "x": x, "denoised": d})
        if s1 == 0:
            x = d
            continue
        keep, s_up = ancestral_coeffs(s, s1, eta)
        x = torch.lerp(d, x, keep) + s_up * sample_noise.randn_like(x)
    return x


def _select(denoiser, reward, noise, sigmas, particles, alpha, cond, eta, batch_size, generator, progress,
            callback, method):
    t0 = time.perf_counter()
    reward = as_reward(reward)
    groups, K = check_common(noise, particles, alpha, eta, batch_size)
    sig = check_sigmas(sigmas, final="any").tolist()
    cond = expand_cond(cond, groups, K)
    gens = make_generators(generator, noise.shape[0], noise.device)
    calls = ModelCalls(denoiser, reward, batch_size)
    x = plain_chains(calls, noise, sig, cond, eta, gens, progress, callback, method)
    r = calls.rewards(x).view(groups, K)
    finite = torch.isfinite(r)
    if not finite.any(1).all():
        g = int((~finite.any(1)).nonzero()[0])
        raise FloatingPointError(f"{method}: the reward is non-finite for every sample of group {g}")
    if method == "best_of_n":
        pick = torch.where(finite, r, torch.full_like(r, -math.inf)).argmax(1, keepdim=True)
        logw = None
    else:
        logw = torch.where(finite, r / alpha, torch.full_like(r, -math.inf))
        logw = logw - torch.logsumexp(logw, 1, keepdim=True)
        u = group_uniforms(None if gens is None else gens[::K], torch.arange(groups), 1)
        pick = resample(logw.exp(), u, "multinomial")[:, :1]
    rows = (pick + K * torch.arange(groups, device=x.device)[:, None]).flatten()
    return AlignResult(
        samples=x[rows], rewards=r.flatten()[rows], method=method, groups=groups, particles=K,
        nfe=calls.denoiser.rows / groups, nfe_grad=0.0, reward_evals=calls.reward_rows / groups,
        log_weights=logw, particles_final=x, nonfinite=(~finite).sum(1)[None],
        wall_time=time.perf_counter() - t0, model_time=calls.time,
        extras={"all_rewards": r},
    )


def best_of_n(
    denoiser: Callable,
    reward: Callable | Sequence,
    noise: Tensor,
    sigmas: Tensor,
    *,
    particles: int = 32,
    cond: Tensor | None = None,
    eta: float = 1.0,
    batch_size: int | None = 512,
    generator: GeneratorLike = None,
    progress: bool = False,
    callback: Callable[[dict], None] | None = None,
) -> AlignResult:
    """Best-of-N: per group of ``particles`` plain chains, the sample of highest reward (``samples [G, *shape]``).

    A non-finite reward never wins; a group whose rewards are all non-finite raises ``FloatingPointError``.
    """
    return _select(denoiser, reward, noise, sigmas, particles, None, cond, eta, batch_size, generator, progress,
                   callback, "best_of_n")


def sir(
    denoiser: Callable,
    reward: Callable | Sequence,
    noise: Tensor,
    sigmas: Tensor,
    *,
    alpha: float,
    particles: int = 32,
    cond: Tensor | None = None,
    eta: float = 1.0,
    batch_size: int | None = 512,
    generator: GeneratorLike = None,
    progress: bool = False,
    callback: Callable[[dict], None] | None = None,
) -> AlignResult:
    """Importance resampling ("soft best-of-N"): one draw per group ``∝ exp(r / alpha)`` (``samples [G, *shape]``).

    ``log_weights [G, K]`` holds the normalised weights of all chains (``particles_final``).
    """
    return _select(denoiser, reward, noise, sigmas, particles, alpha, cond, eta, batch_size, generator, progress,
                   callback, "sir")
