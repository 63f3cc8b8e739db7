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
