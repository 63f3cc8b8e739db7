"""Consistency (CR) and Hybrid Regularization (HR) (Dou, Li, Du, Yang, Yao, Deng, "Hybrid Regularization Improves
Diffusion-based Inverse Problem Solving", ICLR 2025), their consistency and hybrid noise updates in the form of
the official code; docs/methods/inverse.md, "CR and HR".

DR's fresh noise ``eps`` is independent of ``mu``, so ``eps_hat(mu + sigma eps) - eps`` carries a large random part
that pulls ``mu`` toward a smoothed, mode-seeking solution. CR noises ``mu`` with the noise the model predicted at
the previous (higher) level; HR mixes the two, ``eps_hyb = sqrt(1 - beta) eps_hat_prev + sqrt(beta) z``: ``beta = 1``
is DR (RED-diff), ``beta = 0`` is CR. The losses are RED-diff's (:mod:`steerdiff.inverse.red_diff`) with ``eps``
replaced by ``eps_hyb``; code ``algos/HRDIS.py``::

    mu = A^+(y); Adam(mu, lr, betas=(0.9, 0.99)); eps_prev = None
    for sigma in sigmas (descending):
        z, xi ~ N(0, I);  x0 = mu + sigma_x0 xi
        eps = z if eps_prev is None or beta == 1 else sqrt(1 - beta) eps_prev + sqrt(beta) z
        eps_hat = (x0 + sigma eps - D(x0 + sigma eps, sigma)) / sigma          # no gradient through D
        first = eps_prev is None;  eps_prev = eps_hat
        if first and beta < 1: continue                                        # HRDIS skips the first update
        Adam step on L_reg + L_obs

steerdiff's departure (HR only, ``lr_cap``): Adam's step at level ``sigma`` is ``min(lr, lr_cap x sigma)``
(:data:`HR_LR_CAP` = 1; DR and CR keep the published fixed step, ``lr_cap=None``). With a fixed step HR's width
inside a mode was Adam's, not the posterior's: it followed ``lr`` and grew with the level count (G2: spread ratio
1.23 / 1.29 / 1.53 at 200 / 400 / 800 levels; capped 1.03 / 0.95 / 0.96, 1000 chains). docs/methods/inverse.md,
"Multimodal posteriors".

Not a posterior sampler for noisy measurements: no update reads ``sigma_y`` and the data term's Adam steps drive
``A mu`` to ``y`` (the observed coordinate's spread is 0.016 against the exact posterior's 0.49 on
``V.three_mode_problem``), so the chains sample about ``p(x | A x = y)``. Where the measurement noise sets the mode
weights (modes whose measured coordinates differ from ``y`` by about ``sigma_y``), HR collapses onto the mode that
fits ``y`` as the levels grow (spread ratio 0.74 / 0.09 at 100 / 1000 levels there); no level count, step, ``beta``,
``v`` or start fixes it, nor does a Gibbs step that weighs the data by ``sigma_y`` (tried; it misweights the modes
as DAPS does). The run warns where this can be seen cheaply: :func:`noise_share` (2 NFE on 16-64 probes, after
the loop) measures how much of the posterior's measured coordinates the noise sets, and above
:data:`NOISE_SHARE_WARN` the warning says the chains are not posterior samples. Use ``method="mcgdiff"`` there
(docs/methods/inverse.md, "Multimodal posteriors").

Cost: 1 NFE per level and the memory of one forward pass (no backpropagation through ``D``). Rows are independent
chains (Adam is elementwise); their diversity comes from ``z`` only. We return ``mu`` after the last step (HRDIS
saves ``mu`` before it: the two differ by one Adam step).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..core.noise import SampleNoise
from .common import denoise, finite_rows, is_number, raw_denoise, sigmas_argument
from .red_diff import ADAM_BETAS, ADAM_EPS, RED_DIFF_DEFAULTS, WEIGHTS, red_diff_loss
from .registry import SolveContext, register_solver

HR_BETA = 0.2  # _configs/algo/HRDIS.yaml
# CR/HR feed eps_hat forward; its rms is at most about 1 for a calibrated denoiser (E||eps_hat||^2 = d - MMSE/sigma^2).
# Above this the re-used noise expands from level to level: the loop gain sqrt(1 - beta) ||I - dD/dx|| exceeds 1,
# from a network Jacobian with negative eigenvalues, or, for any denoiser, at points between separated modes, where
# dD/dx = Cov[x0 | x] / sigma^2 has eigenvalues above 2 (steerdiff.app.protocols.inverse.noise_feedback_gain).
EPS_HAT_RMS_WARN = 10.0
# A chain on the prior's support has E||mu - D(mu + sigma eps)||^2 <= d sigma^2 (the MMSE is at most the noise's), so
# its lag ||mu - D|| / (sigma sqrt d) is at most about 1. Measured as the median over the last quarter of the levels:
# in healthy runs (G1, G2, the digits surrogate, the digits UNet, DR on the digits MLP) no chain exceeds 2.4; chains
# left between the modes of gmm2d (A = [1, 1], y = 0, 50 levels) exceed 3 for 7% (DR), 35% (CR) and 43% (HR).
LAG_WARN = 3.0
LAG_WARN_SHARE = 0.05  # warn when more than this share of the chains lags
LAG_TAIL = 0.25  # the last quarter of the levels
# The level count the lag warning suggests: the lagging share is taken to fall as 1 / levels, down to half the warning
# share. Measured on the ring (HR, defaults): 0.246 / 0.142 / 0.081 / 0.025 at 100 / 200 / 400 / 800 levels, i.e.
# about levels^-1.1, so the 1 / levels reading over-estimates the count (it errs towards a run that does not warn).
LAG_SUGGEST_SHARE = LAG_WARN_SHARE / 2
# Adam's lr is a step in data units: the published 0.1 is for images in [-1, 1], whose std is about 0.5 (EDM's
# sigma_data). The default keeps that ratio to the prior's own scale (docs/methods/inverse.md, "Defaults").
LR_PER_DATA_STD = 0.1 / 0.5
LR_FALLBACK = 0.1
# HR's Adam step is capped at the noise level, lr_i = min(lr, HR_LR_CAP x sigma_i) (docs/methods/inverse.md, "CR and
# HR", "Multimodal posteriors"). Why: Adam divides the gradient by its own rms, so inside a mode, where the
# gradient at a low level is mostly the injected noise (about sigma eps), each step is a random kick of size lr while
# the pull back to the mode is only about lr k sigma / c per unit distance (c the mode's variance, k = (1 - sqrt(1 -
# beta)) / sqrt(beta), 0.24 for beta = 0.2): the chains' variance settles near c lr / (2 k sigma), growing as sigma
# falls below lr, which is why HR's spread followed lr and grew with the level count on G2. With the step tied to sigma
# the kick and the pull shrink together (right at lr = 2 k sigma without momentum); measured, the factor 1 keeps G2 in
# [0.8, 1.25] from 200 to 800 levels, 0.5 and 2 do not (gauss falls to 0.76 at 800; benchmarks/inverse_hr_spread.py).
HR_LR_CAP = 1.0
# The noise-share check (noise_share): 1 - u^T J u along a random unit direction u of A's row space, J = dD/dx at
# sigma_u = noise_std / ||A u|| around the final chains. For a Gaussian prior of local variance c along u it is
# sigma_u^2 / (c + sigma_u^2): the share of the posterior's measured coordinates that the noise, not the prior, sets.
# Measured medians (HR at its defaults): gauss 0.03, G2 0.03-0.04, G1 0.12, the ring 0.33, the digits surrogate
# 0.34-0.44 and the digits UNet 0.50-0.57 (sigma_y 0.05; one image, one chain: up to 0.54 / 0.66), the three-mode
# problems 0.74.
# Warn above 0.7 (noise variance above 2.3x the prior's local variance along the measured directions): between the
# three-mode problems' 0.735 (closed form) and the largest single-image value on the digits UNet, 0.66.
NOISE_SHARE_WARN = 0.7
NOISE_SHARE_CHAINS = 64  # at most this many probes, one per chain (2 NFE each, not counted in the per-chain NFE)
NOISE_SHARE_MIN = 16  # at least this many, cycling over the chains
NOISE_SHARE_STEP = 0.1  # central-difference step, in units of sigma_u


def variational_solve(denoiser, operator, y: Tensor, sigmas: list[float] | None = None, init: Tensor | None = None, *,
                      beta: float, lam: float, v: float, lr: float, weight: str, sigma_x0: float, noise: SampleNoise,
                      cond: Tensor | None = None, callback=None, progress: bool = False,
                      levels: list[float] | None = None, lr_cap: float | None = None) -> tuple[Tensor, Tensor]:
    """DR (``beta = 1``), CR (``beta = 0``) or HR (``0 < beta < 1``) chains, one per row of ``y``.

    Args:
        denoiser: ``D(x, sigma, cond)``; evaluated without gradient.
        operator: a bound measurement operator (``forward`` differentiable).
        y: measurements ``[B, m]``.
        sigmas: descending positive noise levels (deterministic order, as in HRDIS).
        init: starting ``mu`` ``[B, *shape]`` (usually ``operator.pinv(y)``).
        beta: noise mixing in [0, 1].
        lam, v, lr, weight, sigma_x0: see :data:`steerdiff.inverse.red_diff.RED_DIFF_DEFAULTS`.
        lr_cap: if given, Adam's step at level ``sigma`` is ``min(lr, lr_cap x sigma)`` (:data:`HR_LR_CAP`).
        noise: per-row standard-normal source.
        callback: called each level with ``{"i", "sigma", "x", "denoised", "updated"}`` (``x`` is ``mu`` before the
            step).

        levels: the deprecated name of ``sigmas`` (warns).

    Returns:
        ``(mu, lag)``: ``mu`` ``[B, *shape]`` after the last Adam step, and per chain the median over the last quarter
        of the levels of ``||x0 - D(x0 + sigma eps)|| / (sigma sqrt d)`` (at most about 1 on the prior's support; see
        :data:`LAG_WARN`).
    """
    sigmas = sigmas_argument(sigmas, levels, "variational_solve")
    if init is None:
        raise TypeError("variational_solve() missing the starting mu: init=")
    mu = init.detach().clone().requires_grad_(True)
    tail_from = min(len(sigmas) - 1, int(len(sigmas) * (1 - LAG_TAIL)))
    lags = []
    opt = torch.optim.Adam([mu], lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=0)
    eps_prev = None
    watch = beta != 1  # DR never re-uses eps_hat
    # The first level whose eps_hat rms exceeds EPS_HAT_RMS_WARN (or is NaN) and its rms, kept on the state's device
    # and read once after the loop (no host read per level).
    first_big = torch.full((), -1, dtype=torch.int64, device=mu.device)
    big_rms = torch.zeros((), dtype=torch.float64, device=mu.device)
    for i, s in enumerate(tqdm(sigmas, disable=not progress, desc=f"beta={beta:g}", leave=False)):
        z = noise.randn_like(mu)
        with torch.enable_grad():
            x0 = mu + sigma_x0 * noise.randn_like(mu) if sigma_x0 > 0 else mu
        if eps_prev is None or beta == 1:
            eps = z
        else:
            eps = math.sqrt(1 - beta) * eps_prev + math.sqrt(beta) * z
        with torch.no_grad():
            xs = x0.detach() + s * eps
            d = denoise(denoiser, xs, s, cond, i)
            eps_hat = (xs - d) / s
            if i >= tail_from:
                lags.append((x0.detach() - d).flatten(1).norm(dim=1) / (s * math.sqrt(d[0].numel())))
        first = eps_prev is None
        eps_prev = eps_hat
        if watch:
            rms = eps_hat.pow(2).mean().sqrt()
            hit = (first_big < 0) & ~(rms <= EPS_HAT_RMS_WARN)  # also catches NaN
            first_big = torch.where(hit, i, first_big)
            big_rms = torch.where(hit, rms.double(), big_rms)
        update = not (first and beta < 1)
        if callback is not None:
            callback({"i": i, "sigma": s, "x": mu.detach(), "denoised": d, "updated": update})
        if not update:
            continue
        if lr_cap is not None:
            opt.param_groups[0]["lr"] = min(lr, lr_cap * s)
        with torch.enable_grad():
            loss = red_diff_loss(x0, eps_hat, eps, y, operator, s, lam=lam, v=v, weight=weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
        opt.step()
    if watch and int(first_big) >= 0:
        warnings.warn(f"beta={beta:g}: the re-used predicted noise has rms {float(big_rms):.3g} at sigma "
                      f"{sigmas[int(first_big)]:.3g} (at most about 1 for a calibrated denoiser): the denoiser "
                      "amplifies its own noise estimate here, so CR/HR will diverge. A network whose Jacobian has "
                      "negative eigenvalues does this, and so does any denoiser where the chains sit between separated "
                      "modes. Use DR (beta=1) or DPS, fewer levels, or check the denoiser with "
                      "steerdiff.app.protocols.inverse.noise_feedback_gain", RuntimeWarning, stacklevel=4)
    return mu.detach(), torch.stack(lags).median(0).values.cpu()


INITS = ("pinv", "adjoint", "zeros")
VARIATIONAL_DEFAULTS = {**RED_DIFF_DEFAULTS, "lr": None, "init": "pinv", "lr_cap": None}


def check_variational_options(opts: dict, operator=None) -> dict:
    """DR / CR / HR options: ``lam``, ``v``, ``sigma_x0`` >= 0, ``lr`` > 0 (None: :func:`default_lr`), ``lr_cap`` > 0
    or None, ``weight``, ``init`` (and HR's ``beta``)."""
    for key, low in (("lam", 0.0), ("v", 0.0), ("sigma_x0", 0.0)):
        if not (is_number(opts[key]) and opts[key] >= low):
            raise ValueError(f"{key} must be a finite number >= {low:g}, got {opts[key]!r}")
        opts[key] = float(opts[key])
    if opts["lr"] is not None:
        if not (is_number(opts["lr"]) and opts["lr"] > 0):
            raise ValueError(f"lr must be a positive number (or None for the default), got {opts['lr']!r}")
        opts["lr"] = float(opts["lr"])
    if opts["lr_cap"] is not None:
        if not (is_number(opts["lr_cap"]) and opts["lr_cap"] > 0):
            raise ValueError(f"lr_cap must be a positive number (Adam's step at level sigma is min(lr, lr_cap x "
                             f"sigma)) or None (a fixed step), got {opts['lr_cap']!r}")
        opts["lr_cap"] = float(opts["lr_cap"])
    if opts["weight"] not in WEIGHTS:
        raise ValueError(f"weight must be one of {sorted(WEIGHTS)}, got {opts['weight']!r}")
    if "beta" in opts:
        if not (is_number(opts["beta"]) and 0 <= opts["beta"] <= 1):
            raise ValueError(f"beta must lie in [0, 1], got {opts['beta']!r}")
        opts["beta"] = float(opts["beta"])
    init = opts["init"]
    if isinstance(init, np.ndarray):
        init = opts["init"] = torch.from_numpy(init)
    if isinstance(init, str):
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS} or a tensor, got {init!r}")
    elif not isinstance(init, Tensor):
        raise TypeError(f"init must be one of {INITS} or a tensor [M, *shape] / [M * chains, *shape], got "
                        f"{type(init).__name__}")
    elif not (init.is_floating_point() or init.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"init must be a real tensor, got dtype {init.dtype}")
    return opts


