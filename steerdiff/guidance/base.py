"""The guider base: scale checks, null-condition checks, the start/stop window and the doubled batch.

A guider is a denoiser wrapper (docs/methods/guidance.md, "Conventions shared by every guider").
:func:`steerdiff.sample` hands it ``(denoiser, x, sigma, cond)`` at every model evaluation
(:mod:`steerdiff.core.guided`); it returns the guided prediction ``D`` in the denoised (x0) space. Conditional
and null predictions come from ONE call on a doubled batch (:func:`steerdiff.core.guided.cond_and_null`); when the
null branch cannot matter (``w == 1``, a step outside the ``start``/``stop`` window, ``enabled=False``) the
denoiser is called once, on the condition only.

The start/stop window (diffusers' guiders: guidance is on for step indices ``int(start*N) <= i < int(stop*N)``
of an N-step schedule) needs the sampling schedule: :func:`steerdiff.sample` hands it over through
:meth:`Guider.set_schedule` at the start of every trajectory (callers of a guider outside ``sd.sample`` pass
``sigmas=`` at construction or call ``set_schedule`` themselves). The guider turns the
window into a closed sigma interval ``[sigmas[i_stop - 1], sigmas[i_start]]`` and is active for a denoiser call
whose sigma lies inside it. For samplers with one evaluation per step (euler, ddim, ddpm) this is diffusers' rule
exactly; heun's second evaluation of step ``i`` happens at ``sigmas[i + 1]`` and is guided when step ``i + 1``
is.

A model declares that it has no null condition with the attribute ``has_null = False``; guiders then refuse to
run instead of feeding it ``-1`` labels. Unconditional networks (``num_classes == ()``) are refused too.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from ..core.denoiser import Denoiser, null_cond_like
from ..core.guided import cond_and_null
from ..core.sigmas import check_sigmas

# Relative slack on the window's sigma bounds, so that a schedule value that went through float32 (a model's
# sigma tensor) still counts as inside.
_SIGMA_RTOL = 1e-6


def check_scale(scale, name: str = "scale") -> float:
    """A guidance weight: a finite real number >= 0."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"{name} must be finite and >= 0 (w = 1: conditional, w = 0: unconditional), got {scale}")
    return scale


