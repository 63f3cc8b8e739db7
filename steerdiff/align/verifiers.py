"""Verifiers: batched scorers ``x0 -> [B]`` with their own device, batch size and cost (``docs/methods/search.md``,
"Verifiers").

Inference-time search (Ma et al., "Inference-Time Scaling for Diffusion Models beyond Scaling Denoising Steps",
CVPR 2025, Section 3.1) separates the *verifier* that scores a candidate from the *algorithm* that proposes
candidates. Here a :class:`Verifier` is a reward in the sense of :mod:`steerdiff.align.rewards` (callable on a batch
of clean samples, returning ``[B]``), plus what a search needs to know about it:

* ``device``: where it runs; inputs are moved there and the scores back to the caller's device (a classifier on
  another accelerator, or on the CPU beside a GPU denoiser);
* ``batch_size``: rows per call (None: all at once);
* ``differentiable``: whether its scores carry a gradient (DAS's proposal, TDS, reward guidance need one; best-of-N,
  noise search and tree search do not);
* ``name``; and its cost: ``calls``, ``rows`` and ``seconds`` spent inside it (with ``synchronize=True`` the clock
  waits for the verifier's device, so that the seconds are the device's work and not only the launches).

:func:`as_verifier` adapts any existing reward (every reward stays usable as it is: the aligners take a plain callable
or a verifier alike). Composites: :class:`WeightedVerifier` (the weighted sum, through :class:`~.rewards.WeightedSum`)
and :class:`ParetoVerifier` (several objectives ranked by non-dominated sorting, then crowding distance, as NSGA-II:
Deb et al., IEEE TEC 2002). No verifier is downloaded: the small ones are the shipped digits classifier
(:class:`~.rewards.ClassLogProb`), the held-out classifier (:func:`~.rewards.heldout_digits_classifier`) and the
closed-form rewards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .rewards import WeightedSum


class Verifier:
    """A batched scorer ``x0 [B, ...] -> [B]`` with its own device, micro-batch size and cost counters.

    Subclasses implement :meth:`score` (on ``self.device``); :meth:`__call__` moves the inputs there, cuts them into
    ``batch_size`` rows, times the calls and moves the scores back to the caller's device.

    Args:
        name: for listings and benchmark tables.
        device: where :meth:`score` runs; None: the input's device.
        batch_size: rows per :meth:`score` call; None: all rows at once.
        differentiable: whether :meth:`score` is differentiable in its input (gradient-based aligners need it).
        synchronize: wait for ``device`` before reading the clock (honest seconds on an accelerator; a host
            synchronisation per call).
    """

    def __init__(self, name: str = "verifier", *, device: torch.device | str | None = None,
                 batch_size: int | None = None, differentiable: bool = True, synchronize: bool = False):
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.name = str(name)
        self.device = None if device is None else torch.device(device)
        self.batch_size = batch_size
        self.differentiable = bool(differentiable)
        self.synchronize = bool(synchronize)
        self.calls = 0
        self.rows = 0
        self.seconds = 0.0

    def score(self, x: Tensor) -> Tensor:
        """``[B]`` scores of ``x`` (already on ``self.device``)."""
        raise NotImplementedError

    def _sync(self, device: torch.device) -> None:
        if self.synchronize and device.type == "cuda":
            torch.cuda.synchronize(device)

    def __call__(self, x: Tensor) -> Tensor:
        """``[B]`` scores of ``x``, on ``x``'s device (counted in ``calls``, ``rows``, ``seconds``)."""
        start = time.perf_counter()
        dev = self.device or x.device
        step = x.shape[0] if self.batch_size is None else self.batch_size
        parts = []
        for k in range(0, x.shape[0], max(step, 1)):
            s = self.score(x[k:k + step].to(dev))
            if not isinstance(s, Tensor) or s.shape != (min(k + step, x.shape[0]) - k,):
                got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
                raise ValueError(f"verifier {self.name!r} must return scores of shape [B], got {got}")
            parts.append(s)
            self.calls += 1
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        self._sync(dev)
        self.rows += x.shape[0]
        self.seconds += time.perf_counter() - start
        return out.to(x.device)

    def reset_cost(self) -> None:
        """Zero the counters (``calls``, ``rows``, ``seconds``)."""
        self.calls, self.rows, self.seconds = 0, 0, 0.0

    def cost(self) -> dict:
        """``{"calls", "rows", "seconds"}`` spent in this verifier so far."""
        return {"calls": self.calls, "rows": self.rows, "seconds": self.seconds}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}, device={self.device}, batch_size={self.batch_size}, "
                f"differentiable={self.differentiable})")