def data_scale(denoiser) -> float | None:
    """The prior's per-entry scale, where the denoiser states it: ``sqrt(tr Cov / d)`` of a Gaussian mixture (exact),
    or an EDM model's ``sigma_data``; None otherwise."""
    from .reference import _mixture_of, posterior_trace_cov

    base = getattr(denoiser, "denoiser", denoiser)  # through NFECounter
    try:
        mixture = _mixture_of(base)
    except TypeError:
        mixture = None
    if mixture is not None:
        return math.sqrt(posterior_trace_cov(mixture) / mixture.dim)
    sd = getattr(base, "sigma_data", None)
    return float(sd) if is_number(sd) and sd > 0 else None


def default_lr(denoiser) -> float:
    """Adam's step for DR/CR/HR when none is given: ``0.1 x scale / 0.5`` for a prior of per-entry scale ``scale``
    (:func:`data_scale`), i.e. RED-diff's and HRDIS' 0.1 for images in [-1, 1] (std about 0.5), and 0.1 where the
    scale is unknown."""
    scale = data_scale(denoiser)
    return LR_FALLBACK if scale is None else LR_PER_DATA_STD * scale


def initial_mu(init, ctx: SolveContext) -> Tensor:
    """The starting ``mu`` ``[M * chains, *shape]``: ``pinv(y)``, ``adjoint(y)``, zeros, or a given tensor
    (``[M, *shape]``, repeated per chain, or ``[M * chains, *shape]``)."""
    operator, y, chains, rows = ctx.operator, ctx.y, ctx.chains, ctx.rows
    if isinstance(init, Tensor):
        shape = tuple(operator.shape)
        if tuple(init.shape) == (y.shape[0], *shape):
            init = init.repeat_interleave(chains, 0)
        if tuple(init.shape) != (rows, *shape):
            raise ValueError(f"init must have shape [M, *shape] = {(y.shape[0], *shape)} or [M * chains, *shape] = "
                             f"{(rows, *shape)}, got {tuple(init.shape)}")
        if not torch.isfinite(init).all():
            raise ValueError("init contains NaN or infinite values")
        return init.to(y)
    if init == "pinv":
        return operator.pinv(ctx.y_rep)
    if init == "adjoint":
        return operator.adjoint(ctx.y_rep)
    return y.new_zeros(rows, *operator.shape)


