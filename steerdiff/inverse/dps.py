"""Diffusion Posterior Sampling (Chung, Kim, McCann, Klasky, Ye, ICLR 2023), the posterior-sampling step of their
Algorithms 1 (Gaussian) and 2 (Poisson noise); docs/methods/inverse.md, "DPS".

Code form (``condition_methods.py::PosteriorSampling``) with a **per-sample** norm (the official code
divides by the norm of the whole batch, coupling samples), in EDM units::

    x = sqrt(1 + s_0^2) z                                   # the VP prior N(0, I) in EDM units
    for i:  x0 = D(x, s_i);  g = grad_x ||y - A(x0)||        # 1 NFE + 1 VJP through D
            x  = x0 + s_down (x - x0) / s_i + s_up z'        # DDIM(eta) step; eta = 1: DDPM posterior
            x  = x - scale * sqrt((1 + s_i^2)(1 + s_{i+1}^2)) g   # the VP step x_vp -= scale g_vp in EDM units

A first level ``s_0 = inf`` (a flow schedule) starts from ``z`` itself and takes the limits of the two updates: the
mean ``x0 + s_down z`` and the step ``sqrt(1 + s_1^2) g`` with ``g`` the gradient w.r.t. the state ``z``.

``step_form="paper"`` uses ``zeta' grad ||r||^2 / ||r||`` (the paper's form; the same step with
``scale = 2 zeta'``). ``step_form="score"`` (through :func:`steerdiff.inverse.solve`) adds ``-scale grad ||r||`` to
the score instead, as deepinv's DPS does: the step ``scale s (s - s_down) grad ||r||`` of :func:`dps_score_scales`.
With Poisson noise the norm is the weighted ``||r||_Lambda``.

Vanilla DPS can diverge and produce non-finite samples (the NAMM authors' notebook filters them out). Such a chain
is **guarded**: from the step its state turns non-finite it is frozen at zero (so it cannot poison the batch),
counted, and returned as NaN with the step recorded; it is never silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..core.noise import SampleNoise
from ..core.sampling import ancestral_mean, ancestral_split
from .common import finite_rows, is_number, raw_denoise, sigmas_argument
from .hybrid import data_scale
from .linear import jacobian_norm_sq, operator_norm_sq
from .registry import SolveContext, register_solver

STEP_FORMS = ("code", "paper")
# solve()'s step forms: ``"score"`` is the code form with the per-level steps of :func:`dps_score_scales`
SOLVE_STEP_FORMS = (*STEP_FORMS, "score")
AUTO = "auto"
CONFIG = "config"  # the DPS configs' published step of the operator's task (operator.dps_scale)
DATA_STD_FALLBACK = 0.5  # a prior that states no scale: images in [-1, 1] (std about 0.5, EDM's sigma_data)


def residual_norm(r: Tensor, weight: Tensor | None = None) -> Tensor:
    """Per-sample ``||r||_2`` or ``sqrt(sum_j w_j r_j^2)``: ``[B, m] -> [B]``."""
    return torch.linalg.vector_norm(r if weight is None else r * weight.sqrt(), dim=1)


def dps(denoiser, operator, y: Tensor, sigmas: list[float] | None = None, *, scale: float | Sequence[float],
        eta: float = 1.0,
        weight: Tensor | None = None, step_form: str = "code", noise: SampleNoise, cond: Tensor | None = None,
        callback=None, progress: bool = False, levels: list[float] | None = None) -> tuple[Tensor, Tensor]:
    """Run DPS chains, one per row of ``y``.

    Args:
        denoiser: ``D(x, sigma, cond)``; differentiated once per level.
        operator: a bound measurement operator (``forward`` must be differentiable).
        y: measurements ``[B, m]``, one row per chain.
        sigmas: descending positive noise levels ``s_0 > ... > s_{N-1}`` (``s_0`` may be ``inf``); the last step
            goes to 0.
        scale: step size ``s`` (``step_form="code"``) or ``zeta'`` (``"paper"``): one number, or one per level
            (:func:`dps_auto_scales`).
        eta: DDIM stochasticity (1 = DDPM ancestral, the DPS paper; 0 = deterministic DDIM).
        weight: per-entry residual weights ``[B, m]`` (Poisson's Lambda), or None.
        noise: per-row standard-normal source (one generator per chain).
        callback: called each level with ``{"i", "sigma", "sigma_next", "x", "denoised"}``.
        levels: the deprecated name of ``sigmas`` (warns).

    Returns:
        ``(x, dead_at)``: samples ``[B, *shape]`` (NaN rows for guarded chains) and ``[B]`` int64, the level at which
        each chain turned non-finite (-1 if it never did).
    """
    if step_form not in STEP_FORMS:
        raise ValueError(f"step_form must be one of {STEP_FORMS}, got {step_form!r}")
    sigmas = sigmas_argument(sigmas, levels, "dps")
    sig = list(sigmas) + [0.0]
    scales = [float(scale)] * len(sigmas) if is_number(scale) else [float(v) for v in scale]
    if len(scales) != len(sigmas):
        raise ValueError(f"scale must be a number or one value per level ({len(sigmas)}), got {len(scales)} values")
    b = y.shape[0]
    shape = (b, *operator.shape)
    # sigma_0 = inf (a flow schedule): the state is the unit noise itself, the limit of x / sqrt(1 + s_0^2)
    x = noise.randn(shape, y.dtype, y.device)
    if not math.isinf(sig[0]):
        x = math.sqrt(1 + sig[0] ** 2) * x
    # The guard lives on the state's device and is read once, after the loop: no host read per level.
    dead_at = torch.full((b,), -1, dtype=torch.int64, device=x.device)
    for i in tqdm(range(len(sigmas)), disable=not progress, desc="dps", leave=False):
        s, s_next = sig[i], sig[i + 1]
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            x0 = raw_denoise(denoiser, x, s, cond, i)
            nrm = residual_norm(y - operator.forward(x0), weight)
            if step_form == "code":
                (g,) = torch.autograd.grad(nrm.sum(), x)
            else:  # zeta' * grad ||r||^2 / ||r||
                (g,) = torch.autograd.grad(nrm.square().sum(), x)
                g = g / nrm.detach().clamp_min(torch.finfo(g.dtype).tiny).reshape(-1, *([1] * (g.ndim - 1)))
        x, x0 = x.detach(), x0.detach()
        if callback is not None:
            callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": x0})
        z = noise.randn_like(x)  # drawn every level, so a chain's noise does not depend on the others
        if math.isinf(s):
            # Limits with x = s eps: the mean x0 + s_down eps, and the VP step sqrt((1 + s^2)(1 + s'^2)) g_x with
            # g_x = g_eps / s (g is taken w.r.t. the state eps here), i.e. sqrt(1 + s'^2) g. (Written as DPS always
            # wrote it, x0 + s_down * x, which rounds differently from core's fused add in euler_step.)
            s_down, s_up = ancestral_split(s, s_next, eta)
            x_next = x0 + s_down * x if s_down > 0 else x0
            step = math.sqrt(1 + s_next**2)
        else:
            x_next, s_up = ancestral_mean(x, x0, s, s_next, eta)  # core's DDIM(eta) mean D + (s_down / s)(x - D)
            step = math.sqrt((1 + s**2) * (1 + s_next**2))
        if s_up > 0:
            x_next = x_next + s_up * z
        x_next = x_next - scales[i] * step * g
        dead_at = torch.where(~finite_rows(x_next) & (dead_at < 0), i, dead_at)
        alive = (dead_at < 0).reshape(-1, *([1] * (x.ndim - 1)))
        x = torch.where(alive, x_next, torch.zeros_like(x_next))  # a dead chain stays frozen at zero
    x = torch.where((dead_at < 0).reshape(-1, *([1] * (x.ndim - 1))), x, torch.full_like(x, math.nan))
    return x, dead_at.cpu()


def dps_auto_scales(sigmas: list[float], *, m: int, noise_std: float, norm2: float, data_std: float,
                    eta: float = 1.0) -> list[float]:
    """DPS's step per level from the problem, without a sweep (docs/methods/inverse.md, "Step sizes").

    The DPS approximation ``p(y | x_s) ~ N(y; A x0_hat, v_s I)`` with the variance of a Gaussian prior of per-entry
    std ``data_std`` pushed through ``A`` (isotropic: ``A A^T ~ ||A||^2 I``, exact for inpainting),
    ``v_s = sigma_y^2 + ||A||^2 data_std^2 s^2 / (data_std^2 + s^2)``, makes the exact guided DDIM(eta) step (the
    conditional score in the mean ``x + s (s - s_down) score``)::

        x -= s (s - s_down) grad_x ||y - A x0_hat||^2 / (2 v_s)  =  s (s - s_down) (||r|| / v_s) grad_x ||r||

    DPS's step is ``scale_i sqrt((1 + s^2)(1 + s'^2)) grad_x ||r||``; with the residual at its expected size under
    that likelihood, ``||r|| = sqrt(m v_s)``, the two agree for::

        scale_i = s (s - s_down) sqrt(m / v_s) / sqrt((1 + s^2)(1 + s'^2))

    (for Gaussian ``x0`` and ``A A^T = a^2 I`` this is the exact posterior step whenever ``||r||`` is at its mean,
    which it concentrates on as ``m`` grows). A chain whose residual is larger than expected still gets DPS's
    bounded step. A level ``s = inf`` (a flow schedule's start) gets 0: its step ``s (s - s_down) J`` needs the
    prior's covariance, which a learned denoiser's zero Jacobian there does not give.
    """
    out = []
    sig = [*sigmas, 0.0]
    for s, s_next in zip(sig[:-1], sig[1:], strict=True):
        if math.isinf(s):
            out.append(0.0)
            continue
        s_down, _ = ancestral_split(s, s_next, eta)
        v = noise_std**2 + norm2 * data_std**2 * s**2 / (data_std**2 + s**2)
        if not v > 0:
            raise ValueError("DPS's automatic step needs noise_std > 0 or an operator with a nonzero norm: pass scale=")
        out.append(s * (s - s_down) * math.sqrt(m / v) / math.sqrt((1 + s**2) * (1 + s_next**2)))
    return out


def dps_score_scales(sigmas: list[float], weight: float, eta: float = 1.0) -> list[float]:
    """The per-level DPS steps of the *score form*: the likelihood term ``-weight grad_x ||y - A x0_hat||`` added to
    the prior's score, as deepinv's ``PosteriorDiffusion`` does (``DPSDataFidelity``, ``guidance="norm"``), instead
    of a constant step on the VP state (the official code's form). Through Tweedie's formula the term shifts the
    denoised estimate by ``- weight s^2 grad_x ||r||``, and the DDIM(eta) mean ``x0 + (s_down / s)(x - x0)`` carries
    ``s (s - s_down)`` of it; in DPS's step form ``scale_i sqrt((1 + s^2)(1 + s'^2)) grad_x ||r||`` that is::

        scale_i = weight s (s - s_down) / sqrt((1 + s^2)(1 + s'^2))

    (docs/methods/inverse.md, "Against deepinv"). Large at the high levels, where it sets which mode a chain goes to,
    and small at the low ones, where the prior keeps the spread. ``s = inf`` has no finite step: refused."""
    if not (is_number(weight) and weight > 0):
        raise ValueError(f"scale must be a positive number for step_form='score' (the likelihood's weight), got "
                         f"{weight!r}")
    out = []
    sig = [*sigmas, 0.0]
    for s, s_next in zip(sig[:-1], sig[1:], strict=True):
        if math.isinf(s):
            raise ValueError("step_form='score' has no finite step at sigma = inf (a flow schedule's start): pass "
                             "sigmas from a finite level, or step_form='code'")
        s_down, _ = ancestral_split(s, s_next, eta)
        out.append(weight * s * (s - s_down) / math.sqrt((1 + s**2) * (1 + s_next**2)))
    return out


def check_dps_options(opts: dict, operator) -> dict:
    """DPS's options: ``scale`` (default ``"auto"``, the step rule :func:`dps_auto_scales`; ``"config"``: the DPS
    configs' published step of the operator's task, ``operator.dps_scale``; a positive number; or one positive
    number per level), ``eta``, ``step_form``."""
    if opts["scale"] is None:
        opts["scale"] = AUTO
    if opts["scale"] == CONFIG:
        opts["scale"] = getattr(operator, "dps_scale", None)
        if opts["scale"] is None:
            raise ValueError(f"scale='config': DPS has no published step size for {operator!r}; use scale='auto' "
                             "or a number")
    if isinstance(opts["scale"], (list, tuple, Tensor)):  # one step per level (its length is checked by dps())
        per_level = torch.as_tensor(opts["scale"], dtype=torch.float64).flatten().tolist()
        if not per_level or not all(is_number(v) and v > 0 for v in per_level):
            raise ValueError("scale: a per-level sequence must hold positive finite numbers, one per level")
        opts["scale"] = per_level
    elif opts["scale"] != AUTO and not (is_number(opts["scale"]) and opts["scale"] > 0):
        raise ValueError(f"scale must be a positive number, one per level, 'auto' or 'config', got "
                         f"{opts['scale']!r}")
    if not (is_number(opts["eta"]) and 0 <= opts["eta"] <= 1):
        raise ValueError(f"eta must lie in [0, 1], got {opts['eta']!r}")
    if opts["step_form"] not in SOLVE_STEP_FORMS:
        raise ValueError(f"step_form must be one of {SOLVE_STEP_FORMS}, got {opts['step_form']!r}")
    if opts["step_form"] == "score" and not is_number(opts["scale"]):
        raise ValueError("step_form='score' needs scale= the likelihood's weight (a positive number; deepinv's DPS "
                         f"'weight' in its units), got {opts['scale']!r}")
    return opts


def auto_scales(ctx: SolveContext, opts: dict) -> list[float]:
    """:func:`dps_auto_scales` for a solve: ``||A||_2^2`` exact or by power iteration for a linear operator, the
    Jacobian's at zero for a nonlinear one (a decoded operator: the latent origin); the prior's scale from
    :func:`~steerdiff.inverse.hybrid.data_scale` (0.5 where it states none)."""
    if ctx.weight is not None:
        raise ValueError("DPS's automatic step is derived for Gaussian noise; with Poisson noise pass scale=")
    op, y = ctx.operator, ctx.y_rep
    if op.is_linear:
        norm2 = operator_norm_sq(op, y.dtype, y.device)
    else:
        norm2 = jacobian_norm_sq(op, torch.zeros(1, *op.shape, dtype=y.dtype, device=y.device))
    sd = data_scale(ctx.denoiser)
    scales = dps_auto_scales(ctx.sigmas, m=op.m, noise_std=ctx.noise_std, norm2=norm2,
                             data_std=DATA_STD_FALLBACK if sd is None else sd, eta=opts["eta"])
    # step_form="paper" multiplies grad ||r||^2 / ||r|| = 2 grad ||r||
    return [v / 2 for v in scales] if opts["step_form"] == "paper" else scales


@register_solver("dps", defaults={"scale": None, "eta": 1.0, "step_form": "code"}, check=check_dps_options,
                 inf_start=True)
def run_dps(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """DPS through :func:`steerdiff.inverse.solve`: one NFE and one VJP per level."""
    step_form = opts["step_form"]
    if step_form == "score":
        scale, step_form = dps_score_scales(ctx.sigmas, opts["scale"], opts["eta"]), "code"
    else:
        scale = auto_scales(ctx, opts) if opts["scale"] == AUTO else opts["scale"]
    x, dead_at = dps(ctx.denoiser, ctx.operator, ctx.y_rep, ctx.sigmas, scale=scale, eta=opts["eta"],
                     weight=ctx.weight, step_form=step_form, noise=ctx.noise, cond=ctx.cond,
                     callback=ctx.callback, progress=ctx.progress)
    return x, dead_at, float(len(ctx.sigmas))
