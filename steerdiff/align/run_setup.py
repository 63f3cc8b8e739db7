"""The setup of an alignment run, shared by every alignment sampler: argument checks, the prepared run, and the
model and reward calls (``docs/methods/das.md``, "Papers and code"; the samplers are those of Kim, Kim, Park, ICLR 2025,
and their baselines).

:func:`prepare` validates the arguments all samplers take (``denoiser, reward, noise, sigmas, alpha, particles,
cond, eta, batch_size, generator, progress, callback``) in one fixed order, with hooks for a method's own checks,
and returns an :class:`AlignRun`: the grid, conditions per row, per-row generators, the counted
:class:`RewardCalls` (core's :class:`~steerdiff.core.calls.ModelCall` plus the reward), the callback, and the
per-group cost counts a result reports. :func:`step_info` is the one dict every sampler passes to ``callback``.

This module was ``steerdiff.align.sampler`` (that path still imports, with a ``DeprecationWarning``).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..core.calls import ModelCall
from ..core.noise import GeneratorLike, SampleNoise, make_generators
from ..core.sigmas import check_sigmas
from ..distributed import SINGLE, DistContext, check_same, resolve
from ..guidance.reward import reward_gradient
from .rewards import as_reward
from .shard import ParticleShard
from .smc import NOISE_BLOCK, host_decisions

Reward = Callable | Sequence
"""A reward ``r(x0) -> [B]``, or a list of ``(weight, reward)`` pairs (their weighted sum)."""
Callback = Callable[[dict], None]
"""Called once per step with :func:`step_info`'s dict."""


# ------------------------------------------------------------------------------------------------ callback
CALLBACK_KEYS = ("i", "sigma", "sigma_next", "x", "denoised", "grad", "reward", "log_twist", "log_weights", "ess",
                 "lambda", "resampled", "ancestors")


def step_info(i: int, sigma: float, sigma_next: float, x: Tensor, denoised: Tensor, *, grad: Tensor | None = None,
              reward: Tensor | None = None, log_twist: Tensor | None = None, log_weights: Tensor | None = None,
              ess: Tensor | None = None, lam: Tensor | None = None, resampled: Tensor | None = None,
              ancestors: Tensor | None = None) -> dict:
    """The dict every align sampler passes to ``callback`` once per step (keys :data:`CALLBACK_KEYS`).

    ``i``, ``sigma``, ``sigma_next``: the step; ``x [B, ...]``: the particles entering the move (after any
    resampling); ``denoised``: ``D(x, sigma)``; ``grad``: ``grad_x r(D(x, sigma)) / alpha`` where the sampler
    uses it; ``reward``: ``r(D(x, sigma))`` ``[G, P]``; ``log_twist``, ``log_weights``: ``[G, P]``;
    ``ess``, ``lambda``, ``resampled``: ``[G]``; ``ancestors``: ``[G, P]`` where resampled. A key is None where the
    sampler has no such quantity at that step (plain chains carry only the first five).
    """
    return {"i": i, "sigma": sigma, "sigma_next": sigma_next, "x": x, "denoised": denoised, "grad": grad,
            "reward": reward, "log_twist": log_twist, "log_weights": log_weights, "ess": ess, "lambda": lam,
            "resampled": resampled, "ancestors": ancestors}


