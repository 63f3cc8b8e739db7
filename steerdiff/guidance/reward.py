"""Reward-gradient guidance: ``D_g(x, sigma, c) = D(x, sigma, c) + rho sigma^2 grad_x r(x, sigma, c)``, and the one
reward-gradient routine steerdiff uses.

Geometry-reward guidance of "What Secrets Do Your Manifolds Hold?" (Humayun et al., ICLR 2025; docs/methods/geometry.md
"Geometry-reward guidance"): a noise-aware reward ``r_phi(x_sigma, sigma, c)`` trained to predict the local scaling psi
of the final sample; its gradient, scaled by ``sigma^2`` (the EDM form of adding a score term; the VP form
``eps - rho sqrt(1 - alphabar) grad_{x_vp} r`` is the same thing, docs/methods/conventions.md "VP wrapping"), steers the
sampler towards higher (``rho > 0``) or lower (``rho < 0``) psi. Any differentiable reward works:

* ``kind="noisy"`` (default): ``r(x, sigma, cond) -> [B]`` on the noisy state (a noise-aware regressor);
* ``kind="clean"``: ``r(x0) -> [B]`` on the denoised estimate, differentiated through the denoiser,
  ``grad_x r(D(x, sigma, c))`` (the Tweedie / DPS-style reward gradient the alignment baseline
  :func:`steerdiff.align.reward_guidance` uses).

:func:`reward_gradient` is the single place where a reward's value and input gradient are computed: the alignment
samplers (``steerdiff.align``, through ``ModelCalls.twist``) and this guider both call it. With ``create_graph=True``
the gradient stays differentiable, so a Jacobian can be taken through the guided sampler (claim 9 of
docs/methods/geometry.md "Validation").
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.denoiser import NULL, Denoiser, as_sigma_batch
from .base import Guider, check_real, check_x_sigma
from .registry import register_guider

KINDS = ("noisy", "clean")


def reward_gradient(fn: Callable[[Tensor], Tensor | tuple[Tensor, Any]], x: Tensor, *,
                    create_graph: bool = False) -> tuple[Tensor, Tensor, Any]:
    """The value ``r = fn(x)`` ``[B]``, its input gradient ``grad_x sum_b r_b`` and ``fn``'s auxiliary output.

    ``fn`` maps a batch ``x [B, ...]`` to rewards ``[B]``, or to ``(rewards, aux)`` (e.g. the denoised estimate the
    reward was computed on). Rows whose reward is not finite are left out of the backward pass (their gradient is 0),
    so that one bad row cannot poison the others. Rows are independent when ``fn`` is, so the gradient of the sum is
    the per-row gradient.

    Args:
        fn: the reward (a closure over the noise level, condition, denoiser, ...).
        x: the input batch.
        create_graph: keep the gradient differentiable (higher-order derivatives, e.g. a Jacobian through a guided
            sampler); ``x`` is then used as it is when it already requires grad (a non-leaf in a graph). Without it
            everything returned is detached.

    Returns:
        ``(r, grad, aux)``: ``r`` as ``fn`` returned it (detached unless ``create_graph``), ``grad`` of ``x``'s shape
        (zeros where ``fn`` does not depend on ``x``) and ``aux`` (None when ``fn`` returned rewards only).

    Raises:
        TypeError: ``fn`` did not return a tensor.
    """
    xc = x if (create_graph and x.requires_grad) else x.detach().requires_grad_(True)
    with torch.enable_grad():
        out = fn(xc)
        r, aux = out if isinstance(out, tuple) else (out, None)
        if not isinstance(r, Tensor):
            raise TypeError(f"the reward must return a tensor [B], got {type(r).__name__}")
        finite = torch.isfinite(r.detach())
        if r.requires_grad:
            (g,) = torch.autograd.grad(torch.where(finite, r, torch.zeros_like(r)).sum(), xc, allow_unused=True,
                                       create_graph=create_graph)
        else:
            g = None
    g = torch.zeros_like(x) if g is None else g
    if not create_graph:
        r, g = r.detach(), g.detach()
        aux = aux.detach() if isinstance(aux, Tensor) else aux
    return r, g, aux


class RewardGuidance(Guider):
    """``D + rho sigma^2 grad_x r``: reward-gradient guidance as a guider for :func:`steerdiff.sample`.

    Usage::

        sd.sample(denoiser, noise, sigmas, method="ddim", cond=cond, guidance=RewardGuidance(r_phi, rho=1.5))

    ``sd.sample`` needs ``cond=`` with any guider; for an unconditional model pass the all-null condition
    ``torch.full((B,), -1)``. One denoiser evaluation per call (NFE is that of the unguided sampler) plus one
    backward pass through the reward (and, for ``kind="clean"``, through the denoiser).

    Args:
        reward: ``r(x, sigma, cond) -> [B]`` (``kind="noisy"``) or ``r(x0) -> [B]`` (``kind="clean"``);
            differentiable in its input.
        rho: guidance scale; ``rho > 0`` raises the reward, ``rho < 0`` lowers it, ``0`` is the plain model.
        kind: ``"noisy"`` or ``"clean"`` (see the module docstring).
        clip: if given, each row's gradient ``sigma^2 grad`` is rescaled to at most this L2 norm (off by default).
        create_graph: keep the guidance term differentiable in ``x`` (for Jacobians through the guided sampler).
        start, stop, sigmas, enabled: the schedule window of :class:`~steerdiff.guidance.base.Guider`.

    Rows whose reward is not finite get no guidance at that call.
    """

    name = "reward"

    def __init__(self, reward: Callable, rho: float = 1.0, kind: str = "noisy", clip: float | None = None,
                 create_graph: bool = False, start: float = 0.0, stop: float = 1.0, sigmas: Tensor | None = None,
                 enabled: bool = True):
        if not callable(reward):
            raise TypeError(f"reward must be a callable returning [B] rewards, got {type(reward).__name__}")
        if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not math.isfinite(rho):
            raise ValueError(f"rho must be a finite real number (> 0 raises the reward, < 0 lowers it), got {rho!r}")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} (reward on the noisy state, or on D(x)), got {kind!r}")
        super().__init__(1.0, start=start, stop=stop, sigmas=sigmas, enabled=enabled)
        self.reward = reward
        self.rho = float(rho)
        self.kind = kind
        self.clip = None if clip is None else check_real(clip, "clip", 0.0)
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"clip must be a positive number or None, got {clip}")
        self.create_graph = bool(create_graph)
        self.last_reward: Tensor | None = None  # the reward of the latest guided call (detached), for callbacks

    @property
    def config(self) -> dict:
        return {"rho": self.rho, "kind": self.kind, "clip": self.clip, "create_graph": self.create_graph,
                "start": self.start, "stop": self.stop, "enabled": self.enabled}

    @classmethod
    def from_config(cls, config: dict) -> Guider:
        raise TypeError("RewardGuidance holds a reward callable, which a config cannot carry: build it as "
                        "RewardGuidance(reward, **config)")

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor | None = None,
              step: int | None = None) -> Tensor:
        """``D(x, sigma, cond) + rho sigma^2 grad_x r`` (the plain ``D`` outside the window, at ``rho = 0``, and at
        ``sigma = inf``, where ``sigma^2 grad`` has no finite limit)."""
        check_x_sigma(x, sigma, type(self).__name__)
        if isinstance(cond, Tensor) and not cond.dtype.is_floating_point and bool((cond == NULL).all()):
            cond = None  # all-null is cond=None (the convention), so unconditional models need no labels
        active = self._active_rows(sigma)
        sig = as_sigma_batch(sigma, x)
        if active is False or self.rho == 0.0 or bool(torch.isinf(sig).any()):
            return denoiser(x, sigma, cond)
        if self.kind == "noisy":
            d = denoiser(x, sigma, cond)
            r, g, _ = reward_gradient(lambda xc: self.reward(xc, sigma, cond), x, create_graph=self.create_graph)
        else:
            r, g, d = reward_gradient(lambda xc: _clean(self.reward, denoiser, xc, sigma, cond), x,
                                      create_graph=self.create_graph)
        self.last_reward = r.detach()
        bad = ~torch.isfinite(r.detach())
        if bool(bad.any()):
            g = torch.where(_rows(bad, g), torch.zeros_like(g), g)
        shift = g * (sig.to(g.dtype) ** 2).reshape(-1, *([1] * (g.ndim - 1)))
        if self.clip is not None:
            norm = shift.flatten(1).norm(dim=1).clamp_min(1e-30)
            shift = shift * (self.clip / norm).clamp(max=1.0).reshape(-1, *([1] * (g.ndim - 1)))
        out = d + self.rho * shift.to(d.dtype)
        if active is True:
            return out
        return torch.where(_rows(active, out), out, d)

    __call__ = guide


def _clean(reward: Callable, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond) -> tuple[Tensor, Tensor]:
    d = denoiser(x, sigma, cond)
    return reward(d), d


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(like.device).reshape(-1, *([1] * (like.ndim - 1)))


@register_guider("reward")
class ScaledRewardGuidance(RewardGuidance):
    """:class:`RewardGuidance` in the registry's convention: ``build_guider("reward", w, reward=r)``.

    Every registered guider is built as ``cls(scale, **options)`` with ``w = 1`` the plain model (CFG's ``D_u + w
    (D_c - D_u)`` = ``D_c + (w - 1)(D_c - D_u)``); here ``D + (w - 1) sigma^2 grad r``, i.e. ``rho = w - 1`` (Ho &
    Salimans' ``omega``). ``reward`` may be left out only at ``w = 1``. For ``rho < -1`` build
    :class:`RewardGuidance` directly.
    """

    def __init__(self, scale: float, reward: Callable | None = None, kind: str = "noisy", clip: float | None = None,
                 create_graph: bool = False, start: float = 0.0, stop: float = 1.0, sigmas: Tensor | None = None,
                 enabled: bool = True):
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale < 0:
            raise ValueError(f"scale must be a finite number >= 0 (w = 1: the plain model; rho = w - 1), got "
                             f"{scale!r}")
        if reward is None:
            if scale != 1:
                raise ValueError(f"reward guidance at scale {scale} needs reward= (a callable returning [B] rewards)")
            reward = _no_reward
        super().__init__(reward, rho=float(scale) - 1.0, kind=kind, clip=clip, create_graph=create_graph,
                         start=start, stop=stop, sigmas=sigmas, enabled=enabled)


def _no_reward(x: Tensor, *_args) -> Tensor:
    return x.new_zeros(x.shape[0])
