"""Discrete samplers: one loop over a host-side grid and a registered step (``docs/methods/discrete.md``, "Samplers").

* ``ancestral``: the exact reverse step ``p(x_s | x_t)`` of :meth:`Process.posterior` on ``steps`` equal times (D3PM,
  Austin et al. 2021, Sec. 3.3; MDLM, Sahoo et al. 2024, Sec. 3.2), or on times ``(1 - i / steps) ** time_power``
  (DeFoG's time distortion, Qin et al. 2025); any process.
* ``unmask``: ``steps`` rounds that each reveal a fixed number of masked positions chosen uniformly at random, drawn
  from the denoiser's ``p(x_0 | x_t)`` (the tau-leaping / k-tokens-per-step reading of the absorbing reverse process;
  with one token per step, ``steps = L``, it is the any-order autoregressive chain and exact).
* ``maskgit``: confidence-ordered decoding (Chang et al., CVPR 2022, Sec. 3.2): draw every masked token, keep the most
  confident ones (log-probability plus annealed Gumbel noise), the number still masked following ``L cos(pi i / 2N)``.

Each costs one denoiser evaluation per grid entry (NFE = ``len(grid)``; a doubled CFG batch counts 2). The loop reads
no tensor on the host: the grid is Python floats and ints; every random number comes from per-row generators.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.noise import GeneratorLike, make_generators
from .process import Process, categorical, make_process
from .registry import SAMPLERS, register_sampler


# ------------------------------------------------------------------------------------------------ randomness
class RowRandom:
    """Uniforms with one generator per batch row (``docs/methods/conventions.md``, "Randomness").

    Each row's generator fills ``block`` draws of a given width at a time, so a row's numbers depend only on its own
    generator and the sequence of widths requested, never on the batch. ``generators=None`` uses the global RNG and
    one ``torch.Generator`` is shared by all rows (one call per draw: fast, not batch-invariant).
    """

    def __init__(self, generators: list[torch.Generator] | torch.Generator | None, block: int = 32):
        self.generators = generators
        self.block = block
        self._buffers: dict[int, list] = {}

    @classmethod
    def make(cls, generator: GeneratorLike, n: int) -> RowRandom:
        if isinstance(generator, torch.Generator) or generator is None:
            return cls(generator)
        return cls(make_generators(generator, n))

    def rand(self, n: int, width: int, device) -> Tensor:
        """``[n, width]`` float32 uniforms in [0, 1) on ``device``."""
        g = self.generators
        if g is None or isinstance(g, torch.Generator):
            dev = device if g is None else g.device
            return torch.rand(n, width, generator=g, device=dev).to(device, non_blocking=True)
        if n != len(g):
            raise ValueError(f"batch of {n} rows but {len(g)} generators")
        buf = self._buffers.get(width)
        if buf is None or buf[1] == self.block:
            rows = [torch.rand(self.block, width, generator=gi, device=gi.device) for gi in g]
            buf = self._buffers[width] = [torch.stack(rows).to(device, non_blocking=True), 0]
        buf[1] += 1
        return buf[0][:, buf[1] - 1]


@dataclass(frozen=True)
class Step:
    """One grid entry: evaluate the denoiser at time ``t`` and move to time ``s < t``; ``reveal`` positions are
    unmasked (unmasking samplers); ``frac`` is ``i / steps`` (MaskGIT's annealing)."""

    t: float
    s: float
    reveal: int = 0
    frac: float = 0.0


def _check_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    return steps


def ancestral_grid(process: Process, length: int, steps: int, time_power: float = 1.0) -> list[Step]:
    """``steps`` time steps from 1 to 0: ``t_i = (1 - i / steps) ** time_power``, equal steps at ``1``.

    ``time_power > 1`` spends more of the steps near the data (small ``t``) and takes coarser ones near the noise:
    ``2`` is the ``polydec`` time distortion of DeFoG's sampling grid (Qin et al., ICML 2025, "DeFoG: Discrete Flow
    Matching for Graph Generation", the sampling-time distortions of its training-sampling decoupling: ``f(t) = 2t -
    t^2`` in their time, which runs from noise to data). Each step stays the exact reverse step between its two
    times; only where the steps fall changes."""
    n = _check_steps(steps)
    p = check_time_power(time_power)
    return [Step((1 - i / n) ** p, (1 - (i + 1) / n) ** p, 0, i / n) for i in range(n)]


def check_time_power(time_power: float) -> float:
    """``time_power`` as a float, refused unless a finite number > 0."""
    if isinstance(time_power, bool) or not isinstance(time_power, (int, float)) or not 0 < time_power < math.inf:
        raise ValueError(f"time_power must be a finite number > 0, got {time_power!r}")
    return float(time_power)


def plan(spec, process: Process, length: int, steps: int, time_power: float = 1.0) -> list[Step]:
    """The grid of the sampler ``spec`` (a :class:`~steerdiff.discrete.registry.SamplerSpec`); ``time_power != 1``
    (:func:`ancestral_grid`) only for the time grid of ``ancestral``: the unmasking samplers' times follow from
    their reveal counts."""
    p = check_time_power(time_power)
    if p == 1.0:
        return spec.grid(process, length, steps)
    if spec.grid is not ancestral_grid:
        raise ValueError(f"time_power applies to the 'ancestral' sampler's time grid only, got method "
                         f"{spec.name!r} with time_power = {time_power!r}")
    return ancestral_grid(process, length, steps, p)


def _reveal_grid(process: Process, masked: Sequence[int]) -> list[Step]:
    """Steps from the counts of masked positions before each step (``masked[0] = L`` ... ``masked[-1] = 0``): the
    times are those where the expected masked fraction ``1 - alpha_t`` equals the count over ``L``."""
    length, n = masked[0], len(masked) - 1
    t_of = process.schedule.t_of_alpha
    return [Step(t_of(1 - masked[i] / length), t_of(1 - masked[i + 1] / length), masked[i] - masked[i + 1], i / n)
            for i in range(n)]


def unmask_grid(process: Process, length: int, steps: int) -> list[Step]:
    """``steps`` rounds revealing ``round(L (i+1)/steps) - round(L i/steps)`` positions each (``steps = L``: one)."""
    n = min(_check_steps(steps), length)
    return _reveal_grid(process, [length - round(length * i / n) for i in range(n + 1)])


def maskgit_grid(process: Process, length: int, steps: int) -> list[Step]:
    """MaskGIT's cosine mask schedule: ``floor(L cos(pi i / 2N))`` positions still masked after ``i`` of ``N`` steps,
    at least one revealed per step (Chang et al. 2022, Sec. 3.2-3.3)."""
    n = min(_check_steps(steps), length)
    masked = [length]
    for i in range(1, n + 1):
        want = math.floor(length * math.cos(math.pi * i / (2 * n)) + 1e-9)
        masked.append(max(min(want, masked[-1] - 1), n - i))  # leave one per remaining step
    return _reveal_grid(process, masked)


@register_sampler("ancestral", ancestral_grid, note="exact reverse steps p(x_s | x_t) on equal times (or "
                  "time_power-distorted ones); any process")
def ancestral_step(process: Process, x: Tensor, p0: Tensor, step: Step, rand: RowRandom) -> Tensor:
    """``x_s ~ p(x_s | x_t) = sum_{x0} p0(x0) q(x_s | x_t, x0)``, independently per position."""
    probs = process.posterior(x, p0, step.t, step.s)
    return categorical(probs, rand.rand(x.shape[0], x.shape[1], x.device))


def _reveal(x: Tensor, p0: Tensor, score: Tensor, k: int, masked: Tensor, rand: RowRandom) -> Tensor:
    """Replace the ``k`` masked positions of highest ``score`` by draws from ``p0`` (positions not masked are kept)."""
    if k <= 0:
        return x
    score = torch.where(masked, score, torch.full_like(score, -math.inf))
    top = torch.zeros_like(masked).scatter(1, score.topk(k, dim=1).indices, True) & masked
    draw = categorical(p0, rand.rand(x.shape[0], x.shape[1], x.device))
    return torch.where(top, draw, x)


@register_sampler("unmask", unmask_grid, absorbing_only=True,
                  note="k random masked positions per step drawn from p(x0|x_t); steps = L is exact")
def unmask_step(process: Process, x: Tensor, p0: Tensor, step: Step, rand: RowRandom) -> Tensor:
    """Reveal ``step.reveal`` masked positions chosen uniformly at random, each drawn from its ``p0``."""
    masked = x == process.mask_index
    score = rand.rand(x.shape[0], x.shape[1], x.device)
    return _reveal(x, p0, score, step.reveal, masked, rand)


@register_sampler("maskgit", maskgit_grid, absorbing_only=True,
                  note="confidence-ordered decoding (MaskGIT), cosine mask schedule")
def maskgit_step(process: Process, x: Tensor, p0: Tensor, step: Step, rand: RowRandom,
                 choice_temperature: float = 4.5) -> Tensor:
    """Draw every masked token from ``p0``, keep the ``step.reveal`` most confident: ``log p0(draw) + tau g``, ``g``
    standard Gumbel, ``tau = choice_temperature (1 - i/N)`` (MaskGIT's code, default 4.5); ``0`` is greedy order."""
    masked = x == process.mask_index
    b, n = x.shape
    draw = categorical(p0, rand.rand(b, n, x.device))
    conf = p0.gather(-1, draw[..., None])[..., 0].float().clamp_min(1e-30).log()
    u = rand.rand(b, n, x.device).clamp(1e-20, 1 - 1e-7)
    conf = conf + choice_temperature * (1 - step.frac) * -torch.log(-torch.log(u))
    conf = torch.where(masked, conf, torch.full_like(conf, -math.inf))
    top = torch.zeros_like(masked).scatter(1, conf.topk(step.reveal, dim=1).indices, True) & masked
    return torch.where(top, draw, x)


# ------------------------------------------------------------------------------------------------ the loop
def checked_probs(denoiser: Callable, x: Tensor, t: float, cond, step: int, num_classes: int) -> Tensor:
    """``denoiser(x, t [B], cond) -> p0 [B, L, K]``; refuses a wrong shape naming the step and ``t``."""
    tt = torch.full((x.shape[0],), t, dtype=torch.float32, device=x.device)
    p0 = denoiser(x, tt, cond)
    want = (*x.shape, num_classes)
    if not isinstance(p0, Tensor) or tuple(p0.shape) != want:
        got = tuple(p0.shape) if isinstance(p0, Tensor) else type(p0).__name__
        raise ValueError(f"the denoiser must return probabilities of shape {want} [B, L, K], got {got} "
                         f"(step {step}, t = {t:.4g})")
    return p0


def from_logits(net: Callable) -> Callable:
    """A discrete denoiser from a network returning logits: ``D(x, t, cond) = softmax(net(x, t, cond))`` over the last
    axis, computed in at least float32 and returned in the logits' dtype (``docs/methods/conventions.md``, "Discrete
    diffusion": denoisers return probabilities)."""

    def denoiser(x: Tensor, t: Tensor, cond=None) -> Tensor:
        logits = net(x, t, cond)
        return torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1).to(logits.dtype)

    return denoiser


