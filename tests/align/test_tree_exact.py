"""Diffusion Tree Sampling's output measure computed exactly (Jain et al. 2025, arXiv 2506.20701;
``docs/methods/tree_search.md``, "Why the paper's selection under-tilts").

The chain is discrete (binary ``x_0 -> x_1 -> x_2``), so every outcome of growing a tree for ``K`` rollouts (each
chain draw, each selection) can be enumerated with its probability, driving the library's own :class:`Forest`
(selection, backup, output reach). DTS's output descent picks terminal ``t`` with probability
``u(t) exp(r_t / alpha) / sum_s u(s) exp(r_s / alpha)`` (``u``: the uniform descent's probability), so the quantity
that decides whether it samples the tilt is the expected unnormalised measure ``E sum_t u(t) exp(r_t / alpha)
delta_{x_t}``, which must equal ``p(x_2) exp(r(x_2) / alpha)`` (closed form below). It does at every budget when the
rollouts are allocated blind to the values (the default), and does not with the paper's Boltzmann selection.
"""

from __future__ import annotations

import math

import pytest
import torch

from steerdiff.align.tree_search import tree_search
from steerdiff.align.tree_state import Forest, split_steps
from steerdiff.models import GaussianMixture

P0 = (0.5, 0.5)  # p(x_0)
KERNELS = (((0.8, 0.2), (0.2, 0.8)), ((0.9, 0.1), (0.1, 0.9)))  # p(x_1 | x_0), p(x_2 | x_1)
R = (0.0, 2.0)  # r(x_2)
ALPHA = 1.0


def _exact_measure() -> list[float]:
    """``p(x_2) exp(r(x_2) / alpha)`` by summing the chain."""
    k1, k2 = KERNELS
    p2 = [sum(P0[a] * k1[a][b] * k2[b][c] for a in (0, 1) for b in (0, 1)) for c in (0, 1)]
    return [p2[c] * math.exp(R[c] / ALPHA) for c in (0, 1)]


def _clone(f: Forest, states: list) -> tuple[Forest, list]:
    g = Forest(f.config, f.noise, f.x, f.den, [list(a) for a in f.parent], [list(a) for a in f.step],
               [list(a) for a in f.value], [list(a) for a in f.visits], [list(a) for a in f.reward], list(f.nfe),
               list(f.reward_evals), list(f.rollouts), children=[[list(c) for c in t] for t in f.children],
               saturated=[list(a) for a in f.saturated], log_ratio=[list(a) for a in f.log_ratio],
               prior=[list(a) for a in f.prior], log_mu=[list(a) for a in f.log_mu],
               batches=[list(a) for a in f.batches])
    g._pending = dict(f._pending)
    return g, list(states)


def _selections(f: Forest, temp: float) -> list[tuple[int, float, list[float]]]:
    """Every outcome of :meth:`Forest.select`: (node to expand, its probability, uniforms that make select pick it)."""
    out = []

    def walk(n, prob, us):
        if f.saturated[0][n]:
            return
        kids = f.children[0][n]
        if len(kids) < f.capacity(0, n):
            out.append((n, prob, us + [0.5] * (4 - len(us))))
            return
        open_ = [k for k in kids if not f.saturated[0][k]]
        a = [f.value[0][k] / temp for k in open_]
        m = max(a)
        w = [1.0] * len(a) if m == -math.inf else [math.exp(v - m) for v in a]
        acc = 0.0
        for j, k in enumerate(open_):
            if w[j] > 0:
                walk(k, prob * w[j] / sum(w), us + [(acc + w[j] / 2) / sum(w)])
            acc += w[j]

    walk(0, 1.0, [])
    return out


def _grow(f: Forest, states: list, n: int) -> list[tuple[Forest, list, float]]:
    """Every outcome of expanding ``n`` by one chain step and rolling out to ``x_2``, backed up."""
    outs = []

    def roll(f, states, node, prob):
        s = f.step[0][node]
        if s == 2:
            f.backup(0, node, R[states[node]])
            outs.append((f, states, prob))
            return
        for b in (0, 1):
            g, ss = _clone(f, states)
            ss.append(b)
            roll(g, ss, g.add(0, node), prob * KERNELS[s][states[node]][b])

    s = f.step[0][n]
    for b in (0, 1):
        g, ss = _clone(f, states)
        ss.append(b)
        roll(g, ss, g.add(0, n), P0[b] if s < 0 else KERNELS[s][states[n]][b])
    return outs


