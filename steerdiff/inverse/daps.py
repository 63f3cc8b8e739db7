"""Decoupled Annealing Posterior Sampling, DAPS (Zhang, Chu, Berner, Zheng, He, Torr, Anandkumar, Sun, "Improving
Diffusion Inverse Problem Solving with Decoupled Noise Annealing", CVPR 2025 / arXiv 2407.01521, Section 3,
Algorithm 1); docs/methods/inverse.md, "DAPS".

Per annealing level ``s_i`` (the solver's ``sigmas``), in EDM units::

    x0h = ODE(x, s_i -> 0)                      # probability-flow Euler, ode_steps NFE (rho = 7 grid to 0)
    x0  = x0h; repeat langevin_steps times:     # Langevin on p(x0 | x_t, y) ~ N(x0; x0h, r^2 I) p(y | x0)
        x0 += lr (-(x0 - x0h) / r^2 - grad ||y - A(x0)||^2 / (2 sigma_y^2)) + sqrt(2 lr) z
    x   = x0 + s_{i+1} z                        # re-noise to the next level (the last level returns x0)

with ``r = s_i`` (the paper's ``r_t = sigma_t``). ``A`` may be nonlinear (the gradient is taken by autograd); no VJP
through the denoiser.

Step size (documented rule, replacing the paper's per-task ``lr`` table): ``lr = lr_scale / L`` with ``L = 1 / r^2
+ ||A||_2^2 / sigma_y^2`` the Lipschitz constant of the Langevin drift for a linear ``A`` (``||A||_2`` from the SVD,
or power iteration for large operators), ``lr_scale = 0.1`` (unadjusted Langevin then inflates the variance of the
stiffest direction by ``1 / (1 - lr_scale / 2)``, about 5%). A nonlinear operator (a decoded one included) gets the
same rule per row and level with the Gauss-Newton constant of the drift at the level's ``x0h``: ``||A||_2^2`` becomes
``||J(x0h)||_2^2``, the local Jacobian's, by power iteration (``JACOBIAN_ITERS`` at the first level, then
``JACOBIAN_WARM_ITERS`` warm-started from the last level's vector; two forwards and one VJP of ``A`` each, beside the
``langevin_steps`` forward + backward passes). DAPS needs ``sigma_y > 0`` (the likelihood of the Langevin target).

Defaults: ``ode_steps = 5``, ``langevin_steps = 100`` (the paper's DAPS-1K: 200 levels x 5 ODE steps); the paper's
annealing grid is EDM's rho = 7 from 100 to 0.1, ours the solver's ``sigmas``. NFE = ``levels x ode_steps``.
Departures from the official code (``zhangbingliang2019/DAPS``): its Langevin likelihood uses a hyperparameter
``tau`` (0.01 by default) in place of ``sigma_y`` and a fixed ``lr`` decayed to ``lr_min_ratio`` over the annealing;
we use ``sigma_y`` itself and the Lipschitz rule above.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .common import denoise, finite_start, is_number
from .linear import jacobian_norm_sq_rows, operator_norm_sq
from .registry import SolveContext, register_solver

DAPS_DEFAULTS = {"ode_steps": 5, "langevin_steps": 100, "lr": None, "lr_scale": 0.1}
ODE_RHO = 7.0
JACOBIAN_ITERS = 10  # power iterations for a nonlinear operator's local norm at the first level
JACOBIAN_WARM_ITERS = 3  # at later levels, warm-started: x0h moves little between levels


def check_daps_options(opts: dict, operator) -> dict:
    """DAPS's options: ``ode_steps`` >= 1, ``langevin_steps`` >= 0, ``lr`` > 0 or None (the rule), ``lr_scale`` in
    (0, 1]."""
    for key, low in (("ode_steps", 1), ("langevin_steps", 0)):
        v = opts[key]
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= low):
            raise ValueError(f"{key} must be an integer >= {low}, got {v!r}")
    if opts["lr"] is not None and not (is_number(opts["lr"]) and opts["lr"] > 0):
        raise ValueError(f"lr must be a positive number or None, got {opts['lr']!r}")
    if not (is_number(opts["lr_scale"]) and 0 < opts["lr_scale"] <= 1):
        raise ValueError(f"lr_scale must lie in (0, 1], got {opts['lr_scale']!r}")
    return opts


def ode_sigmas(s: float, n: int) -> list[float]:
    """``n + 1`` levels from ``s`` to 0 on EDM's rho = 7 grid."""
    return [(s ** (1 / ODE_RHO) * (1 - j / n)) ** ODE_RHO for j in range(n)] + [0.0]