def levels_for_lag(levels: int, lagging_share: float) -> int:
    """The level count at which a run whose ``lagging_share`` of chains lag at ``levels`` levels should lag in at most
    :data:`LAG_SUGGEST_SHARE` of them, taking the share to fall as ``1 / levels`` (the measured fall is steeper, see
    :data:`LAG_SUGGEST_SHARE`); rounded up to a multiple of 50 and never below ``2 x levels``."""
    need = levels * lagging_share / LAG_SUGGEST_SHARE
    return int(max(2 * levels, 50 * math.ceil(need / 50)))


def noise_share(denoiser, operator, mu: Tensor, noise_std: float, cond: Tensor | None = None, seed: int = 0) -> Tensor:
    """How much of the posterior's measured coordinates the measurement noise sets, per row of ``mu``: ``1 - u^T J u``
    with ``u`` a random unit direction of ``A``'s row space (``A^T w / ||A^T w||``, ``w ~ N(0, I)``), ``J = dD/dx``
    at ``x = mu + sigma_u xi``, ``sigma_u = noise_std / median ||A u||`` (the noise in data units along ``u``), by a
    central difference of step ``NOISE_SHARE_STEP x sigma_u``. By Tweedie's second-order formula ``sigma_u^2 u^T J u``
    is the prior's variance along ``u`` given ``x``; for a Gaussian prior of local variance ``c`` along ``u`` the value
    is ``sigma_u^2 / (c + sigma_u^2)``: 0 where the data set the measured coordinates, 1 where the noise does.

    Needs a linear operator and ``noise_std > 0``; 2 NFE per row; its own draws (``seed``), not the chains'.
    Returns ``[B]`` on the CPU."""
    x = mu.detach()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = torch.randn(operator.forward(x).shape, generator=g, dtype=torch.float64).to(x)
        u = operator.adjoint(w)
        u = u / u.flatten(1).norm(dim=1).clamp_min(torch.finfo(u.dtype).tiny).reshape(-1, *([1] * (u.dim() - 1)))
        s = noise_std / float(operator.forward(u).flatten(1).norm(dim=1).median())
        xs = x + s * torch.randn(x.shape, generator=g, dtype=torch.float64).to(x)
        h = NOISE_SHARE_STEP * s
        jv = (raw_denoise(denoiser, xs + h * u, s, cond) - raw_denoise(denoiser, xs - h * u, s, cond)) / (2 * h)
        return (1 - (u * jv).flatten(1).sum(1)).cpu()


