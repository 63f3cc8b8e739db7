"""Discrete VP/DDPM networks as denoisers: the one place where foreign conventions are converted
(docs/methods/conventions.md, "VP wrapping").

A VP network sees ``x_vp = sqrt(abar) x0 + sqrt(1 - abar) eps`` at an integer timestep ``t``. In the sigma
convention ``sigma = sqrt((1 - abar) / abar)`` and ``x_vp = x / sqrt(1 + sigma^2)``, so for an input ``x`` at noise
level ``sigma`` (with ``c = 1 / sqrt(1 + sigma^2)``):

* ``epsilon``:       ``D = x - sigma * eps_net``
* ``v_prediction``:  ``v = sqrt(abar) eps - sqrt(1 - abar) x0``  =>  ``D = c^2 x - sigma c v_net``
* ``sample``:        ``D = x0_net``

``sigma -> t`` interpolates ``log sigma`` linearly over the training table (k-diffusion's ``DiscreteSchedule``);
with ``quantize=True`` it rounds to the nearest training timestep, which is exact for schedules made by
:func:`steerdiff.sigmas.from_alphas_cumprod` and otherwise evaluates the network at the nearest level.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from .denoiser import HOST_LEVEL_ATTR, LevelPlan, append_dims, host_level, planned
from .sigmas import sigmas_from_alphas_cumprod

_NUMBER = {torch.float32: np.float32, torch.float64: np.float64}

PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")

VPNetwork = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]


class VPDenoiser:
    """Turn ``net(x_vp, t, cond) -> eps | v | x0`` over discrete timesteps into ``D(x, sigma, cond)``.

    Args:
        net: the VP network; ``t`` is a float tensor ``[B]`` (integral values when ``quantize``).
        alphas_cumprod: ``[T]`` cumulative products of the training schedule.
        prediction_type: ``epsilon``, ``v_prediction`` or ``sample`` (diffusers' names).
        quantize: round timesteps to the nearest training step (True) or interpolate (False).
        sample_shape: per-sample shape, checked by samplers when given.
    """

    def __init__(
        self,
        net: VPNetwork,
        alphas_cumprod: Tensor,
        prediction_type: str = "epsilon",
        quantize: bool = True,
        sample_shape: tuple[int, ...] | None = None,
    ):
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        self.net = net
        self.prediction_type = prediction_type
        self.quantize = quantize
        self.sigmas = sigmas_from_alphas_cumprod(alphas_cumprod)  # float64 [T], increasing in t
        self.log_sigmas = self.sigmas.log()
        if sample_shape is not None:
            self.sample_shape = tuple(sample_shape)

    @property
    def sigma_min(self) -> float:
        return float(self.sigmas[0])

    @property
    def sigma_max(self) -> float:
        return float(self.sigmas[-1])

    @property
    def sigma_range(self) -> tuple[float, float]:
        """``(sigma_min, sigma_max)`` of the training timesteps: :func:`steerdiff.sample` refuses schedules above it
        and warns below it (the network would see a clamped timestep)."""
        return self.sigma_min, self.sigma_max

    def _log_sigmas_on(self, device: torch.device) -> Tensor:
        # Cached per device so that no call moves sigma to the host (no sync on accelerators).
        cache = self.__dict__.setdefault("_ls_cache", {})
        if device not in cache:
            cache[device] = self.log_sigmas.to(device)
        return cache[device]

    def sigma_to_t(self, sigma: Tensor) -> Tensor:
        """Continuous (or rounded) timestep for each sigma, clamped to the training range (float64)."""
        ls = self._log_sigmas_on(sigma.device)
        log_sigma = sigma.detach().to(ls.dtype).log().clamp(ls[0], ls[-1])
        hi = torch.searchsorted(ls, log_sigma).clamp(1, ls.numel() - 1)
        lo = hi - 1
        if self.quantize:  # nearest training level in log sigma
            return torch.where((log_sigma - ls[lo]).abs() <= (ls[hi] - log_sigma).abs(), lo, hi).to(ls.dtype)
        # Linear interpolation of t in log-sigma between the bracketing table entries.
        w = ((log_sigma - ls[lo]) / (ls[hi] - ls[lo])).clamp(0, 1)
        return lo.to(ls.dtype) + w

    def t_to_sigma(self, t: Tensor) -> Tensor:
        """Inverse of :meth:`sigma_to_t`: interpolate ``log sigma`` at continuous ``t`` (float64)."""
        t = t.detach().to("cpu", torch.float64).clamp(0, self.sigmas.numel() - 1)
        lo = t.floor().long().clamp(max=self.sigmas.numel() - 2)
        w = t - lo
        return ((1 - w) * self.log_sigmas[lo] + w * self.log_sigmas[lo + 1]).exp()

    def _t_of_level(self, level: float) -> float:
        """:meth:`sigma_to_t` of one level in float64 numbers (the per-step fast path; cached per level)."""
        cache = self.__dict__.setdefault("_t_cache", {})
        t = cache.get(level)
        if t is None:
            ls = self.__dict__.get("_ls_list")
            if ls is None:
                ls = self.__dict__["_ls_list"] = self.log_sigmas.tolist()
            log_sigma = min(max(math.log(level) if level > 0 else -math.inf, ls[0]), ls[-1])
            hi = min(max(bisect.bisect_left(ls, log_sigma), 1), len(ls) - 1)
            lo = hi - 1
            if self.quantize:
                t = float(lo if abs(log_sigma - ls[lo]) <= abs(ls[hi] - log_sigma) else hi)
            else:
                t = lo + min(max((log_sigma - ls[lo]) / (ls[hi] - ls[lo]), 0.0), 1.0)
            if len(cache) < 4096:
                cache[level] = t
        return t

    def _at_level(self, x: Tensor, level: float, cond) -> Tensor | None:
        """The call at one host level with the input scaling and the prediction conversion in numbers of ``x``'s
        precision (IEEE float32 / float64 arithmetic, as the tensor ops round it); None for other dtypes."""
        numbers = self._numbers_of_level(level, x.dtype)
        if numbers is None:
            return None
        t_level, c, s, cc, sc = numbers
        t = torch.full((x.shape[0],), t_level, dtype=x.dtype, device=x.device)
        out = self.net(x * c, t, cond)
        if out.shape != x.shape:
            raise ValueError(f"VP network returned shape {tuple(out.shape)}, expected {tuple(x.shape)}")
        out = out if out.dtype == x.dtype else out.to(x.dtype)
        if self.prediction_type == "epsilon":
            return x - out * s
        if self.prediction_type == "v_prediction":
            return x * cc - out * sc
        return out

    def _numbers_of_level(self, level: float, dtype: torch.dtype) -> tuple[float, ...] | None:
        """``(t, c, sigma, c^2, sigma c)`` of one level as :meth:`_at_level` uses them, computed in numpy scalars of
        ``dtype``'s precision and cached per level and dtype (the same numbers at every step that meets the level
        again, without the scalar arithmetic); None for a dtype without its numpy scalar."""
        cache = self.__dict__.setdefault("_level_cache", {})
        key = (level, dtype)
        numbers = cache.get(key)
        if numbers is None:
            number = _NUMBER.get(dtype)
            if number is None:
                return None
            s = number(level)
            c = number(1) / np.sqrt(number(1) + s * s)
            numbers = (self._t_of_level(level), float(c), float(s), float(c * c), float(s * c))
            if len(cache) < 4096:
                cache[key] = numbers
        return numbers

    def _plan_entries(self, plan: LevelPlan, dtype: torch.dtype) -> list[tuple | None]:
        """``(timestep batch, c, sigma, c^2, sigma c)`` of each level of ``plan`` for the per-step path: the numbers
        of :meth:`_numbers_of_level` as a ``[rows]`` batch and 0-dim host tensors of ``dtype``."""
        nums = [self._numbers_of_level(s, dtype) for s in plan.levels]
        cols = [plan.batches([None if n is None else n[0] for n in nums], dtype)]
        cols += [plan.scalars([None if n is None else n[j] for n in nums], dtype) for j in range(1, 5)]
        return [None if n is None else e for n, e in zip(nums, zip(*cols, strict=True), strict=True)]

    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        tag = getattr(sigma, HOST_LEVEL_ATTR, None)
        if tag is not None and not sigma.requires_grad and x.shape[0] and sigma.numel() == x.shape[0] and \
                tag[1] == (None if sigma.is_inference() else sigma._version):
            # A sampler's tagged batch (host_level's first case) at a level met before: _at_level with its cached
            # numbers, in this frame (the per-step path; benchmarks/pipeline_step_ops.py counts its calls).
            cache = self.__dict__.get("_level_cache")
            numbers = None if cache is None else cache.get((tag[0], x.dtype))
            if numbers is not None:
                t_level, c, s, cc, sc = numbers
                # A LevelPlan's sigma batch: the timestep batch and the factors as 0-dim host tensors for all its
                # levels, made at once (no tensor made per step: a Python number in a product is wrapped into one)
                entry = planned(sigma, ("vp", self, x.dtype), lambda plan: self._plan_entries(plan, x.dtype)) \
                    if sigma.dtype == x.dtype else None
                if entry is not None and entry[0]._version == 0:
                    t, c, s, cc, sc = entry
                else:
                    t = torch.full((x.shape[0],), t_level, dtype=x.dtype, device=x.device)
                out = self.net(x * c, t, cond)
                if out.shape != x.shape:
                    raise ValueError(f"VP network returned shape {tuple(out.shape)}, expected {tuple(x.shape)}")
                out = out if out.dtype == x.dtype else out.to(x.dtype)
                if self.prediction_type == "epsilon":
                    return x - out * s
                if self.prediction_type == "v_prediction":
                    return x * cc - out * sc
                return out
        level = host_level(sigma) if math.prod(sigma.shape) == x.shape[0] else None
        if level is not None:
            out = self._at_level(x, level, cond)
            if out is not None:
                return out
        # Timesteps in float32 at least: half precision would round t = 999 to 1000.
        t = self.sigma_to_t(sigma).to(device=x.device, dtype=torch.promote_types(x.dtype, torch.float32))
        s = append_dims(sigma.to(x.dtype), x.ndim)
        c = 1 / (1 + s**2).sqrt()
        out = self.net(x * c, t, cond)
        if out.shape != x.shape:
            raise ValueError(f"VP network returned shape {tuple(out.shape)}, expected {tuple(x.shape)}")
        out = out.to(x.dtype)
        if self.prediction_type == "epsilon":
            return x - s * out
        if self.prediction_type == "v_prediction":
            return c**2 * x - s * c * out
        return out
