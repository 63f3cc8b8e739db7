"""Samplers over a denoiser (DESIGN.md, "Public API"; shapes follow k-diffusion's ``sample_<name>`` functions).

Each sampler is a function of a model ``model(x, sigma_batch) -> D``, a starting state ``x`` (already scaled to
``sigmas[0]``) and a schedule ``sigmas`` (decreasing, ending in 0), integrating the probability-flow ODE
``dx/dsigma = (x - D(x, sigma)) / sigma`` (Karras et al. 2022, eq. 1 with sigma(t) = t) or its ancestral SDE.

* ``euler``: first order.
* ``heun``: Karras et al. 2022, Algorithm 2 without churn (second order; Euler on the last step to sigma = 0).
* ``ddim``: Song et al. 2021 in sigma space; ``eta`` sets the stochasticity. With ``eta = 0`` it is the
  Euler step exactly (``D + sigma_next * (x - D) / sigma``).
* ``ddpm``: ancestral sampling from the DDPM posterior ``q(x_next | x, x0 = D)``, written in sigma space as the
  posterior of the variance-exploding chain (mean ``(s'^2/s^2) x + (1 - s'^2/s^2) D``, variance
  ``s'^2 (s^2 - s'^2) / s^2``); it equals ``ddim`` with ``eta = 1``.
* ``ocm-ddpm`` / ``ocm-ddim``: the optimal Gaussian reverse kernel with a learned diagonal covariance
  (``covariance=``); the step lives in :mod:`steerdiff.covariance.kernel` (covariance.md 2.3).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .denoiser import Denoiser, NFECounter
from .guided import GuidedDenoiser
from .noise import GeneratorLike, SampleNoise, make_generators
from .sigmas import check_sigmas

Model = Callable[[Tensor, Tensor], Tensor]
Callback = Callable[[dict], None]


def _denoise(model: Model, x: Tensor, sigma: float, i: int) -> Tensor:
    """One checked model evaluation at noise level ``sigma`` (step ``i``)."""
    # sigma in at least float32: a half-precision sigma would be rounded (e.g. 0.002 -> 0.0019989).
    d = model(x, x.new_full((x.shape[0],), sigma, dtype=torch.promote_types(x.dtype, torch.float32)))
    if not isinstance(d, Tensor) or d.shape != x.shape:
        got = tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__
        raise ValueError(f"denoiser returned shape {got}, expected the input's shape {tuple(x.shape)}")
    # A sum is non-finite if any entry is: one cheap reduction (and one host sync) per evaluation.
    if not math.isfinite(d.sum().item()) and not torch.isfinite(d).all():
        bad = int((~torch.isfinite(d)).flatten(1).any(1).sum())
        raise FloatingPointError(
            f"denoiser returned non-finite values at step {i} (sigma={sigma:.6g}) for {bad} of {x.shape[0]} samples"
        )
    return d.to(x.dtype)


def _steps(sigmas: list[float], progress: bool, desc: str):
    return tqdm(range(len(sigmas) - 1), disable=not progress, desc=desc, leave=False)


def sample_euler(model: Model, x: Tensor, sigmas: list[float], callback=None, progress=False, **_) -> Tensor:
    """Euler steps of the probability-flow ODE; NFE = ``len(sigmas) - 1``."""
    for i in _steps(sigmas, progress, "euler"):
        s, s_next = sigmas[i], sigmas[i + 1]
        denoised = _denoise(model, x, s, i)
        if callback is not None:
            callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": denoised})
        x = torch.lerp(denoised, x, s_next / s)  # = x + (s_next - s) * (x - D) / s
    return x


def sample_heun(model: Model, x: Tensor, sigmas: list[float], callback=None, progress=False, **_) -> Tensor:
    """Karras et al. (2022) Algorithm 2 without churn; NFE = ``2 * (len(sigmas) - 1) - 1``."""
    for i in _steps(sigmas, progress, "heun"):
        s, s_next = sigmas[i], sigmas[i + 1]
        denoised = _denoise(model, x, s, i)
        if callback is not None:
            callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": denoised})
        x_euler = torch.lerp(denoised, x, s_next / s)
        if s_next == 0:
            x = x_euler
            continue
        # Trapezoid: x + h/2 (d + d'), with d = (x - D)/s, d' = (x_euler - D')/s', h = s' - s.
        h = s_next - s
        d_sum = (x - denoised) / s + (x_euler - _denoise(model, x_euler, s_next, i)) / s_next
        x = x.add(d_sum, alpha=0.5 * h)
    return x


def ancestral_split(s: float, s_next: float, eta: float) -> tuple[float, float]:
    """Split the step ``s -> s_next`` into a deterministic part ``s_down`` and fresh noise ``s_up``.

    ``s_up = eta * s_next * sqrt(1 - s_next^2 / s^2)`` is DDIM's sigma_t(eta) (Song et al. 2021, eq. 16) mapped to
    sigma space (divide the VP variance by alphabar_next); ``s_down = sqrt(s_next^2 - s_up^2)``.
    """
    if s_next == 0:
        return 0.0, 0.0
    s_up = min(s_next, eta * s_next * math.sqrt(max(0.0, 1 - (s_next / s) ** 2)))
    return math.sqrt(max(0.0, s_next**2 - s_up**2)), s_up


def sample_ddim(
    model: Model, x: Tensor, sigmas: list[float], callback=None, progress=False, noise=None, eta: float = 0.0, **_
) -> Tensor:
    """DDIM in sigma space: ``x_next = D + s_down * (x - D) / s + s_up * z``; NFE = ``len(sigmas) - 1``."""
    noise = noise or SampleNoise(None)
    for i in _steps(sigmas, progress, "ddim"):
        s, s_next = sigmas[i], sigmas[i + 1]
        denoised = _denoise(model, x, s, i)
        if callback is not None:
            callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": denoised})
        s_down, s_up = ancestral_split(s, s_next, eta)
        x = torch.lerp(denoised, x, s_down / s)
        if s_up > 0:
            x = x.add(noise.randn_like(x), alpha=s_up)
    return x


def sample_ddpm(model: Model, x: Tensor, sigmas: list[float], callback=None, progress=False, noise=None, **_) -> Tensor:
    """Ancestral sampling from the DDPM posterior (beta-tilde variance); NFE = ``len(sigmas) - 1``."""
    noise = noise or SampleNoise(None)
    for i in _steps(sigmas, progress, "ddpm"):
        s, s_next = sigmas[i], sigmas[i + 1]
        denoised = _denoise(model, x, s, i)
        if callback is not None:
            callback({"i": i, "sigma": s, "sigma_next": s_next, "x": x, "denoised": denoised})
        keep = (s_next / s) ** 2  # weight of x_t in the posterior mean
        x = torch.lerp(denoised, x, keep)
        var = s_next**2 * (1 - keep)
        if var > 0:
            x = x.add(noise.randn_like(x), alpha=math.sqrt(var))
    return x


SAMPLERS: dict[str, Callable[..., Tensor]] = {
    "euler": sample_euler,
    "heun": sample_heun,
    "ddim": sample_ddim,
    "ddpm": sample_ddpm,
}


OCM_METHODS = ("ocm-ddpm", "ocm-ddim")


def nfe_of(method: str, steps: int) -> int:
    """Denoiser evaluations per sample (without guidance) for ``steps`` steps of ``method``."""
    if method in OCM_METHODS:
        return steps
    if method not in SAMPLERS:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(SAMPLERS)}")
    return 2 * steps - 1 if method == "heun" else steps


@dataclass
class SampleStats:
    """Cost of a sampling run: ``nfe`` per sample (a doubled guidance batch counts 2), batched ``calls``, seconds."""

    nfe: float
    calls: int
    wall_time: float
    clamped: int = 0  # ocm methods: predicted variances clamped for being negative or non-finite


def _check_inputs(denoiser, noise, cond) -> None:
    if not callable(denoiser):
        raise TypeError(f"denoiser must be callable D(x, sigma, cond), got {type(denoiser).__name__}")
    if not isinstance(noise, Tensor) or noise.ndim < 2 or noise.shape[0] < 1:
        got = tuple(noise.shape) if isinstance(noise, Tensor) else type(noise).__name__
        raise ValueError(f"noise must be a tensor [B, *shape] with B >= 1, got {got}")
    if not noise.is_floating_point():
        raise ValueError(f"noise must be a floating-point tensor, got dtype {noise.dtype}")
    shape = getattr(denoiser, "sample_shape", None)
    if shape is not None and tuple(noise.shape[1:]) != tuple(shape):
        raise ValueError(
            f"noise has sample shape {tuple(noise.shape[1:])} but the denoiser expects {tuple(shape)} "
            f"(noise must be [B, {', '.join(map(str, shape))}])"
        )
    if cond is not None:
        if not isinstance(cond, Tensor) or cond.dtype.is_floating_point or cond.dtype == torch.bool:
            raise ValueError("cond must be an integer tensor [B] or [B, m] (-1 = null)")
        if cond.ndim not in (1, 2) or cond.shape[0] != noise.shape[0]:
            raise ValueError(f"cond must have shape [B] or [B, m] with B={noise.shape[0]}, got {tuple(cond.shape)}")


def sample(
    denoiser: Denoiser,
    noise: Tensor,
    sigmas: Tensor,
    method: str = "heun",
    cond: Tensor | None = None,
    guidance: object | None = None,
    generator: GeneratorLike = None,
    progress: bool = False,
    callback: Callback | None = None,
    eta: float | None = None,
    enable_grad: bool = False,
    return_stats: bool = False,
    covariance: object | None = None,
) -> Tensor | tuple[Tensor, SampleStats]:
    """Draw samples by integrating from ``sigmas[0]`` to 0.

    Args:
        denoiser: ``D(x, sigma, cond=None) -> E[x0 | x]``.
        noise: standard normal ``[B, *shape]``; scaled by ``sigmas[0]`` here. Make it per sample with
            :func:`steerdiff.randn` so a sample does not depend on its batch.
        sigmas: decreasing schedule ending in 0 (e.g. :func:`steerdiff.sigmas.karras`).
        method: ``euler``, ``heun``, ``ddim``, ``ddpm``, or ``ocm-ddpm`` / ``ocm-ddim`` (need ``covariance``).
        cond: integer condition ``[B]`` or ``[B, m]`` (``-1`` = null), passed to the denoiser.
        guidance: a combiner ``f(d_cond, d_uncond, x, sigma)`` or a guider with ``guide(denoiser, x, sigma,
            cond)`` (see :mod:`steerdiff.core.guided`); needs ``cond``.
        generator: per-sample randomness for ``ddim`` (eta > 0) and ``ddpm``: an int seed (row ``i`` gets
            ``seed + i``), a list of seeds or generators, one shared generator, or None (global RNG).
        progress: show a tqdm bar.
        callback: called each step with ``{"i", "sigma", "sigma_next", "x", "denoised"}``.
        eta: DDIM stochasticity in [0, 1] (``ddim`` only; default 0).
        enable_grad: keep the autograd graph through the sampler (for gradients w.r.t. noise or parameters).
        return_stats: also return :class:`SampleStats` (NFE per sample, calls, wall time).
        covariance: ``ocm-*`` methods only: a covariance head (:func:`steerdiff.covariance.load_head`), a
            ``GaussianMixture`` (exact oracle) or a baseline name; see :func:`steerdiff.covariance.as_covariance`.

    Returns:
        The samples ``[B, *shape]`` in ``noise``'s dtype, and the stats if asked.
    """
    ocm = method in OCM_METHODS
    if method not in SAMPLERS and not ocm:
        raise ValueError(f"method must be one of {sorted(SAMPLERS) + list(OCM_METHODS)}, got {method!r}")
    if ocm and covariance is None:
        raise ValueError(f"method={method!r} needs covariance= (e.g. steerdiff.covariance.load_head_for('digits'))")
    if ocm and guidance is not None:
        raise ValueError("covariance heads are the Jacobian of the unguided denoiser: guidance= is not supported "
                         f"with method={method!r} (covariance.md 7, pitfall 8)")
    if not ocm and covariance is not None:
        raise ValueError(f"covariance= applies to methods {OCM_METHODS} only, got method={method!r}")
    if eta is not None:
        if method not in ("ddim", "ocm-ddim"):
            raise ValueError(f"eta applies to method='ddim' or 'ocm-ddim' only, got method={method!r}")
        if not (0.0 <= eta <= 1.0):
            raise ValueError(f"eta must lie in [0, 1], got {eta}")
    _check_inputs(denoiser, noise, cond)
    sig = check_sigmas(sigmas).tolist()  # one host transfer; the loop then uses Python floats only
    stochastic = ocm or method == "ddpm" or (method == "ddim" and (eta or 0.0) > 0)
    gens = make_generators(generator, noise.shape[0], noise.device) if stochastic else None

    counter = NFECounter(denoiser)
    if guidance is not None:
        guided = GuidedDenoiser(counter, guidance, cond)
        guided.begin(torch.tensor(sig, dtype=torch.float64))

        def model(x, s):
            return guided(x, s)
    else:

        def model(x, s):
            return counter(x, s, cond)

    start = time.perf_counter()
    clamped = 0
    with torch.set_grad_enabled(enable_grad):
        x = noise * sig[0]
        if ocm:
            from ..covariance.kernel import sample_ocm_steps  # lazy: covariance builds on core

            x, clamped = sample_ocm_steps(model, x, sig, denoiser=denoiser, covariance=covariance, cond=cond,
                                          kind=method[4:], eta=eta or 0.0, noise=SampleNoise(gens),
                                          callback=callback, progress=progress)
        else:
            x = SAMPLERS[method](
                model, x, sig, callback=callback, progress=progress, noise=SampleNoise(gens), eta=eta or 0.0
            )
    stats = SampleStats(nfe=counter.nfe(noise.shape[0]), calls=counter.calls, wall_time=time.perf_counter() - start,
                        clamped=clamped)
    return (x, stats) if return_stats else x
