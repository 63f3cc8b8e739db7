"""Dynamical Diffusion (DyDiff; Guo et al., "Dynamical Diffusion: Learning Temporal Dynamics with Diffusion Models",
ICLR 2025): temporal mixing of the diffused sequence, as a denoiser wrapper (docs/methods/dydiff.md "What it does"
and "API").

A sequence ``x: [B, S, *frame]`` (frames on axis 1, context first) is diffused as ``x_sigma = M(theta_bar) (x0 +
sigma eps)``, where ``M`` is the lower-triangular ``S x S`` mixing operator on the frame axis,
``mix(v)[0] = v[0]``, ``mix(v)[s] = sqrt(1 - theta_bar) mix(v)[s-1] + sqrt(theta_bar) v[s]``, and
``theta_bar(sigma) = 1 - r sigma^2 / (1 + sigma^2)`` (the ``cosine-r`` schedule in EDM form). The network predicts
``E[M x0 | x_sigma]``. DyDiff's DDIM loop is exactly ordinary sampling of ``y = M^-1 x`` with the wrapped denoiser
``D_y(y) = M^-1 D~(M y)``: :class:`DyDiffDenoiser`. Every steerdiff sampler then runs unchanged; the paper samples with
deterministic DDIM only, so Heun (the default of :func:`forecast`) and stochastic samplers are extensions beyond the
paper. ``r = 0`` gives ``M = I``: the standard conditional diffusion baseline.

Condition format: the clean context frames ``[B, n_context, *frame]`` as a
:class:`steerdiff.models.FrameContext` (what :func:`steerdiff.sample` accepts as a structured condition), a plain
float tensor of that shape (direct calls), or None (no context).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from ..core import sample as core_sample
from ..core import sigmas as core_sigmas
from ..core.noise import randn
from ..models.frames import FrameContext, as_frame_context
from ..models.io import build_model, load, model_spec, register_model

THETA_MIN = 1e-3  # unmix divides by sqrt(theta_bar); r -> 1 would reach 8e-4 at the top of the schedule


def check_r(r: float) -> float:
    """``r`` as a float in ``[0, 1]`` (the mixing ratio; 0 = the standard baseline), else a ValueError naming it."""
    if isinstance(r, bool) or not isinstance(r, numbers.Real) or not (0.0 <= float(r) <= 1.0):
        raise ValueError(f"r must be a number in [0, 1] (0 = no temporal mixing), got {r!r}")
    return float(r)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    # mixing runs in float32 at least (float64 states of a sampler stay float64).
    return torch.float64 if dtype == torch.float64 else torch.float32


def theta_bar(sigma: Tensor | float, r: float) -> Tensor:
    """``theta_bar(sigma) = 1 - r sigma^2 / (1 + sigma^2)``, clamped to ``>= 1e-3``; ``sigma = inf``
    gives ``1 - r``.

    Args:
        sigma: noise levels ``[B]`` (or a scalar), ``>= 0``.
        r: mixing ratio in ``[0, 1]``.
    """
    r = check_r(r)
    sigma = torch.as_tensor(sigma)
    sigma = sigma.to(_work_dtype(sigma.dtype) if sigma.is_floating_point() else torch.float32)
    if bool((sigma < 0).any()) or bool(sigma.isnan().any()):
        raise ValueError("sigma must be >= 0 (noise levels)")
    frac = 1.0 / (1.0 + sigma.pow(-2))  # sigma^2 / (1 + sigma^2), finite at 0 and inf
    return (1.0 - r * frac).clamp_min(THETA_MIN)


def _coefficients(theta: Tensor, v: Tensor) -> tuple[Tensor, Tensor, torch.dtype]:
    if v.ndim < 2:
        raise ValueError(f"v must be a sequence [B, S, *frame] (frames on axis 1), got shape {tuple(v.shape)}")
    theta = torch.as_tensor(theta, device=v.device)
    if theta.ndim == 0:
        theta = theta.expand(v.shape[0])
    if theta.shape != (v.shape[0],):
        raise ValueError(f"theta_bar must be a scalar or have shape [B]=[{v.shape[0]}], got {tuple(theta.shape)}")
    dtype = _work_dtype(v.dtype)
    theta = theta.to(dtype)
    if bool((theta <= 0).any()) or bool((theta > 1).any()):
        raise ValueError("theta_bar must lie in (0, 1]")
    shape = (v.shape[0],) + (1,) * (v.ndim - 2)  # one coefficient per batch element, broadcast over a frame
    return theta.sqrt().reshape(shape), (1.0 - theta).sqrt().reshape(shape), dtype


def mix(v: Tensor, theta: Tensor | float) -> Tensor:
    """``M(theta_bar) v`` on the frame axis (the official code's ``get_emas``): ``out[0] = v[0]``,
    ``out[s] = b out[s-1] + a v[s]`` with ``a = sqrt(theta_bar)``, ``b = sqrt(1 - theta_bar)``; one ``theta_bar`` per
    batch element.

    Args:
        v: ``[B, S, *frame]``.
        theta: ``theta_bar``, a scalar or ``[B]``, in ``(0, 1]``.

    Returns:
        ``[B, S, *frame]`` in ``v``'s dtype (computed in float32, or float64 for float64 input).
    """
    a, b, dtype = _coefficients(theta, v)
    w = v.to(dtype)
    rows = [w[:, 0]]
    for s in range(1, w.shape[1]):
        rows.append(b * rows[-1] + a * w[:, s])
    return torch.stack(rows, dim=1).to(v.dtype)


def unmix(w: Tensor, theta: Tensor | float) -> Tensor:
    """``M(theta_bar)^-1 w`` without forming the inverse (the official code's ``get_reverse_emas``): ``out[0] = w[0]``,
    ``out[s] = (w[s] - b w[s-1]) / a``. Arguments as :func:`mix`."""
    a, b, dtype = _coefficients(theta, w)
    u = w.to(dtype)
    rows = [u[:, 0]] + [(u[:, s] - b * u[:, s - 1]) / a for s in range(1, u.shape[1])]
    return torch.stack(rows, dim=1).to(w.dtype)


def mixing_matrix(theta: float | Tensor, frames: int) -> Tensor:
    """The explicit ``S x S`` matrix ``M(theta_bar)`` (float64; for tests and analysis): ``M[s, 0] = b^s``,
    ``M[s, j] = a b^(s-j)`` for ``1 <= j <= s``. A ``[B]`` theta gives ``[B, S, S]``."""
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise ValueError(f"frames must be an int >= 1, got {frames!r}")
    theta = torch.as_tensor(theta, dtype=torch.float64)
    a, b = theta.sqrt()[..., None, None], (1.0 - theta).sqrt()[..., None, None]
    s = torch.arange(frames, dtype=torch.float64)
    power = (s[:, None] - s[None, :]).clamp_min(0)
    m = a * b**power * (s[:, None] >= s[None, :])
    m[..., :, 0] = b[..., 0] ** s  # column 0: b^s
    return m


def _check_n_context(n_context, frames: int | None) -> int:
    if isinstance(n_context, bool) or not isinstance(n_context, int):
        raise ValueError(f"n_context must be an int (number of context frames), got {n_context!r}")
    if frames is not None and not 1 <= n_context < frames:
        raise ValueError(f"n_context must lie in [1, S) = [1, {frames}) (context frames of an S-frame sequence), "
                         f"got {n_context}")
    if n_context < 1:
        raise ValueError(f"n_context must be >= 1, got {n_context}")
    return n_context


@register_model()
class DyDiffDenoiser(nn.Module):
    """The DyDiff denoiser of ``y = M^-1 x``: ``D_y(y, sigma, cond) = unmix(net(mix(y, tb), sigma, cond), tb)`` with
    ``tb = theta_bar(sigma, r)`` (docs/methods/dydiff.md "What it does"). ``y`` follows the standard forward process
    ``y = x0 + sigma eps``, so any steerdiff sampler, guider or ensemble runs on it unchanged.

    Args:
        net: the mixed-space denoiser ``D~(x_sigma, sigma, cond) ~ E[M x0 | x_sigma]`` (e.g. ``EDMPrecond(FrameMixer)``
            trained with the ``dydiff`` objective), or its model spec ``{"class", "config"}``. Any callable works for
            sampling; saving needs a registered model.
        r: mixing ratio in ``[0, 1]`` (0.5 is the released default; 0 is the standard conditional baseline and makes
            this wrapper return ``net``'s output bit for bit).
        n_context: context frames ``S_c`` (``1 <= S_c < S``); default: the backbone's ``n_context``.

    Attributes:
        sample_shape: ``(S, *frame)`` when ``net`` declares it.
    """

    def __init__(self, net, r: float = 0.5, n_context: int | None = None):
        super().__init__()
        if isinstance(net, dict):
            net = build_model(net)
        if not callable(net):
            raise TypeError(f"net must be a denoiser D(x, sigma, cond) or a model spec, got {type(net).__name__}")
        self.r = check_r(r)
        shape = getattr(net, "sample_shape", None)
        self.sample_shape = tuple(shape) if shape is not None else None
        if n_context is None:
            inner = getattr(net, "net", net)
            n_context = getattr(inner, "n_context", None)
            if n_context is None:
                raise ValueError("n_context: pass it, net has no n_context attribute")
        frames = self.sample_shape[0] if self.sample_shape else None
        self.n_context = _check_n_context(n_context, frames)
        self.num_classes: tuple[int, ...] = ()
        if isinstance(net, nn.Module):
            self.net = net
        else:
            self._fn = net

    @property
    def denoiser(self):
        """The wrapped mixed-space denoiser ``D~``."""
        return self.net if "net" in self._modules else self._fn

    @property
    def sigma_data(self) -> float | None:
        return getattr(self.denoiser, "sigma_data", None)

    @property
    def sigma_range(self) -> tuple[float, float]:
        return getattr(self.denoiser, "sigma_range", (0.0, math.inf))

    @property
    def config(self) -> dict:
        return {"net": model_spec(self.net), "r": self.r, "n_context": self.n_context}

    @property
    def frames(self) -> int | None:
        return self.sample_shape[0] if self.sample_shape else None

    def context(self, frames: Tensor) -> FrameContext:
        """The condition for context frames ``[B, n_context, *frame]`` (checked against this model)."""
        ctx = FrameContext(frames) if not isinstance(frames, FrameContext) else frames
        if ctx.n_context != self.n_context:
            raise ValueError(f"context has {ctx.n_context} frames, the model needs n_context={self.n_context}")
        if self.sample_shape is not None and tuple(ctx.frames.shape[2:]) != self.sample_shape[1:]:
            raise ValueError(f"context frames have shape {tuple(ctx.frames.shape[2:])}, the model's frames "
                             f"{self.sample_shape[1:]}")
        return ctx

    def forward(self, y: Tensor, sigma: Tensor | float, cond=None) -> Tensor:
        """``E[x0 | y]`` for ``y: [B, S, *frame]`` at ``sigma: [B]`` (or a scalar); ``cond``: the context."""
        if y.ndim < 3:
            raise ValueError(f"y must be a sequence [B, S, *frame], got shape {tuple(y.shape)}")
        if self.sample_shape is not None and tuple(y.shape[1:]) != self.sample_shape:
            raise ValueError(f"y must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(y.shape)}")
        _check_n_context(self.n_context, y.shape[1])
        ctx = as_frame_context(cond, y.shape[0], tuple(y.shape[2:]))
        if ctx is not None and ctx.n_context != self.n_context:
            raise ValueError(f"cond: context has {ctx.n_context} frames, the model needs n_context={self.n_context}")
        sigma = torch.as_tensor(sigma, dtype=y.dtype, device=y.device)
        sigma = sigma.expand(y.shape[0]) if sigma.ndim == 0 else sigma
        tb = theta_bar(sigma, self.r)
        out = self.denoiser(mix(y, tb), sigma, ctx if ctx is not None else cond)
        return unmix(out, tb)


def wrap(net, r: float = 0.5, n_context: int | None = None) -> DyDiffDenoiser:
    """:class:`DyDiffDenoiser` around ``net`` (a shorthand)."""
    return DyDiffDenoiser(net, r, n_context)


def load_forecaster(name_or_dir, device: str | torch.device = "cpu") -> DyDiffDenoiser:
    """Load a saved :class:`DyDiffDenoiser` (a directory or a shipped name such as ``advection_dydiff``).

    Raises:
        CheckpointError: as :func:`steerdiff.models.load`; ValueError: the checkpoint is not a DyDiff forecaster.
    """
    model = load(name_or_dir, device=device)
    if not isinstance(model, DyDiffDenoiser):
        raise ValueError(f"{name_or_dir}: not a DyDiff forecaster (got a {type(model).__name__}); wrap it with "
                         "steerdiff.temporal.DyDiffDenoiser(net, r, n_context)")
    return model


def forecast(
    model: DyDiffDenoiser,
    context: Tensor,
    members: int = 8,
    steps: int = 12,
    *,
    method: str = "heun",
    sigma_min: float = 0.002,
    sigma_max: float = 80.0,
    rho: float = 7.0,
    seed: int = 0,
    future_only: bool = True,
    **sample_options,
) -> Tensor:
    """Ensemble forecast: ``members`` samples of the sequence given its context (the validation protocol's sampling:
    Heun, 12 steps, Karras schedule 0.002..80, rho 7).

    Member ``m`` of case ``b`` starts from the noise of seed ``seed + b * members + m`` (per-sample noise: a member
    does not depend on the batch). Heun is an extension beyond the paper's DDIM; ``method="ddim"`` is the
    paper's sampler.

    Args:
        model: a :class:`DyDiffDenoiser` (with ``sample_shape``).
        context: ``[B, n_context, *frame]`` or ``[n_context, *frame]`` clean context frames.
        members: ensemble size (>= 1).
        steps: sampler steps.
        method, sigma_min, sigma_max, rho, sample_options: passed to :func:`steerdiff.sample` and
            :func:`steerdiff.sigmas.karras`.
        seed: first noise seed.
        future_only: return the ``S - n_context`` future frames only (the context frames are regenerated too).

    Returns:
        ``[B, members, S_f, *frame]`` (``S_f = S - n_context``; all ``S`` frames when ``future_only=False``).
    """
    if not isinstance(model, DyDiffDenoiser) or model.sample_shape is None:
        raise ValueError("model must be a DyDiffDenoiser around a network with a sample_shape")
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"members must be an int >= 1, got {members!r}")
    if not isinstance(context, Tensor) or not context.is_floating_point():
        raise ValueError("context must be a float tensor [B, n_context, *frame] or [n_context, *frame]")
    frame = model.sample_shape[1:]
    if context.ndim == len(frame) + 1:
        context = context[None]
    if context.ndim != len(frame) + 2 or tuple(context.shape[2:]) != frame:
        raise ValueError(f"context must have shape [B, {model.n_context}, {', '.join(map(str, frame))}], got "
                         f"{tuple(context.shape)}")
    ctx = model.context(context)
    b = context.shape[0]
    cond = ctx.repeat_interleave(members)
    param = next(model.parameters(), None)
    device = param.device if param is not None else context.device
    noise = randn((b * members, *model.sample_shape), seeds=seed, device=str(device))
    sig = core_sigmas.karras(steps, sigma_min, sigma_max, rho)
    with torch.no_grad():
        out = core_sample(model, noise, sig, method=method, cond=cond.to(device), **sample_options)
    out = out.reshape(b, members, *model.sample_shape)
    return out[:, :, model.n_context:] if future_only else out
