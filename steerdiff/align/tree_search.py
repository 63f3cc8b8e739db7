"""Diffusion Tree Sampling (DTS) and Diffusion Tree Search (DTS*) (Jain, Sareen, Pedramfar, Ravanbakhsh, "Diffusion
Tree Sampling: Scalable inference-time alignment of diffusion models", arXiv 2506.20701, section 4, Algorithms 1-2;
``docs/methods/tree_search.md``).

The reverse chain is a tree whose nodes are the states ``x_i`` of the sampler's grid (:mod:`.tree_state`). Each
iteration of a group's tree:

1. **selection** descends from the dummy root through full nodes, DTS drawing a child uniformly (the default,
   value-blind) or ``∝ exp(v / (alpha T))`` (``select_temperature = T``; ``T = 1`` is the paper's Boltzmann
   policy), DTS* taking the greedy ``argmax v`` (plus an optional UCT-like bonus), to the first node with room;
2. **expansion** adds a child by one stochastic ancestral step of the model's chain (:func:`.smc.propose` from the
   node's cached ``D(x, sigma)``; a child of the root is the next row of ``noise``);
3. **rollout** runs the model's chain from the child to the grid's end, every intermediate state appended to the
   tree (one denoiser call per step: ``N - i - 1`` NFE for a child at step ``i + 1``);
4. **backup** scores the terminal ``r(x_N)`` (one reward call) and recomputes the soft values
   ``v(n) = alpha log mean_children exp(v(c) / alpha)`` up to the root.

DTS's output is a descent from the root drawing children ``∝ exp(v / alpha)``. Unrolled, it picks terminal ``t`` with
probability ``exp(r_t / alpha) u(t) / sum_s exp(r_s / alpha) u(s)``, ``u(t) = prod_n 1 / |C(n)|`` the uniform
descent's probability: a self-normalised importance resampling whose unnormalised measure
``sum_t u(t) exp(r_t / alpha) delta_{x_t}`` has expectation exactly ``p(x) exp(r(x) / alpha)`` when the tree's shape
does not depend on the rewards (children are iid chain steps), at every budget. The paper's Boltzmann selection
(``select_temperature=1``; the paper's Theorem 1 is asymptotic) makes the shape depend on the rewards: a child
whose first rollouts scored low is rarely revisited, its one-chain estimate stays low, and the measure is biased
toward low rewards (under-tilt) at every budget we could afford; computed exactly on a 2-step chain in
``tests/align/test_tree_exact.py``. Reweighting by the selection's probabilities does not remove it either (the
prefix a rollout reuses is not a fresh chain draw once the tree's shape was chosen by the rewards). So DTS's default
allocation is value-blind (``select_temperature=None`` -> ``inf`` for ``mode="dts"``), exact in expectation; the
paper's rule stays available. DTS* returns the best terminal found (greedy search: no exactness claim). Every
rollout's terminal is a candidate (``particles_final``, with the output's probability of picking it in
``log_weights``); ``reweight=True`` resamples one rollout ``∝ exp(r / alpha)`` times its proposal ratio
``prod (1 / |C(n)|) / pi(c | n)`` instead (equal ratios under the value-blind default).

Issue 38's opt-in expansions (``docs/methods/tree_search.md``, "Steering with DAS's look-ahead"), DTS only: the
allocation follows DAS's look-ahead ``r(D(x, sigma)) / alpha`` of each node's *own* state (never a rollout's
reward, so the output stays exact in expectation). ``expand="split"``: each rollout branches at a step drawn in a
sigma window, reached by a descent that favours children with a high look-ahead (multilevel splitting).
``expand="sweep"``: each iteration is ``particles`` chains resampled at every step by the look-ahead's increments
(SMC's twist), every state a node, a child weighted by ``1 / mu``, its expected count in its batch; the look-ahead
may be tempered by a ramp in sigma and computed at every ``k``-th step only (``lookahead_ramp``,
``lookahead_every``; ``docs/methods/tree_search.md``, "Tempered look-ahead").

Anytime: ``nfe`` is a cumulative budget per group; pass the returned tree (``result.extras["tree"]``) or a checkpoint
file as ``resume`` with a larger budget to continue; the continued run equals an uninterrupted one bit for bit. The
groups' trees are independent and their rollouts run batched, in lockstep over the grid. Sharding over
``torch.distributed`` splits the groups (whole trees) over the ranks: a tree's iterations are sequential, so its
nodes stay on one rank.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from ..core.noise import GeneratorLike
from ..distributed import DistContext, all_gather
from .registry import register_aligner
from .result import AlignResult
from .run_setup import AlignRun, Callback, Reward, prepare
from .smc import propose, start_state
from .tree_state import Forest, boltzmann_pick, lookahead_levels, lookahead_steps, split_steps, sweep_widths

MODES = ("dts", "dts_star")
EXPANSIONS = ("open", "split", "sweep")
OUTPUTS = ("sample_one", "argmax")  # the SMC samplers' names, so that the CLI's --output choices serve both


class _Drawn:
    """The ``noise`` argument of :func:`.smc.propose` with the draws already made (one row per rollout)."""

    def __init__(self, z: Tensor):
        self.z = z

    def randn_like(self, x: Tensor) -> Tensor:
        return self.z.to(x.dtype)


def _config(mode, alpha, particles, branching, widening, select_temperature, exploration, eta, sigmas, noise,
            gen_device, expand="open", split_sigma=None, lookahead=0.0, lookahead_ramp=None,
            lookahead_every=1, widen=None) -> dict:
    cfg = {"mode": mode, "alpha": float(alpha), "particles": particles, "branching": branching,
           "widening": float(widening), "select_temperature": float(select_temperature),
           "exploration": float(exploration), "eta": float(eta), "sigmas": list(sigmas),
           "shape": list(noise.shape[1:]), "dtype": str(noise.dtype).removeprefix("torch."), "gen_device": gen_device}
    if expand != "open":  # only then, so that trees grown before splitting existed resume unchanged
        cfg.update(expand=expand, split_sigma=_sigma_range(split_sigma), lookahead=float(lookahead))
    if lookahead_ramp is not None:  # these two only when set, so that sweeps grown before them resume unchanged
        cfg["lookahead_ramp"] = _ramp(lookahead_ramp)
    if lookahead_every != 1:
        cfg["lookahead_every"] = lookahead_every
    if widen is not None:  # only when set, as the two above
        cfg["widen"] = [[float(s), int(k)] for s, k in _widen_pairs(widen)]
    return cfg


def _sigma_range(split_sigma) -> list[float]:
    """``split_sigma`` as ``[lo, hi]``: None -> every sigma, a number -> ``[0, it]``, a pair as given."""
    if split_sigma is None:
        return [0.0, math.inf]
    if isinstance(split_sigma, (int, float)):
        return [0.0, float(split_sigma)]
    lo, hi = split_sigma
    return [float(lo), float(hi)]


def _ramp(lookahead_ramp) -> list[float]:
    """``lookahead_ramp`` as ``[s0, p]``: a number is ``s0`` with ``p = 2`` (DAS's ``tempering="sigma"``)."""
    if isinstance(lookahead_ramp, (int, float)):
        return [float(lookahead_ramp), 2.0]
    s0, p = lookahead_ramp
    return [float(s0), float(p)]


def _widen_pairs(widen) -> list:
    """``widen`` as a list of ``(sigma, chains)`` pairs (one pair, or a sequence of them)."""
    return [widen] if len(widen) == 2 and not isinstance(widen[0], (tuple, list)) else list(widen)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _check(mode, branching, widening, select_temperature, exploration, nfe, output, draws, checkpoint_every,
           reweight, expand="open", split_sigma=None, lookahead=0.0, lookahead_ramp=None, lookahead_every=1,
           widen=None) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if expand not in EXPANSIONS:
        raise ValueError(f"expand must be one of {EXPANSIONS}, got {expand!r}")
    if expand != "open" and mode != "dts":
        raise ValueError(f"expand={expand!r} is a sampler's allocation (mode='dts'); DTS* expands the open node")
    if expand == "sweep" and reweight:
        raise ValueError("reweight: a sweep tree's output is its descent (reweight=False)")
    if not (isinstance(lookahead, (int, float)) and not isinstance(lookahead, bool) and math.isfinite(lookahead)
            and lookahead >= 0):
        raise ValueError(f"lookahead must be a finite number >= 0 (0: off), got {lookahead!r}")
    if lookahead and expand == "open":
        raise ValueError("lookahead steers the splitting / sweep expansions: pass expand='split' or 'sweep'")
    ramp = lookahead_ramp
    if ramp is not None and not (_positive(ramp) or (isinstance(ramp, (tuple, list)) and len(ramp) == 2
                                                     and all(_positive(v) for v in ramp))):
        raise ValueError(f"lookahead_ramp must be None (no tempering), a sigma s0 > 0 or a pair (s0, p) of finite "
                         f"numbers > 0 (lambda = min(1, (s0 / sigma)^p)), got {lookahead_ramp!r}")
    if isinstance(lookahead_every, bool) or not isinstance(lookahead_every, int) or lookahead_every < 1:
        raise ValueError(f"lookahead_every must be a positive integer (1: every step), got {lookahead_every!r}")
    if (ramp is not None or lookahead_every != 1) and expand != "sweep":
        raise ValueError("lookahead_ramp / lookahead_every temper the sweeps' look-ahead: pass expand='sweep'")
    pairs = _widen_pairs(widen) if isinstance(widen, (tuple, list)) and widen else None
    if widen is not None and not (
            pairs and all(isinstance(q, (tuple, list)) and len(q) == 2 and _positive(q[0]) and isinstance(q[1], int)
                          and not isinstance(q[1], bool) and q[1] >= 1 for q in pairs)
            and all(a[0] > b[0] for a, b in zip(pairs, pairs[1:], strict=False))):
        raise ValueError(f"widen must be None, a pair (sigma, chains) or a sequence of them with decreasing sigmas: "
                         f"finite sigmas > 0, positive integer numbers of chains at the steps with sigma_j <= sigma, "
                         f"got {widen!r}")
    if widen is not None and expand != "sweep":
        raise ValueError("widen sets a sweep's chains per step: pass expand='sweep'")
    pair = isinstance(split_sigma, (tuple, list)) and len(split_sigma) == 2
    nums = list(split_sigma) if pair else [split_sigma]
    if split_sigma is not None and not (
            all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in nums)
            and nums[-1] > 0 and nums[0] <= nums[-1]):
        raise ValueError(f"split_sigma must be None (every step), a largest sigma > 0 or a pair (lo, hi) with "
                         f"0 <= lo <= hi, got {split_sigma!r}")
    if not (isinstance(widening, (int, float)) and 0 <= widening < 1):
        raise ValueError(f"widening must lie in [0, 1) (0: off), got {widening!r}")
    t = select_temperature
    if t is not None and not (isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 and not math.isnan(t)):
        raise ValueError(f"select_temperature must be > 0 (1: the paper's; inf: value-blind) or None, got "
                         f"{select_temperature!r}")
    if isinstance(branching, bool) or not isinstance(branching, int) or branching < 1:
        raise ValueError(f"branching must be a positive integer (children per node), got {branching!r}")
    if not (isinstance(exploration, (int, float)) and math.isfinite(exploration) and exploration >= 0):
        raise ValueError(f"exploration must be a finite number >= 0, got {exploration!r}")
    if nfe is not None and (isinstance(nfe, bool) or not isinstance(nfe, int) or nfe < 0):
        raise ValueError(f"nfe must be a non-negative integer (the NFE budget per group) or None, got {nfe!r}")
    if output is not None and output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS} or None, got {output!r}")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive integer, got {draws!r}")
    if not isinstance(reweight, bool):
        raise ValueError(f"reweight must be True or False, got {reweight!r}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an integer >= 0, got {checkpoint_every!r}")


