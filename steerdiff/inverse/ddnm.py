"""DDNM and DDNM+ (Wang, Yu, Zhang, "Zero-Shot Image Restoration Using Denoising Diffusion Null-Space Model",
ICLR 2023, Sections 3.2-3.3, Algorithm 1 and eqs. 17-19); docs/methods/inverse.md, "DDNM".

In EDM units (``x = x0 + sigma eps``), per level ``s -> s'``::

    x0 = D(x, s);  eps = (x - x0) / s                                      # 1 NFE
    sigma_y = 0:   x0h = x0 - A^+(A x0 - y)                                # range-null decomposition, eq. 13
                   x'  = x0h + s_down eps + s_up z                         # DDIM(eta) step (ancestral_split)
    sigma_y > 0 (DDNM+, in the SVD basis V, per direction i with singular value s_i):
                   lam_i = 1 if s' >= sigma_y / s_i else s' s_i / sigma_y   (1 on the null space)
                   x0h   = x0 - V diag(lam) V^T A^+ (A x0 - y)             # eq. 17
                   n_i   = sqrt(s'^2 - (lam_i sigma_y / s_i)^2)            # noise still to add, eq. 19
                   x'    = x0h + V diag(n / s') V^T (s_down eps + s_up z)

``sigma_y = 0`` needs only ``A`` and ``A^+`` (matrix-free wherever the operator defines ``_pinv``, e.g. ``Inpaint``):
the last step returns ``x0h``, so every sample satisfies ``A x = y`` exactly. It is a projection, not a posterior
sampler: the observed part is ``A^+ y`` by construction and only the null-space part comes from the prior's
(DDIM-like) reverse process. DDNM+ needs the SVD of the explicit matrix (:mod:`steerdiff.inverse.linear`); its
final step (``s' = 0``) has ``lam = 0`` and returns the denoiser's ``x0``.

Departures from the official code (``wyhuai/DDNM``, ``ddnm_plus``): the official code uses one scalar ``lam`` for
operators whose singular values are all 1 (its ``A^+`` absorbs them); we apply eq. 19 per singular direction, as
the paper writes it. Time-travel (the paper's "DDNM+" resampling, ``travel_length``) is not implemented.
Default ``eta = 0.85`` (the official scripts' ``--eta 0.85``).
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..core.sampling import ancestral_split
from .common import denoise, eps_of, is_number, refuse_nonlinear, start_noise
from .linear import spectral
from .registry import SolveContext, register_solver

DDNM_DEFAULTS = {"eta": 0.85}


def start_state(ctx: SolveContext, dtype: torch.dtype, sigma0: float | None = None) -> Tensor:
    """The VP prior ``N(0, I)`` in EDM units at ``sigma0`` (default ``sigmas[0]``): ``sqrt(1 + s_0^2) z`` (as DPS);
    the unit noise ``z`` at ``inf`` (:func:`~steerdiff.inverse.common.start_noise`)."""
    return start_noise(ctx, dtype, ctx.sigmas[0] if sigma0 is None else sigma0)


def check_eta(opts: dict) -> dict:
    if not (is_number(opts["eta"]) and 0 <= opts["eta"] <= 1):
        raise ValueError(f"eta must lie in [0, 1], got {opts['eta']!r}")
    opts["eta"] = float(opts["eta"])
    return opts


def check_ddnm_options(opts: dict, operator) -> dict:
    """DDNM's option: ``eta`` in [0, 1] (DDIM stochasticity; 0.85 in the official scripts)."""
    refuse_nonlinear(operator, "ddnm", "range-null decomposition with A and A^+")
    return check_eta(opts)


@register_solver("ddnm", defaults=DDNM_DEFAULTS, check=check_ddnm_options, inf_start=True)
def run_ddnm(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
    """DDNM (``noise_std = 0``) or DDNM+ (``noise_std > 0``): 1 NFE, no VJP per level; operator calls per level:
    one ``A`` and one ``A^+`` (DDNM, ``extras["operator_calls"]``) or products in the cached SVD basis (DDNM+, 0
    operator calls)."""
    y, op, eta, sy = ctx.y_rep, ctx.operator, opts["eta"], ctx.noise_std
    x = start_state(ctx, y.dtype)
    sig = list(ctx.sigmas) + [0.0]
    spec = spectral(op, y.dtype, y.device, "ddnm") if sy > 0 else None
    ybar = spec.y_bar(y) if spec is not None else None
    calls = 0
    for i in tqdm(range(len(ctx.sigmas)), disable=not ctx.progress, desc="ddnm", leave=False):
        s, s_next = sig[i], sig[i + 1]
        x0 = denoise(ctx.denoiser, x, s, ctx.cond, i)
        eps = eps_of(x, x0, s)  # at s = inf the state is the unit noise, the limit of (x - x0) / s
        s_down, s_up = ancestral_split(s, s_next, eta)
        z = ctx.noise.randn_like(x)  # drawn every level so a chain's noise does not depend on the others
        if spec is None:
            x0h = x0 - op.pinv(op.forward(x0) - y)
            calls += 2
            x = x0h + s_down * eps + s_up * z if s_next > 0 else x0h
        else:
            c0 = spec.to_spec(x0)
            # lam_i = min(1, s' s_i / sigma_y) on observed directions (eq. 19), 1 on the null space (no data there)
            lam = torch.where(spec.observed, (s_next * spec.s / sy).clamp(max=1.0), 1.0)
            c0h = torch.where(spec.observed, c0 - lam * (c0 - ybar), c0)
            if s_next > 0:
                y_noise = torch.where(spec.observed, lam * sy / torch.where(spec.observed, spec.s, 1), 0.0)
                n = (s_next**2 - y_noise**2).clamp_min(0).sqrt() / s_next
                c = c0h + n * spec.to_spec(s_down * eps + s_up * z)
            else:
                c = c0h
            x = spec.from_spec(c)
        if ctx.callback is not None:
            ctx.callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": x0})
    ctx.extras["operator_calls"] = calls
    return x, torch.full((ctx.rows,), -1, dtype=torch.int64), 0.0
