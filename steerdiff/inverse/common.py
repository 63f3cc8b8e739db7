"""Pieces every inverse solver shares: the denoiser call of each step, on core's one checked model call
(:func:`steerdiff.core.calls.checked_call`), the guard that marks non-finite chains and the deprecation of the
former keyword ``levels=`` (the solvers' noise levels are ``sigmas``, as everywhere in steerdiff; the default
schedule is :func:`steerdiff.core.sigmas.vp_linear_levels`). docs/methods/inverse.md, "DPS" and "DR, CR and HR"."""

from __future__ import annotations

import math
import numbers
import warnings

import torch
from torch import Tensor

from ..core.calls import checked_call

HALF = (torch.float16, torch.bfloat16)


def model_dtype(denoiser) -> torch.dtype | None:
    """The dtype a denoiser computes in: its ``dtype`` attribute, else the first floating parameter of an
    ``nn.Module`` (looking through :class:`~steerdiff.core.denoiser.NFECounter`); None when it does not say."""
    d = getattr(denoiser, "dtype", None)
    if isinstance(d, torch.dtype):
        return d
    module = getattr(denoiser, "denoiser", denoiser)
    if isinstance(module, torch.nn.Module):
        for p in module.parameters():
            if p.is_floating_point():
                return p.dtype
    return None


def _model_call(denoiser, cond: Tensor | None):
    """``fn(z, sigma_batch)`` for core's checked call. A half-precision model (fp16 / bf16) gets the state cast to its
    dtype and returns in the state's dtype: the solvers keep their state, Adam's moments and the DPS step in
    float32 or float64 (``solve`` refuses half-precision measurements), as diffusers keeps a scheduler's arithmetic
    in float32 around a half-precision UNet. The cast is differentiable, so DPS's VJP goes through it."""
    md = model_dtype(denoiser)
    if md not in HALF:
        return lambda z, sb: denoiser(z, sb, cond)
    return lambda z, sb: denoiser(z.to(md), sb.to(md), cond).to(z.dtype) if z.dtype != md else denoiser(z, sb, cond)


def denoise(denoiser, x: Tensor, sigma: float, cond: Tensor | None, i: int) -> Tensor:
    """``D(x, sigma, cond)`` with core's checks (output shape; non-finite output names the step and sigma)."""
    return checked_call(_model_call(denoiser, cond), x, sigma, i)


def raw_denoise(denoiser, x: Tensor, sigma: float, cond: Tensor | None, i: int | None = None) -> Tensor:
    """``D(x, sigma, cond)`` with core's shape check only (``finite=False``): DPS guards non-finite rows itself."""
    return checked_call(_model_call(denoiser, cond), x, sigma, i, finite=False)


def sigmas_argument(sigmas, levels, fn: str):
    """The noise levels of a solver called with ``sigmas`` or the deprecated keyword ``levels`` (warns)."""
    if levels is not None:
        if sigmas is not None:
            raise TypeError(f"{fn}() got both sigmas= and levels= (the deprecated name of sigmas=); pass sigmas= only")
        warnings.warn(f"{fn}(levels=...) is deprecated: the noise levels are sigmas=", DeprecationWarning, stacklevel=3)
        return levels
    if sigmas is None:
        raise TypeError(f"{fn}() missing the noise levels: sigmas=")
    return sigmas


def finite_rows(x: Tensor) -> Tensor:
    """``[B]`` bool: rows whose every entry is finite."""
    return torch.isfinite(x).flatten(1).all(1)


def is_number(v) -> bool:
    """A finite real scalar (Python or numpy; not a bool)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


# The finite level PiGDM and DAPS start at in place of a flow schedule's sigma = inf (docs/methods/inverse.md,
# "Flow priors and latent pipelines"): neither has a limit there computable from D(z, inf) (PiGDM's weight s^2 times
# a Jacobian that vanishes as 1/s^2; DAPS's Langevin prior term 1/r^2 -> 0 leaves the likelihood alone), so they
# take the VP prior at a level where alphabar = 1 / (1 + s^2) is 1e-6 or less.
FLOW_FINITE_START = 1e3


def finite_start(sigmas: list[float]) -> list[float]:
    """``sigmas`` with a first level ``inf`` replaced by ``max(1e3, 10 sigmas[1])`` (:data:`FLOW_FINITE_START`):
    same length, so the same NFE; finite schedules come back unchanged."""
    if not sigmas or not math.isinf(sigmas[0]):
        return list(sigmas)
    nxt = sigmas[1] if len(sigmas) > 1 else 0.0
    return [max(FLOW_FINITE_START, 10 * nxt), *sigmas[1:]]


def start_noise(ctx, dtype: torch.dtype, sigma0: float) -> Tensor:
    """The VP prior ``N(0, I)`` at ``sigma0`` in EDM units, ``sqrt(1 + s_0^2) z``; at ``sigma0 = inf`` (a flow
    schedule) the unit noise ``z`` itself, the limit of ``x / sqrt(1 + s_0^2)`` (as DPS and core's samplers)."""
    x = ctx.noise.randn((ctx.rows, *ctx.operator.shape), dtype, ctx.y_rep.device)
    return x if math.isinf(sigma0) else math.sqrt(1 + sigma0**2) * x


def eps_of(x: Tensor, x0: Tensor, s: float) -> Tensor:
    """The noise direction ``(x - x0) / s`` of the state ``x`` at level ``s``; at ``s = inf`` the state is the unit
    noise (:func:`start_noise`) and the limit is the state itself."""
    return x if math.isinf(s) else (x - x0) / s


def refuse_nonlinear(operator, method: str, why: str) -> None:
    """Raise ValueError when ``operator`` is nonlinear: ``method`` needs ``A`` linear in the space it samples
    (``why``: what it does with ``A``). For a latent pipeline's decoded operator (``z -> A(decode(z))``,
    :func:`steerdiff.pipelines.through_decoder`) the message says why a pixel-space ``A`` does not serve: the
    decoder makes it nonlinear in the latents, where the method's SVD / projection would have to act
    (docs/methods/inverse.md, "Flow priors and latent pipelines")."""
    if operator.is_linear:
        return
    fn = getattr(operator, "fn", None)
    latent = getattr(fn, "pipeline", None) is not None and callable(getattr(fn, "init", None))
    where = (" It measures through a latent pipeline's VAE decoder: z -> A(decode(z)) is nonlinear in the latents "
             "the method samples, so A's SVD / projection in pixel space does not apply there (projecting the "
             "decoded x0 and re-encoding it is another method)." if latent else "")
    raise ValueError(f"method={method!r} needs a linear operator ({why}); {operator!r} is nonlinear.{where} Use "
                     "method='dps', 'daps' or 'dr' / 'cr' / 'hr'")
