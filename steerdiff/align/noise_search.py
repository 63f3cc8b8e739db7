"""Noise search: inference-time search over the starting noise (and over paths) of a deterministic sampler, scored by a
verifier (``docs/methods/search.md``, "Noise search").

Ma et al., "Inference-Time Scaling for Diffusion Models beyond Scaling Denoising Steps", CVPR 2025, Section 3.2 (the
search algorithms; the reference implementation is sayakpaul/tt-scale-flux): with a deterministic ODE sampler the
sample is a function ``x0 = Phi(n)`` of its starting noise, so spending more compute means trying more noises.

* ``random``: each round draws ``particles`` fresh noises per group, runs them to the end and keeps the best
  ``x0`` seen (round 0 runs the given ``noise``); best-of-N with an ODE sampler, over ``rounds`` rounds.
* ``zero_order``: round 0 as random; each later round draws ``particles`` neighbours of the group's pivot (its best
  noise so far), ``n' = (n + lambda eps) / sqrt(1 + lambda^2)`` with ``eps ~ N(0, I)`` from the row's generator
  (``lambda = neighbourhood``; the mix preserves ``N(0, I)``, so every neighbour is itself a valid starting noise),
  and the pivot moves to the best neighbour when it beats it (a first-order-free hill climb, the paper's "zero-order
  search").
* ``paths``: round 0 as random, keeping each trajectory's state at level ``sigma_j`` (``j = path_from``); each later
  round re-noises the pivot's state at ``sigma_j`` forward to ``sigma_k`` (``k = path_to < j``),
  ``x_k = x_j + sqrt(sigma_k^2 - sigma_j^2) eps``, and continues the ODE from ``sigma_k`` (the paper's "search over
  paths", with one re-noising level instead of a schedule of them).

Every round keeps the best so far (a candidate replaces the pivot only if its reward is strictly higher), so the
best reward never decreases with the rounds. It is an optimiser of ``r`` near the model's typical set, not a sampler
of the tilted law ``p exp(r / alpha)``: its output is biased towards ``argmax r`` (``benchmarks/search.py`` reports
the bias on the exact mixtures).

Cost, per group: ``particles`` trajectories per round, each the sampler's NFE on the grid it runs (the full grid, or
``sigmas[path_to:]`` for a path round); no VJP; ``particles`` verifier rows per round. ``budget`` (NFE per group)
chooses the largest number of rounds within it. The candidates of a round are rows of one population
(``groups x particles``), sharded over processes like an SMC population (:class:`~.shard.ParticleShard`): every
draw comes from its global row's generator, so a sharded run equals the one-process run bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..core.calls import where
from ..core.denoiser import host_level
from ..core.noise import GeneratorLike
from ..core.registry import SAMPLERS
from ..distributed import DistContext
from ..io.plugins import Registry
from .registry import register_aligner
from .result import AlignResult
from .run_setup import AlignRun, Callback, Reward, prepare
from .smc import start_state

SEARCHES: Registry[str] = Registry("noise search", argument="search")
"""The search rules of :func:`noise_search` (``random``, ``zero_order``, ``paths``), each with its description."""
for _name, _text in (("random", "fresh noises every round, keep the best (Ma et al. 2025, random search)"),
                     ("zero_order", "neighbours of the best noise, hill-climbing (Ma et al. 2025, zero-order search)"),
                     ("paths", "re-noise the best path's intermediate state and continue (search over paths)")):
    SEARCHES.add(_name, _text)


def _check_sampler(name: str, sigma0: float):
    spec = SAMPLERS.get(name)
    if spec.stochastic(0.0):
        raise ValueError(f"sampler must be deterministic (an ODE sampler such as euler, heun, dpmpp_2m): "
                         f"{name!r} draws fresh noise, so a noise would not determine its sample")
    if math.isinf(sigma0) and not spec.inf_start:
        raise ValueError(f"sampler {name!r} cannot start at sigma = inf; use euler or heun, or a finite first sigma")
    return spec


def _path_levels(steps: int, path_from: int | None, path_to: int | None, inf_start: bool) -> tuple[int, int]:
    j = steps // 2 if path_from is None else path_from
    k = max(int(inf_start), j - max(1, steps // 8)) if path_to is None else path_to
    if not (isinstance(j, int) and isinstance(k, int) and int(inf_start) <= k < j < steps):
        raise ValueError(f"path_to < path_from must be step indices with {int(inf_start)} <= path_to < path_from < "
                         f"steps={steps} (got path_to={k}, path_from={j}); sigma[path_to] is the level the best "
                         "path is re-noised to")
    return j, k


def _search_cost(steps: int, particles: int, *, sampler: str = "euler", search: str = "random",
                 rounds: int | None = None, budget: float | None = None, path_from: int | None = None,
                 path_to: int | None = None, **_) -> dict:
    """Nominal NFE per group: ``particles`` trajectories per round (``docs/methods/search.md``, "Cost")."""
    spec = SAMPLERS.get(sampler)
    full = spec.nfe(steps)
    again = full
    if search == "paths":
        _, k = _path_levels(steps, path_from, path_to, False)
        again = spec.nfe(steps - k)
    r = _rounds(rounds, budget, particles * full, particles * again)
    return {"nfe": particles * (full + (r - 1) * again), "nfe_grad": 0}


def _rounds(rounds: int | None, budget: float | None, first: float, again: float) -> int:
    if rounds is not None and budget is not None:
        raise ValueError("give rounds or budget, not both")
    if budget is not None:
        if not (isinstance(budget, (int, float)) and math.isfinite(budget)) or budget < first:
            raise ValueError(f"budget={budget!r} NFE per group is below one round ({first:g} NFE: particles x the "
                             "sampler's NFE on the grid)")
        return 1 + int((budget - first) // again)
    if rounds is None:
        return 1
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    return rounds


class _Solve:
    """The deterministic sampler over a part of the grid, on this process's rows, through the counted calls."""

    def __init__(self, run: AlignRun, spec):
        self.run, self.spec = run, spec

    def __call__(self, x: Tensor, start: int, keep: int | None) -> tuple[Tensor, Tensor | None]:
        """From state ``x`` at ``sigmas[start]`` to the end; returns ``(final, state at sigmas[keep] or None)``."""
        run, calls = self.run, self.run.calls

        def model(z, sb, step=None):
            level = host_level(sb)
            if level is None:
                raise ValueError(f"noise_search: the sampler passed an untagged sigma ({where(step, math.nan)})")
            return calls(z, level, run.cond, None if step is None else start + step)

        kept = {}

        def callback(info: dict) -> None:
            if keep is not None and start + info["i"] == keep:
                kept["x"] = info["x"]
            run.emit(start + info["i"], info["x"], info["denoised"])  # the user's callback, step_info's dict

        with torch.no_grad():
            out = self.spec.fn(model, x, run.sigmas[start:], callback=callback,
                               progress=run.progress and run.shard.ctx.is_main)
        out = out[0] if isinstance(out, tuple) else out
        return out, kept.get("x")