def _rank_path(path, run: AlignRun) -> Path:
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{run.shard.ctx.rank}{p.suffix}") if run.shard.ctx.distributed else p


def _forest(run: AlignRun, config: dict, resume, groups: int) -> tuple[Forest, list[torch.Generator]]:
    """A new forest, or the resumed one (checked against this call's arguments), and the groups' generators."""
    if resume is None:
        forest = Forest.empty(config, run.noise, groups)
        if run.generators is not None:
            gens = list(run.generators[:: run.particles])  # a group's draws come from its first row's generator
        else:  # the global RNG seeds one generator per group, so that the tree can be resumed
            seeds = torch.randint(0, 2**62, (groups,)).tolist()
            gens = [torch.Generator(device=run.noise.device).manual_seed(s) for s in seeds]
        return forest, gens
    if isinstance(resume, (str, os.PathLike)):
        forest = Forest.load(_rank_path(resume, run)).to(run.noise.device, run.noise.dtype)
    elif isinstance(resume, Forest):
        forest = resume
    else:
        raise TypeError(f"resume must be a tree (result.extras['tree']), a checkpoint path or None, got "
                        f"{type(resume).__name__}")
    keys = list(config) + [k for k in forest.config if k not in config]  # a setting only one of them has differs too
    diff = [k for k in keys if k != "gen_device" and forest.config.get(k) != config.get(k)]
    if diff:
        raise ValueError(f"resume: the tree was grown with other settings: {diff} differ "
                         f"({ {k: forest.config.get(k) for k in diff} } vs { {k: config.get(k) for k in diff} })")
    if forest.groups != groups or not torch.equal(forest.noise, run.noise):
        raise ValueError("resume: noise differs from the noise the tree was grown from (pass the same noise)")
    gens = []
    for s in forest.gen_states:
        gen = torch.Generator(device=forest.config["gen_device"])
        gen.set_state(s)
        gens.append(gen)
    return forest, gens