# ------------------------------------------------------------------------------------------------ model calls
class RewardCalls(ModelCall):
    """Core's model call (:class:`~steerdiff.core.calls.ModelCall`: micro-batched, counted, timed, shape-checked)
    plus the reward ``r(x0)`` and its gradient ``grad_x r(D(x, sigma))`` in the same micro-batches.

    Non-finite denoiser outputs are not raised here (``finite=False``): the SMC samplers kill such particles
    themselves (``docs/methods/das.md``, "Non-finite values").

    Args:
        denoiser: ``D(x, sigma, cond=None)``.
        reward: ``r(x0) -> [B]``.
        batch_size: rows per forward/backward call (memory stays flat in the number of particles); None = all.
        shard: the rows this process holds; its micro-batches are cut where the one-process run cuts them
            (:meth:`~steerdiff.align.shard.ParticleShard.chunks`), so that sharding does not change a result.
    """

    def __init__(self, denoiser: Callable, reward: Callable, batch_size: int | None,
                 shard: ParticleShard | None = None):
        super().__init__(denoiser, batch_size=batch_size, chunks=self._shard_cuts, finite=False)
        self.reward = reward
        self.shard = shard
        self._shard_chunks: list[slice] | None = None
        self.grad_rows = 0
        self.reward_rows = 0
        self.reward_time = 0.0  # seconds inside the reward's forward calls (part of ``time``)

    def score(self, x0: Tensor) -> Tensor:
        """``reward(x0)``, timed into ``reward_time`` (the verifier's seconds, ``docs/methods/search.md``, "Cost")."""
        start = time.perf_counter()
        out = self.reward(x0)
        self.reward_time += time.perf_counter() - start
        return out

    def _shard_cuts(self, n: int) -> list[slice] | None:
        """A shard's own cuts of its rows (None: cut by ``batch_size``)."""
        if self.shard is not None and not self.shard.local and n == len(self.shard.rows):
            if self._shard_chunks is None:
                self._shard_chunks = self.shard.chunks(self.batch_size)
            return self._shard_chunks
        return None

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
            for c in self.chunks(x0.shape[0]):
                out.append(self._check_reward(self.score(x0[c]), c.stop - c.start, where).double())
        self.reward_rows += x0.shape[0]
        self.time += time.perf_counter() - start
        return torch.cat(out)

    def denoise(self, x: Tensor, sigma: float, cond: Tensor | None, step: int | None = None) -> Tensor:
        """``D(x, sigma)`` without gradients (``step`` is named in errors)."""
        with torch.no_grad():
            return self(x, sigma, cond, step)

    def _reward_of_denoised(self, x: Tensor, sigma: float, cond: Tensor | None, step: int | None,
                            where: str) -> tuple[Tensor, Tensor]:
        """``(r(D(x, sigma)), D)`` with the graph kept, for :func:`steerdiff.guidance.reward.reward_gradient`."""
        d = self.one(x, sigma, cond, step)
        rho = self._check_reward(self.score(d), d.shape[0], where)
        if not rho.requires_grad:
            raise ValueError(f"reward returned a tensor without a gradient ({where}); for a black-box "
                             "reward pass gradient=False")
        return rho, d

    def twist(self, x: Tensor, sigma: float, cond: Tensor | None, grad: bool, step: int):
        """``(D, rho, grad_x rho)`` at ``x`` (``grad_x rho`` is None unless ``grad``); rho in float64.

        Rows whose reward is not finite get a zero gradient (they are killed by the caller); their reward is
        excluded from the backward pass so that they cannot poison the others.
        """
        start = time.perf_counter()
        where = f"step {step}, sigma={sigma:.6g}"
        ds, rhos, grads = [], [], []
        for c in self.chunks(x.shape[0]):
            cc = None if cond is None else cond[c]
            if not grad:
                with torch.no_grad():
                    d = self.one(x[c], sigma, cc, step)
                    rho = self._check_reward(self.score(d), d.shape[0], where)
                ds.append(d)
                rhos.append(rho.double())
                continue
            rho, g, d = reward_gradient(lambda xc, cc=cc: self._reward_of_denoised(xc, sigma, cc, step, where), x[c])
            ds.append(d)
            rhos.append(rho.double())
            grads.append(g)
            self.grad_rows += g.shape[0]
        self.reward_rows += x.shape[0]
        self.time += time.perf_counter() - start
        return torch.cat(ds), torch.cat(rhos), (torch.cat(grads) if grad else None)


ModelCalls = RewardCalls
"""The former name of :class:`RewardCalls` (kept as an alias)."""


# ------------------------------------------------------------------------------------------------ arguments
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


# ------------------------------------------------------------------------------------------------ the run
@dataclass
class AlignRun:
    """A validated alignment run: ``groups`` populations of ``particles`` rows of ``noise`` over ``sigmas``.

    ``noise``, ``cond`` and ``generators`` hold this process's rows (``shard.rows`` of the ``G * P``; all of them in
    one process); per-particle ``[G, P]`` quantities are gathered by the sampler through ``shard``.
    """

    method: str
    noise: Tensor
    groups: int
    particles: int
    alpha: float | None
    eta: float
    sigmas: list[float]
    cond: Tensor | None  # one per local row
    generators: list | None  # one per local row, or None for the global RNG
    calls: RewardCalls
    progress: bool
    callback: Callback | None
    schedule: Any = None  # what the method's ``schedule`` hook returned
    started: float = field(default_factory=time.perf_counter)
    shard: ParticleShard | None = None

    def __post_init__(self) -> None:
        if self.shard is None:
            self.shard = ParticleShard(SINGLE, self.groups, self.particles)

    @property
    def steps(self) -> int:
        return len(self.sigmas) - 1

    @property
    def host_decisions(self) -> bool:
        """Whether the per-step SMC decisions are read on the host (:func:`steerdiff.align.smc.host_decisions`:
        on the CPU; on any other device they stay on the device, with no synchronisation per step)."""
        return host_decisions(self.noise)

    @property
    def group_generators(self) -> list | None:
        """A group's resampling and output draws come from its first row's generator (None where another rank
        holds that row)."""
        return self.shard.group_generators(self.generators)

    def sample_noise(self) -> SampleNoise:
        return SampleNoise(self.generators, block=NOISE_BLOCK)

    def bar(self, desc: str | None = None):
        return tqdm(range(self.steps), disable=not self.progress or not self.shard.ctx.is_main,
                    desc=desc or self.method, leave=False)

    def emit(self, i: int, x: Tensor, denoised: Tensor, **values) -> None:
        """Call the callback (if any) with the one step shape, :func:`step_info`."""
        if self.callback is not None:
            self.callback(step_info(i, self.sigmas[i], self.sigmas[i + 1], x, denoised, **values))

    def costs(self) -> dict:
        """Per-group ``nfe``, ``nfe_grad``, ``reward_evals``, and the times (this process's seconds: ``model_time``
        in the denoiser, the reward and their VJPs; ``verifier_time`` in the reward's forward calls, a part of it;
        ``wall_time`` since :func:`prepare`), as :class:`AlignResult` fields."""
        c, total = self.calls, self.shard.total
        return {"nfe": total(c.denoiser.rows) / self.groups, "nfe_grad": total(c.grad_rows) / self.groups,
                "reward_evals": total(c.reward_rows) / self.groups, "model_time": c.time,
                "verifier_time": c.reward_time,
                "wall_time": time.perf_counter() - self.started}