@register_solver("daps", defaults=DAPS_DEFAULTS, check=check_daps_options, inf_start=True)
def run_daps(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """DAPS: ``ode_steps`` NFE per level, no VJP; ``langevin_steps`` forward + backward passes of ``A`` per level."""
    y, op, sy2 = ctx.y_rep, ctx.operator, ctx.noise_std**2
    if not sy2 > 0:
        raise ValueError("method='daps' needs noise_std > 0 (its Langevin target includes the likelihood "
                         "N(y; A x0, sigma_y^2 I)); use method='ddnm' or 'ddrm' for noiseless measurements")
    local = opts["lr"] is None and not op.is_linear  # the rule with the Jacobian at each level's x0h
    norm2 = operator_norm_sq(op, y.dtype, y.device) if opts["lr"] is None and op.is_linear else None
    sig = finite_start(ctx.sigmas) + [0.0]  # a flow schedule's inf: a finite start (no limit there, see common)
    x = ctx.noise.randn((ctx.rows, *op.shape), y.dtype, y.device) * math.sqrt(1 + sig[0] ** 2)
    k = 0
    lrs = []
    k_ops = 0
    v = None  # the local power iteration's vector, carried across levels
    for i in tqdm(range(len(ctx.sigmas)), disable=not ctx.progress, desc="daps", leave=False):
        s, s_next = sig[i], sig[i + 1]
        xo = x
        grid = ode_sigmas(s, opts["ode_steps"])
        for a, b in zip(grid[:-1], grid[1:], strict=True):
            d = denoise(ctx.denoiser, xo, a, ctx.cond, k)
            k += 1
            xo = d if b == 0 else xo + (b - a) / a * (xo - d)
        x0h = xo
        r2 = s * s
        if local:
            if v is None:  # its own fixed stream: the solver's noise draws stay those of a run with lr given
                g = torch.Generator().manual_seed(0)
                v = torch.randn(x0h.shape, generator=g, dtype=torch.float64).to(x0h.device, x0h.dtype)
            jn2, v = jacobian_norm_sq_rows(op, x0h, v, JACOBIAN_ITERS if i == 0 else JACOBIAN_WARM_ITERS)
            lr = (opts["lr_scale"] / (1 / r2 + jn2 / sy2)).reshape((-1,) + (1,) * (x0h.dim() - 1))
            k_ops = k_ops + (JACOBIAN_ITERS if i == 0 else JACOBIAN_WARM_ITERS)
        else:
            lr = opts["lr"] if norm2 is None else opts["lr_scale"] / (1 / r2 + norm2 / sy2)
        lrs.append(lr)
        x0 = x0h.clone()
        for _ in range(opts["langevin_steps"]):
            with torch.enable_grad():
                xg = x0.detach().requires_grad_(True)
                nll = (y - op.forward(xg)).square().sum() / (2 * sy2)
                (g,) = torch.autograd.grad(nll, xg)
            noise_scale = (2 * lr).sqrt() if local else math.sqrt(2 * lr)  # per row under the local rule
            x0 = x0 - lr * ((x0 - x0h) / r2 + g) + noise_scale * ctx.noise.randn_like(x0)
        z = ctx.noise.randn_like(x0)
        x = x0 + s_next * z if s_next > 0 else x0
        if ctx.callback is not None:
            ctx.callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": x0h})
    ctx.extras["operator_calls"] = opts["langevin_steps"] * len(ctx.sigmas)  # forward passes, each backpropagated
    if local:  # the local norm's power iterations: two forwards and one forward + VJP each
        ctx.extras["jacobian_iterations"] = k_ops
    ctx.extras["lr"] = lrs
    return x, torch.full((ctx.rows,), -1, dtype=torch.int64), 0.0
