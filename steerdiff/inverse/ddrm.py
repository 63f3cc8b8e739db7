"""Denoising Diffusion Restoration Models, DDRM (Kawar, Elad, Ermon, Song, NeurIPS 2022, Section 4, eqs. 7-8);
docs/methods/inverse.md, "DDRM".

DDRM works in the SVD basis ``A = U diag(s) V^T``: ``xbar = V^T x``, ``ybar_i = (U^T y)_i / s_i`` with noise
``sigma_y / s_i``. The paper is already written in variance-exploding units (``x_t = x0 + sigma_t eps``), which are
ours. Per level ``s -> s'`` with ``c0 = V^T D(x, s)`` (1 NFE), per direction ``i`` (eq. 8)::

    null space (s_i = 0):      c'_i = c0_i + sqrt(1 - eta^2) s' (xbar_i - c0_i) / s + eta s' z
    s' <  sigma_y / s_i:       c'_i = c0_i + sqrt(1 - eta^2) s' (ybar_i - c0_i) / (sigma_y / s_i) + eta s' z
    s' >= sigma_y / s_i:       c'_i = (1 - eta_b) c0_i + eta_b ybar_i + sqrt(s'^2 - sigma_y^2 eta_b^2 / s_i^2) z

and the start (eq. 7): ``xbar_i = ybar_i + sqrt(s_0^2 - sigma_y^2 / s_i^2) z`` on observed directions (where
``s_0 > sigma_y / s_i``), ``sqrt(1 + s_0^2) z`` elsewhere. The last step (``s' = 0``) returns ``c0`` on the null
space and on observed directions with ``sigma_y > 0``, ``ybar`` where ``sigma_y = 0`` (so ``A x = y`` exactly).

The SVD is that of the explicit matrix (:mod:`steerdiff.inverse.linear`; refused beyond 4096 unknowns and for
nonlinear operators). Defaults ``eta = 0.85``, ``eta_b = 1`` (the paper's, Section 5; 20 steps there). Departure from
the official code (``bahjat-kawar/ddrm``): the official code runs on a VP model and converts each step; it is the
same update written in VP units.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .common import denoise, eps_of, is_number, refuse_nonlinear
from .ddnm import check_eta
from .linear import spectral
from .registry import SolveContext, register_solver

DDRM_DEFAULTS = {"eta": 0.85, "eta_b": 1.0}


def check_ddrm_options(opts: dict, operator) -> dict:
    """DDRM's options: ``eta`` and ``eta_b`` in [0, 1]."""
    if not (is_number(opts["eta_b"]) and 0 <= opts["eta_b"] <= 1):
        raise ValueError(f"eta_b must lie in [0, 1], got {opts['eta_b']!r}")
    opts["eta_b"] = float(opts["eta_b"])
    refuse_nonlinear(operator, "ddrm", "it works in the SVD basis of A")
    return check_eta(opts)


@register_solver("ddrm", defaults=DDRM_DEFAULTS, check=check_ddrm_options, inf_start=True)
def run_ddrm(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """DDRM: 1 NFE, no VJP per level; the operator enters only through its SVD (two basis changes per level)."""
    y, eta, eta_b, sy = ctx.y_rep, opts["eta"], opts["eta_b"], ctx.noise_std
    spec = spectral(ctx.operator, y.dtype, y.device, "ddrm")
    obs = spec.observed
    ybar = spec.y_bar(y)
    sy_i = torch.where(obs, sy / torch.where(obs, spec.s, 1), math.inf)  # sigma_y / s_i (inf on the null space)
    sig = list(ctx.sigmas) + [0.0]
    s0 = sig[0]
    z = ctx.noise.randn((ctx.rows, spec.s.shape[0]), y.dtype, y.device)  # white in any orthonormal basis
    start_obs = obs & (s0 > sy_i)
    if math.isinf(s0):  # a flow schedule: the state is the unit noise, the limit of c / s_0 on every direction
        c = z
    else:
        c = torch.where(start_obs, ybar + (s0**2 - torch.where(start_obs, sy_i, 0) ** 2).clamp_min(0).sqrt() * z,
                        math.sqrt(1 + s0**2) * z)
    x = spec.from_spec(c)
    for i in tqdm(range(len(ctx.sigmas)), disable=not ctx.progress, desc="ddrm", leave=False):
        s, s_next = sig[i], sig[i + 1]
        x0 = denoise(ctx.denoiser, x, s, ctx.cond, i)
        c0 = spec.to_spec(x0)
        z = ctx.noise.randn_like(c)
        keep = math.sqrt(1 - eta**2) * s_next
        null = c0 + keep * eps_of(c, c0, s) + eta * s_next * z
        below = obs & (s_next < sy_i)
        safe = torch.where(below, sy_i, 1.0)
        low = c0 + keep * (ybar - c0) / safe + eta * s_next * z
        high_var = (s_next**2 - (sy_i.nan_to_num(posinf=0.0) * eta_b) ** 2).clamp_min(0)
        high = (1 - eta_b) * c0 + eta_b * ybar + high_var.sqrt() * z
        c = torch.where(~obs, null, torch.where(below, low, high))
        x = spec.from_spec(c)
        if ctx.callback is not None:
            ctx.callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": x0})
    ctx.extras["operator_calls"] = 0
    return x, torch.full((ctx.rows,), -1, dtype=torch.int64), 0.0