def _expected(rollouts: int, temp: float) -> dict:
    """Over every tree of ``rollouts`` rollouts (2 root children, 2 children per node): the output's law of
    ``x_2``, the expected measure ``sum_t u(t) exp(r_t / alpha) delta``, and the reweighted rollouts' measure
    ``(1 / K) sum_k ratio_k exp(r_k / alpha) delta`` (``reweight=True``)."""
    cfg = {"mode": "dts", "alpha": ALPHA, "particles": 2, "branching": 2, "widening": 0.0,
           "select_temperature": temp, "exploration": 0.0, "eta": 1.0, "sigmas": [3.0, 2.0, 1.0]}
    frontier = [(Forest.empty(cfg, torch.zeros(2, 1), 1), [None], 1.0)]
    for _ in range(rollouts):
        nxt = []
        for f, states, pr in frontier:
            for n, q, us in _selections(f, ALPHA * temp):
                assert f.select(0, us) == n  # the library's selection agrees with the enumeration
                for g, ss, r in _grow(f, states, n):
                    nxt.append((g, ss, pr * q * r))
        frontier = nxt
    assert math.isclose(sum(pr for _, _, pr in frontier), 1.0, rel_tol=1e-12)
    law, measure, reweighted = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
    for f, states, pr in frontier:
        reach, u = f.log_reach(0), [1.0] + [0.0] * (f.size(0) - 1)
        for n in range(f.size(0)):
            for c in f.children[0][n]:
                u[c] = u[n] / len(f.children[0][n])
        for t in f.terminals(0):
            x, w = states[t], math.exp(R[states[t]] / ALPHA)
            law[x] += pr * math.exp(reach[t])
            measure[x] += pr * u[t] * w
            reweighted[x] += pr * w * math.exp(f.log_ratio[0][t]) / rollouts
    return {"law": law, "measure": measure, "reweighted": reweighted}