def _plan(forest: Forest, gens, budget: int, stopped: list[bool]) -> list[tuple[int, int]]:
    """One selection per running group: ``(group, node to expand)``. A group whose next rollout would pass the
    budget, or whose tree is exhausted, stops, and its generator is rewound (a resumed run redraws the same)."""
    n_steps, plans = forest.steps, []
    # an iteration's NFE from a node at step i: its chains' denoiser calls at steps i + 1 .. N - 1
    width = sweep_widths(forest.config) if forest.config.get("expand") == "sweep" else [1] * (n_steps + 1)
    for g in range(forest.groups):
        if stopped[g]:
            continue
        state = gens[g].get_state()
        u = torch.rand(n_steps + 2, generator=gens[g], dtype=torch.float64, device=gens[g].device).tolist()
        n = forest.select(g, u)
        if n is None or forest.nfe[g] + sum(width[forest.step[g][n] + 1: n_steps]) > budget:
            gens[g].set_state(state)
            stopped[g] = True
            continue
        plans.append((g, n))
    return plans


def _iterate(run: AlignRun, forest: Forest, gens, plans: list[tuple[int, int]]) -> None:
    """Expansion, batched rollouts (lockstep over the grid) and backup for ``plans``."""
    sig, eta, n_steps, p = run.sigmas, run.eta, forest.steps, run.particles
    forest.reserve(max(forest.size(g) for g, _ in plans) + n_steps + 1)
    dev, shape = forest.x.device, forest.x.shape[2:]
    rows = []  # per plan: [group, current node, its step, noise draws, next draw]
    for g, n in plans:
        i = forest.step[g][n]  # the child is at step i + 1
        moves = sum(1 for j in range(max(i, 0), n_steps) if sig[j + 1] > 0)
        gen = gens[g]
        z = torch.randn((moves, *shape), generator=gen, dtype=forest.x.dtype, device=gen.device).to(dev)
        c = forest.add(g, n)
        if i < 0:  # a child of the root: the next row of this group's noise
            k = len(forest.children[g][0]) - 1
            forest.x[g, c] = start_state(forest.noise[g * p + k][None], sig[0])[0]
            used = 0
        else:
            xn, _ = propose(forest.x[g, n][None], forest.den[g, n][None], sig[i], sig[i + 1], eta, _Drawn(z[:1]))
            forest.x[g, c] = xn[0]
            used = int(sig[i + 1] > 0)
        rows.append([g, c, i + 1, z, used])
    # splitting with look-ahead: the nodes a selection may compare (children of a possible branch step) get
    # r(D(x, sigma)) / alpha, one reward call on the D the rollout computes anyway; read once after the rollouts
    ahead = set()
    if forest.config.get("expand") == "split" and forest.config["lookahead"] > 0:
        ahead = {b + 1 for b in forest.split_steps()}
    priors = []
    for j in range(min(r[2] for r in rows), n_steps):
        live = [r for r in rows if r[2] == j]
        gi = torch.tensor([r[0] for r in live], device=dev)
        ni = torch.tensor([r[1] for r in live], device=dev)
        x = forest.x[gi, ni]
        cond = None if run.cond is None else run.cond[(gi * p).to(run.cond.device)]
        if j in ahead:
            d, rho, _ = run.calls.twist(x, sig[j], cond, False, j)
            priors.append(([r[0] for r in live], [r[1] for r in live], rho))
        else:
            d = run.calls.denoise(x, sig[j], cond, j)
        forest.den[gi, ni] = d
        run.emit(j, x, d)
        zs = torch.stack([r[3][r[4]] for r in live]) if sig[j + 1] > 0 else None
        x_next, _ = propose(x, d, sig[j], sig[j + 1], eta, _Drawn(zs))
        for r in live:
            r[1], r[2], r[4] = forest.add(r[0], r[1]), j + 1, r[4] + int(sig[j + 1] > 0)
        forest.x[gi, torch.tensor([r[1] for r in live], device=dev)] = x_next
    gi = torch.tensor([r[0] for r in rows], device=dev)
    ni = torch.tensor([r[1] for r in rows], device=dev)
    rewards = run.calls.rewards(forest.x[gi, ni]).tolist()  # the one host read of an iteration
    if priors:
        values = torch.cat([rho for _, _, rho in priors]).tolist()
        alpha, k = forest.config["alpha"], 0
        for gs, ns, _ in priors:
            for g, n in zip(gs, ns, strict=True):
                v = values[k]
                forest.prior[g][n] = v / alpha if math.isfinite(v) else -math.inf  # never preferred
                forest.reward_evals[g] += 1
                k += 1
    for (g, n), r, rew in zip(plans, rows, rewards, strict=True):
        forest.nfe[g] += n_steps - (forest.step[g][n] + 1)
        forest.reward_evals[g] += 1
        forest.rollouts[g] += 1
        forest.backup(g, r[1], rew)


