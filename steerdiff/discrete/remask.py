"""Confidence-ordered decoding with remasking for absorbing (masked) processes (``docs/methods/discrete.md``,
"Remasking and the confidence corrector").

MaskGIT (Chang et al., CVPR 2022, Sec. 3.2) reveals, at each of ``N`` steps, the most confident of the masked
positions' draws, the number still masked following ``n cos(pi j / 2N)``; once revealed a token is final, so a wrong
early decision can only be worked around. ReMDM (Wang et al., 2025, "Remasking discrete diffusion models with
inference-time scaling", Sec. 3-4) lets decoded tokens be masked again and re-decided with more context. Here:

* the plan is per row, on that row's own count ``n`` of masked positions at the start (padded graph slots and given
  tokens are not counted, so rows of different sizes follow their own cosine schedule in one batch);
* ``eta``: from the second step on, before the denoiser is asked, ``round(eta k)`` decoded positions are masked
  again (``k`` the step's net reveals), and ``k`` plus those are revealed, so the schedule of masked counts is kept
  and about ``eta n`` decisions are revisited over the run;
* ``loop``: after the schedule, ``loop`` more steps each mask ``loop_k`` decoded positions again and re-decode them
  (ReMDM's "loop" phase at a small time);
* which decoded positions are masked again (``remask_by``): those whose probability *when they were decoded* was
  lowest (ReMDM's confidence-based schedule), or uniformly at random (``"random"``);
* each step's time is the one whose masked fraction ``1 - alpha_t`` equals the row's masked share.

Exactness: with one reveal per step in random order (``choice_temperature`` dominating the confidence, no ``eta``)
the decoding is the any-order autoregressive chain, exact for an exact denoiser; a ``loop`` step with
``remask_by="random"`` and ``loop_k = 1`` re-draws one uniformly chosen position from its exact conditional, a
Gibbs move that keeps the law (tested on a table). Confidence-ordered reveals and confidence-based remasking are
not exact; they are what is measured on graphs.

Cost: ``N + loop`` denoiser evaluations (twice with a doubled CFG batch). The plan is made on the host before the
loop (one read of the masked counts); the loop reads no tensor on the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.noise import GeneratorLike
from .process import Process, categorical
from .sampling import RowCounter, RowRandom

REMASK_BY = ("confidence", "random")


@dataclass
class RemaskStats:
    """What a run cost: ``nfe`` denoiser evaluations per sample and the masked counts planned before each step
    (``masked [steps + loop, B]``, after that step's remasking)."""

    nfe: float
    masked: Tensor


def _check(steps, eta, loop, loop_k, remask_by, choice_temperature) -> None:
    for name, val, lo in (("steps", steps, 1), ("loop", loop, 0), ("loop_k", loop_k, 1)):
        if isinstance(val, bool) or not isinstance(val, int) or val < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {val!r}")
    for name, val in (("eta", eta), ("choice_temperature", choice_temperature)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) or val < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {val!r}")
    if remask_by not in REMASK_BY:
        raise ValueError(f"remask_by must be one of {REMASK_BY}, got {remask_by!r}")


def plan(counts: list[int], steps: int, eta: float = 0.0, loop: int = 0, loop_k: int = 1
         ) -> tuple[list[list[int]], list[list[int]]]:
    """Per step, per row: ``(remask, masked)``: positions masked again before the step and positions masked when
    the denoiser is asked (after remasking); a step reveals ``masked`` minus the next step's ``masked`` minus its
    ``remask`` (all the rest at the last step). ``counts``: each row's masked positions at the start."""
    remask, masked = [], []
    left = list(counts)  # masked after the previous step
    for j in range(steps):
        want = [math.floor(n * math.cos(math.pi * (j + 1) / (2 * steps)) + 1e-9) if j < steps - 1 else 0
                for n in counts]
        r = [0 if j == 0 else min(round(eta * (m - w)), n - m) for n, m, w in zip(counts, left, want, strict=True)]
        remask.append(r)
        masked.append([m + ri for m, ri in zip(left, r, strict=True)])
        left = want
    for _ in range(loop):
        r = [min(loop_k, n) for n in counts]
        remask.append(r)
        masked.append(r)
    return remask, masked


def _top(score: Tensor, k: Tensor) -> Tensor:
    """``[B, L]`` bool: the ``k [B]`` highest entries of each row of ``score`` (``-inf`` entries never, given
    ``k`` at most the row's finite count)."""
    rank = score.argsort(1, descending=True).argsort(1)
    return (rank < k[:, None]) & (score > -math.inf)


def remask_decode(denoiser: Callable, process: Process, x: Tensor, steps: int, *, eta: float = 0.0, loop: int = 0,
                  loop_k: int = 1, remask_by: str = "confidence", choice_temperature: float = 4.5, cond=None,
                  guidance=None, generator: GeneratorLike = None, return_stats: bool = False):
    """Fill the masked positions of ``x [B, L]`` by confidence-ordered decoding with remasking (module docstring).

    Args:
        denoiser: ``D(x [B, L], t [B], cond) -> p(x_0 | x_t) [B, L, K]`` (graphs:
            :func:`steerdiff.discrete.graph.flat_denoiser`).
        process: an absorbing process (``mask_index``); tokens ``< K`` in ``x`` are given and kept, other
            non-mask tokens (a graph's ``pad``) are kept.
        steps: the schedule's steps ``N`` (a row with fewer masked positions reveals nothing at some).
        eta: remasked positions per net reveal (0: MaskGIT).
        loop, loop_k: extra steps at the end and the positions each re-decides.
        remask_by: ``"confidence"`` (lowest probability when decoded first) or ``"random"``.
        choice_temperature: MaskGIT's annealed Gumbel noise on the reveal order, ``tau (1 - j / N)`` (0: greedy).
        cond, guidance: as :func:`steerdiff.discrete.sample` (a guider's ``wrap``; CFG on logits).
        generator: as :func:`steerdiff.discrete.sample` (int seed: row ``i`` gets ``seed + i``).
        return_stats: also return :class:`RemaskStats`.
    """
    _check(steps, eta, loop, loop_k, remask_by, choice_temperature)
    if not getattr(process, "absorbing", False):
        raise ValueError(f"process must be absorbing (remasking needs the mask state), got {process!r}")
    if x.dim() != 2 or x.dtype != torch.long:
        raise ValueError(f"x must be a long tensor [B, L], got {x.dtype} of shape {tuple(x.shape)}")
    b, length = x.shape
    k, mask = process.num_classes, process.mask_index
    dev = x.device
    counts = (x == mask).sum(1).tolist()  # the plan's one host read, before the loop
    remask, masked = plan(counts, steps, eta, loop, loop_k)
    t_of = process.schedule.t_of_alpha
    times = [torch.tensor([t_of(1 - m / float(c)) if c else 0.0 for m, c in zip(row, counts, strict=True)],
                          dtype=torch.float32, device=dev) for row in masked]
    remask_t = [torch.tensor(r, device=dev) for r in remask]
    masked_t = [torch.tensor(m, device=dev) for m in masked]
    rand = RowRandom.make(generator, b)
    counter = RowCounter(denoiser)
    model = guidance.wrap(counter) if guidance is not None else counter
    decoded = x == mask  # positions this run decides (the only ones ever masked again)
    stored = torch.full((b, length), math.inf, device=dev)  # log-probability of each decoded token when drawn
    total = len(times)
    for j in range(total):
        again = decoded & (x != mask)
        if remask_by == "random":
            score = torch.where(again, rand.rand(b, length, dev), torch.full_like(stored, -math.inf))
        else:
            score = torch.where(again, -stored, torch.full_like(stored, -math.inf))
        x = torch.where(_top(score, remask_t[j]), torch.full_like(x, mask), x)
        p0 = model(x, times[j], cond)
        if tuple(p0.shape) != (b, length, k):
            raise ValueError(f"the denoiser must return probabilities of shape {(b, length, k)} [B, L, K], got "
                             f"{tuple(p0.shape)} (step {j})")
        p0 = p0.float()
        draw = categorical(p0, rand.rand(b, length, dev))
        conf = p0.gather(-1, draw[..., None])[..., 0].clamp_min(1e-30).log()
        is_masked = x == mask
        if j + 1 < steps:
            reveal = masked_t[j] - masked_t[j + 1] + remask_t[j + 1]
            u = rand.rand(b, length, dev).clamp(1e-20, 1 - 1e-7)
            order = conf + choice_temperature * (1 - j / steps) * -torch.log(-torch.log(u))
            chosen = _top(torch.where(is_masked, order, torch.full_like(order, -math.inf)), reveal)
        else:  # the schedule's last step and the loop steps reveal every masked position
            chosen = is_masked
        x = torch.where(chosen, draw, x)
        stored = torch.where(chosen, conf, stored)
    if return_stats:
        return x, RemaskStats(counter.rows / max(b, 1), torch.tensor(masked))
    return x