class RewardVerifier(Verifier):
    """A reward ``r(x0) -> [B]`` of :mod:`steerdiff.align.rewards` (or any callable) as a :class:`Verifier`."""

    def __init__(self, reward: Callable, name: str | None = None, **kwargs):
        if not callable(reward):
            raise TypeError(f"reward must be callable r(x0) -> [B], got {type(reward).__name__}")
        kwargs.setdefault("differentiable", getattr(reward, "differentiable", True))
        super().__init__(name or _name_of(reward), **kwargs)
        self.reward = reward

    def score(self, x: Tensor) -> Tensor:
        return self.reward(x)


def _name_of(reward: Callable) -> str:
    if hasattr(reward, "name") and isinstance(reward.name, str):
        return reward.name
    return getattr(reward, "__name__", type(reward).__name__)


def as_verifier(reward, *, name: str | None = None, device: torch.device | str | None = None,
                batch_size: int | None = None, differentiable: bool | None = None,
                synchronize: bool = False) -> Verifier:
    """A :class:`Verifier` from a reward: a verifier is returned as it is (when no setting is given), a list of
    ``(weight, reward)`` pairs becomes a :class:`WeightedVerifier`, any other callable a :class:`RewardVerifier`.

    Raises:
        TypeError: ``reward`` is neither callable nor a list of pairs.
    """
    settings = {"device": device, "batch_size": batch_size, "synchronize": synchronize}
    if isinstance(reward, Verifier):
        if name is None and device is None and batch_size is None and differentiable is None and not synchronize:
            return reward
        reward = reward.score if not isinstance(reward, RewardVerifier) else reward.reward
    if isinstance(reward, (list, tuple)):
        return WeightedVerifier(reward, name=name, **settings)
    if differentiable is not None:
        settings["differentiable"] = differentiable
    return RewardVerifier(reward, name=name, **settings)


class WeightedVerifier(Verifier):
    """``sum_m w_m v_m(x)`` (a :class:`~.rewards.WeightedSum` of verifiers or rewards); differentiable when every
    term is. ``components(x)`` gives ``[M, B]``."""

    def __init__(self, terms: Sequence[tuple[float, Callable]], name: str | None = None, **kwargs):
        self.sum = WeightedSum(terms)
        kwargs.setdefault("differentiable", all(getattr(r, "differentiable", True) for _, r in self.sum.terms))
        super().__init__(name or " + ".join(f"{w:g}*{_name_of(r)}" for w, r in self.sum.terms), **kwargs)

    def score(self, x: Tensor) -> Tensor:
        return self.sum(x)

    def components(self, x: Tensor) -> Tensor:
        return self.sum.components(x)


# ------------------------------------------------------------------------------------------------ Pareto
def non_dominated_ranks(values: Tensor) -> Tensor:
    """The Pareto front index of each of ``N`` points with ``M`` objectives ``values [M, N]`` (to maximise): 0 for
    the non-dominated points, 1 for those dominated only by front 0, ... (non-dominated sorting, Deb et al. 2002).
    NaN counts as the worst value."""
    v = torch.nan_to_num(values.double(), nan=-torch.inf)
    ge = (v[:, :, None] >= v[:, None, :]).all(0)  # ge[i, j]: i at least as good as j everywhere
    gt = (v[:, :, None] > v[:, None, :]).any(0)
    dominates = ge & gt  # dominates[i, j]: i dominates j
    n = v.shape[1]
    rank = torch.full((n,), -1, dtype=torch.int64)
    left = torch.ones(n, dtype=torch.bool)
    front = 0
    while left.any():
        dominated = (dominates[left][:, left]).any(0)  # among those left, dominated by another one left
        idx = left.nonzero().flatten()[~dominated]
        rank[idx] = front
        left[idx] = False
        front += 1
    return rank