def _sweep(run: AlignRun, forest: Forest, gens, plans: list[tuple[int, int]]) -> None:
    """One sweep per plan (``expand="sweep"``): ``K = particles`` chains from the plan's node (the root: the rows of
    ``noise``), run in lockstep to the grid's end and resampled at every step, systematically, ``∝ exp(h_j(x) -
    h_{j-1}(parent))`` with ``h = lookahead r(D(x, sigma)) / alpha`` (the incremental weights of DAS's look-ahead
    twist). Every state is a node; a node's children from this sweep form one batch, each child weighted ``1 / mu``
    with ``mu = K p`` its expected count (:meth:`.Forest.sweep_value`). Resampling draws and noise come from the
    group's generator; the sweeps' weights, ancestors and look-aheads stay on the device as ``[plans, K]`` tensors
    and the tree's structure is read back once per iteration (no host read per step, no loop over chains).

    With ``widen = (sigma_w, K')`` the levels at steps with ``sigma_j <= sigma_w`` hold ``K'`` chains
    (:func:`.tree_state.sweep_widths`): the resampling into such a level draws ``K'`` children from the ``K`` of the
    level before (systematically, ``mu = K' p``; without a look-ahead there, ``K' / K`` children each when ``K``
    divides ``K'``); the counts still depend on the level's own states only."""
    sig, eta, n_steps, p = run.sigmas, run.eta, forest.steps, run.particles
    lam, alpha = forest.config["lookahead"], forest.config["alpha"]
    window = set(lookahead_steps(forest.config))  # the steps that compute a look-ahead and resample
    level = lookahead_levels(forest.config)  # the ramp lambda_j (1 without one)
    W = sweep_widths(forest.config)  # chains per level, by step (all ``particles`` without ``widen``)
    cum = [0]  # cum[j]: the nodes of a sweep from the root before its level at step j
    for w in W:
        cum.append(cum[-1] + w)
    dev, shape = forest.x.device, forest.x.shape[2:]
    forest.reserve(max(forest.size(g) + cum[n_steps + 1] - cum[forest.step[g][n] + 1] for g, n in plans))
    starts, bases, h0 = [], [], []  # per plan: its first level's step, the index of its first node, its start's h
    for g, n in plans:
        i, base = forest.step[g][n], forest.size(g)
        K = W[i + 1]
        ids = torch.arange(base, base + K, device=dev)
        if i < 0:  # the root's batch: the rows of this group's noise
            forest.x[g, ids] = start_state(forest.noise[g * p: g * p + K], sig[0])
        else:
            gen = gens[g]
            z = torch.randn((K, *shape), generator=gen, dtype=forest.x.dtype, device=gen.device).to(dev)
            xn, _ = propose(forest.x[g, n].expand(K, *shape), forest.den[g, n].expand(K, *shape), sig[i], sig[i + 1],
                            eta, _Drawn(z))
            forest.x[g, ids] = xn
        h0.append(forest.prior[g][n] * (lam * level[i]) if i >= 0 and lam > 0 and math.isfinite(forest.prior[g][n])
                  else 0.0)
        starts.append(i + 1)
        bases.append(base)
    groups_t = torch.tensor([g for g, _ in plans], device=dev)
    first = torch.tensor(bases, device=dev) - torch.tensor([cum[s] for s in starts], device=dev)  # + cum[j]: level j
    # h of each chain's last state, a row per plan as wide as the widest level (a level of K chains: the first K)
    h_all = torch.tensor(h0, dtype=torch.float64, device=dev)[:, None].repeat(1, max(W))
    records = []  # per step: the plans running, [R, 2 K' + K] (ancestors, log mu, this level's look-ahead or NaN)
    for j in range(min(starts), n_steps):
        act = [k for k, st in enumerate(starts) if st <= j]
        R, K, K2 = len(act), W[j], W[j + 1]
        chains = torch.arange(K, device=dev)
        rows = slice(None) if R == len(plans) else torch.tensor(act, device=dev)
        gi = groups_t[rows].repeat_interleave(K)
        ni = ((first[rows] + cum[j])[:, None] + chains).flatten()
        x = forest.x[gi, ni]
        cond = None if run.cond is None else run.cond[(gi * p).to(run.cond.device)]
        prev = h_all[rows, :K]
        if lam > 0 and j in window:
            d, rho, _ = run.calls.twist(x, sig[j], cond, False, j)
            h = torch.where(torch.isfinite(rho), rho * (lam * level[j] / alpha), -math.inf).view(R, K)
        else:
            d, rho = run.calls.denoise(x, sig[j], cond, j), None
            h = prev  # no look-ahead at this step: the weights stay as they were
        forest.den[gi, ni] = d
        run.emit(j, x, d)
        logit = torch.where(torch.isinf(h) & (h < 0), -math.inf, h - torch.where(torch.isfinite(prev), prev, 0.0))
        dead = torch.isinf(logit).all(1, keepdim=True)
        prob = torch.softmax(torch.where(dead, 0.0, logit), 1)  # a batch whose look-aheads are all -inf: uniform
        # systematic resampling: E[count_k] = K prob_k, the count decided by this level's states only
        plan_gens = [gens[plans[k][0]] for k in act]
        u = torch.stack([torch.rand(1, generator=gen, dtype=torch.float64, device=gen.device)
                         for gen in plan_gens]).to(dev)
        pos = (u + torch.arange(K2, device=dev, dtype=torch.float64)) / K2
        anc = torch.searchsorted(prob.cumsum(1), pos).clamp_(max=K - 1)
        flat = (anc + (torch.arange(R, device=dev) * K)[:, None]).flatten()
        if sig[j + 1] > 0:
            z = torch.stack([torch.randn((K2, *shape), generator=gen, dtype=forest.x.dtype, device=gen.device)
                             for gen in plan_gens]).to(dev).flatten(0, 1)
        else:
            z = None
        x_next, _ = propose(x[flat], d[flat], sig[j], sig[j + 1], eta, _Drawn(z))
        forest.x[groups_t[rows].repeat_interleave(K2),
                 ((first[rows] + cum[j + 1])[:, None] + torch.arange(K2, device=dev)).flatten()] = x_next
        log_mu = (K2 * prob).log().gather(1, anc)
        h_all[rows, :K2] = h.gather(1, anc)
        look = torch.full((R, K), math.nan, dtype=torch.float64, device=dev) if rho is None else rho.view(R, K)
        records.append((act, K, K2, torch.cat([anc.double(), log_mu, look], 1)))
    KN = W[n_steps]
    terms_n = ((first + cum[n_steps])[:, None] + torch.arange(KN, device=dev)).flatten()
    rewards = run.calls.rewards(forest.x[groups_t.repeat_interleave(KN), terms_n])
    flat = torch.cat([rec.flatten() for *_, rec in records] + [rewards]).tolist()  # the one host read of an iteration
    levels: list[list] = [[] for _ in plans]
    at = 0
    for act, K, K2, _ in records:
        for k in act:
            levels[k].append((flat[at:at + K2], flat[at + K2:at + 2 * K2], flat[at + 2 * K2:at + 2 * K2 + K]))
            at += 2 * K2 + K
    for k, (g, n) in enumerate(plans):
        forest.add_sweep(g, n, levels[k], flat[at + k * KN: at + (k + 1) * KN])
        forest.nfe[g] += cum[n_steps] - cum[starts[k]]
        forest.reward_evals[g] += KN
        forest.rollouts[g] += KN


