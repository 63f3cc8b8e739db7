"""DAS: test-time reward alignment by tempered SMC (Kim, Kim, Park, ICLR 2025, arXiv 2501.05803); das.md sections 3-4.

Target ``p_tar(x0) ∝ p(x0) exp(r(x0) / alpha)`` (in practice the path measure of the discretised model chain tilted
by ``exp(r(x_N) / alpha)``). Each group of P particles is one SMC population:

* twist ``psi_i(x) = exp(lambda_i r(D(x, sigma_i)) / alpha)``, ``psi_N(x) = exp(r(x) / alpha)``, with a tempering
  schedule ``lambda_i`` growing from 0 to 1;
* proposal ``N(mu_i(x) + delta_i, tau_i^2 I)``, ``delta_i = kappa tau_i^2 lambda_{i+1} grad_x r(D(x, sigma_i)) /
  alpha`` (the gradient goes through the denoiser), ``mu_i``, ``tau_i`` the ancestral (DDPM, eta = 1) step;
* incremental weight ``log p - log q + log psi_{i+1}(x_{i+1}) - log psi_i(x_i)`` with the closed form
  ``log p - log q = -(delta . z) / tau - |delta|^2 / (2 tau^2)``;
* resampling of a group when its ESS drops below ``ess_threshold * P``; *every* per-particle quantity (state,
  denoised value, gradient, reward, log-twist, condition) is reindexed (das.md section 10.1, fixed here);
* a valid evidence estimate ``log Z += logsumexp(l + log w)`` with normalised ``l`` (section 10, fixed here).

Where the grid ends in 0 the last move is deterministic, ``x_N = D(x_{N-1})``, and the final increment is
``r(x_N) / alpha - log psi_{N-1}`` with no proposal term (TDS's rule; section 10.6's re-added increment is not
copied). Non-finite particles (state, denoised value, reward or weight) get log-weight ``-inf``, are counted in
``result.nonfinite`` and force their group to resample, so they never spread to the others.
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
    RESAMPLERS,
    ModelCalls,
    ancestral_coeffs,
    check_common,
    ess,
    expand_cond,
    flat_dot,
    group_uniforms,
    normalize,
    resample,
    row_finite,
)

OUTPUTS = ("sample_one", "weighted", "resample", "argmax")
SCHEDULES = ("exp", "adaptive", "constant", "zero")


def default_gamma(steps: int, tempering: str | float = "exp") -> float:
    """The tempering rate reaching ``lambda = 1`` at 87% of ``steps`` (das.md section 10.3).

    ``exp``: ``2^(1 / (0.87 steps)) - 1`` (0.00800 for 100 steps, the official 0.008); polynomial:
    ``1 / (0.87 steps)``.
    """
    k = max(1.0, 0.87 * steps)
    return 2.0 ** (1.0 / k) - 1.0 if tempering == "exp" else 1.0 / k


def tempering_schedule(tempering, steps: int, gamma: float | None = None, start: float = 0.0) -> Tensor | None:
    """Fixed tempering levels ``[steps + 1]`` (``lambda_N = 1``), or None for ``"adaptive"``.

    ``tempering``: ``"exp"`` ``min((1 + gamma)^(i - i_s) - 1, 1)``; a number e: ``min((gamma (i - i_s))^e, 1)``
    (the exponent is applied to the next level too, unlike the official code, das.md 10.8); ``"constant"``
    ``lambda = 1`` (TDS); ``"zero"`` ``lambda = 0`` (importance resampling at the end only); a sequence of
    ``steps`` levels in [0, 1]. Levels before ``i_s = int(steps * start)`` are 0.
    """
    i_s = int(steps * start)
    k = torch.arange(steps, dtype=torch.float64) - i_s
    if isinstance(tempering, str):
        if tempering not in SCHEDULES:
            raise ValueError(f"tempering must be one of {SCHEDULES}, a positive exponent or {steps} levels, "
                             f"got {tempering!r}")
        if tempering == "adaptive":
            return None
        if tempering == "exp":
            g = default_gamma(steps - i_s) if gamma is None else gamma
            lam = ((1 + g) ** k - 1).clamp(max=1.0)
        else:
            lam = torch.full((steps,), 1.0 if tempering == "constant" else 0.0, dtype=torch.float64)
    elif isinstance(tempering, (int, float)) and not isinstance(tempering, bool):
        if not tempering > 0:
            raise ValueError(f"a polynomial tempering exponent must be positive, got {tempering}")
        g = default_gamma(steps - i_s, "poly") if gamma is None else gamma
        lam = (g * k).clamp(min=0.0).pow(float(tempering)).clamp(max=1.0)
    else:
        lam = torch.as_tensor(tempering, dtype=torch.float64).flatten()
        if lam.numel() != steps or not torch.all((lam >= 0) & (lam <= 1)):
            raise ValueError(f"tempering levels must be {steps} values in [0, 1], got {lam.numel()} values")
    if gamma is not None and not gamma > 0:
        raise ValueError(f"gamma must be positive, got {gamma}")
    lam = torch.where(k < 0, torch.zeros_like(lam), lam)
    return torch.cat([lam, lam.new_ones(1)])


def _adaptive_lambda(logw: Tensor, base: Tensor, rho: Tensor, lo: Tensor, target: float, iters: int = 40) -> Tensor:
    """Largest ``lambda`` in ``[lo, 1]`` (per group) whose would-be ESS stays >= ``target``, by bisection.

    Would-be weights: ``normalise(logw + base + lambda * rho)`` (das.md 3, "adaptive"; bisection instead of Adam).
    """

    def ess_at(lam):
        return ess(normalize(logw + base + lam[:, None] * rho))

    hi = torch.ones_like(lo)
    ok_hi = ess_at(hi) >= target
    ok_lo = ess_at(lo) >= target
    a, b = lo.clone(), hi.clone()
    for _ in range(iters):
        mid = 0.5 * (a + b)
        good = ess_at(mid) >= target
        a, b = torch.where(good, mid, a), torch.where(good, b, mid)
    return torch.where(ok_hi, hi, torch.where(ok_lo, a, lo))


def _take(t: Tensor | None, rows: Tensor) -> Tensor | None:
    return None if t is None else t[rows]


def run_smc(
    denoiser: Callable, reward, noise: Tensor, sigmas, *, alpha: float, particles: int, cond: Tensor | None,
    tempering, gamma: float | None, tempering_start: float, ess_threshold: float, resampler: str, output: str,
    gradient: bool, eta: float, vp_compat: bool, batch_size: int | None, generator: GeneratorLike,
    progress: bool, callback: Callable[[dict], None] | None, method: str,
) -> AlignResult:
    """The SMC engine behind :func:`das` and :func:`steerdiff.align.tds` (das.md section 4)."""
    t_start = time.perf_counter()
    reward = as_reward(reward)
    groups, P = check_common(noise, particles, alpha, eta, batch_size)
    if P < 2:
        raise ValueError(f"particles must be >= 2 for SMC (got {P}); use reward_guidance for single chains")
    if not (isinstance(ess_threshold, (int, float)) and 0 < ess_threshold <= 1):
        raise ValueError(f"ess_threshold must lie in (0, 1] (a fraction of the particles), got {ess_threshold!r}")
    if resampler not in RESAMPLERS:
        raise ValueError(f"resampler must be one of {RESAMPLERS}, got {resampler!r}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if not 0 <= tempering_start < 1:
        raise ValueError(f"tempering_start must lie in [0, 1), got {tempering_start}")
    sig = check_sigmas(sigmas, final="any").tolist()
    N = len(sig) - 1
    i_s = int(N * tempering_start)
    fixed = tempering_schedule(tempering, N, gamma, tempering_start)
    adaptive = fixed is None
    B, shape, dev = noise.shape[0], noise.shape[1:], noise.device
    cond = expand_cond(cond, groups, P)
    gens = make_generators(generator, B, dev)
    group_gens = None if gens is None else gens[::P]  # a group's resampling draws: its first row's generator
    sample_noise = SampleNoise(gens, block=NOISE_BLOCK)
    calls = ModelCalls(denoiser, reward, batch_size)
    f64 = dict(dtype=torch.float64, device=dev)

    x = noise * (math.sqrt(1 + sig[0] ** 2) if vp_compat else sig[0])
    logw = torch.full((groups, P), -math.log(P), **f64)
    logpsi_prev = torch.zeros(groups, P, **f64)
    dlog = torch.zeros(groups, P, **f64)
    log_z = torch.zeros(groups, **f64)
    lam_cur = torch.zeros(groups, **f64)
    ess_tr = torch.full((N + 1, groups), math.nan, **f64)
    lam_tr = torch.zeros(N + 1, groups, **f64)
    res_tr = torch.zeros(N, groups, dtype=torch.bool, device=dev)
    bad_tr = torch.zeros(N + 1, groups, dtype=torch.int64, device=dev)
    reward_tr = torch.full((N + 1, groups), math.nan, **f64)
    rho = None
    smc_time = 0.0

    def weigh(inc: Tensor, bad: Tensor, i: int) -> Tensor:
        nonlocal logw, log_z
        killed = bad | ~torch.isfinite(inc)
        inc = torch.where(killed, torch.full_like(inc, -math.inf), inc)
        bad_tr[i] = killed.sum(1)
        dead = torch.isneginf(logw + inc).all(1)
        if dead.any():
            g = int(dead.nonzero()[0])
            raise FloatingPointError(
                f"{method}: every particle of group {g} has a non-finite state, denoised value, reward or weight "
                f"at step {i} (sigma={sig[min(i, N)]:.6g}); check the reward and the denoiser (or lower alpha's "
                f"inverse, 1/alpha={1 / alpha:.3g})")
        log_z = log_z + torch.logsumexp(logw + inc, 1)
        logw = normalize(logw + inc)
        return ess(logw)

    bar = tqdm(range(N), disable=not progress, desc=method, leave=False)
    for i in bar:
        s, s1 = sig[i], sig[i + 1]
        last_det = s1 == 0
        if i >= i_s:
            need_grad = gradient and not last_det and (adaptive or float(fixed[i + 1]) > 0)
            d, rho_flat, g = calls.twist(x, s, cond, need_grad, i)
            rho = rho_flat.view(groups, P)
            bad = ~torch.isfinite(rho) | ~(row_finite(d) & row_finite(x)).view(groups, P)
            if g is not None:  # a non-finite gradient is zeroed (the weights stay exact for the actual move)
                zero = bad.flatten() | ~row_finite(g)
                if zero.any():
                    g[zero] = 0
            rho_safe = torch.where(bad, torch.zeros_like(rho), rho)
            t_smc = time.perf_counter()
            if adaptive:
                base = torch.where(bad, torch.full_like(rho, -math.inf), dlog - logpsi_prev)
                lam_cur = _adaptive_lambda(logw, base, rho_safe / alpha, lam_cur, ess_threshold * P)
            else:
                lam_cur = fixed[i].expand(groups).to(dev)
            lam_tr[i] = lam_cur
            logpsi = lam_cur[:, None] * rho_safe / alpha
            ess_i = weigh(dlog + logpsi - logpsi_prev, bad, i)
            ess_tr[i] = ess_i
            reward_tr[i] = torch.where(bad, torch.nan, rho).nanmean(1)
            do = (ess_i < ess_threshold * P) | (bad_tr[i] > 0) | (ess_threshold >= 1)
            res_tr[i] = do
            anc = None
            if do.any():
                gi = do.nonzero().flatten()
                anc = torch.arange(P, device=dev).repeat(groups, 1)
                anc[gi] = resample(logw[gi].exp(), group_uniforms(group_gens, gi, P), resampler)
                rows = (anc + P * torch.arange(groups, device=dev)[:, None]).flatten()
                x, d, g, cond = x[rows], d[rows], _take(g, rows), _take(cond, rows)
                rho = rho.flatten()[rows].view(groups, P)
                logpsi = logpsi.flatten()[rows].view(groups, P)
                logw[gi] = -math.log(P)
            smc_time += time.perf_counter() - t_smc
            if callback is not None:
                callback({"i": i, "sigma": s, "sigma_next": s1, "x": x, "denoised": d,
                          "grad": None if g is None else g / alpha, "reward": rho, "log_twist": logpsi,
                          "log_weights": logw, "ess": ess_i, "lambda": lam_cur, "resampled": do, "ancestors": anc})
        else:
            d, g = calls.denoise(x, s, cond), None
            logpsi = torch.zeros(groups, P, **f64)
            if callback is not None:
                callback({"i": i, "sigma": s, "sigma_next": s1, "x": x, "denoised": d, "grad": None,
                          "reward": None, "log_twist": logpsi, "log_weights": logw, "ess": None,
                          "lambda": lam_cur, "resampled": None, "ancestors": None})
        # --- propose x_{i+1}
        if last_det:
            x, dlog = d, torch.zeros_like(dlog)
        else:
            keep, s_up = ancestral_coeffs(s, s1, eta)
            mean = torch.lerp(d, x, keep)
            z = sample_noise.randn_like(x)
            lam_next = lam_cur if adaptive else fixed[i + 1].expand(groups).to(dev)
            if g is not None and i + 1 >= i_s:
                kappa = math.sqrt((1 + s * s) / (1 + s1 * s1)) if vp_compat else 1.0
                scale = (kappa * s_up**2 / alpha) * lam_next.repeat_interleave(P)
                delta = g * scale.to(g.dtype).view(-1, *([1] * len(shape)))
                x = mean + delta + s_up * z
                dlog = (-flat_dot(delta, z) / s_up - flat_dot(delta, delta) / (2 * s_up**2)).view(groups, P)
            else:
                x = mean + s_up * z
                dlog = torch.zeros_like(dlog)
        logpsi_prev = logpsi
        if progress:
            if not torch.isnan(ess_tr[i]).all():
                bar.set_postfix(ess=f"{float(ess_tr[i].mean()) / P:.2f}", lam=f"{float(lam_cur.mean()):.3f}")
    bar.close()

    # --- final weight: psi_N = exp(r(x_N) / alpha), lambda_N = 1
    if sig[-1] == 0 and rho is not None and N - 1 >= i_s:
        r_final = rho  # x_N = D(x_{N-1}) and rho = r(D(x_{N-1})), reindexed with it: no new reward call
    else:
        r_final = calls.rewards(x).view(groups, P)
    bad = ~torch.isfinite(r_final) | ~row_finite(x).view(groups, P)
    r_safe = torch.where(bad, torch.zeros_like(r_final), r_final)
    lam_tr[N] = 1.0
    t_smc = time.perf_counter()
    ess_tr[N] = weigh(dlog + r_safe / alpha - logpsi_prev, bad, N)
    reward_tr[N] = torch.where(bad, torch.nan, r_final).nanmean(1)
    samples, out_rewards = _output(x, r_final, logw, output, resampler, group_gens, groups, P)
    smc_time += time.perf_counter() - t_smc
    n = lambda rows: rows / groups  # noqa: E731 - per-group counts
    return AlignResult(
        samples=samples, rewards=out_rewards, method=method, groups=groups, particles=P,
        nfe=n(calls.denoiser.rows), nfe_grad=n(calls.grad_rows), reward_evals=n(calls.reward_rows),
        log_weights=logw, particles_final=x, ess=ess_tr, lambdas=lam_tr, resampled=res_tr, log_evidence=log_z,
        nonfinite=bad_tr, wall_time=time.perf_counter() - t_start, model_time=calls.time, smc_time=smc_time,
        extras={"reward_mean_per_step": reward_tr, "tempering": tempering if isinstance(tempering, str) else "custom",
                "ess_threshold": ess_threshold, "resampler": resampler, "output": output},
    )


def _output(x, r_final, logw, output, resampler, group_gens, groups, P):
    rows_of = lambda anc: (anc + P * torch.arange(groups, device=x.device)[:, None]).flatten()  # noqa: E731
    if output == "weighted":
        return x, r_final.flatten()
    if output == "argmax":
        rows = rows_of(logw.argmax(1, keepdim=True))
    elif output == "sample_one":
        u = group_uniforms(group_gens, torch.arange(groups), 1)
        rows = rows_of(resample(logw.exp(), u, "multinomial")[:, :1])
    else:
        u = group_uniforms(group_gens, torch.arange(groups), P)
        rows = rows_of(resample(logw.exp(), u, resampler))
    return x[rows], r_final.flatten()[rows]


def das(
    denoiser: Callable,
    reward: Callable | Sequence,
    noise: Tensor,
    sigmas: Tensor,
    *,
    alpha: float,
    particles: int = 16,
    cond: Tensor | None = None,
    tempering: str | float | Sequence[float] = "exp",
    gamma: float | None = None,
    tempering_start: float = 0.0,
    ess_threshold: float = 0.5,
    resampler: str = "ssp",
    output: str = "sample_one",
    gradient: bool = True,
    eta: float = 1.0,
    vp_compat: bool = False,
    batch_size: int | None = 512,
    generator: GeneratorLike = None,
    progress: bool = False,
    callback: Callable[[dict], None] | None = None,
) -> AlignResult:
    """Sample ``∝ p(x0) exp(r(x0) / alpha)`` with DAS, one SMC population per group of ``particles`` rows.

    Args:
        denoiser: ``D(x, sigma, cond=None) -> E[x0 | x]``.
        reward: ``r(x0) -> [B]`` (differentiable unless ``gradient=False``), or a list of ``(weight, reward)``
            pairs (their weighted sum; the multi-objective setting of das.md section 6).
        noise: standard normal ``[G * P, *shape]`` (make it per row with :func:`steerdiff.randn`); rows
            ``g * P ... g * P + P - 1`` are group g. Scaled by ``sigmas[0]`` here (``sqrt(1 + sigma_0^2)`` with
            ``vp_compat``).
        sigmas: decreasing grid ``sigma_0 > ... > sigma_N >= 0``. Ending at ``sigma_min > 0`` (the official
            setting) makes every step stochastic; ending in 0 makes the last step ``x_N = D(x_{N-1})``.
        alpha: KL weight (> 0); the twist strength is ``lambda / alpha``.
        particles: P >= 2 particles per group.
        cond: integer condition per group ``[G]`` or per row ``[G * P]``; reindexed with the particles.
        tempering: ``"exp"`` (official), a polynomial exponent, ``"adaptive"`` (bisection on the ESS),
            ``"constant"`` (lambda = 1, TDS), ``"zero"``, or ``N`` explicit levels.
        gamma: tempering rate; default reaches lambda = 1 at 87% of the steps (0.008 for 100 steps).
        tempering_start: fraction of steps run as the plain sampler (no reward, no weights) before tempering.
        ess_threshold: resample a group when ``ESS < ess_threshold * P``; in (0, 1], 1 resamples every step.
        resampler: ``ssp`` (official), ``systematic``, ``stratified``, ``multinomial`` or ``residual``.
        output: ``"sample_one"`` (one draw ∝ final weights per group, ``samples [G, *shape]``), ``"weighted"``
            (all particles ``[G * P, *shape]`` with ``log_weights``), ``"resample"`` (P equally weighted draws
            per group) or ``"argmax"`` (the official pipelines' largest-weight particle).
        gradient: use the reward gradient in the proposal; False for black-box rewards (then the proposal is the
            plain kernel and only the weights steer).
        eta: DDIM stochasticity in (0, 1] (1 = DDPM, the default).
        vp_compat: VP prior ``N(0, (1 + sigma_0^2) I)`` and shift factor ``kappa`` of the official code.
        batch_size: rows per denoiser/VJP call (memory does not grow with P); None = all rows at once.
        generator: per-row randomness as in :func:`steerdiff.sample` (int seed: row i gets seed + i).
        progress: tqdm bar showing the mean ESS / P and lambda.
        callback: called each step with ``{"i", "sigma", "sigma_next", "x", "denoised", "grad", "reward",
            "log_twist", "log_weights", "ess", "lambda", "resampled", "ancestors"}`` (after resampling).

    Non-finite values: a particle whose state, denoised value, reward (NaN, +inf or -inf) or weight is not
    finite gets log-weight ``-inf``, is counted in ``result.nonfinite`` and its group is resampled at once, so it
    never reaches the output nor affects other particles; a non-finite gradient is replaced by 0 (the weights stay
    exact for the move actually made). Only when every particle of a group is non-finite does the run stop.

    Returns:
        :class:`AlignResult` with ``log_weights``, ``ess``, ``lambdas``, ``resampled``, ``log_evidence``,
        ``nonfinite`` and the per-group costs ``nfe`` (denoiser) and ``nfe_grad`` (VJPs).

    Raises:
        ValueError: alpha <= 0, particles < 2, ess_threshold outside (0, 1], a reward of the wrong shape, ...
        FloatingPointError: every particle of a group is non-finite at some step.
    """
    return run_smc(denoiser, reward, noise, sigmas, alpha=alpha, particles=particles, cond=cond,
                   tempering=tempering, gamma=gamma, tempering_start=tempering_start, ess_threshold=ess_threshold,
                   resampler=resampler, output=output, gradient=gradient, eta=eta, vp_compat=vp_compat,
                   batch_size=batch_size, generator=generator, progress=progress, callback=callback, method="das")