def crowding_distance(values: Tensor, rank: Tensor) -> Tensor:
    """NSGA-II's crowding distance of each point within its front (``inf`` at a front's extremes): the sum over the
    objectives of the gap between its two neighbours, divided by the front's range."""
    v = torch.nan_to_num(values.double(), nan=-1e300)
    out = torch.zeros(v.shape[1], dtype=torch.float64)
    for f in rank.unique():
        idx = (rank == f).nonzero().flatten()
        if len(idx) <= 2:
            out[idx] = torch.inf
            continue
        for m in range(v.shape[0]):
            vals = v[m, idx]
            order = torch.argsort(vals, stable=True)
            span = vals[order[-1]] - vals[order[0]]
            out[idx[order[0]]] = torch.inf
            out[idx[order[-1]]] = torch.inf
            if span > 0:
                gaps = (vals[order[2:]] - vals[order[:-2]]) / span
                out[idx[order[1:-1]]] += gaps
    return out


def pareto_scores(values: Tensor) -> Tensor:
    """A scalar per point that orders ``N`` points of ``values [M, N]`` (to maximise) by Pareto front, then by
    crowding distance within a front: ``-rank + c / (1 + c)`` with ``c`` the crowding distance (``inf`` gives 1, so
    a front's extremes come first). Higher is better; the order is NSGA-II's crowded comparison. The scores are
    relative to the ``N`` points given (a point's score depends on the others)."""
    rank = non_dominated_ranks(values)
    c = crowding_distance(values, rank)
    share = torch.where(torch.isinf(c), torch.ones_like(c), c / (1 + c))
    return -rank.double() + share * (1 - 1e-9)


class ParetoVerifier(Verifier):
    """Several objectives for multi-objective search, compared by Pareto dominance.

    A search that chooses among a group's candidates (:func:`steerdiff.align.noise_search.noise_search`) calls
    :meth:`components` and ranks the group's candidates with :func:`pareto_scores` (front, then crowding distance).
    Where one scalar per sample is needed independently of the others (an SMC weight, a gradient, the ``rewards`` a
    result reports), :meth:`__call__` gives the weighted sum ``sum_m w_m v_m(x)`` (``weights``, default equal):
    Pareto rank is a property of a population, not of one sample, so it cannot be that scalar.
    """

    pareto = True

    def __init__(self, verifiers: Sequence[Callable], weights: Sequence[float] | None = None,
                 name: str | None = None, **kwargs):
        verifiers = list(verifiers)
        if len(verifiers) < 2:
            raise ValueError(f"a Pareto verifier needs at least two objectives, got {len(verifiers)}")
        weights = [1.0 / len(verifiers)] * len(verifiers) if weights is None else [float(w) for w in weights]
        if len(weights) != len(verifiers):
            raise ValueError(f"weights: got {len(weights)} for {len(verifiers)} objectives")
        self.objectives = verifiers
        self.sum = WeightedSum(list(zip(weights, verifiers, strict=True)))
        kwargs.setdefault("differentiable", all(getattr(r, "differentiable", True) for r in verifiers))
        super().__init__(name or "pareto(" + ", ".join(_name_of(r) for r in verifiers) + ")", **kwargs)

    def score(self, x: Tensor) -> Tensor:
        return self.sum(x)

    def components(self, x: Tensor) -> Tensor:
        """``[M, B]`` objective values (float64, no gradient), on ``x``'s device."""
        start = time.perf_counter()
        dev = self.device or x.device
        with torch.no_grad():
            out = torch.stack([r(x.to(dev)).double() for r in self.objectives])
        self._sync(dev)
        self.calls += 1
        self.rows += x.shape[0]
        self.seconds += time.perf_counter() - start
        return out.to(x.device)

    def rank(self, x: Tensor) -> Tensor:
        """:func:`pareto_scores` of the samples ``x`` among themselves ``[B]``."""
        return pareto_scores(self.components(x).cpu()).to(x.device)