def _rollout_log_weights(forest: Forest, g: int, terms: list[int]) -> list[float]:
    """``v(t) / alpha + log_ratio(t)`` per terminal: the importance weight of each rollout for the tilted law (the
    reward's tilt times the proposal ratio of :meth:`.Forest.select`)."""
    if any(math.isnan(forest.log_ratio[g][t]) for t in terms):
        raise ValueError("tree_search: reweight=True needs the rollouts' proposal ratios, which this tree lacks (a "
                         "checkpoint from an older version); pass reweight=False for the paper's descent")
    return [forest.value[g][t] / forest.config["alpha"] + forest.log_ratio[g][t] for t in terms]


def _outputs(forest: Forest, gens, output: str, draws: int, reweight: bool) -> list[tuple[int, int]]:
    """Per output row, ``(group, terminal node)``: a rollout resampled by its importance weight (``reweight``), a
    DTS descent (``sample_one``; their draws leave the generators where the search left them) or each group's
    best terminal (``argmax``)."""
    picks = []
    for g in range(forest.groups):
        terms = forest.terminals(g)
        if not terms:
            first = (sum(sweep_widths(forest.config)[:-1]) if forest.config.get("expand") == "sweep"
                     else forest.steps)
            raise ValueError(f"tree_search: group {g} has no rollout; the nfe budget ({forest.nfe[g]} spent) is "
                             f"below the first iteration ({first} NFE)")
        if not any(math.isfinite(forest.reward[g][t]) for t in terms):
            raise FloatingPointError(f"tree_search: the reward is non-finite for every rollout of group {g}")
        if output == "argmax":
            best = max(terms, key=lambda t: (forest.value[g][t], -t))
            picks.append((g, best))
            continue
        state, dev = gens[g].get_state(), gens[g].device
        # the search stopped on a refused selection and rewound its uniforms (a resumed run redraws them); that
        # refusal depended on them (it reached a node whose rollout costs more than the budget left), so the output
        # must not reuse them: skip that block and draw after it
        torch.rand(forest.steps + 2, generator=gens[g], dtype=torch.float64, device=dev)
        u = torch.rand(draws, forest.steps + 2, generator=gens[g], dtype=torch.float64, device=dev).tolist()
        gens[g].set_state(state)
        if reweight:
            lw = _rollout_log_weights(forest, g, terms)
            picks.extend((g, terms[boltzmann_pick(lw, 1.0, u[k][0])]) for k in range(draws))
            continue
        for k in range(draws):
            n, depth = 0, 0
            while forest.children[g][n]:
                kids = forest.children[g][n]
                n = kids[boltzmann_pick(forest.child_logits(g, n), 1.0, u[k][depth])]
                depth += 1
            picks.append((g, n))
    return picks


