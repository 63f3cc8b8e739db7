"""The search trees of Diffusion Tree Sampling / Search (``docs/methods/tree_search.md``; Jain, Sareen, Pedramfar,
Ravanbakhsh, "Diffusion Tree Sampling: Scalable inference-time alignment of diffusion models", arXiv 2506.20701,
section 4 and Algorithms 1-2).

A :class:`Forest` holds ``G`` independent trees, one per group. Node 0 of every tree is the dummy root (step -1, no
state); a node at step ``i`` holds a state ``x_i`` at ``sigma_i`` of the sampler's grid, ``D(x_i, sigma_i)`` once it
was computed, a soft value ``v`` and a visit count; a node at step ``N`` (the last grid point) is terminal and its
value is the reward ``r(x_N)``. The structure (parents, steps, values, visits, rewards) lives on the host: selection
and backup are host decisions, one host read of the rewards per iteration (never per denoising step); the states
live on the model's device.

The soft Bellman backup (the paper's eq. 5 estimated on the tree's children) is
``v(n) = alpha log( (1 / |C(n)|) sum_{c in C(n)} exp(v(c) / alpha) )``, with ``alpha = 1 / lambda`` the KL weight of
the tilted target ``p(x) exp(r(x) / alpha)``.

A tree grown by sweeps (``config["expand"] == "sweep"``) weighs each child by ``1 / mu``, its expected count in the
batch that created it, and averages a node's batches (:meth:`Forest.sweep_value`; ``docs/methods/tree_search.md``,
"Sweeps"); with one batch of iid children (``mu = |C(n)|``) that is the backup above.

A forest is saved as one safetensors file (the tensors, generator states included, and the JSON configuration in the
file's metadata), written atomically, and loaded back bit for bit (:meth:`Forest.save`, :meth:`Forest.load`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..io.errors import CheckpointError
from ..io.tensors import load_tensors, save_tensors

FORMAT = "steerdiff.tree_search/1"


def soft_backup(values: list[float], alpha: float) -> float:
    """``alpha log mean_c exp(v_c / alpha)`` (max-shifted; ``-inf`` if every child is ``-inf``)."""
    a = [v / alpha for v in values]
    m = max(a)
    if m == -math.inf:
        return -math.inf
    return alpha * (m + math.log(sum(math.exp(v - m) for v in a)) - math.log(len(a)))


def _log_prob(values: list[float], temp: float, k: int) -> float:
    """``log`` of the probability :func:`boltzmann_pick` gives index ``k`` at temperature ``temp``."""
    a = [0.0] * len(values) if temp == math.inf else [v / temp for v in values]
    m = max(a)
    if m == -math.inf:
        return -math.log(len(a))
    return a[k] - m - math.log(sum(math.exp(v - m) for v in a))


def boltzmann_pick(values: list[float], alpha: float, u: float) -> int:
    """Index drawn ``∝ exp(v / alpha)`` with the uniform ``u`` (inverse CDF); uniform if every value is ``-inf`` or
    ``alpha`` is ``inf`` (value-blind, whatever the values, ``-inf`` included)."""
    a = [0.0] * len(values) if alpha == math.inf else [v / alpha for v in values]
    m = max(a)
    w = [1.0] * len(a) if m == -math.inf else [math.exp(v - m) for v in a]
    target, acc = u * sum(w), 0.0
    for k, wk in enumerate(w):
        acc += wk
        if target < acc:
            return k
    return max(k for k, wk in enumerate(w) if wk > 0)


def split_steps(config: dict) -> list[int]:
    """The steps a splitting expansion (``expand="split"``) may branch at: ``i`` in ``0 .. N - 1`` with ``lo <=
    sigma_i <= hi``, ``(lo, hi) = split_sigma`` (the child is at ``i + 1``), less a last step that is deterministic
    (``sigma_N = 0``)."""
    sig, (lo, hi) = config["sigmas"], config["split_sigma"]
    last = len(sig) - 2 if sig[-1] == 0 else len(sig) - 1
    return [i for i in range(last) if lo <= sig[i] <= hi]


def lookahead_levels(config: dict) -> list[float]:
    """A sweep's look-ahead tempering ``lambda_j`` per grid step ``j = 0 .. N`` (``lookahead_ramp = (s0, p)``:
    ``min(1, (s0 / sigma_j)^p)``, 1 at ``sigma_j = 0``; without a ramp 1 everywhere): the look-ahead potential of a
    state at step ``j`` is ``h_j(x) = lookahead lambda_j r(D(x, sigma_j)) / alpha`` (``docs/methods/tree_search.md``,
    "Tempered look-ahead")."""
    sig, ramp = config["sigmas"], config.get("lookahead_ramp")
    if ramp is None:
        return [1.0] * len(sig)
    s0, p = ramp
    return [1.0 if s <= s0 else (s0 / s) ** p for s in sig]


def lookahead_steps(config: dict) -> list[int]:
    """The steps at which a sweep computes its look-ahead (and resamples): :func:`split_steps` thinned to every
    ``lookahead_every``-th one counted back from the last (so the smallest sigma of the window keeps its
    look-ahead), ascending."""
    steps, k = split_steps(config), config.get("lookahead_every", 1)
    return sorted(steps[::-1][::k])


def sweep_widths(config: dict) -> list[int]:
    """The chains a sweep runs at each grid step ``j = 0 .. N`` (the nodes of its level at step ``j``): ``particles``,
    or with ``widen = [(sigma_1, K_1), (sigma_2, K_2), ...]`` (decreasing sigmas) ``K_m`` at the steps with
    ``sigma_{m+1} < sigma_j <= sigma_m`` (``docs/methods/tree_search.md``, "Widening a sweep"). Step 0 (the root's
    batch, the rows of ``noise``) always holds ``particles``."""
    sig, p, widen = config["sigmas"], config["particles"], config.get("widen")
    out = [p] * len(sig)
    for s_w, k in widen or []:  # decreasing sigmas: a later pair overrides an earlier one below its own sigma
        out[1:] = [k if s <= s_w else w for s, w in zip(sig[1:], out[1:], strict=True)]
    return out


@dataclass
class Forest:
    """``G`` search trees over one grid (see the module docstring). Per group ``g``, node lists ``parent[g]``,
    ``step[g]``, ``value[g]``, ``visits[g]``, ``reward[g]`` (NaN but at terminals); states ``x [G, capacity,
    *shape]`` and denoised values ``den`` (same shape); cumulative costs per group ``nfe``, ``reward_evals``,
    ``rollouts``; ``done[g]``: the tree is exhausted (every node full down to the terminals)."""

    config: dict
    noise: Tensor  # [G * P, *shape]: the root's children are these rows, in order
    x: Tensor
    den: Tensor
    parent: list[list[int]]
    step: list[list[int]]
    value: list[list[float]]
    visits: list[list[int]]
    reward: list[list[float]]
    nfe: list[int]
    reward_evals: list[int]
    rollouts: list[int]
    wall_time: float = 0.0
    model_time: float = 0.0
    gen_states: list[Tensor] | None = None
    children: list[list[list[int]]] = field(default_factory=list)
    saturated: list[list[bool]] = field(default_factory=list)
    # per node, NaN but at terminals: log[ prod (1 / |C(n)|) / pi(c | n) ] over the full nodes the rollout's
    # selection passed, with the children counts and the selection probabilities *at the time*; the proposal ratio
    # that makes the rollouts an importance sample of the model's chain (see :meth:`select`)
    log_ratio: list[list[float]] = field(default_factory=list)
    # seconds inside the reward's (verifier's) forward calls, a part of ``model_time``, over every call that grew it
    verifier_time: float = 0.0
    # per node, NaN where not computed: the look-ahead value ``r(D(x_n, sigma_n)) / alpha`` that the splitting
    # expansion (``config["expand"] == "split"``) steers its selection with; computed from the node's own state only
    prior: list[list[float]] = field(default_factory=list)
    # sweeps (``config["expand"] == "sweep"``): per node, ``log mu``, the log of the expected number of children
    # its parent got in the batch that created it (its weight in the parent's estimate is ``1 / mu``), and the
    # number of batches the node received (its estimate is their mean); 0.0 / 0 on every other tree
    log_mu: list[list[float]] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)
    _pending: dict = field(default_factory=dict, repr=False)

    # ---------------------------------------------------------------------------------------------- building
    @classmethod
    def empty(cls, config: dict, noise: Tensor, groups: int) -> Forest:
        cap = 64
        shape = tuple(noise.shape[1:])
        x = noise.new_zeros((groups, cap, *shape))
        return cls(config, noise, x, torch.full_like(x, math.nan), [[-1] for _ in range(groups)],
                   [[-1] for _ in range(groups)], [[-math.inf] for _ in range(groups)], [[0] for _ in range(groups)],
                   [[math.nan] for _ in range(groups)], [0] * groups, [0] * groups, [0] * groups,
                   children=[[[]] for _ in range(groups)], saturated=[[False] for _ in range(groups)],
                   log_ratio=[[math.nan] for _ in range(groups)], prior=[[math.nan] for _ in range(groups)],
                   log_mu=[[0.0] for _ in range(groups)], batches=[[0] for _ in range(groups)])

    @property
    def groups(self) -> int:
        return len(self.parent)

    @property
    def steps(self) -> int:
        return len(self.config["sigmas"]) - 1

    def size(self, g: int) -> int:
        return len(self.parent[g])

    def capacity(self, g: int, n: int) -> int:
        """Children a node may have: the root ``particles`` (the rows of ``noise``), a node one step before a final
        ``sigma = 0`` one (that step is deterministic), a terminal none, any other ``branching``."""
        s = self.step[g][n]
        if s < 0:
            return self.config["particles"]
        if s == self.steps:
            return 0
        if s == self.steps - 1 and self.config["sigmas"][-1] == 0:
            return 1
        if self.config.get("expand") in ("split", "sweep"):  # children are added where a branch lands: no bound
            return sys.maxsize
        # progressive widening: a node visited N times may hold ceil(N ** widening) children, at least ``branching``
        # (fixed branching leaves each node's choice a finite-sample importance resampling among its children)
        w = self.config.get("widening", 0.0)
        cap = self.config["branching"]
        return max(cap, math.ceil(self.visits[g][n] ** w)) if w > 0 else cap

    def reserve(self, needed: int) -> None:
        """Grow the state storage (doubling) so that every tree can hold ``needed`` nodes."""
        cap = self.x.shape[1]
        if needed <= cap:
            return
        new = max(needed, 2 * cap)
        pad = (self.groups, new - cap, *self.x.shape[2:])
        self.x = torch.cat([self.x, self.x.new_zeros(pad)], 1)
        self.den = torch.cat([self.den, self.den.new_full(pad, math.nan)], 1)

    def add(self, g: int, parent: int) -> int:
        """A new node under ``parent`` (its state is written by the caller); returns its index."""
        n = self.size(g)
        self.parent[g].append(parent)
        self.step[g].append(self.step[g][parent] + 1)
        self.value[g].append(-math.inf)
        self.visits[g].append(0)
        self.reward[g].append(math.nan)
        self.children[g].append([])
        self.saturated[g].append(False)
        self.log_ratio[g].append(math.nan)
        self.prior[g].append(math.nan)
        self.log_mu[g].append(0.0)
        self.batches[g].append(0)
        self.children[g][parent].append(n)
        return n

    # ---------------------------------------------------------------------------------------------- search
    def select(self, g: int, uniforms: list[float]) -> int | None:
        """The node to expand: descend from the root through full nodes to the first one with room for a child.

        DTS (``mode="dts"``) draws a child ``∝ exp(v / (alpha T))`` (the paper's Boltzmann selection at ``T =
        select_temperature = 1``; ``T = inf``: uniform, the aligner's default, which keeps the output's importance
        measure exact, ``docs/methods/tree_search.md`` "Why the paper's selection under-tilts"); DTS*
        (``"dts_star"``) takes ``argmax v + c sqrt(log N(n) / N(c))`` (greedy, with the UCT-like bonus ``c =
        exploration``; 0: the paper's greedy rule). Only children with room below them are candidates. None: the
        tree is exhausted.

        For DTS the descent's proposal ratio ``sum log[(1 / |C(n)|) / pi(c | n)]`` is kept for the rollout that
        follows (:meth:`backup` stores it at its terminal): the model's chain picks each of a full node's children
        (iid draws of ``p(x_{i+1} | x_i)``) with probability ``1 / |C(n)|``, the selection with ``pi``, so the ratio
        reweights the value-driven allocation back to the chain (an adaptive importance sample of it)."""
        if self.config.get("expand") in ("split", "sweep"):
            return self._select_split(g, uniforms)
        alpha, star, c = self.config["alpha"], self.config["mode"] == "dts_star", self.config["exploration"]
        n, depth, lr = 0, 0, 0.0
        while True:
            if self.saturated[g][n]:
                return None
            kids = self.children[g][n]
            if len(kids) < self.capacity(g, n):
                self._pending[g] = math.nan if star else lr
                return n
            open_ = [k for k in kids if not self.saturated[g][k]]
            vals = [self.value[g][k] for k in open_]
            if star:
                logn = math.log(max(self.visits[g][n], 1))
                score = [v + c * math.sqrt(logn / max(self.visits[g][k], 1)) for k, v in zip(open_, vals, strict=True)]
                n = open_[max(range(len(open_)), key=score.__getitem__)]
            else:  # the paper's policy at select_temperature = 1; inf: uniform (allocation blind to the values)
                temp = alpha * self.config.get("select_temperature", 1.0)
                j = boltzmann_pick(vals, temp, uniforms[depth])
                lr += -math.log(len(kids)) - _log_prob(vals, temp, j)
                n = open_[j]
            depth += 1

    def split_steps(self) -> list[int]:
        """:func:`split_steps` of this forest's configuration."""
        return split_steps(self.config)

    def _select_split(self, g: int, uniforms: list[float]) -> int:
        """Multilevel splitting (``expand="split"``): until the root has its ``particles`` children, the root;
        then a branch step ``b`` drawn uniformly from :meth:`split_steps` (with ``uniforms[-1]``), and a descent
        from the root to a node at step ``b``, each node's child drawn ``∝ exp(lookahead * prior(c))`` (``prior``:
        the child's look-ahead value ``r(D(x_c)) / alpha``, computed from its own state; uniform where absent or
        ``lookahead = 0``), with ``uniforms[step + 1]``. Every non-terminal node has a child, so the descent
        reaches step ``b``.

        Why the output stays exact in expectation: the number of children a node gets depends on its own and its
        siblings' (and ancestors') states and the uniforms, never on its descendants' states or any reward, so a
        node's children are iid chain draws whose count is fixed independently of them, and the induction of
        ``docs/methods/tree_search.md`` ("Why the paper's selection under-tilts") goes through: the uniform
        descent's measure ``sum_t u(t) exp(r_t / alpha)`` has expectation ``p exp(r / alpha)``; the rollout costs
        depend only on the uniforms (no stopping time depends on a state). This is the splitting estimator of
        rare-event simulation (trajectories split where an importance function is high, each weighted by
        ``1 / splits``), with the importance function DAS's look-ahead."""
        kids = self.children[g][0]
        if len(kids) < self.config["particles"]:
            self._pending[g] = 0.0
            return 0
        steps = self.split_steps()
        b = steps[min(int(uniforms[-1] * len(steps)), len(steps) - 1)]
        lam, n, lr = self.config["lookahead"], 0, 0.0
        level = lookahead_levels(self.config)  # all 1 without a ramp (and on splitting trees)
        reach = None
        if self.config["expand"] == "sweep":
            # a sweep's node may have no descendant at step b (its line died out in the resampling): not a way down.
            # Whether it has one is decided by the draws at steps <= b, never by a state below step b, so a batch
            # added at step b still does not depend on its node's children
            reach = set()
            for k in range(self.size(g)):
                if self.step[g][k] == b:
                    while k > 0 and k not in reach:
                        reach.add(k)
                        k = self.parent[g][k]
        while self.step[g][n] < b:
            kids = self.children[g][n] if reach is None else [k for k in self.children[g][n] if k in reach]
            if len(kids) > 1:
                pri = [self.prior[g][k] for k in kids]
                vals = [0.0 if lam == 0 or math.isnan(p) else lam * level[self.step[g][n] + 1] * p for p in pri]
                j = boltzmann_pick(vals, 1.0, uniforms[self.step[g][n] + 1])
                lr += -math.log(len(kids)) - _log_prob(vals, 1.0, j)
                n = kids[j]
            else:
                n = kids[0]
        self._pending[g] = lr
        return n

    def backup(self, g: int, terminal: int, r: float) -> None:
        """Set the terminal's reward (NaN counts as ``-inf``) and back the soft values up to the root; a node whose
        children are all saturated and that has no room left becomes saturated."""
        alpha = self.config["alpha"]
        v = r if math.isfinite(r) else (math.inf if r == math.inf else -math.inf)
        self.reward[g][terminal], self.value[g][terminal] = r, v
        self.log_ratio[g][terminal] = self._pending.pop(g, math.nan)
        self.visits[g][terminal] += 1
        self.saturated[g][terminal] = True
        n = self.parent[g][terminal]
        while n >= 0:
            kids = self.children[g][n]
            self.value[g][n] = soft_backup([self.value[g][k] for k in kids], alpha)
            self.visits[g][n] += 1
            self.saturated[g][n] = len(kids) >= self.capacity(g, n) and all(self.saturated[g][k] for k in kids)
            n = self.parent[g][n] if n > 0 else -1

    def child_logits(self, g: int, n: int) -> list[float]:
        """``v(c) / alpha - log mu(c)`` per child of ``n``: the log-weight of each child in ``n``'s estimate (the
        output descent draws children ``∝ exp`` of it); ``v(c) / alpha`` on trees without sweeps."""
        alpha, value, log_mu = self.config["alpha"], self.value[g], self.log_mu[g]
        return [value[c] / alpha - log_mu[c] for c in self.children[g][n]]

    def sweep_value(self, g: int, n: int) -> float:
        """A sweep tree's soft value of ``n``: ``alpha log( (1 / B(n)) sum_c exp(v(c) / alpha) / mu(c) )``, ``B(n)``
        its batches (each batch's sum over its children divided by its expected count is an unbiased estimate of
        ``E[exp(r / alpha) | x_n]``; a batch that drew no child contributes 0); ``-inf`` without children."""
        return _weighted_soft(self.child_logits(g, n), self.config["alpha"], self.batches[g][n])

    def add_sweep(self, g: int, n: int, levels: list[tuple[list[float], list[float], list[float]]],
                  rewards: list[float]) -> None:
        """Append one sweep started at ``n`` (``docs/methods/tree_search.md``, "Sweeps") and set its values; the
        states were written by the caller at the next free indices (a level of consecutive nodes per step, ``K_l``
        of them, the first level children of ``n``; ``K_l = K`` on every level unless the sweep widens).

        ``levels[l] = (ancestors, log_mu, look_ahead)`` per resampling step: the index in level ``l`` of each node
        of level ``l + 1``'s parent, that node's ``log mu`` (``K_{l+1}`` each), and level ``l``'s raw look-ahead
        ``r(D(x))`` (``K_l``; NaN: none computed); ``rewards``: the terminals' ``r(x_N)`` (``K_L``). Level ``0``'s
        ``K_0`` nodes weigh ``log K_0``; every node
        above the terminals got one batch and ``n`` one more; the soft values (:meth:`sweep_value`) are backed up
        children first through the sweep, then from ``n`` to the root (each of those visited ``K`` more times).
        The same as adding the nodes one by one with :meth:`add` and backing each value up with
        :meth:`sweep_value`, in lists built at once."""
        alpha = self.config["alpha"]
        widths = [len(look) for _, _, look in levels] + [len(rewards)]  # K_l per level, the terminals' last
        K, K0 = widths[-1], widths[0]
        parent, step, value, children = self.parent[g], self.step[g], self.value[g], self.children[g]
        log_mu, batches, prior = self.log_mu[g], self.batches[g], self.prior[g]
        base, total = len(parent), sum(widths)
        inner = total - K
        par, off = [n] * K0, base
        for lvl, (anc, _, _) in enumerate(levels):
            par.extend([off + int(a) for a in anc])
            off += widths[lvl]
        s0 = step[n] + 1
        parent.extend(par)
        step.extend([s0 + lvl for lvl, w in enumerate(widths) for _ in range(w)])
        value.extend([-math.inf] * total)
        self.visits[g].extend([0] * inner + [1] * K)
        self.reward[g].extend([math.nan] * inner + rewards)
        children.extend([] for _ in range(total))
        self.saturated[g].extend([False] * inner + [True] * K)
        self.log_ratio[g].extend([math.nan] * total)
        log_mu.extend([math.log(K0)] * K0)
        evals = 0
        for _, lmu, look in levels:
            log_mu.extend(lmu)
            for v in look:  # this level's own look-ahead (NaN where the step is outside the window)
                if math.isnan(v):
                    prior.append(math.nan)
                else:
                    prior.append(v / alpha if math.isfinite(v) else -math.inf)  # never preferred
                    evals += 1
        prior.extend([math.nan] * K)
        self.reward_evals[g] += evals
        batches[n] += 1
        batches.extend([1] * inner + [0] * K)
        for c, q in enumerate(par, base):
            children[q].append(c)
        for t, v in enumerate(rewards, base + inner):
            value[t] = v if math.isfinite(v) else (math.inf if v == math.inf else -math.inf)
        for q in range(base + inner - 1, base - 1, -1):  # children first
            value[q] = _weighted_soft([value[c] / alpha - log_mu[c] for c in children[q]], alpha, 1)
        q, visits = n, self.visits[g]
        while q >= 0:  # the start node and its ancestors
            value[q] = self.sweep_value(g, q)
            visits[q] += K
            q = parent[q] if q > 0 else -1

    def terminals(self, g: int) -> list[int]:
        """The terminal nodes (one per rollout, in creation order)."""
        last = self.steps
        return [n for n, s in enumerate(self.step[g]) if s == last]

    def log_reach(self, g: int) -> list[float]:
        """``log q(n)``: the probability that the output descent (children ``∝ exp(v / alpha)`` from the root) passes
        through node ``n``; over the terminals it is DTS's output law (parents precede children)."""
        alpha, value, log_mu = self.config["alpha"], self.value[g], self.log_mu[g]
        out = [0.0] * self.size(g)
        exp, log, inf = math.exp, math.log, math.inf
        for n, kids in enumerate(self.children[g]):
            if not kids:
                continue
            a = [value[c] / alpha - log_mu[c] for c in kids]
            m = max(a)
            if m == -inf:  # every child -inf: the descent is uniform
                lse = log(len(a))
                a = [0.0] * len(a)
            else:
                lse = m + log(sum(exp(v - m) for v in a))
            on = out[n]
            for k, ak in zip(kids, a, strict=True):
                out[k] = on + ak - lse if on > -inf else -inf
        return out

    # ---------------------------------------------------------------------------------------------- files
    def save(self, path: str | os.PathLike) -> None:
        """One safetensors file, atomically: the tensors, and the configuration and structure as JSON metadata."""
        tensors = {"noise": self.noise, "x": self.x, "den": self.den}
        for g, s in enumerate(self.gen_states or []):
            tensors[f"gen_state.{g}"] = s
        meta = {"format": FORMAT, "config": self.config, "parent": self.parent, "step": self.step,
                "value": [[_num(v) for v in vs] for vs in self.value], "visits": self.visits,
                "reward": [[_num(v) for v in vs] for vs in self.reward], "nfe": self.nfe,
                "log_ratio": [[_num(v) for v in vs] for vs in self.log_ratio],
                "prior": [[_num(v) for v in vs] for vs in self.prior],
                "log_mu": [[_num(v) for v in vs] for vs in self.log_mu], "batches": self.batches,
                "reward_evals": self.reward_evals, "rollouts": self.rollouts, "wall_time": self.wall_time,
                "model_time": self.model_time, "verifier_time": self.verifier_time}
        # float values travel as repr strings, which round-trip a float64 exactly
        save_tensors(tensors, path, {"tree_search": json.dumps(meta)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> Forest:
        from safetensors import safe_open

        tensors = load_tensors(path)
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("tree_search")
        if raw is None:
            raise CheckpointError(f"{path}: not a tree-search checkpoint (no 'tree_search' metadata)")
        meta = json.loads(raw)
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: tree-search format {meta.get('format')!r}, expected {FORMAT!r}")
        groups = len(meta["parent"])
        f = cls(meta["config"], tensors["noise"], tensors["x"], tensors["den"], meta["parent"], meta["step"],
                [[float(v) for v in vs] for vs in meta["value"]], meta["visits"],
                [[float(v) for v in vs] for vs in meta["reward"]], meta["nfe"], meta["reward_evals"],
                meta["rollouts"], meta["wall_time"], meta["model_time"],
                [tensors[f"gen_state.{g}"] for g in range(groups)] if "gen_state.0" in tensors else None)
        # a tree saved before the proposal ratios were kept: NaN (the reweighted output refuses it)
        ratios = meta.get("log_ratio") or [[math.nan] * len(p) for p in meta["parent"]]
        f.log_ratio = [[float(v) for v in vs] for vs in ratios]
        priors = meta.get("prior") or [[math.nan] * len(p) for p in meta["parent"]]  # none before splitting existed
        f.prior = [[float(v) for v in vs] for vs in priors]
        f.log_mu = [[float(v) for v in vs] for vs in (meta.get("log_mu") or [[0.0] * len(p) for p in meta["parent"]])]
        f.batches = meta.get("batches") or [[0] * len(p) for p in meta["parent"]]
        f.verifier_time = float(meta.get("verifier_time", 0.0))  # 0 for a tree saved before it was kept
        f.rebuild()
        return f

    def rebuild(self) -> None:
        """The children lists and saturation flags from the parents (after a load)."""
        self.children, self.saturated = [], []
        for g in range(self.groups):
            kids: list[list[int]] = [[] for _ in range(self.size(g))]
            for n in range(1, self.size(g)):
                kids[self.parent[g][n]].append(n)
            self.children.append(kids)
            sat = [False] * self.size(g)
            for n in reversed(range(self.size(g))):  # children follow their parents
                sat[n] = self.step[g][n] == self.steps or (
                    len(kids[n]) >= self.capacity(g, n) and all(sat[k] for k in kids[n]))
            self.saturated.append(sat)

    def to(self, device: torch.device | str, dtype: torch.dtype) -> Forest:
        self.noise, self.x, self.den = (t.to(device, dtype) for t in (self.noise, self.x, self.den))
        return self


def _weighted_soft(logits: list[float], alpha: float, batches: int) -> float:
    """``alpha (log sum_c exp(a_c) - log batches)`` (max-shifted; ``-inf`` without children or if every ``a_c`` is
    ``-inf``): a sweep node's soft value from its children's log-weights (:meth:`Forest.sweep_value`)."""
    if not logits:
        return -math.inf
    m = max(logits)
    if m == -math.inf:
        return -math.inf
    return alpha * (m + math.log(sum(math.exp(v - m) for v in logits)) - math.log(batches))


def _num(v: float) -> str:
    return repr(float(v))
