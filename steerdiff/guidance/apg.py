"""Adaptive projected guidance (APG): Sadat, Hilliges, Weber, "Eliminating Oversaturation and Artifacts of High
Guidance Scales in Diffusion Models" (ICLR 2025), Sec. 3 and Algorithm 1; docs/methods/guidance.md, "APG".

Per sample, over all non-batch dims, in float64, in D (x0-prediction) space by default. At sampler step ``k``:

1. ``dD_k = D_c - D_u``;
2. momentum (``beta != 0``): ``M_k = dD_k + beta M_{k-1}``, ``M_{-1} = 0``; ``dD_k <- M_k``;
3. norm clamp (``r > 0``): ``dD_k <- dD_k min(1, r / ||dD_k||)``;
4. projection on ``u = D_c / max(||D_c||, 1e-12)``: ``par = <dD_k, u> u``, ``orth = dD_k - par``;
5. ``D_apg = D_c + (w - 1)(orth + eta par)``.

Scale convention: the paper's ``w`` (``w = 1`` is the conditional model; with ``eta = 1``, ``r = 0``, ``beta = 0``
APG equals CFG ``D_u + w (D_c - D_u)``). ComfyUI's APG node ``cond_scale`` ``s`` is ``w = s + 1`` (``s = 1``:
no guidance), and so is diffusers' ``AdaptiveProjectedGuidance(use_original_formulation=True)``; diffusers' default
(``D_u + s * update``) is a different operator, equal to ours only for ``eta = 1, r = 0``; see
:mod:`steerdiff.guidance.conventions`.

The momentum buffer is per trajectory and per sample row: samplers call :meth:`APG.reset` at the start of a
trajectory, and a change of batch shape, dtype or device re-initialises it. It advances once per sampler step
(Algorithm 1 has one evaluation per step), whatever the sampler (docs/methods/guidance.md, "Momentum and samplers
with several evaluations per step"): ``sd.sample`` passes the step index ``step`` with every evaluation; every
evaluation of step ``i`` uses ``dD + beta M_{i-1}``, with ``M_{i-1}`` the buffer step ``i - 1`` left, and step ``i``
leaves the value of its last evaluation as ``M_i``. For Heun that is the evaluation at ``sigma_{i+1}``, so the chain
of buffers carried from step to step is Euler's recursion on the same grid (``dD`` at ``sigma_{i+1}`` plus ``beta``
times the buffer of ``sigma_i``). Heun's two evaluations used to advance the buffer twice per step, and keeping the
first evaluation's value instead of the last lets the end-of-step evaluation build on a buffer two levels old;
both left digits at ``w = 3`` and 10 Heun steps off its class (measured in docs/methods/guidance.md). A call
without ``step`` (a guider used outside ``sd.sample``) counts as a new step, as in Algorithm 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.denoiser import denoised_from_eps, eps_from_denoised
from .base import Guider, check_real, check_space, sample_dims, scale_rows
from .cfg import _positive_sigma
from .registry import register_guider

NORM_FLOOR = 1e-12  # ||D_c|| floor for the projection direction: D_c is near 0 for zero-mean data at large sigma


def project(v: Tensor, onto: Tensor) -> tuple[Tensor, Tensor]:
    """Split ``v`` into its parts parallel and orthogonal to ``onto``, per sample over all non-batch dims.

    A zero ``onto`` has no direction: everything is orthogonal (parallel part 0), never NaN.
    """
    dims = sample_dims(v)
    unit = onto / torch.linalg.vector_norm(onto, dim=dims, keepdim=True).clamp_min(NORM_FLOOR)
    par = (v * unit).sum(dim=dims, keepdim=True) * unit
    return par, v - par


def clamp_norm(v: Tensor, r: float) -> Tensor:
    """``v * min(1, r / ||v||)`` per sample; a zero ``v`` stays zero (no 0/0)."""
    norm = torch.linalg.vector_norm(v, dim=sample_dims(v), keepdim=True)
    over = norm > r
    return v * torch.where(over, r / torch.where(over, norm, torch.ones_like(norm)), torch.ones_like(norm))


@register_guider("apg")
class APG(Guider):
    """Adaptive projected guidance on one doubled batch (stateful: momentum; call :meth:`reset` per trajectory).

    Args:
        scale: the paper's ``w`` (>= 0): ``D_c + (w - 1)(orth + eta par)``; ``w = 1`` returns ``D_c`` (one
            evaluation). ComfyUI's ``cond_scale`` ``s`` is ``w = s + 1``. A 1-D tensor or list ``[B]`` gives one
            ``w`` per sample (the momentum, clamp and projection are per sample anyway).
        eta: weight of the update's part parallel to ``D_c``, in [0, 1] (paper: 0; ``eta = 1`` keeps it).
        norm_threshold: ``r``, absolute L2 bound on the (momentum) update per sample; ``None`` or 0 disables the
            clamp. ``r`` scales with ``sqrt(d) * data scale``: prefer ``r_rms``.
        r_rms: the bound per element RMS, ``r = r_rms * sqrt(d)`` with ``d`` the number of elements per sample.
            Give ``norm_threshold`` or ``r_rms``, not both.
        momentum: ``beta`` with ``|beta| < 1`` (paper's SDXL value -0.5; 0 disables momentum).
        space: ``"D"`` (default, as the paper's author advises) or ``"eps"`` (convert ``D -> eps``, apply, convert
            back: the projection then uses the eps direction, another geometry; test G5 of docs/methods/guidance.md).
        start, stop, sigmas, enabled: as for :class:`~steerdiff.guidance.CFG`. Steps outside the window do not
            touch the momentum buffer.

    The momentum advances once per sampler step (module docstring): :meth:`guide` takes the step index ``step``
    from ``sd.sample``; without it every call is a new step.
    """

    name = "apg"

    def __init__(
        self,
        scale: float | Tensor | Sequence[float],
        eta: float = 0.0,
        norm_threshold: float | None = None,
        momentum: float = -0.5,
        r_rms: float | None = None,
        space: str = "D",
        start: float = 0.0,
        stop: float = 1.0,
        sigmas: Tensor | None = None,
        enabled: bool = True,
    ):
        super().__init__(scale, start=start, stop=stop, sigmas=sigmas, enabled=enabled)
        self.eta = check_real(eta, "eta", 0.0, 1.0)
        if norm_threshold is not None and r_rms is not None:
            raise ValueError("give norm_threshold (absolute r) or r_rms (r = r_rms * sqrt(d)), not both")
        self.norm_threshold = None if norm_threshold is None else check_real(norm_threshold, "norm_threshold", 0.0)
        self.r_rms = None if r_rms is None else check_real(r_rms, "r_rms", 0.0)
        momentum = check_real(momentum, "momentum")
        if abs(momentum) >= 1:
            raise ValueError(
                f"momentum must satisfy |momentum| < 1 (M = dD + momentum * M diverges otherwise), got {momentum}"
            )
        self.momentum = float(momentum)
        self.space = check_space(space)
        self.momentum_buffer: Tensor | None = None  # the buffer of the latest step (its latest evaluation)
        self._buffer_step: int | None = None  # that step's index (None: a call without a step index)
        self._previous: Tensor | None = None  # M_{i-1}: the base of every evaluation of the latest step

    @property
    def config(self) -> dict:
        return {
            **super().config,
            "eta": self.eta,
            "norm_threshold": self.norm_threshold,
            "momentum": self.momentum,
            "r_rms": self.r_rms,
            "space": self.space,
        }

    def reset(self) -> None:
        self.momentum_buffer = self._previous = None
        self._buffer_step = None

    def threshold(self, numel: int) -> float:
        """The absolute clamp radius ``r`` for samples of ``numel`` elements (0: no clamp)."""
        if self.r_rms is not None:
            return self.r_rms * math.sqrt(numel)
        return self.norm_threshold or 0.0

    def update(self, p_cond: Tensor, p_null: Tensor, step: int | None = None) -> Tensor:
        """Steps 1-4 on float64 predictions: the modified update ``orth + eta par``.

        Momentum per sampler step (module docstring): every evaluation of ``step`` builds on the buffer the previous
        step left, ``dD + beta M_{i-1}``, and the step leaves its last evaluation's value as ``M_i``. A call with
        ``step=None`` is a step of its own.
        """
        delta = p_cond - p_null
        if self.momentum != 0.0:
            buf = self.momentum_buffer
            if buf is not None and (buf.shape != delta.shape or buf.dtype != delta.dtype or buf.device != delta.device):
                self.reset()  # another batch (shape, dtype or device): its momentum starts from zero
            if step is None or step != self._buffer_step or self.momentum_buffer is None:
                self._previous, self._buffer_step = self.momentum_buffer, step  # a new step: M_{i-1} is its base
            prev = self._previous
            delta = delta if prev is None else delta + self.momentum * prev
            self.momentum_buffer = delta
        r = self.threshold(delta[0].numel())
        if r > 0:
            delta = clamp_norm(delta, r)
        par, orth = project(delta, p_cond)
        return orth + self.eta * par if self.eta != 0.0 else orth

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor, step: int | None = None) -> Tensor:
        p_cond, p_null = d_cond.double(), d_null.double()
        if self.space == "eps":
            x64, s64 = x.double(), _positive_sigma(sigma, "APG(space='eps')")
            p_cond, p_null = eps_from_denoised(x64, s64, p_cond), eps_from_denoised(x64, s64, p_null)
        out = p_cond + (scale_rows(self.scale, p_cond) - 1.0) * self.update(p_cond, p_null, step)
        if self.space == "eps":
            out = denoised_from_eps(x64, s64, out)
        return out.to(d_cond.dtype)