def _gather(run: AlignRun, t: Tensor) -> Tensor:
    """This rank's per-group rows -> all groups' (rank order is group order in the ``groups`` layout)."""
    if not run.shard.ctx.distributed:
        return t
    return torch.cat(all_gather(run.shard.ctx, t, run.shard.stats))


def _result(run: AlignRun, forest: Forest, gens, output: str, draws: int, reweight: bool,
            started: float) -> AlignResult:
    picks = _outputs(forest, gens, output, draws, reweight)
    dev = forest.x.device
    gi = torch.tensor([g for g, _ in picks], device=dev)
    ni = torch.tensor([n for _, n in picks], device=dev)
    samples = forest.x[gi, ni]
    rewards = torch.tensor([forest.reward[g][n] for g, n in picks], dtype=torch.float64, device=dev)
    terms = [forest.terminals(g) for g in range(forest.groups)]
    m = torch.tensor([max(len(t) for t in terms)])
    m = int(max(all_gather(run.shard.ctx, m, run.shard.stats)))
    cand = forest.x.new_full((forest.groups, m, *forest.x.shape[2:]), math.nan)
    cand_r = torch.full((forest.groups, m), math.nan, dtype=torch.float64)
    logw = torch.full((forest.groups, m), -math.inf, dtype=torch.float64)
    evidence = []
    for g, t in enumerate(terms):
        cand[g, : len(t)] = forest.x[g, t]
        cand_r[g, : len(t)] = torch.tensor([forest.reward[g][n] for n in t], dtype=torch.float64)
        if reweight:  # the resampling law over the rollouts, and the importance estimate of log E_p exp(r / alpha)
            lw = torch.tensor(_rollout_log_weights(forest, g, t), dtype=torch.float64)
            logw[g, : len(t)] = lw - torch.logsumexp(lw, 0)
            evidence.append(float(torch.logsumexp(lw, 0)) - math.log(len(t)))
        else:
            reach = forest.log_reach(g)
            logw[g, : len(t)] = torch.tensor([reach[n] for n in t], dtype=torch.float64)
            evidence.append(forest.value[g][0] / forest.config["alpha"])
    per_group = torch.tensor([forest.nfe, forest.reward_evals, forest.rollouts], dtype=torch.float64).T
    bad = torch.tensor([sum(not math.isfinite(forest.reward[g][n]) for n in t) for g, t in enumerate(terms)])
    root = torch.tensor(evidence, dtype=torch.float64)
    samples, rewards, cand, cand_r, logw, per_group, root, bad = (
        _gather(run, t) for t in (samples, rewards, cand, cand_r.to(dev), logw.to(dev), per_group, root, bad))
    forest.gen_states = [g.get_state() for g in gens]
    c = run.calls
    return AlignResult(
        samples=samples, rewards=rewards, method="tree_search", groups=run.groups, particles=run.particles,
        nfe=float(per_group[:, 0].mean()), nfe_grad=0.0, reward_evals=float(per_group[:, 1].mean()),
        log_weights=logw, particles_final=cand.flatten(0, 1), log_evidence=root.to(dev),
        nonfinite=bad[None], wall_time=forest.wall_time, model_time=forest.model_time,
        verifier_time=forest.verifier_time,
        extras={"tree": forest, "mode": forest.config["mode"], "output": output, "reweight": reweight,
                "candidate_rewards": cand_r,
                "nfe_per_group": per_group[:, 0], "reward_evals_per_group": per_group[:, 1],
                "rollouts": per_group[:, 2], "nfe_this_call": run.shard.total(c.denoiser.rows) / run.groups,
                "wall_time_this_call": time.perf_counter() - started})


def _tree_cost(steps: int, particles: int, nfe: int | None = None, **_) -> dict:
    """The budget: ``nfe`` per group (default :func:`default_budget`), no reward gradient."""
    return {"nfe": default_budget(steps, particles) if nfe is None else nfe, "nfe_grad": 0}