def _close(a, b, rel=1e-12) -> bool:
    return all(math.isclose(x, y, rel_tol=rel) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("rollouts", [3, 4])
def test_value_blind_allocation_keeps_the_output_measure_exact_at_every_budget(rollouts):
    """The default (``select_temperature=inf``): the tree's shape does not depend on the rewards, so its measure is
    ``p exp(r / alpha)`` in expectation exactly, and so is the reweighted rollouts' (all ratios are one)."""
    exact = _expected(rollouts, math.inf)
    assert _close(exact["measure"], _exact_measure()) and _close(exact["reweighted"], _exact_measure())


def test_the_papers_boltzmann_selection_biases_the_measure_toward_low_rewards():
    """With the paper's selection (``select_temperature=1``) a child whose first rollout scored low is rarely
    revisited and keeps its low one-chain estimate, while a lucky one is revisited and regresses: from the third
    rollout on, the measure of the low-reward state is inflated and the high one's deflated (computed: 0.549 vs
    0.5 and 3.33 vs 3.69 at four rollouts), so the output under-tilts against the value-blind tree's. Reweighting
    by the selection's probabilities is exact while every reused prefix is a root child (three rollouts) and not
    after (the prefix's own shape was chosen by the rewards)."""
    want = _exact_measure()
    two = _expected(2, 1.0)  # the root's own chains: no selection has happened yet
    assert _close(two["measure"], want)
    paper, blind = _expected(4, 1.0), _expected(4, math.inf)
    assert paper["measure"][0] > 1.05 * want[0] and paper["measure"][1] < 0.95 * want[1]
    assert paper["law"][1] < blind["law"][1] - 0.02
    assert _close(_expected(3, 1.0)["reweighted"], want)
    assert not _close(paper["reweighted"], want, rel=1e-3)


def test_dts_allocates_blind_to_the_values_by_default_and_dts_star_greedily():
    mix = GaussianMixture([0.5, 0.5], [[-2.0], [2.0]], 0.25)
    sig = torch.tensor([20.0, 2.0, 0.5, 0.0], dtype=torch.float64)
    kw = dict(alpha=1.0, particles=2, nfe=12, generator=0)
    noise = torch.zeros(2, 1, dtype=torch.float64)
    dts = tree_search(mix, lambda x: x.flatten(1).sum(1), noise, sig, **kw)
    star = tree_search(mix, lambda x: x.flatten(1).sum(1), noise, sig, mode="dts_star", **kw)
    paper = tree_search(mix, lambda x: x.flatten(1).sum(1), noise, sig, select_temperature=1.0, **kw)
    assert dts.extras["tree"].config["select_temperature"] == math.inf
    assert star.extras["tree"].config["select_temperature"] == 1.0
    assert paper.extras["tree"].config["select_temperature"] == 1.0


# ---------------------------------------------------------------------------------------------- splitting
H = (-1.0, 1.0)  # a look-ahead value of x_1 (a function of the state alone), standing in for r(D(x_1)) / alpha


def _split_selections(f: Forest) -> list[tuple[int, float, list[float]]]:
    """Every outcome of the splitting selection: (node to branch at, probability, uniforms that make it so)."""
    if len(f.children[0][0]) < f.config["particles"]:
        return [(0, 1.0, [0.5] * 4)]
    out, steps, lam = [], split_steps(f.config), f.config["lookahead"]
    for i, b in enumerate(steps):
        def walk(n, prob, us, b=b, i=i):
            if f.step[0][n] == b:
                out.append((n, prob / len(steps), us[:3] + [(i + 0.5) / len(steps)]))
                return
            kids = f.children[0][n]
            a = [0.0 if lam == 0 or math.isnan(f.prior[0][k]) else lam * f.prior[0][k] for k in kids]
            w = [math.exp(v - max(a)) for v in a]
            acc = 0.0
            for j, k in enumerate(kids):
                u = list(us)
                u[f.step[0][n] + 1] = (acc + w[j] / 2) / sum(w)
                walk(k, prob * w[j] / sum(w), u)
                acc += w[j]

        walk(0, 1.0, [0.5] * 4)
    return out


def _expected_split(rollouts: int, lookahead: float, prior_from_rewards: bool = False) -> list[float]:
    """The expected measure ``sum_t u(t) exp(r_t / alpha) delta`` over every tree grown by splitting
    (``expand="split"``) on the binary chain, the ``x_1`` nodes carrying the look-ahead ``H[x_1]`` (or, to show
    what the test catches, their soft value once backed up: a prior that reads the subtree's rewards)."""
    cfg = {"mode": "dts", "alpha": ALPHA, "particles": 2, "branching": 2, "widening": 0.0,
           "select_temperature": math.inf, "exploration": 0.0, "eta": 1.0, "sigmas": [3.0, 2.0, 1.0],
           "expand": "split", "split_sigma": [0.0, math.inf], "lookahead": lookahead}
    frontier = [(Forest.empty(cfg, torch.zeros(2, 1), 1), [None], 1.0)]
    for _ in range(rollouts):
        nxt = []
        for f, states, pr in frontier:
            for n, q, us in _split_selections(f):
                assert f.select(0, us) == n  # the library's selection agrees with the enumeration
                for g, ss, r in _grow(f, states, n):
                    for m in range(g.size(0)):
                        if g.step[0][m] == 1:
                            g.prior[0][m] = g.value[0][m] if prior_from_rewards else H[ss[m]]
                    nxt.append((g, ss, pr * q * r))
        frontier = nxt
    assert math.isclose(sum(pr for _, _, pr in frontier), 1.0, rel_tol=1e-12)
    measure = [0.0, 0.0]
    for f, states, pr in frontier:
        u = [1.0] + [0.0] * (f.size(0) - 1)
        for n in range(f.size(0)):
            for c in f.children[0][n]:
                u[c] = u[n] / len(f.children[0][n])
        for t in f.terminals(0):
            measure[states[t]] += pr * u[t] * math.exp(R[states[t]] / ALPHA)
    return measure


@pytest.mark.parametrize("lookahead", [0.0, 1.5])
def test_splitting_with_look_ahead_keeps_the_output_measure_exact(lookahead):
    """``expand="split"``: branch steps drawn blind, children picked ``∝ exp(lookahead * H(x_1))`` with ``H`` a
    function of the child's own state: the number of children a node gets never depends on its descendants, so
    the measure is ``p exp(r / alpha)`` in expectation at every budget (here 3 and 4 rollouts, the look-ahead
    favouring the high-reward state, so the tree's shape does depend on it)."""
    for rollouts in (3, 4):
        assert _close(_expected_split(rollouts, lookahead), _exact_measure())


def test_splitting_steered_by_the_subtrees_rewards_is_biased():
    """The same enumeration with the selection reading each ``x_1`` node's soft value (its rollouts' rewards)
    instead of a look-ahead of its state: the measure is no longer exact (the test above can fail)."""
    assert not _close(_expected_split(4, 1.5, prior_from_rewards=True), _exact_measure(), rel=1e-3)