class RowCounter:
    """Counts denoiser rows evaluated (NFE per sample = rows / batch), across doubled CFG batches too."""

    def __init__(self, denoiser: Callable):
        self.denoiser, self.rows = denoiser, 0

    def __call__(self, x: Tensor, t: Tensor, cond=None) -> Tensor:
        self.rows += x.shape[0]
        return self.denoiser(x, t, cond)


@dataclass
class DiscreteStats:
    """What a run cost: ``nfe`` denoiser evaluations per sample and the grid it followed."""

    nfe: float
    grid: list


def prepare(process, num_classes, method: str, x: Tensor | None, shape, rand: RowRandom, device):
    spec = SAMPLERS.get(method)
    if spec.absorbing_only and not process.absorbing:
        raise ValueError(f"method {method!r} unmasks tokens and needs the absorbing process, got {process.name!r}")
    if x is None:
        if shape is None or len(shape) != 2:
            raise ValueError(f"shape must be (batch, length) when x is not given, got {shape!r}")
        x = process.prior(tuple(shape), rand.rand(shape[0], shape[1], device))
    elif x.dim() != 2 or x.dtype != torch.long:
        raise ValueError(f"x must be a long tensor [B, L], got {x.dtype} of shape {tuple(x.shape)}")
    return spec, x


