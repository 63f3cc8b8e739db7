"""DiffPIR (Zhu, Zhang, Liang, Cao, Wen, Timofte, Van Gool, "Denoising Diffusion Models for Plug-and-Play Image
Restoration", CVPRW 2023, Section 3, eqs. 11-15 and Algorithm 1); docs/methods/inverse.md, "DiffPIR".

Half-quadratic splitting, per level ``s -> s'`` in EDM units (the paper's ``sigma_bar_t = sqrt(1 - abar) /
sqrt(abar)`` is our ``s``)::

    x0  = D(x, s)                                                       # prior step, 1 NFE
    x0h = argmin_z ||y - A z||^2 + rho ||z - x0||^2,  rho = lam sigma_y^2 / s^2      # data step, closed form:
        = V diag(1 / (s_i^2 + rho)) (s_i U^T y + rho V^T x0)            # (A^T A + rho I)^{-1}(A^T y + rho x0)
    eps = (x - x0h) / s
    x'  = x0h + s' (sqrt(1 - zeta) eps + sqrt(zeta) z)                  # eq. 15

``sigma_y = 0`` gives ``rho = 0``: the data step is the projection onto ``A z = y`` (``z = x0`` on the null space).
The proximal step uses the SVD (:mod:`steerdiff.inverse.linear`; Inpaint's is matrix-free), or ``cg_iters``
conjugate-gradient iterations with ``forward`` / ``adjoint`` started at ``x0`` (``linsolve="cg"``, the default
beyond 4096 unknowns).

Defaults ``lam = 1``, ``zeta = 0.1``. ``lam = 1`` is the value the paper's derivation gives (the data step as the MAP
of ``p(y | x0) p(x0 | x_t)`` with ``p(x0 | x_t) ~ N(x0_hat, sigma_bar_t^2 I)``: ``rho = sigma_y^2 / s^2``, no free
constant), and it beats deepinv's default 7 on the exact mixtures and on digits (docs/methods/inverse.md, "Step
sizes"); ``zeta = 0.1`` is deepinv's default (the official scripts, ``yuanzhi-zhu/DiffPIR``, set ``lambda_`` and
``zeta`` per task). Departures from the official code: no ``skip``-type subsampling of its
1000-step table (we take the solver's ``sigmas``), no ``iter_num_U`` inner repeats, and the data step is applied at
every level including the last.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .common import denoise, eps_of, is_number
from .ddnm import start_state
from .linear import cg, spectral
from .pigdm import check_linsolve
from .registry import SolveContext, register_solver

DIFFPIR_DEFAULTS = {"lam": 1.0, "zeta": 0.1, "linsolve": "auto", "cg_iters": 50}


def check_diffpir_options(opts: dict, operator) -> dict:
    """DiffPIR's options: ``lam`` > 0 (the data-step weight rule ``rho = lam sigma_y^2 / s^2``), ``zeta`` in
    [0, 1] (the share of fresh noise), ``linsolve`` and ``cg_iters``
    (:func:`~steerdiff.inverse.pigdm.check_linsolve`)."""
    if not (is_number(opts["lam"]) and opts["lam"] > 0):
        raise ValueError(f"lam must be a positive number, got {opts['lam']!r}")
    if not (is_number(opts["zeta"]) and 0 <= opts["zeta"] <= 1):
        raise ValueError(f"zeta must lie in [0, 1], got {opts['zeta']!r}")
    return check_linsolve({**opts, "lam": float(opts["lam"]), "zeta": float(opts["zeta"])}, operator, "diffpir")


@register_solver("diffpir", defaults=DIFFPIR_DEFAULTS, check=check_diffpir_options, inf_start=True)
def run_diffpir(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """DiffPIR: 1 NFE, no VJP per level; the data step is two SVD-basis products per level."""
    y, lam, zeta, sy2, op = ctx.y_rep, opts["lam"], opts["zeta"], ctx.noise_std**2, ctx.operator
    use_svd = opts["linsolve"] == "svd"
    spec = spectral(op, y.dtype, y.device, "diffpir") if use_svd else None
    sy_u = spec.y_spec(y) * spec.s if use_svd else None  # s_i (U^T y)_i
    aty = None if use_svd else op.adjoint(y)
    x = start_state(ctx, y.dtype)
    sig = list(ctx.sigmas) + [0.0]
    calls = 0 if use_svd else 1
    for i in tqdm(range(len(ctx.sigmas)), disable=not ctx.progress, desc="diffpir", leave=False):
        s, s_next = sig[i], sig[i + 1]
        x0 = denoise(ctx.denoiser, x, s, ctx.cond, i)
        rho = lam * sy2 / (s * s)
        if use_svd:
            c0 = spec.to_spec(x0)
            den = spec.s**2 + rho
            # rho = 0: the null part is x0's
            c = torch.where(den > 0, (sy_u + rho * c0) / torch.where(den > 0, den, 1.0), c0)
            x0h = spec.from_spec(c)
        else:  # (A^T A + rho I) z = A^T y + rho x0 from z = x0 (rho = 0: the projection of x0 onto A z = y)
            x0h = cg(lambda t, rho=rho: op.adjoint(op.forward(t)) + rho * t, aty + rho * x0, x0=x0,
                     iters=opts["cg_iters"])
            calls += 2 * (opts["cg_iters"] + 1)
        z = ctx.noise.randn_like(x)
        if s_next > 0:
            x = x0h + s_next * (math.sqrt(1 - zeta) * eps_of(x, x0h, s) + math.sqrt(zeta) * z)
        else:
            x = x0h
        if ctx.callback is not None:
            ctx.callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": x0})
    ctx.extras["operator_calls"] = calls  # 0 with the SVD
    return x, torch.full((ctx.rows,), -1, dtype=torch.int64), 0.0
