"""Pseudoinverse-Guided Diffusion Models, PiGDM (Song, Vahdat, Mardani, Kautz, ICLR 2023, Section 3, eqs. 5-8 and
Algorithm 1); docs/methods/inverse.md, "PiGDM".

``p(x0 | x_t)`` is approximated by ``N(D(x_t), r_t^2 I)``, so ``p(y | x_t) ~ N(A D, r_t^2 A A^T + sigma_y^2 I)``
and its score is the vector-Jacobian product (eq. 8)::

    g = (dD/dx)^T A^T (r^2 A A^T + sigma_y^2 I)^{-1} (y - A D(x)),     r^2 = s^2 / (1 + s^2)   (VP, eq. 5)

In EDM units we add it to the denoised estimate through Tweedie's formula (``E[x0 | x, y] = D + s^2 grad log
p(y | x)``) and take a DDIM(eta) step from ``x0' = D + scale s^2 g``::

    x0 = D(x, s)  (1 NFE + 1 VJP);  x0' = x0 + scale s^2 g;  x' = x0' + s_down (x - x0') / s + s_up z

``(r^2 A A^T + sigma_y^2 I)^{-1}`` is applied in the SVD basis of the explicit matrix
(:mod:`steerdiff.inverse.linear`): ``A^T M^{-1} v = V diag(s_i / (r^2 s_i^2 + sigma_y^2)) U^T v``, or, for large
operators without a cheap SVD (``linsolve="cg"``, the default beyond 4096 unknowns), by ``cg_iters`` conjugate-gradient
iterations on ``M u = v`` with ``forward`` / ``adjoint``, then ``A^T u``. For a Gaussian
prior whose posterior covariance given ``x_t`` is ``r^2 I`` the step is exact (the Kalman update), whatever
``sigma_y``: no step size to tune (``scale = 1``).

Departures from the official code (NVlabs/RED-diff ``algos/pgdm.py``): the official update adds the guidance as
``sqrt(alpha_t) g`` to the DDIM state (the paper's Algorithm 1 with its adaptive weight); we add it to ``x0`` with
weight ``s^2`` (Tweedie), which is the same direction with the weight that makes the Gaussian case exact. Default
``eta = 1`` (Algorithm 1's ``eta``; the paper's experiments use 100 steps).
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..core.sampling import ancestral_split
from .base import EXPLICIT_PINV_MAX_D
from .common import denoise, finite_start, is_number, refuse_nonlinear
from .ddnm import check_eta, start_state
from .linear import cg, spectral
from .registry import SolveContext, register_solver

PIGDM_DEFAULTS = {"eta": 1.0, "scale": 1.0, "linsolve": "auto", "cg_iters": 50}
LINSOLVES = ("auto", "svd", "cg")


def check_linsolve(opts: dict, operator, method: str) -> dict:
    """``linsolve``: ``"svd"`` (the cached SVD), ``"cg"`` (conjugate gradients with ``forward`` / ``adjoint``,
    ``cg_iters`` iterations) or ``"auto"`` (the SVD where it exists: Inpaint, or at most 4096 unknowns)."""
    if opts["linsolve"] not in LINSOLVES:
        raise ValueError(f"linsolve must be one of {LINSOLVES}, got {opts['linsolve']!r}")
    if not (isinstance(opts["cg_iters"], int) and not isinstance(opts["cg_iters"], bool) and opts["cg_iters"] >= 1):
        raise ValueError(f"cg_iters must be an integer >= 1, got {opts['cg_iters']!r}")
    refuse_nonlinear(operator, method, "its data step solves with A A^T or A^T A")
    if opts["linsolve"] == "auto":
        from .operators import Inpaint

        small = operator.shape is None or operator.d <= EXPLICIT_PINV_MAX_D
        opts["linsolve"] = "svd" if small or isinstance(operator, Inpaint) else "cg"
    return opts


def check_pigdm_options(opts: dict, operator) -> dict:
    """PiGDM's options: ``eta`` in [0, 1], ``scale`` > 0 (the guidance weight, 1 = Tweedie's), ``linsolve`` and
    ``cg_iters`` (:func:`check_linsolve`)."""
    if not (is_number(opts["scale"]) and opts["scale"] > 0):
        raise ValueError(f"scale must be a positive number, got {opts['scale']!r}")
    return check_linsolve(check_eta(opts), operator, "pigdm")


@register_solver("pigdm", defaults=PIGDM_DEFAULTS, check=check_pigdm_options, inf_start=True)
def run_pigdm(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """PiGDM: 1 NFE and 1 VJP per level; ``A x0`` and ``A^T M^{-1}`` are products in the cached SVD basis."""
    y, eta, scale, sy2, op = ctx.y_rep, opts["eta"], opts["scale"], ctx.noise_std**2, ctx.operator
    use_svd = opts["linsolve"] == "svd"
    spec = spectral(op, y.dtype, y.device, "pigdm") if use_svd else None
    if use_svd and sy2 == 0 and spec.rank < op.m:
        raise ValueError("method='pigdm' with noise_std=0 needs A A^T invertible (full row rank); "
                         f"{op!r} has rank {spec.rank} < m = {op.m}: pass noise_std > 0")
    yspec = spec.y_spec(y) if use_svd else None
    sig = finite_start(ctx.sigmas) + [0.0]  # a flow schedule's inf: a finite start (no limit there, see common)
    x = start_state(ctx, y.dtype, sig[0])
    calls = 0
    for i in tqdm(range(len(ctx.sigmas)), disable=not ctx.progress, desc="pigdm", leave=False):
        s, s_next = sig[i], sig[i + 1]
        r2 = s * s / (1 + s * s)
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            x0 = denoise(ctx.denoiser, xg, s, ctx.cond, i)
            if use_svd:
                # V^T A^T M^{-1} (y - A x0) = diag(s_i / (r^2 s_i^2 + sigma_y^2)) (U^T y - s_i c0_i) on observed i
                c0 = spec.to_spec(x0.detach())
                w = torch.where(spec.observed, spec.s / (r2 * spec.s**2 + sy2), 0.0)
                v = spec.from_spec(w * (yspec - spec.s * c0))
            else:  # M u = y - A x0 by CG in measurement space, then v = A^T u
                with torch.no_grad():
                    u = cg(lambda t, r2=r2: r2 * op.forward(op.adjoint(t)) + sy2 * t, y - op.forward(x0.detach()),
                           iters=opts["cg_iters"])
                    v = op.adjoint(u)
                calls += 2 + 2 * (opts["cg_iters"] + 1)
            (g,) = torch.autograd.grad(x0, xg, grad_outputs=v)
        x0 = x0.detach() + scale * s * s * g
        if ctx.callback is not None:
            ctx.callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": x0})
        z = ctx.noise.randn_like(x)
        s_down, s_up = ancestral_split(s, s_next, eta)
        x = x0 + (s_down / s) * (x - x0) + s_up * z if s_next > 0 else x0
    ctx.extras["operator_calls"] = calls  # 0 with the SVD (the operator enters through its cached SVD only)
    return x, torch.full((ctx.rows,), -1, dtype=torch.int64), float(len(ctx.sigmas))
