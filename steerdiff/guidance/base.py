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

The scale is one number or one per sample (docs/methods/guidance.md, "Per-sample scales"): a 1-D tensor (or list)
``[B]`` whose row ``b`` guides sample ``b``, so one batch can sweep several scales. Row ``b`` of such a batch is the
row ``b`` of a run at the scalar ``scale[b]``; only an all-ones scale skips the null branch.

``sd.sample`` tells the guider which sampler step an evaluation belongs to (``guide(..., step=i)``; Heun's two
evaluations of step ``i`` share it): stateful guiders (APG's momentum) advance once per step on every sampler.
``step=None`` (a direct call) counts every call as a new step.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.denoiser import Denoiser, host_level, null_cond_like
from ..core.guided import cond_and_null
from ..core.sigmas import check_sigmas

# Relative slack on the window's sigma bounds, so that a schedule value that went through float32 (a model's
# sigma tensor) still counts as inside.
_SIGMA_RTOL = 1e-6


Scale = float | Tensor
"""A guidance weight: one float, or a float64 tensor ``[B]`` with one weight per sample."""

_SCALE_FORM = "a real number or a 1-D tensor / list with one real number per sample"


def check_scale(scale, name: str = "scale", per_sample: bool = False) -> Scale:
    """A guidance weight: a finite real number >= 0, or with ``per_sample`` also one per sample.

    Per-sample weights (a 1-D tensor, list or tuple ``[B]``, B >= 1) come back as a float64 tensor on the input's
    device; a 0-d tensor counts as a number. Raises TypeError for a non-number (bool, str, complex) and ValueError
    for a NaN, infinite or negative weight, an empty list or a tensor of more than one dimension, naming ``name``.
    """
    if isinstance(scale, Tensor) and scale.ndim == 0 and not (scale.dtype == torch.bool or scale.is_complex()):
        scale = scale.item()
    array_like = isinstance(scale, (Tensor, Sequence)) or hasattr(scale, "__array__")  # numpy arrays too
    if per_sample and array_like and not isinstance(scale, (str, bytes, numbers.Real)):
        return _check_scale_rows(scale, name)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        form = _SCALE_FORM if per_sample else "a real number"
        raise TypeError(f"{name} must be {form}, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"{name} must be finite and >= 0 (w = 1: conditional, w = 0: unconditional), got {scale}")
    return scale


def _check_scale_rows(scale, name: str) -> Tensor:
    if not isinstance(scale, (Tensor, Sequence)):
        try:
            scale = torch.as_tensor(scale)
        except (TypeError, ValueError, RuntimeError) as err:  # e.g. a numpy array of strings
            raise TypeError(f"{name} must be {_SCALE_FORM}, got {type(scale).__name__} ({err})") from None
    if isinstance(scale, Tensor):
        if scale.dtype == torch.bool or scale.is_complex():
            raise TypeError(f"{name} must be {_SCALE_FORM}, got a tensor of dtype {scale.dtype}")
        rows = scale.detach().to(torch.float64)
    else:
        bad = [v for v in scale if isinstance(v, bool) or not isinstance(v, numbers.Real)]
        if bad:
            raise TypeError(f"{name} must be {_SCALE_FORM}, got an entry of type {type(bad[0]).__name__}")
        rows = torch.tensor([float(v) for v in scale], dtype=torch.float64)
    if rows.ndim != 1 or rows.numel() == 0:
        raise ValueError(f"{name} per sample must be a non-empty 1-D tensor [B], got shape {tuple(rows.shape)}")
    bad_rows = ~torch.isfinite(rows) | (rows < 0)
    if bool(bad_rows.any()):
        i = int(bad_rows.nonzero()[0, 0])
        raise ValueError(f"{name} must be finite and >= 0 in every row (w = 1: conditional, w = 0: unconditional), "
                         f"got {float(rows[i])} in row {i}")
    return rows


_HOST_ROWS = "_steerdiff_host_rows"
_ON_DEVICE = "_steerdiff_on_device"


def scale_host_rows(scale: Tensor) -> tuple[float, ...]:
    """Per-sample weights as host numbers, read once per weights tensor (kept on it): the per-step tests of a
    guider (:func:`scale_is`) then read no tensor, which on an accelerator would synchronise it every step."""
    rows = getattr(scale, _HOST_ROWS, None)
    if rows is None:
        rows = tuple(scale.tolist())
        setattr(scale, _HOST_ROWS, rows)
    return rows


def scale_is(scale: Scale, value: float) -> bool:
    """Whether every row of ``scale`` equals ``value`` (no read of a tensor after the first call)."""
    return scale == value if isinstance(scale, float) else all(v == value for v in scale_host_rows(scale))


def scale_rows(scale: Scale, like: Tensor, name: str = "scale", dtype: torch.dtype | None = None) -> float | Tensor:
    """``scale`` ready to multiply a batch ``like`` ``[B, *shape]``: a float as it is, per-sample weights as
    ``[B, 1, ..., 1]`` in ``dtype`` (default ``like``'s) on ``like``'s device.

    Raises:
        ValueError: per-sample weights whose length is not the batch size B.
    """
    if isinstance(scale, float):
        return scale
    if scale.shape[0] != like.shape[0]:
        raise ValueError(f"{name} has {scale.shape[0]} per-sample weights but the batch has {like.shape[0]} rows: "
                         f"give one weight per sample (shape [{like.shape[0]}]) or a single number")
    key = (like.device, dtype or like.dtype, like.ndim)
    cache = getattr(scale, _ON_DEVICE, None)
    if cache is None:
        cache = {}
        setattr(scale, _ON_DEVICE, cache)
    rows = cache.get(key)
    if rows is None:  # one copy per device, dtype and rank: no host-to-device copy (a stream sync) per step
        rows = cache[key] = scale.to(device=key[0], dtype=key[1]).reshape(-1, *([1] * (like.ndim - 1)))
    return rows


def scale_config(scale: Scale) -> float | list[float]:
    """``scale`` as a JSON value: a float, or a list of per-sample floats."""
    return scale if isinstance(scale, float) else scale.tolist()


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


def check_x_sigma(x, sigma, who: str) -> None:
    """``x`` a tensor ``[B, *shape]`` and ``sigma`` a floating-point tensor ``[B]`` (one noise level per row)."""
    if not isinstance(x, Tensor) or x.ndim < 1:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{who}: x must be a tensor [B, *shape], got {got}")
    if not isinstance(sigma, Tensor) or sigma.shape != (x.shape[0],) or not sigma.is_floating_point():
        got = f"{tuple(sigma.shape)} {sigma.dtype}" if isinstance(sigma, Tensor) else type(sigma).__name__
        raise ValueError(f"{who}: sigma must be a floating-point tensor [B] with B={x.shape[0]} (one noise level "
                         f"per row, as sd.sample passes it), got {got}")


def check_options(cls: type, args: tuple, options: dict, who: str) -> None:
    """Refuse options the constructor of ``cls`` does not take, listing those it does (before building anything)."""
    try:
        inspect.signature(cls).bind(*args, **options)
    except TypeError as err:
        accepted = [n for n, p in inspect.signature(cls).parameters.items()
                    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        raise TypeError(f"{who}: {err}; it takes {accepted}") from None


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


def window_rows(window: tuple[float, float], sigma: Tensor) -> Tensor | bool:
    """Whether the levels ``sigma [B]`` lie in the closed sigma ``window`` ``(lo, hi)`` (``lo > hi``: empty): True /
    False for the whole batch, or a ``[B]`` mask when rows disagree. A sampler's batch carries its one level on the
    host (:func:`steerdiff.core.host_level`): then no value of the tensor is read."""
    lo, hi = window
    if lo > hi:
        return False
    level = host_level(sigma)
    if level is not None:
        return lo * (1 - _SIGMA_RTOL) <= level <= hi * (1 + _SIGMA_RTOL)
    s = sigma.detach().double()
    mask = (s >= lo * (1 - _SIGMA_RTOL)) & (s <= hi * (1 + _SIGMA_RTOL))
    n_on = int(mask.sum())
    if n_on == mask.numel():
        return True
    return False if n_on == 0 else mask


class Guider:
    """Base class of the guiders: ``guide(denoiser, x, sigma, cond) -> D`` and ``reset()``.

    Subclasses implement :meth:`combine` on the conditional and null predictions and may override
    :meth:`_branches` (which predictions a call needs).

    Args:
        scale: guidance weight ``w`` in the D-space convention ``D_u + w (D_c - D_u)`` (docs/methods/guidance.md,
            "Scale conventions"):
            ``w = 1`` is the conditional model, ``w = 0`` the unconditional one. Converters from other
            conventions: :mod:`steerdiff.guidance.conventions`. A 1-D tensor or list ``[B]`` gives one weight per
            sample (its length must be the batch size at every call).
        start: fraction of the sampling steps after which guidance starts (diffusers' ``start``).
        stop: fraction of the sampling steps after which guidance stops (diffusers' ``stop``).
        sigmas: the sampling schedule (needed only when ``start > 0`` or ``stop < 1``); or call
            :meth:`set_schedule`.
        enabled: ``False`` turns the guider into the plain conditional model (one evaluation per call).
    """

    name = "guider"
    _combine_takes_step = True  # set per subclass from its combine() signature (__init_subclass__)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Subclasses written before the step index existed implement combine(d_cond, d_null, x, sigma).
        cls._combine_takes_step = "step" in inspect.signature(cls.combine).parameters

    def __init__(
        self,
        scale: float | Tensor | Sequence[float],
        start: float = 0.0,
        stop: float = 1.0,
        sigmas: Tensor | None = None,
        enabled: bool = True,
    ):
        self.scale = check_scale(scale, per_sample=True)
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
        return {"scale": scale_config(self.scale), "start": self.start, "stop": self.stop, "enabled": self.enabled}

    @classmethod
    def from_config(cls, config: dict) -> Guider:
        """The guider of a :attr:`config` dict (a mapping of constructor arguments)."""
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict of {cls.__name__} arguments (its .config), got "
                            f"{type(config).__name__}")
        check_options(cls, (), config, f"{cls.__name__}.from_config")
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"

    def reset(self) -> None:
        """Forget per-trajectory state; samplers call this at the start of every trajectory."""

    # --- evaluation -----------------------------------------------------------------------------------------
    def _branches(self) -> str:
        """Which predictions a guided call needs: ``"cond"``, ``"null"`` or ``"both"``."""
        return "cond" if scale_is(self.scale, 1.0) else "both"

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
        return window_rows(self._window, sigma)

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor, step: int | None = None) -> Tensor:
        """The guided prediction ``D`` at ``(x, sigma)`` for condition ``cond`` (``[B]`` or ``[B, m]``).

        ``step`` is the index of the sampler step this evaluation belongs to (``sd.sample`` passes it; several
        evaluations of one step share it); ``None`` counts the call as a new step.
        """
        who = type(self).__name__
        check_x_sigma(x, sigma, who)
        cond = check_cond(cond, x, who)
        scale_rows(self.scale, x)  # a per-sample scale must match the batch, whatever branch runs
        active = self._active_rows(sigma)
        branches = self._branches() if active is not False else "cond"
        if branches == "cond":
            return denoiser(x, sigma, cond)
        check_denoiser_has_null(denoiser, who)
        if branches == "null" and active is True:
            # The conditional term vanishes (CFG with w = 0): one evaluation, on the null condition only.
            return denoiser(x, sigma, null_cond_like(cond))
        d_cond, d_null = cond_and_null(denoiser, x, sigma, cond)
        if self._combine_takes_step:
            out = self.combine(d_cond, d_null, x, sigma, step=step)
        else:
            out = self.combine(d_cond, d_null, x, sigma)
        if isinstance(self.scale, Tensor):
            # Rows at w = 1 are the conditional model exactly, as a scalar w = 1 is (an eps-space round trip or a
            # rescale factor would otherwise leave an ulp).
            if any(v == 1.0 for v in scale_host_rows(self.scale)):
                out = torch.where(_unit_rows(self.scale, out), d_cond, out)
        if active is True:
            return out
        return torch.where(_rows(active, out), out, d_cond)

    __call__ = guide

    _fixed_branches = False  # a subclass's own _branches() depends on its configuration alone (see direct_combiner)

    def direct_combiner(self):
        """What :meth:`guide` reduces to at every call of a sampler's trajectory, when that is one rule: the
        combiner ``f(d_cond, d_null, x, sigma, step)`` of the conditional and null predictions of one doubled batch
        (:func:`steerdiff.core.guided.cond_and_null`); None when a call may do anything else.

        That is the case for a guider that keeps :meth:`guide` and :meth:`_active_rows` as they are here, is enabled
        on the whole schedule (no ``start`` / ``stop`` window), has one scalar weight and needs both predictions
        (``_branches() == "both"``, which depends on the configuration alone: the base rule, or a subclass's that
        sets ``_fixed_branches``). :class:`steerdiff.core.guided.GuidedDenoiser` then calls it directly after the
        trajectory's first call (which ran :meth:`guide` and its checks), skipping the per-call checks and the
        dispatch (docs/methods/guidance.md, "Conventions shared by every guider"); the result is the same, bit for
        bit.
        """
        cls = type(self)
        if cls.guide is not Guider.guide or cls._active_rows is not Guider._active_rows:
            return None
        if cls._branches is not Guider._branches and not cls._fixed_branches:
            return None
        if not self.enabled or self.windowed or not isinstance(self.scale, float) or self._branches() != "both":
            return None
        if self._combine_takes_step:
            return self.combine
        combine = self.combine
        return lambda d_cond, d_null, x, sigma, step=None: combine(d_cond, d_null, x, sigma)

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor, step: int | None = None) -> Tensor:
        """The guided ``D`` from the conditional and null predictions (``step``: as in :meth:`guide`)."""
        raise NotImplementedError


def _unit_rows(scale: Tensor, like: Tensor) -> Tensor:
    """The mask ``scale == 1`` as ``[B, 1, ..., 1]`` on ``like``'s device, made once per device and rank."""
    cache = getattr(scale, _ON_DEVICE, None)
    if cache is None:
        cache = {}
        setattr(scale, _ON_DEVICE, cache)
    key = ("unit", like.device, like.ndim)
    if key not in cache:
        cache[key] = _rows(scale == 1.0, like)
    return cache[key]


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(like.device).reshape(-1, *([1] * (like.ndim - 1)))