def check_real(value, name: str, lo: float | None = None, hi: float | None = None, open_hi: bool = False) -> float:
    """A finite real number in ``[lo, hi]`` (``[lo, hi)`` with ``open_hi``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    too_high = hi is not None and (value >= hi if open_hi else value > hi)
    if not math.isfinite(value) or (lo is not None and value < lo) or too_high:
        if lo is None and hi is None:
            raise ValueError(f"{name} must be a finite number, got {value}")
        if hi is None:
            raise ValueError(f"{name} must be a finite number >= {lo}, got {value}")
        bounds = f"[{lo}, {hi})" if open_hi else f"[{lo}, {hi}]"
        raise ValueError(f"{name} must be a finite number in {bounds}, got {value}")
    return value


def check_space(space: str) -> str:
    if space not in ("D", "eps"):
        raise ValueError(f"space must be 'D' (denoised / x0 prediction) or 'eps' (noise prediction), got {space!r}")
    return space


def sample_dims(t: Tensor) -> tuple[int, ...]:
    """All non-batch dimensions: every norm, inner product and std is per sample over these (no cross-sample mixing)."""
    return tuple(range(1, t.ndim))


def check_denoiser_has_null(denoiser: Denoiser, who: str) -> None:
    """Refuse models that declare they have no null condition, and unconditional networks."""
    if getattr(denoiser, "has_null", True) is False:
        raise ValueError(
            f"{who} needs the null (unconditional) prediction D(x, sigma, -1), but the denoiser declares "
            "has_null = False (it was not trained with condition dropout); use a model trained with p_uncond > 0"
        )
    num_classes = getattr(denoiser, "num_classes", None)
    if num_classes is not None and tuple(num_classes) == ():
        raise ValueError(f"{who} needs a conditional denoiser, but this one is unconditional (num_classes=())")


def check_cond(cond, x: Tensor, who: str) -> Tensor:
    if cond is None:
        raise ValueError(
            f"{who} needs a condition: pass cond= (an integer tensor [B] or [B, m]; -1 = null). "
            "cond=None means all-null, which leaves nothing to guide towards"
        )
    integer = isinstance(cond, Tensor) and not (cond.dtype.is_floating_point or cond.dtype.is_complex)
    if not integer or cond.dtype == torch.bool:
        got = cond.dtype if isinstance(cond, Tensor) else type(cond).__name__
        raise ValueError(f"cond must be an integer tensor [B] or [B, m] (-1 = null), got {got}")
    if cond.ndim not in (1, 2) or cond.shape[0] != x.shape[0]:
        raise ValueError(f"cond must have shape [B] or [B, m] with B={x.shape[0]}, got {tuple(cond.shape)}")
    return cond


class Guider:
    """Base class of the guiders: ``guide(denoiser, x, sigma, cond) -> D`` and ``reset()``.

    Subclasses implement :meth:`combine` on the conditional and null predictions and may override
    :meth:`_branches` (which predictions a call needs).

    Args:
        scale: guidance weight ``w`` in the D-space convention ``D_u + w (D_c - D_u)`` (docs/methods/guidance.md,
            "Scale conventions"):
            ``w = 1`` is the conditional model, ``w = 0`` the unconditional one. Converters from other
            conventions: :mod:`steerdiff.guidance.conventions`.
        start: fraction of the sampling steps after which guidance starts (diffusers' ``start``).
        stop: fraction of the sampling steps after which guidance stops (diffusers' ``stop``).
        sigmas: the sampling schedule (needed only when ``start > 0`` or ``stop < 1``); or call
            :meth:`set_schedule`.
        enabled: ``False`` turns the guider into the plain conditional model (one evaluation per call).
    """

    name = "guider"

    def __init__(
        self,
        scale: float,
        start: float = 0.0,
        stop: float = 1.0,
        sigmas: Tensor | None = None,
        enabled: bool = True,
    ):
        self.scale = check_scale(scale)
        self.start = check_real(start, "start", 0.0, 1.0, open_hi=True)
        self.stop = check_real(stop, "stop", self.start, 1.0)
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
        self.enabled = enabled
        self._window: tuple[float, float] | None = None  # (sigma_lo, sigma_hi); lo > hi means never active
        if sigmas is not None:
            self.set_schedule(sigmas)

    # --- configuration --------------------------------------------------------------------------------------
    @property
    def windowed(self) -> bool:
        """Whether guidance is limited to part of the schedule."""
        return self.start > 0.0 or self.stop < 1.0

    def set_schedule(self, sigmas: Tensor) -> Guider:
        """Fix the sampling schedule that ``start``/``stop`` refer to (decreasing, ending in 0). Returns self."""
        sig = check_sigmas(sigmas).tolist()
        n = len(sig) - 1
        i_start, i_stop = int(self.start * n), int(self.stop * n)
        if i_stop <= i_start:
            self._window = (math.inf, -math.inf)  # empty window: guidance never runs
        else:
            self._window = (sig[i_stop - 1], sig[i_start])
        return self

    @property
    def config(self) -> dict:
        """Constructor arguments as JSON-serialisable values (the schedule is not part of the config)."""
        return {"scale": self.scale, "start": self.start, "stop": self.stop, "enabled": self.enabled}

    @classmethod
    def from_config(cls, config: dict) -> Guider:
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"

    def reset(self) -> None:
        """Forget per-trajectory state; samplers call this at the start of every trajectory."""

    # --- evaluation -----------------------------------------------------------------------------------------
    def _branches(self) -> str:
        """Which predictions a guided call needs: ``"cond"``, ``"null"`` or ``"both"``."""
        return "cond" if self.scale == 1.0 else "both"

    def _active_rows(self, sigma: Tensor) -> Tensor | bool:
        """True / False for the whole batch, or a ``[B]`` mask when rows disagree (never the case in samplers)."""
        if not self.enabled:
            return False
        if not self.windowed:
            return True
        if self._window is None:
            raise RuntimeError(
                f"{type(self).__name__}(start={self.start}, stop={self.stop}) needs the sampling schedule to place "
                "its window: sample with sd.sample (which passes it), pass sigmas= to the constructor, or call "
                "set_schedule(sigmas) first"
            )
        lo, hi = self._window
        if lo > hi:
            return False
        s = sigma.detach().double()
        mask = (s >= lo * (1 - _SIGMA_RTOL)) & (s <= hi * (1 + _SIGMA_RTOL))
        n_on = int(mask.sum())
        if n_on == mask.numel():
            return True
        return False if n_on == 0 else mask

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor) -> Tensor:
        """The guided prediction ``D`` at ``(x, sigma)`` for condition ``cond`` (``[B]`` or ``[B, m]``)."""
        who = type(self).__name__
        cond = check_cond(cond, x, who)
        active = self._active_rows(sigma)
        branches = self._branches() if active is not False else "cond"
        if branches == "cond":
            return denoiser(x, sigma, cond)
        check_denoiser_has_null(denoiser, who)
        if branches == "null" and active is True:
            # The conditional term vanishes (CFG with w = 0): one evaluation, on the null condition only.
            return denoiser(x, sigma, null_cond_like(cond))
        d_cond, d_null = cond_and_null(denoiser, x, sigma, cond)
        out = self.combine(d_cond, d_null, x, sigma)
        if active is True:
            return out
        return torch.where(_rows(active, out), out, d_cond)

    __call__ = guide

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor) -> Tensor:
        raise NotImplementedError


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(like.device).reshape(-1, *([1] * (like.ndim - 1)))