def run_variational(ctx: SolveContext, opts: dict, beta: float) -> tuple[Tensor, Tensor, float]:
    """One variational solver through :func:`steerdiff.inverse.solve`: no VJP; non-finite chains become NaN; chains
    that end off the prior's support (median lag above :data:`LAG_WARN`) are warned about and their lag is kept in
    ``ctx.extras["lag"]``."""
    if opts["lr"] is None:
        opts["lr"] = default_lr(ctx.denoiser)
    x, lag = variational_solve(ctx.denoiser, ctx.operator, ctx.y_rep, ctx.sigmas, initial_mu(opts["init"], ctx),
                               beta=beta, lam=opts["lam"], v=opts["v"], lr=opts["lr"], weight=opts["weight"],
                               sigma_x0=opts["sigma_x0"], noise=ctx.noise, cond=ctx.cond, callback=ctx.callback,
                               progress=ctx.progress, lr_cap=opts["lr_cap"])
    finite = finite_rows(x)
    dead_at = torch.where(finite.cpu(), -1, len(ctx.sigmas) - 1)  # checked once, at the end
    x = torch.where(finite.reshape(-1, *([1] * (x.ndim - 1))), x, math.nan)
    ctx.extras["lag"] = lag.reshape(-1, ctx.chains)
    lagging = int((lag[finite.cpu()] > LAG_WARN).sum())
    if lagging > LAG_WARN_SHARE * ctx.rows:
        suggest = levels_for_lag(len(ctx.sigmas), lagging / ctx.rows)
        ctx.extras["levels_suggested"] = suggest
        warnings.warn(f"{ctx.method}: {lagging} of {ctx.rows} chains end where the prior puts no data: over the last "
                      f"quarter of the levels their mu stays more than {LAG_WARN:g}x the noise level from the "
                      "denoiser's estimate D(mu + sigma eps) (at most about 1x on the prior's support; median "
                      f"{float(lag.median()):.2f}x, per chain in result.extras['lag']). They sit between the modes of "
                      f"a multimodal posterior, or lag behind the denoiser: about {suggest} levels (steps={suggest}, "
                      f"now {len(ctx.sigmas)}; result.extras['levels_suggested']) should leave under "
                      f"{100 * LAG_SUGGEST_SHARE:g}% of the chains lagging; a larger lr or method='mcgdiff' may also "
                      "sample it (docs/methods/inverse.md, \"Multimodal posteriors\")", RuntimeWarning, stacklevel=4)
    check_noise_share(ctx, x, finite)
    return x, dead_at, 0.0


