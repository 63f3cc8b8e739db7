"""Flow-matching networks as denoisers: the one place where the flow convention is converted
(docs/methods/conventions.md, "Flow-matching models").

A flow (rectified-flow) model sees ``x_t = (1 - t) x0 + t eps`` at time ``t`` in [0, 1] (Lipman et al., ICLR 2023,
"Flow Matching for Generative Modeling"; Liu et al., ICLR 2023, "Flow Straight and Fast"; the convention of SD3,
Esser et al. 2024, "Scaling Rectified Flow Transformers", Sec. 2, and of diffusers' flow transformers). Dividing
by ``1 - t`` gives the EDM form ``x = x_t / (1 - t) = x0 + sigma eps`` with ``sigma = t / (1 - t)``, so for an input
``x`` at noise level ``sigma`` (``t = sigma / (1 + sigma)``, ``x_t = x / (1 + sigma)``):

* ``velocity`` (``v = eps - x0``, SD3 / FLUX / diffusers): ``D = x_t - t v``;
* ``x0``: ``D = x0_net``;
* ``eps``: ``D = (x_t - t eps_net) / (1 - t) = x - sigma eps_net`` (the EDM relation: eps is the same noise).

At ``sigma = inf`` (``t = 1``, pure noise, the first level of :func:`steerdiff.sigmas.flow`) the samplers hand the
denoiser the unit noise itself as ``x``, the limit of ``x / sigma`` and of ``x / (1 + sigma)``: the network sees
``x_t = x`` at ``t = 1`` and ``D = x_t - v`` (velocity) or the network's ``x0``. An eps-predicting network cannot be
evaluated there (``x - sigma eps`` is ``inf - inf``: the noise carries no information about ``x0``), so its range
stops below ``inf`` and a schedule starting there is refused.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from .denoiser import (
    AT_LEAST_FLOAT32,
    HOST_LEVEL_ATTR,
    PLAN_ATTR,
    LevelPlan,
    append_dims,
    host_level,
    planned,
    tagged_level,
)
from .sampling import _takes_three_arguments

FLOW_PREDICTIONS = ("velocity", "x0", "eps")

FlowNetwork = Callable[..., Tensor]
"""``net(x_t, t * t_scale, cond) -> prediction`` (or ``net(x_t, t * t_scale)`` for an unconditional network)."""


class FlowDenoiser(nn.Module):
    """Turn a flow network ``net(x_t, t * t_scale, cond) -> v | x0 | eps`` into a denoiser ``D(x, sigma, cond)``.

    ``t = sigma / (1 + sigma)`` and ``x_t = x / (1 + sigma)`` (at ``sigma = inf``: ``t = 1`` and ``x_t = x``, the unit
    noise); ``D = x_t - t v`` for velocity prediction (see the module docstring for the others).

    The network is called positionally. Whether it takes a condition is decided once, from its signature (as
    :func:`steerdiff.core.sampling.check_denoiser` does): a network that accepts three arguments is always called
    ``net(x_t, t, cond)`` (``cond=None`` for an unconditional call), one that accepts two is called ``net(x_t, t)``
    and refuses a condition. Wrap a network with keyword inputs (a diffusers transformer) in a function, e.g.
    ``lambda x_t, t, cond: transformer(hidden_states=x_t, timestep=t, ...).sample``.

    Args:
        net: the flow network, an ``nn.Module`` (held as a submodule, so ``.to()`` and ``.parameters()`` reach it)
            or any callable.
        prediction: what the network predicts: ``"velocity"`` (``v = eps - x0``), ``"x0"`` or ``"eps"``.
        t_scale: the network's timestep is ``t * t_scale``: 1000 for diffusers' flow transformers (SD3, FLUX), 1 for
            ``facebookresearch/flow_matching`` models.
        sample_shape: per-sample shape the samplers check noise against; default the network's ``sample_shape``.

    Attributes:
        sigma_range: ``(0, inf)`` for velocity and x0 prediction (evaluable at pure noise), ``(0, float max)`` for
            eps prediction; :func:`steerdiff.sample` refuses schedules above it.
        data_scale: 1, the scale of the data flow models are trained on (unit-variance latents): a run from noise
            that starts at a finite sigma below 10 warns (a t-grid passed as sigmas).
        sample_shape, num_classes: forwarded from ``net`` when it has them.

    Raises:
        ValueError: ``prediction`` is not one of :data:`FLOW_PREDICTIONS`; ``t_scale`` is not a positive finite
            number.
        TypeError: ``net`` is not callable, or cannot be called with two or three positional arguments.
    """

    data_scale = 1.0

    def __init__(self, net: FlowNetwork, prediction: str = "velocity", t_scale: float = 1000.0,
                 sample_shape: tuple[int, ...] | None = None):
        super().__init__()
        if not callable(net):
            raise TypeError(f"net must be a callable flow network net(x_t, t, cond), got {type(net).__name__}")
        if prediction not in FLOW_PREDICTIONS:
            raise ValueError(f"prediction must be one of {FLOW_PREDICTIONS}, got {prediction!r}")
        if isinstance(t_scale, bool) or not isinstance(t_scale, (int, float)) or not (
                math.isfinite(t_scale) and t_scale > 0):
            raise ValueError(f"t_scale must be a positive finite number (1000 for diffusers transformers, 1 for "
                             f"flow_matching models), got {t_scale!r}")
        if type(net).__module__.startswith("diffusers."):
            raise TypeError(f"net is a diffusers {type(net).__name__}, whose inputs are keywords (hidden_states, "
                            "timestep, encoder_hidden_states, ...): wrap it, e.g. FlowDenoiser(lambda x_t, t, cond: "
                            "net(hidden_states=x_t, timestep=t, encoder_hidden_states=..., ...).sample)")
        target = net.forward if isinstance(net, nn.Module) else net
        self.takes_cond = _takes_three_arguments(target)
        if not self.takes_cond and not _takes_two_arguments(target):
            raise TypeError(f"net must accept (x_t, t) or (x_t, t, cond) positionally, but "
                            f"{getattr(net, '__name__', type(net).__name__)}{inspect.signature(target)} does not")
        self.net = net
        self.prediction = prediction
        self.t_scale = float(t_scale)
        shape = sample_shape if sample_shape is not None else getattr(net, "sample_shape", None)
        if shape is not None:
            self.sample_shape: tuple[int, ...] = tuple(int(n) for n in shape)
        if hasattr(net, "num_classes"):
            self.num_classes: tuple[int, ...] = tuple(net.num_classes)

    @property
    def sigma_range(self) -> tuple[float, float]:
        """``(0, inf)``, or ``(0, float max)`` for eps prediction (which has no limit at ``sigma = inf``)."""
        return 0.0, (torch.finfo(torch.float64).max if self.prediction == "eps" else math.inf)

    def forward(self, x: Tensor, sigma: Tensor | float, cond: Tensor | None = None) -> Tensor:
        """``E[x0 | x]`` at noise levels ``sigma: [B]`` (a scalar is broadcast), ``sigma >= 0`` (``inf`` allowed:
        then ``x`` is the unit noise)."""
        entry = getattr(sigma, PLAN_ATTR, None)  # (plan, index): a LevelPlan's sigma batch, the samplers' per step
        if entry is not None:
            plan = entry[0]
            made = plan.memo.get(self)  # (timestep batch, keep, t) of every level, once the path below made them
            if made is not None and sigma._version == 0 and x.dtype is plan.dtype and x.shape[0] == plan.rows and \
                    x.device == plan.device and not sigma.requires_grad and (cond is None or self.takes_cond):
                # What the checks and the numbers below give for such a batch (the same tensors and ops), without
                # them: the loop's own work per step (issue 36, benchmarks/pipeline_overhead.py's step gap).
                planned_entry = made[entry[1]]
                if planned_entry is not None and planned_entry[0]._version == 0:
                    timestep, keep, t = planned_entry
                    x_t = x * keep
                    out = self.net(x_t, timestep, cond) if self.takes_cond else self.net(x_t, timestep)
                    if isinstance(out, Tensor) and out.shape == x.shape:
                        out = out if out.dtype == x.dtype else out.to(x.dtype)
                        if self.prediction == "velocity":
                            return x_t - t * out
                        if self.prediction == "x0":
                            return out
                        return x - append_dims(sigma, x.ndim).to(x.dtype) * out  # eps (finite: no inf level here)
                    return self._bad_output(out, x, timestep)
        if not isinstance(x, Tensor) or x.ndim < 1:
            raise ValueError(f"x must be a tensor [B, *shape], got {type(x).__name__}")
        # t in float32 at least, as VPDenoiser's timesteps (a table lookup: promote_types is a dispatched op)
        dtype = AT_LEAST_FLOAT32.get(x.dtype) or torch.promote_types(x.dtype, torch.float32)
        if not (isinstance(sigma, Tensor) and sigma.dtype == dtype and sigma.device == x.device):
            sigma = torch.as_tensor(sigma, device=x.device).to(dtype)
        if sigma.ndim == 0:
            sigma = sigma.expand(x.shape[0])
        if sigma.shape != (x.shape[0],):
            raise ValueError(f"sigma must be a scalar or have shape [B]=[{x.shape[0]}], got {tuple(sigma.shape)}")
        if cond is not None and not self.takes_cond:
            raise ValueError("cond was given but the flow network takes (x_t, t) only (an unconditional network); "
                             "pass cond=None or a network net(x_t, t, cond)")
        uniform = None
        tag = getattr(sigma, HOST_LEVEL_ATTR, None)
        if tag is not None and sigma.dtype == x.dtype and not sigma.requires_grad and x.shape[0] and \
                tag[1] == (None if sigma.is_inference() else sigma._version):
            # A sampler's tagged batch at a level met before: _uniform_time_and_keep's numbers from its cache,
            # without its calls (the per-step path; benchmarks/pipeline_step_ops.py counts them).
            uniform = _UNIFORM_CACHE.get((tag[0], x.dtype, self.t_scale))
        if uniform is None:
            uniform = _uniform_time_and_keep(sigma, x.dtype, self.t_scale)
        if uniform is not None:  # one finite level on the host: t and keep as numbers (x_t = keep * x)
            t, keep, timestep = uniform
            at_inf = None
            # A LevelPlan's sigma batch: the timestep batch and t, keep as 0-dim host tensors for all its levels,
            # made at once (no tensor made per step: a Python number in a product is wrapped into a new one)
            entry = None if tag is None else planned(sigma, self, lambda plan: _plan_entries(plan, dtype, self.t_scale))
            if entry is not None and entry[0]._version == 0:
                timestep, keep, t = entry
                x_t = x * keep
            else:
                x_t = x * keep
                timestep = torch.full((x.shape[0],), timestep, dtype=dtype, device=x.device)
        else:
            t, keep, at_inf = _flow_time_and_keep(sigma)  # x_t = keep * x (x is eps at inf)
            per_sample = (x.shape[0],) + (1,) * (x.ndim - 1)  # [B] -> [B, 1, ..., 1]
            timestep = t * self.t_scale
            t = _cast(t, x.dtype).view(per_sample)
            x_t = x * _cast(keep, x.dtype).view(per_sample)
        out = self.net(x_t, timestep, cond) if self.takes_cond else self.net(x_t, timestep)
        if not isinstance(out, Tensor) or out.shape != x.shape:
            return self._bad_output(out, x, timestep)
        out = out if out.dtype == x.dtype else out.to(x.dtype)
        if self.prediction == "velocity":
            return x_t - t * out
        if self.prediction == "x0":
            return out
        # eps: (x_t - t eps) / (1 - t) = x - sigma eps, without dividing by 1 - t (which rounds to 0 near t = 1)
        if at_inf is not None and bool(at_inf.any()):
            raise ValueError("an eps-predicting flow network cannot be evaluated at sigma = inf (t = 1): "
                             "x0 = (x_t - t eps) / (1 - t) is 0/0 there; start the schedule at a finite sigma")
        return x - append_dims(sigma, x.ndim).to(x.dtype) * out

    def _bad_output(self, out, x: Tensor, timestep: Tensor):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"flow network returned shape {got}, expected the shape of x_t {tuple(x.shape)} "
                         f"(prediction={self.prediction!r}, t in [{float(timestep.min()) / self.t_scale:.6g}, "
                         f"{float(timestep.max()) / self.t_scale:.6g}])")

    def extra_repr(self) -> str:
        return f"prediction={self.prediction!r}, t_scale={self.t_scale:g}"


def _cast(v: Tensor, dtype: torch.dtype) -> Tensor:
    """``v.to(dtype)``, without the call when ``v`` has it already (the per-step case)."""
    return v if v.dtype == dtype else v.to(dtype)


_NUMBER = {torch.float32: np.float32, torch.float64: np.float64}


def _uniform_time_and_keep(sigma: Tensor, dtype: torch.dtype, t_scale: float) -> tuple[float, float, float] | None:
    """``(t, keep, t * t_scale)`` as numbers when every entry of ``sigma`` is one finite level known on the host
    (:func:`~steerdiff.core.denoiser.host_level`: a sampler's tagged batch on any device, or a host tensor) and ``x``
    (of ``dtype``) is computed in ``sigma``'s precision; else None. The samplers' case: a tensor op costs more
    than the arithmetic, so the three are computed in numpy scalars of that precision, rounded as the tensor ops
    of :func:`_flow_time_and_keep` round them (``x * keep`` with a number equals ``x * keep`` with a tensor of
    that value)."""
    if sigma.dtype != dtype or dtype not in _NUMBER:
        return None
    s = host_level(sigma)  # a tagged sampler batch on any device, or a uniform host tensor
    if s is None or not math.isfinite(s):
        return None
    return _numbers_of_level(s, dtype, t_scale)


def _plan_entries(plan: LevelPlan, dtype: torch.dtype, t_scale: float) -> list[tuple | None]:
    """``(timestep batch, keep, t)`` of each level of ``plan`` for :meth:`FlowDenoiser.forward`: the numbers of
    :func:`_numbers_of_level` (written out here: one call for all levels) as a ``[rows]`` batch and 0-dim host
    tensors of ``dtype``; None at ``inf`` (the tensor path)."""
    number = _NUMBER[dtype]
    one, scale = number(1.0), number(t_scale)
    nums = []
    for s in plan.levels:
        out = _UNIFORM_CACHE.get((s, dtype, t_scale))
        if out is None and math.isfinite(s):
            v = number(s)
            one_plus = v + one
            t = v / one_plus
            out = (float(t), float(one / one_plus), float(t * scale))
        nums.append(out)
    timesteps = plan.batches([None if n is None else n[2] for n in nums], dtype)
    keeps = plan.scalars([None if n is None else n[1] for n in nums], dtype)
    ts = plan.scalars([None if n is None else n[0] for n in nums], dtype)
    return [None if n is None else e for n, e in zip(nums, zip(timesteps, keeps, ts, strict=True), strict=True)]


def _numbers_of_level(s: float, dtype: torch.dtype, t_scale: float) -> tuple[float, float, float]:
    """:func:`_uniform_time_and_keep`'s numbers of the finite level ``s`` (cached)."""
    key = (s, dtype, t_scale)
    out = _UNIFORM_CACHE.get(key)  # the same numbers for a level met again (every call of a repeated schedule)
    if out is None:
        number = _NUMBER[dtype]
        s, one = number(s), number(1.0)
        one_plus = s + one
        t = s / one_plus
        out = (float(t), float(one / one_plus), float(t * number(t_scale)))
        if len(_UNIFORM_CACHE) < 4096:
            _UNIFORM_CACHE[key] = out
    return out


_UNIFORM_CACHE: dict[tuple[float, torch.dtype, float], tuple[float, float, float]] = {}


def _flow_time_and_keep(sigma: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """``t = sigma / (1 + sigma)`` and ``keep = 1 / (1 + sigma)``, both 1 where ``sigma = inf``, and the mask of
    those levels (None when none is infinite and no mask was needed).

    This runs once per denoiser call, so it keeps to few tensor ops (the per-step cost of a pipeline's loop); the
    values are the same on every path. A host tensor without a gradient (the samplers' case on the CPU) is read on
    the host: with no infinite level, three ops. On an accelerator the mask is applied without reading it back (no
    device sync): ``inf / inf = nan`` and ``1 / inf = 0`` are computed there and overwritten. With a gradient to
    ``sigma``, ``inf`` is kept out of both branches first, so that no ``nan`` reaches the gradient.
    """
    if sigma.requires_grad:
        at_inf = torch.isinf(sigma)
        finite = torch.where(at_inf, torch.zeros_like(sigma), sigma)  # keeps inf / inf out of either branch
        t = torch.where(at_inf, torch.ones_like(sigma), finite / (1 + finite))
        keep = torch.where(at_inf, torch.ones_like(sigma), 1 / (1 + finite))
        return t, keep, at_inf
    one_plus = sigma + 1
    t = torch.div(sigma, one_plus)
    keep = one_plus.reciprocal_()  # 1 / (1 + sigma), as Tensor.__rdiv__ computes it
    level = tagged_level(sigma)  # a sampler's batch: its one level, known on the host
    if level is not None:
        if not math.isinf(level):
            return t, keep, None
    elif sigma.device.type == "cpu":
        levels = sigma.tolist()
        if math.inf not in levels and -math.inf not in levels:
            return t, keep, None
    at_inf = torch.isinf(sigma)
    return t.masked_fill_(at_inf, 1.0), keep.masked_fill_(at_inf, 1.0), at_inf


def _takes_two_arguments(fn) -> bool:
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        return False
    except ValueError:
        return True
    return True