def _pick(run: AlignRun, reward, x0: Tensor, best: dict | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Score a round's candidates; returns ``(rewards [G, P], winner column [G], replace [G] bool, scores [G, P])``.

    A candidate replaces the pivot only when it is strictly better (ties keep the pivot). A Pareto verifier
    (``reward.pareto``) ranks the group's candidates and its pivot by :func:`~.verifiers.pareto_scores`.
    """
    import time

    r = run.shard.per_particle(run.calls.rewards(x0))
    score = torch.where(torch.isnan(r), torch.full_like(r, -math.inf), r)
    if getattr(reward, "pareto", False):
        from .verifiers import pareto_scores

        start = time.perf_counter()
        comps = torch.stack([run.shard.per_particle(c) for c in reward.components(x0)]).cpu()  # [M, G, P]
        run.calls.reward_time += time.perf_counter() - start
        run.calls.time += time.perf_counter() - start
        ps = []
        for g in range(run.groups):
            c = comps[:, g] if best is None else torch.cat([best["components"][:, g, None], comps[:, g]], 1)
            ps.append(pareto_scores(c))
        ps = torch.stack(ps)
        if best is None:
            col = ps.argmax(1)
            return r, col, torch.ones(run.groups, dtype=torch.bool), comps
        col = ps.argmax(1)  # column 0 is the pivot: argmax's first maximum keeps it on a tie
        return r, (col - 1).clamp(min=0), col > 0, comps
    col = score.argmax(1)
    top = score.gather(1, col[:, None])[:, 0]
    replace = torch.ones_like(top, dtype=torch.bool) if best is None else top > best["score"]
    return r, col, replace, None


@register_aligner("noise_search", cost=_search_cost,
                  note="search over starting noises / paths of a deterministic sampler (an optimiser of r)")
def noise_search(
    denoiser: Callable, reward: Reward, noise: Tensor, sigmas: Tensor, *, particles: int = 16,
    search: str = "random", rounds: int | None = None, budget: float | None = None, sampler: str = "euler",
    neighbourhood: float = 0.5, path_from: int | None = None, path_to: int | None = None, cond: Tensor | None = None,
    batch_size: int | None = 512, generator: GeneratorLike = None, progress: bool = False,
    callback: Callback | None = None, dist: DistContext | None = None, shard_by: str = "auto",
) -> AlignResult:
    """Noise search (Ma et al., CVPR 2025, Section 3.2): per group, the best ``x0`` a deterministic sampler reaches from
    the noises (or paths) the search tries (``samples [G, *shape]``, ``rewards [G]``).

    Args:
        particles: candidates per round and group (the rows of ``noise`` per group: ``noise [G * particles, ...]``).
        search: ``random``, ``zero_order`` or ``paths`` (:data:`SEARCHES`).
        rounds: search rounds (round 0 runs ``noise``); default 1 (then every search is best-of-N with an ODE
            sampler).
        budget: NFE per group instead of ``rounds``: the most rounds that fit.
        sampler: a deterministic sampler of :data:`steerdiff.core.registry.SAMPLERS` (euler, heun, dpmpp_2m, ...).
        neighbourhood: ``lambda`` of the zero-order neighbours ``(n + lambda eps) / sqrt(1 + lambda^2)``.
        path_from, path_to: step indices ``j > k`` of the path search: the best path's state at ``sigmas[j]`` is
            re-noised to ``sigmas[k]``; defaults ``j = steps // 2``, ``k = j - max(1, steps // 8)``.
        generator: per-row seeds for the fresh draws of later rounds (an int seed: row ``i`` gets ``seed + i``).

    ``particles_final``: the last round's candidates (this process's rows). ``extras``: ``best_per_round
    [rounds, G]`` (the best reward after each round, non-decreasing),
    ``improved [rounds, G]`` (whether the pivot moved), ``pivot_noise [G, ...]`` (the best starting noise; for
    ``paths`` the one of the round-0 trajectory the best path branched from), ``search``, ``rounds``, ``sampler``.
    """
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {SEARCHES.names()}, got {search!r}")
    if not (isinstance(neighbourhood, (int, float)) and math.isfinite(neighbourhood) and neighbourhood > 0):
        raise ValueError(f"neighbourhood must be a positive finite number (lambda), got {neighbourhood!r}")
    settings = dict(search=search, rounds=rounds, budget=budget, sampler=sampler, neighbourhood=neighbourhood,
                    path_from=path_from, path_to=path_to)
    run = prepare("noise_search", denoiser, reward, noise, sigmas, particles=particles, alpha=None, cond=cond,
                  eta=1.0, batch_size=batch_size, generator=generator, progress=progress, callback=callback,
                  dist=dist, shard_by=shard_by, options=settings)
    spec = _check_sampler(sampler, run.sigmas[0])
    steps, inf0 = run.steps, math.isinf(run.sigmas[0])
    full = spec.nfe(steps)
    j = k = None
    again = full
    if search == "paths":
        j, k = _path_levels(steps, path_from, path_to, inf0)
        again = spec.nfe(steps - k)
    n_rounds = _rounds(rounds, budget, particles * full, particles * again)
    solve, draws = _Solve(run, spec), run.sample_noise()
    reward_fn = run.calls.reward
    G, P, rows = run.groups, particles, run.shard.rows
    group_of = (rows // P).to(run.noise.device)  # each local row's group
    best: dict | None = None
    trace, improved = [], []
    current = run.noise
    for rnd in range(n_rounds):
        if rnd == 0 or search != "paths":
            x0, state_j = solve(start_state(current, run.sigmas[0]), 0, j)
        else:
            eps = draws.randn_like(best["state"][group_of])
            lift = math.sqrt(run.sigmas[k] ** 2 - run.sigmas[j] ** 2)
            x0, state_j = solve(best["state"][group_of] + lift * eps, k, j)
        r, col, replace, comps = _pick(run, reward_fn, x0, best)
        win = torch.arange(G) * P + col.cpu()  # global rows of the winners
        new = {"x0": run.shard.gather_rows(x0, win), "reward": r.gather(1, col.to(r.device)[:, None])[:, 0],
               "noise": run.shard.gather_rows(current, win)}
        new["score"] = torch.where(torch.isnan(new["reward"]), torch.full_like(new["reward"], -math.inf),
                                   new["reward"])
        if state_j is not None:
            new["state"] = run.shard.gather_rows(state_j, win)
        if comps is not None:
            new["components"] = comps.gather(2, col.cpu()[None, :, None].expand(comps.shape[0], G, 1))[:, :, 0]
        if best is None:
            best = new
        else:
            if search == "paths":
                new["noise"] = best["noise"]  # a path keeps the noise of the trajectory it branched from
            for key, value in new.items():
                m = replace.to(value.device)
                m = m[None] if key == "components" else m.view(-1, *([1] * (value.ndim - 1)))  # [M, G]: by column
                best[key] = torch.where(m, value, best[key])
        trace.append(best["reward"].clone())
        improved.append(replace.clone())
        if rnd + 1 < n_rounds and search == "random":
            current = draws.randn_like(run.noise)
        elif rnd + 1 < n_rounds and search == "zero_order":
            eps = draws.randn_like(run.noise)
            current = (best["noise"][group_of] + neighbourhood * eps) / math.sqrt(1 + neighbourhood**2)
    if not torch.isfinite(best["score"]).all():
        g = int((~torch.isfinite(best["score"])).nonzero()[0])
        raise FloatingPointError(f"noise_search: the reward is non-finite for every candidate of group {g}")
    extras = {"best_per_round": torch.stack(trace), "improved": torch.stack(improved), "pivot_noise": best["noise"],
              "search": search, "rounds": n_rounds, "sampler": sampler,
              "communication": None if run.shard.local else {"layout": run.shard.layout, **run.shard.stats.as_dict()}}
    return AlignResult(samples=best["x0"], rewards=best["reward"], method="noise_search", groups=G, particles=P,
                       particles_final=x0, extras=extras, **run.costs())