def check_noise_share(ctx: SolveContext, x: Tensor, finite: Tensor) -> None:
    """Warn where the measurement noise, which no DR / CR / HR update reads, sets the posterior's measured coordinates
    (median :func:`noise_share` above :data:`NOISE_SHARE_WARN`; kept in ``ctx.extras["noise_share"]``). Skipped for
    nonlinear operators, non-Gaussian noise and ``noise_std = 0``."""
    if not (ctx.operator.is_linear and ctx.weight is None and ctx.noise_std > 0):
        return
    ok = finite.nonzero().flatten()
    if ok.numel() == 0:
        return
    # at least NOISE_SHARE_MIN probes, cycling over the chains when there are fewer (one direction each): a run of one
    # chain gets a median steady enough to warn on; at most NOISE_SHARE_CHAINS (one batch of the model)
    probes = max(min(ok.numel(), NOISE_SHARE_CHAINS), NOISE_SHARE_MIN)
    ok = ok[torch.arange(probes) % ok.numel()].to(x.device)
    base = getattr(ctx.denoiser, "denoiser", ctx.denoiser)  # through NFECounter: a check, not the solver's cost
    share = noise_share(base, ctx.operator, x[ok], ctx.noise_std, None if ctx.cond is None else ctx.cond[ok])
    ctx.extras["noise_share"] = float(share.median())
    ctx.extras["noise_share_nfe"] = 2 * ok.numel()
    if ctx.extras["noise_share"] > NOISE_SHARE_WARN:
        warnings.warn(f"{ctx.method}: the measurement noise (noise_std={ctx.noise_std:g}) is wider than the prior's "
                      f"local spread along the measured directions (noise share {ctx.extras['noise_share']:.2f}, "
                      f"above {NOISE_SHARE_WARN:.2f}; result.extras['noise_share']), so the noise sets much of the "
                      "posterior there, and no DR / CR / HR update reads noise_std: their chains fit A x = y about "
                      "exactly and sample about p(x | A x = y). Where modes' measured coordinates differ from y by "
                      "about noise_std, their weights and the spread are not the posterior's, at any level count, lr "
                      "or beta: these chains are not posterior samples. method='mcgdiff' (or 'ddnm', 'dps') weighs the "
                      "data by noise_std (docs/methods/inverse.md, \"Multimodal posteriors\")", RuntimeWarning,
                      stacklevel=5)


@register_solver("dr", defaults=VARIATIONAL_DEFAULTS, check=check_variational_options)
def run_dr(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """DR (RED-diff, Mardani et al. 2024): fresh noise at every level, ``beta = 1``."""
    return run_variational(ctx, opts, beta=1.0)


@register_solver("cr", defaults=VARIATIONAL_DEFAULTS, check=check_variational_options)
def run_cr(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """CR: the previous level's predicted noise re-used, ``beta = 0``."""
    return run_variational(ctx, opts, beta=0.0)


@register_solver("hr", defaults={**VARIATIONAL_DEFAULTS, "beta": HR_BETA, "lr_cap": HR_LR_CAP},
                 check=check_variational_options)
def run_hr(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """HR: ``sqrt(1 - beta)`` of the previous predicted noise plus ``sqrt(beta)`` fresh noise."""
    return run_variational(ctx, opts, beta=opts["beta"])