def prepare(method: str, denoiser: Callable, reward: Reward, noise: Tensor, sigmas, *, particles: int,
            alpha: float | None, cond: Tensor | None, eta: float, batch_size: int | None, generator: GeneratorLike,
            progress: bool, callback: Callback | None, check: Callable[[int], None] | None = None,
            schedule: Callable[[int], Any] | None = None, dist: DistContext | None = SINGLE, shard_by: str = "auto",
            options: Any = None) -> AlignRun:
    """Validate the shared arguments and set up a run.

    Order (so that the first bad argument is the one reported): the reward, the noise layout, ``particles``,
    ``alpha`` (None: not used), ``eta``, ``batch_size``; then ``check(particles)``, the method's own arguments;
    the grid (decreasing, final value any ``>= 0``); ``schedule(steps)``, the method's plan read from the grid
    (stored as ``run.schedule``); the condition; the sharding (``dist``, ``shard_by``); the generators.

    Sharded (``dist`` of more than one process, or None under :func:`steerdiff.distributed.init`; the default,
    :data:`~steerdiff.distributed.SINGLE`, is for samplers that do not shard): every rank passes
    the same arguments (the full ``noise`` and ``cond``; checked with one all-gathered fingerprint that also covers
    ``options``, the method's own settings), keeps its rows (:class:`~steerdiff.align.shard.ParticleShard`) and
    needs per-row generators (an int seed or per-row seeds).
    """
    started = time.perf_counter()
    reward = as_reward(reward)
    groups, particles = check_common(noise, particles, alpha, eta, batch_size)
    if check is not None:
        check(particles)
    sig = check_sigmas(sigmas, final="any", allow_inf_start=True).tolist()  # inf: start from the unit noise
    plan = None if schedule is None else schedule(len(sig) - 1)
    cond = expand_cond(cond, groups, particles)
    ctx = resolve(dist)
    shard = ParticleShard(ctx, groups, particles, shard_by)
    if ctx.distributed:
        if generator is None or isinstance(generator, torch.Generator):
            raise ValueError("generator must be an int seed or one seed (or generator) per row in a sharded run: "
                             "each particle draws from its own row's generator so that the result does not depend "
                             f"on the number of processes (got {type(generator).__name__})")
        check_same(ctx, method, noise=noise, sigmas=sig, particles=particles, alpha=alpha, eta=eta,
                   batch_size=batch_size, cond=cond, shard_by=shard_by, options=options,
                   generator=generator if isinstance(generator, int) or all(isinstance(g, int) for g in generator)
                   else len(generator))
        if ctx.is_main and not shard.same_batches(batch_size):
            run = shard.chunks(None)[0]
            warnings.warn(f"{method}: batch_size={batch_size} cuts this rank's rows ({shard.layout} layout) into other "
                          "micro-batches than one process would, so the result can differ from the one-process run "
                          "at float rounding (networks round differently with the batch size); for bitwise equality "
                          f"pass a batch_size that divides {run.stop - run.start}, the consecutive rows a rank holds",
                          stacklevel=3)
        if isinstance(generator, int):
            generator = [generator + int(i) for i in shard.rows]
        else:
            if len(generator) != noise.shape[0]:
                raise ValueError(f"generator: got {len(generator)} seeds or generators for {noise.shape[0]} rows")
            generator = shard.take_list(generator)
    gens = make_generators(generator, len(shard.rows), noise.device)
    return AlignRun(method=method, noise=shard.take(noise), groups=groups, particles=particles, alpha=alpha, eta=eta,
                    sigmas=sig, cond=shard.take(cond), generators=gens,
                    calls=RewardCalls(denoiser, reward, batch_size, shard), progress=progress, callback=callback,
                    schedule=plan, started=started, shard=shard)