def default_budget(steps: int, particles: int) -> int:
    """The default NFE budget per group: four times what the root's ``particles`` plain chains cost."""
    return 4 * particles * steps


@register_aligner("tree_search", aliases=("dts",), cost=_tree_cost,
                  note="Diffusion Tree Sampling (mode=dts, the tilted law) / Search (mode=dts_star, the best)")
def tree_search(
    denoiser: Callable, reward: Reward, noise: Tensor, sigmas: Tensor, *, alpha: float, nfe: int | None = None,
    mode: str = "dts", particles: int = 16, branching: int = 4, widening: float = 0.0,
    select_temperature: float | None = None, exploration: float = 0.0,
    output: str | None = None, draws: int = 1, reweight: bool = False,
    expand: str = "open", split_sigma: float | tuple[float, float] | None = None, lookahead: float = 0.0,
    lookahead_ramp: float | tuple[float, float] | None = None, lookahead_every: int = 1,
    widen: tuple[float, int] | list[tuple[float, int]] | None = None, resume: Forest | str | os.PathLike | None = None,
    checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 0, cond: Tensor | None = None,
    eta: float = 1.0, batch_size: int | None = 512, generator: GeneratorLike = None, progress: bool = False,
    callback: Callback | None = None, dist: DistContext | None = None, shard_by: str = "groups",
) -> AlignResult:
    """Grow one search tree per group of ``particles`` rows of ``noise`` until ``nfe`` denoiser calls per group, and
    draw the outputs (``samples [G * draws, *shape]`` for ``output="sample_one"``, ``[G, *shape]`` for ``argmax``).

    Args:
        alpha: the KL weight; the target is ``p(x) exp(r(x) / alpha)`` (the paper's ``lambda = 1 / alpha``).
        nfe: cumulative NFE budget per group (expansions and rollouts; a rollout that would pass it is not
            started); None: :func:`default_budget`.
        mode: ``dts`` (Boltzmann selection, samples the tilted law) or ``dts_star`` (greedy selection, search).
        particles: the root's children, the rows of ``noise`` per group (each starts one full chain).
        branching: the most children of any other node (the paper's maximum number of children).
        widening: progressive widening, a node visited ``N`` times may hold ``max(branching, ceil(N^widening))``
            children (0: off, the paper's fixed maximum).
        select_temperature: DTS's selection draws children ``∝ exp(v / (alpha T))``. None (the default): ``inf``
            for DTS, rollouts allocated blind to the values, which keeps the output's importance measure unbiased at
            every budget; ``1`` is the paper's Boltzmann policy, measured and computed exactly to under-tilt at
            finite budgets (``docs/methods/tree_search.md``, "Why the paper's selection under-tilts"); the output
            descent always uses ``alpha``. DTS* ignores it.
        exploration: DTS*'s UCT-like bonus ``c sqrt(log N(parent) / N(child))`` in reward units (0: greedy).
        output: ``sample_one`` (DTS's descent ∝ exp(v / alpha)) or ``argmax`` (the best terminal); None: ``sample_one``
            for DTS, ``argmax`` for DTS*.
        draws: outputs per group for ``output="sample_one"``.
        reweight: DTS's output (``mode="dts"``, ``output="sample_one"``; DTS* and ``argmax`` ignore it). False (the
            default, the paper's): a descent from the root drawing children ``∝ exp(v / alpha)``. True (ours):
            resample one of the tree's rollouts ``∝ exp(r / alpha) prod (1 / |C(n)|) / pi(c | n)``, the proposal
            ratio of the selection that led to it (all ratios are 1 under the default value-blind selection); with
            the paper's selection it is closer to the tilt than the descent but not exact
            (``docs/methods/tree_search.md``).
        expand: where a rollout branches off the tree. ``open`` (the default, the paper's): at the first node with
            room below the selection (``branching`` children per node). ``split`` (ours, DTS only; multilevel
            splitting, ``docs/methods/tree_search.md`` "Splitting with look-ahead"): once the root holds its
            ``particles`` chains, each rollout draws its branch step uniformly among the steps with sigma in
            ``split_sigma`` and descends to it, each node's child drawn ``∝ exp(lookahead r(D(x_c, sigma_c)) /
            alpha)``; no bound on children (``branching``, ``widening``, ``select_temperature`` unused). ``sweep``
            (ours, DTS only; ``docs/methods/tree_search.md`` "Sweeps"): each iteration runs ``particles`` chains
            from the root (first) or from a node reached as in ``split``, resampled at every step ``∝ exp(lookahead
            (h(x) - h(parent)))``; children weigh ``1 / mu`` (their expected count) in the soft values and the
            output descent; ``nfe`` counts all ``particles`` chains. Both keep the output exact in expectation:
            the allocation depends on the nodes' own states, never on a rollout's reward.
        split_sigma: ``expand="split"``: the sigmas of the branch steps, a largest one or a pair ``(lo, hi)``
            (None: every step). Branching where the noise decides little (very large or very small sigma) spends
            a rollout on a near-copy.
        lookahead: ``expand="split"``: the weight of DAS's look-ahead ``r(D(x, sigma)) / alpha`` in the
            selection (0: uniform). Costs one reward call per rollout step at a child of a possible branch step
            (counted in ``reward_evals``; the ``D`` is the rollout's own, no extra NFE); a non-finite look-ahead
            is never preferred. ``expand="sweep"``: its weight in the resampling potential ``h``; one reward call
            per node at a look-ahead step.
        lookahead_ramp: ``expand="sweep"`` only: ``s0`` (``p = 2``) or ``(s0, p)`` of the ramp ``lambda_j = min(1,
            (s0 / sigma_j)^p)`` tempering the look-ahead. Ours, DAS's tempering (``s0`` alone is its
            ``tempering="sigma"``; ``docs/methods/tree_search.md``, "Tempered look-ahead"): ``h_j = lookahead
            lambda_j r(D(x, sigma_j)) / alpha``; None (the default): ``lambda = 1``. Resampling starts early but
            gently; the increments ``h_j - h_{j'}`` still telescope along every line, and the ``1 / mu`` weights keep
            the output exact in expectation whatever the ramp.
        lookahead_every: ``expand="sweep"`` only: the look-ahead (and resampling) at every ``k``-th step of the
            ``split_sigma`` window only, counted back from its last (1: every step). Fewer reward calls, the same
            exactness (steps between keep their weights: no resampling).
        widen: ``expand="sweep"`` only: ``(sigma_w, K')``, the sweeps run ``K'`` chains at the steps with
            ``sigma_j <= sigma_w`` (``particles`` above; ours, ``docs/methods/tree_search.md`` "Widening a sweep"),
            or a sequence of such pairs with decreasing sigmas (each from its sigma down to the next one's; a later
            ``K'`` may be smaller: narrowing). Where the model's chain has not yet decided what the reward scores
            (large sigma: the final reward is about independent of the state there) a few chains suffice, and
            once it has (small sigma) a few again; the budget goes to the steps that decide it. Where the width
            changes the chains are resampled (``mu = K' p``), so the output stays exact in expectation; ``nfe``
            counts each level's chains.
        resume: a tree to continue (``result.extras["tree"]``, continued in place, or a :meth:`Forest.save` file);
            the other arguments must be those it was grown with.
        checkpoint: a file to save the tree to (safetensors, atomically) at the end and every
            ``checkpoint_every`` iterations (0: only at the end); a sharded run writes one file per rank
            (``name.rank<r>.safetensors``).
        shard_by: ``groups`` only (whole trees per rank; the world size must divide the groups).

    The result's ``particles_final [G * M, *shape]`` holds every rollout's terminal (NaN-padded to the largest
    tree's ``M``), ``log_weights [G, M]`` the log-probability that the output picks it (``reweight``: the normalised
    importance weights; else the descent's reach), ``log_evidence`` an estimate of ``log E_p exp(r / alpha)`` (the
    log mean importance weight; without ``reweight`` ``v(root) / alpha``); costs are cumulative over resumed calls.
    """
    started = time.perf_counter()
    _check(mode, branching, widening, select_temperature, exploration, nfe, output, draws, checkpoint_every,
           reweight, expand, split_sigma, lookahead, lookahead_ramp, lookahead_every, widen)
    output = output or ("sample_one" if mode == "dts" else "argmax")
    if select_temperature is None:  # DTS: value-blind allocation, the one whose output is exact (see the docstring)
        select_temperature = math.inf if mode == "dts" else 1.0
    reweight = reweight and mode == "dts" and output == "sample_one"
    run = prepare("tree_search", denoiser, reward, noise, sigmas, particles=particles, alpha=alpha, cond=cond,
                  eta=eta, batch_size=batch_size, generator=generator, progress=progress, callback=callback,
                  dist=dist, shard_by=shard_by,
                  options=dict(mode=mode, branching=branching, exploration=exploration, nfe=nfe, output=output,
                               draws=draws, reweight=reweight, expand=expand, split_sigma=split_sigma,
                               lookahead=lookahead, lookahead_ramp=lookahead_ramp,
                               lookahead_every=lookahead_every, widen=widen))
    if run.shard.layout == "particles":
        raise ValueError("shard_by: tree search shards whole trees (groups); the world size must divide the groups")
    groups = run.noise.shape[0] // particles
    gen_device = str(run.generators[0].device) if run.generators else str(run.noise.device)
    config = _config(mode, alpha, particles, branching, widening, select_temperature, exploration, eta, run.sigmas,
                     run.noise, gen_device, expand, split_sigma, lookahead, lookahead_ramp, lookahead_every, widen)
    if expand != "open" and not split_steps(config):
        raise ValueError(f"split_sigma={split_sigma!r} leaves no step to branch at (the grid's sigmas after the "
                         f"first: {run.sigmas[1]:.4g} ... {run.sigmas[-1]:.4g})")
    forest, gens = _forest(run, config, resume, groups)
    budget = default_budget(run.steps, particles) if nfe is None else nfe
    stopped, it = [False] * groups, 0
    model_time0, verifier_time0 = run.calls.time, run.calls.reward_time
    from tqdm.auto import tqdm

    bar = tqdm(total=budget, disable=not progress or not run.shard.ctx.is_main, desc="tree_search", leave=False)
    grow = _sweep if expand == "sweep" else _iterate
    while plans := _plan(forest, gens, budget, stopped):
        grow(run, forest, gens, plans)
        bar.update(min(forest.nfe) - bar.n)
        it += 1
        if checkpoint is not None and checkpoint_every and it % checkpoint_every == 0:
            forest.gen_states = [g.get_state() for g in gens]
            forest.save(_rank_path(checkpoint, run))
    bar.close()
    forest.wall_time += time.perf_counter() - started
    forest.model_time += run.calls.time - model_time0
    forest.verifier_time += run.calls.reward_time - verifier_time0
    result = _result(run, forest, gens, output, draws, reweight, started)
    if checkpoint is not None:
        forest.save(_rank_path(checkpoint, run))
    return result
