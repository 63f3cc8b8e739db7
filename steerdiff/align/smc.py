"""SMC helpers shared by DAS, TDS and the baselines (das.md sections 3 and 4).

* log-weights: per-group normalisation with logsumexp, ESS ``1 / sum_j W_j^2``;
* resamplers vectorised over groups (``ssp``, ``systematic``, ``stratified``, ``multinomial``, ``residual``), each
  a map from weights ``[G, P]`` and uniforms ``[G, P]`` to ancestor indices ``[G, P]``;
* :class:`ModelCalls`: the denoiser, reward and their vector-Jacobian product evaluated in micro-batches, with
  evaluation counts and the time spent inside them;
* the ancestral (DDPM / DDIM-eta) move, built on :func:`steerdiff.core.sampling.ancestral_split`.

Every random draw comes from per-row generators (:mod:`steerdiff.core.noise`); a group's resampling draws come from
the generator of its first row, so a group's result does not depend on how many other groups share the batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..core.denoiser import NFECounter
from ..core.sampling import ancestral_split

RESAMPLERS = ("ssp", "systematic", "stratified", "multinomial", "residual")


# ------------------------------------------------------------------------------------------------ weights
def normalize(logw: Tensor) -> Tensor:
    """``logw - logsumexp(logw)`` over the last dimension (``-inf`` entries stay ``-inf``)."""
    m = logw.amax(-1, keepdim=True).clamp_min(torch.finfo(logw.dtype).min)
    return logw - m - torch.logsumexp(logw - m, -1, keepdim=True)


def ess(logw: Tensor) -> Tensor:
    """Effective sample size ``1 / sum_j W_j^2`` of normalised log-weights ``[..., P]``."""
    return 1.0 / torch.exp(2 * logw).sum(-1)


# ------------------------------------------------------------------------------------------------ resampling
def _counts_to_ancestors(counts: Tensor) -> Tensor:
    """Offspring counts ``[G, P]`` (summing to P) -> ancestors ``[G, P]``, particle j repeated ``counts_j`` times."""
    p = counts.shape[1]
    cum = counts.cumsum(1)
    slots = torch.arange(p, device=counts.device).expand_as(counts).contiguous()
    return torch.searchsorted(cum, slots, right=True).clamp_max(p - 1)


def _inverse_cdf(weights: Tensor, positions: Tensor) -> Tensor:
    """First j with ``cumsum(W)_j >= position`` (positions in [0, 1)), clipped to ``P - 1``."""
    cum = weights.cumsum(1)
    return torch.searchsorted(cum, positions.contiguous(), right=False).clamp_max(weights.shape[1] - 1)


def _ssp_counts(weights: Tensor, u: Tensor) -> Tensor:
    """Srinivasan sampling process (Gerber, Chopin and Whiteley 2019), vectorised over groups; das.md section 3.

    Counts start at ``floor(P W_j)``; the fractional parts are merged pairwise, two "open" indices at a time, so
    that every count ends in ``{floor(P W_j), floor(P W_j) + 1}`` with mean ``P W_j``. Uses ``u[:, :P-1]``.
    """
    g, p = weights.shape
    pw = p * weights
    n = torch.zeros(g, p + 1, dtype=torch.int64, device=weights.device)
    n[:, :p] = pw.floor().long()
    f = torch.zeros(g, p + 1, dtype=weights.dtype, device=weights.device)  # column p: an empty sentinel
    f[:, :p] = pw - pw.floor()
    rows = torch.arange(g, device=weights.device)
    a = torch.zeros(g, dtype=torch.int64, device=weights.device)
    b = torch.ones(g, dtype=torch.int64, device=weights.device)
    for k in range(p - 1):
        fa, fb = f[rows, a], f[rows, b]
        uu, vv = torch.minimum(fb, 1 - fa), torch.minimum(fa, 1 - fb)
        tot = uu + vv
        p_swap = torch.where(tot > 0, uu / tot.clamp_min(1e-300), torch.zeros_like(tot))
        swap = u[:, k] < p_swap
        a, b = torch.where(swap, b, a), torch.where(swap, a, b)
        fa, fb = torch.where(swap, fb, fa), torch.where(swap, fa, fb)
        amount = torch.where(swap, vv, uu)
        nxt = torch.full_like(a, min(k + 2, p))
        b_empties = fb < 1 - fa
        # b empties into a: f_a += amount, b is closed and the next index opens in its place.
        f[rows, a] = torch.where(b_empties, fa + amount, torch.zeros_like(fa))
        f[rows, b] = torch.where(b_empties, torch.zeros_like(fb), fb - amount)
        n[rows, a] += (~b_empties).long()  # a fills up to one more offspring and closes
        a, b = torch.where(b_empties, a, nxt), torch.where(b_empties, nxt, b)
    # One index stays open with a fractional part of (numerically) 0 or 1.
    last = torch.where(a < p, a, b)
    n[rows, last] += (f[rows, last] > 0.5).long()
    counts = n[:, :p]
    deficit = p - counts.sum(1)
    if (deficit != 0).any():  # rounding in extreme weights only: give the difference to the heaviest particle
        counts[rows, weights.argmax(1)] += deficit
    return counts


def resample(weights: Tensor, u: Tensor, scheme: str = "ssp") -> Tensor:
    """Ancestor indices ``[G, P]`` from normalised weights ``[G, P]`` and uniforms ``u`` in [0, 1) ``[G, P]``.

    Schemes (das.md section 3): ``ssp`` and ``systematic`` give every particle ``floor(P W_j)`` or
    ``floor(P W_j) + 1`` offspring; ``stratified`` draws one position per stratum; ``multinomial`` draws P
    independent ancestors; ``residual`` keeps ``floor(P W_j)`` copies and draws the rest multinomially.
    """
    if scheme not in RESAMPLERS:
        raise ValueError(f"resampler must be one of {RESAMPLERS}, got {scheme!r}")
    g, p = weights.shape
    w = weights / weights.sum(1, keepdim=True)
    steps = torch.arange(p, dtype=w.dtype, device=w.device)
    if scheme == "systematic":
        return _inverse_cdf(w, (steps[None] + u[:, :1]) / p)
    if scheme == "stratified":
        return _inverse_cdf(w, (steps[None] + u) / p)
    if scheme == "multinomial":
        return _inverse_cdf(w, u)
    if scheme == "residual":
        base = (p * w).floor()
        rest = p * w - base
        r = (p - base.sum(1)).round().long()
        extra = _inverse_cdf(rest / rest.sum(1, keepdim=True).clamp_min(1e-300), u)
        take = torch.arange(p, device=w.device)[None] < r[:, None]
        counts = base.long().scatter_add(1, extra, take.long())
        return _counts_to_ancestors(counts)
    return _counts_to_ancestors(_ssp_counts(w, u))


def group_uniforms(generators: Sequence[torch.Generator] | None, groups: Tensor, n: int,
                   dtype: torch.dtype = torch.float64) -> Tensor:
    """``[len(groups), n]`` uniforms; row ``k`` from ``generators[groups[k]]`` (the global RNG if None)."""
    if generators is None:
        return torch.rand(len(groups), n, dtype=dtype)
    return torch.stack([torch.rand(n, generator=generators[int(g)], dtype=dtype) for g in groups])


# ------------------------------------------------------------------------------------------------ model calls
class ModelCalls:
    """Denoiser, reward and reward gradient ``grad_x r(D(x, sigma))`` in micro-batches, counted and timed.

    Args:
        denoiser: ``D(x, sigma, cond=None)``.
        reward: ``r(x0) -> [B]``.
        batch_size: rows per forward/backward call (memory stays flat in the number of particles); None = all.
    """

    def __init__(self, denoiser: Callable, reward: Callable, batch_size: int | None):
        self.denoiser = NFECounter(denoiser)
        self.reward = reward
        self.batch_size = batch_size
        self.grad_rows = 0
        self.reward_rows = 0
        self.time = 0.0

    def _chunks(self, n: int):
        step = n if self.batch_size is None else self.batch_size
        return [slice(k, min(k + step, n)) for k in range(0, n, step)]

    def _check_reward(self, rho, m: int, where: str) -> Tensor:
        if not isinstance(rho, Tensor):
            raise TypeError(f"reward must return a tensor of shape [B], got {type(rho).__name__} ({where})")
        if rho.shape != (m,):
            raise ValueError(f"reward must return shape [B] = [{m}], got {tuple(rho.shape)} ({where})")
        return rho

    def rewards(self, x0: Tensor, where: str = "final samples") -> Tensor:
        """``r(x0)`` in float64, without gradients."""
        start = time.perf_counter()
        out = []
        with torch.no_grad():
            for c in self._chunks(x0.shape[0]):
                out.append(self._check_reward(self.reward(x0[c]), c.stop - c.start, where).double())
        self.reward_rows += x0.shape[0]
        self.time += time.perf_counter() - start
        return torch.cat(out)

    def denoise(self, x: Tensor, sigma: float, cond: Tensor | None) -> Tensor:
        """``D(x, sigma)`` without gradients."""
        start = time.perf_counter()
        out = []
        with torch.no_grad():
            for c in self._chunks(x.shape[0]):
                out.append(self._denoise_chunk(x[c], sigma, None if cond is None else cond[c]))
        self.time += time.perf_counter() - start
        return torch.cat(out)

    def _denoise_chunk(self, x: Tensor, sigma: float, cond: Tensor | None) -> Tensor:
        d = self.denoiser(x, x.new_full((x.shape[0],), sigma), cond)
        if not isinstance(d, Tensor) or d.shape != x.shape:
            got = tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__
            raise ValueError(f"denoiser returned shape {got}, expected the input's shape {tuple(x.shape)}")
        return d.to(x.dtype)

    def twist(self, x: Tensor, sigma: float, cond: Tensor | None, grad: bool, step: int):
        """``(D, rho, grad_x rho)`` at ``x`` (``grad_x rho`` is None unless ``grad``); rho in float64.

        Rows whose reward is not finite get a zero gradient (they are killed by the caller); their reward is
        excluded from the backward pass so that they cannot poison the others.
        """
        start = time.perf_counter()
        where = f"step {step}, sigma={sigma:.6g}"
        ds, rhos, grads = [], [], []
        for c in self._chunks(x.shape[0]):
            cc = None if cond is None else cond[c]
            if not grad:
                with torch.no_grad():
                    d = self._denoise_chunk(x[c], sigma, cc)
                    rho = self._check_reward(self.reward(d), d.shape[0], where)
                ds.append(d)
                rhos.append(rho.double())
                continue
            xc = x[c].detach().requires_grad_(True)
            with torch.enable_grad():
                d = self._denoise_chunk(xc, sigma, cc)
                rho = self._check_reward(self.reward(d), d.shape[0], where)
                if not rho.requires_grad:
                    raise ValueError(f"reward returned a tensor without a gradient ({where}); for a black-box "
                                     "reward pass gradient=False")
                finite = torch.isfinite(rho.detach())
                (g,) = torch.autograd.grad(torch.where(finite, rho, torch.zeros_like(rho)).sum(), xc,
                                           allow_unused=True)
            g = torch.zeros_like(xc) if g is None else g.detach()
            ds.append(d.detach())
            rhos.append(rho.detach().double())
            grads.append(g)
            self.grad_rows += xc.shape[0]
        self.reward_rows += x.shape[0]
        self.time += time.perf_counter() - start
        return torch.cat(ds), torch.cat(rhos), (torch.cat(grads) if grad else None)


# ------------------------------------------------------------------------------------------------ the chain
def ancestral_coeffs(s: float, s_next: float, eta: float) -> tuple[float, float]:
    """``(keep, s_up)`` of the ancestral step: mean ``D + keep (x - D)``, noise std ``s_up`` (das.md section 2).

    With ``eta = 1``: ``keep = s'^2 / s^2`` and ``s_up^2 = s'^2 (s^2 - s'^2) / s^2`` (the DDPM posterior).
    """
    s_down, s_up = ancestral_split(s, s_next, eta)
    return s_down / s, s_up


NOISE_BLOCK = 32
"""Draws buffered per row by :class:`~steerdiff.core.noise.SampleNoise` (fixed, so a row's noise depends only on
its own generator; larger than the core default to halve the per-row generator calls on cheap models)."""


def row_finite(t: Tensor) -> Tensor:
    """``[B]`` bool: the row holds only finite values (one reduction: a row sum is finite iff every entry is,
    barring overflow of the sum itself, which is then treated as non-finite too)."""
    return torch.isfinite(t.flatten(1).sum(1))


def flat_dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-row inner product ``[B]`` in float64."""
    return (a.double() * b.double()).flatten(1).sum(1)


def check_common(noise, particles: int, alpha: float | None, eta: float, batch_size) -> tuple[int, int]:
    """Validate the arguments every alignment sampler shares; returns ``(groups, particles)``."""
    if not isinstance(noise, Tensor) or noise.ndim < 2 or not noise.is_floating_point():
        got = tuple(noise.shape) if isinstance(noise, Tensor) else type(noise).__name__
        raise ValueError(f"noise must be a floating-point tensor [groups * particles, *shape], got {got}")
    if isinstance(particles, bool) or not isinstance(particles, int) or particles < 1:
        raise ValueError(f"particles must be a positive integer, got {particles!r}")
    if noise.shape[0] == 0 or noise.shape[0] % particles:
        raise ValueError(f"noise has {noise.shape[0]} rows; its first dimension must be a positive multiple of "
                         f"particles={particles} (groups x particles)")
    if alpha is not None and not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number (the KL weight), got {alpha!r}")
    if not (isinstance(eta, (int, float)) and 0 < eta <= 1):
        raise ValueError(f"eta must lie in (0, 1] (a stochastic sampler is required), got {eta!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    return noise.shape[0] // particles, particles


def expand_cond(cond: Tensor | None, groups: int, particles: int) -> Tensor | None:
    """A condition per row: ``[G]`` (one per group) is repeated over its particles; ``[G * P]`` is kept."""
    if cond is None:
        return None
    cond = torch.as_tensor(cond)
    if cond.dtype.is_floating_point or cond.dtype == torch.bool or cond.ndim not in (1, 2):
        raise ValueError("cond must be an integer tensor [G] / [G * P] (or [.., m]); -1 = null")
    if cond.shape[0] == groups * particles:
        return cond
    if cond.shape[0] == groups:
        return cond.repeat_interleave(particles, 0)
    raise ValueError(f"cond must have {groups} (groups) or {groups * particles} (rows) entries, got {cond.shape[0]}")