def sample(denoiser: Callable, process: Process | str, steps: int, *, shape: tuple[int, int] | None = None,
           x: Tensor | None = None, method: str = "ancestral", num_classes: int | None = None, cond=None,
           guidance=None, generator: GeneratorLike = None, device=None, callback: Callable | None = None,
           return_stats: bool = False, time_power: float = 1.0, **options):
    """Sample token sequences by a registered discrete sampler.

    Args:
        denoiser: ``D(x [B, L] long, t [B] float, cond) -> p(x_0 | x_t) [B, L, K]`` (``docs/methods/conventions.md``,
            "Discrete diffusion").
        process: a :class:`Process` or a registered name (then ``num_classes`` is needed).
        steps: grid entries (denoiser evaluations); the unmasking samplers cap it at ``L``.
        shape: ``(B, L)`` to start from the process's prior ``x_1``; or ``x``: a start ``[B, L]`` (masked positions
            are filled in, others kept: infilling).
        method: a registered sampler (:data:`steerdiff.discrete.registry.SAMPLERS`).
        cond: the condition handed to the denoiser (``[B]`` class ints, ``-1`` null).
        guidance: a discrete guider (:class:`steerdiff.discrete.CFG`) or None.
        generator: int seed (row ``i`` gets ``seed + i``), seeds, generators, one shared generator or None.
        device: where to start when ``x`` is not given (default: the CPU).
        callback: called after each step with ``{"i", "t", "s", "x", "p0"}``.
        return_stats: also return :class:`DiscreteStats`.
        time_power: ``ancestral`` only: the times ``(1 - i / steps) ** time_power`` (:func:`ancestral_grid`; 1:
            equal steps; 2: DeFoG's ``polydec``); the NFE is ``steps`` whatever it is.
        options: passed to the step (``choice_temperature`` for ``maskgit``).
    """
    process = make_process(process, num_classes)
    n = x.shape[0] if x is not None else (shape[0] if shape else 0)
    rand = RowRandom.make(generator, n)
    spec, x = prepare(process, num_classes, method, x, shape, rand, device if x is None else x.device)
    counter = RowCounter(denoiser)
    model = guidance.wrap(counter) if guidance is not None else counter
    grid = plan(spec, process, x.shape[1], steps, time_power)
    bad = []  # per step, on the device: whether p0 held a non-finite or negative value (read once, after the loop)
    for i, st in enumerate(grid):
        p0 = checked_probs(model, x, st.t, cond, i, process.num_classes)
        bad.append(~(torch.isfinite(p0) & (p0 >= 0)).all())
        x = spec.step(process, x, p0, st, rand, **options)
        if callback is not None:
            callback({"i": i, "t": st.t, "s": st.s, "x": x, "p0": p0})
    if bad and bool(torch.stack(bad).any()):
        i = int(torch.stack(bad).nonzero()[0, 0])
        raise FloatingPointError(f"the denoiser returned non-finite or negative probabilities at step {i} "
                                 f"(t = {grid[i].t:.4g})")
    if return_stats:
        return x, DiscreteStats(counter.rows / max(x.shape[0], 1), grid)
    return x


def nfe_of(method: str, length: int, steps: int, guided: bool = False) -> int:
    """Denoiser evaluations per sample of ``method`` over ``steps`` (capped at ``length`` for the unmasking ones),
    doubled for a CFG batch."""
    spec = SAMPLERS.get(method)
    n = steps if not spec.absorbing_only else min(steps, length)
    return n * (2 if guided else 1)
