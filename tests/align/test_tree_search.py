"""Diffusion Tree Sampling / Search (``steerdiff.align.tree_search``; Jain et al. 2025, arXiv 2506.20701) against
exact answers: the cost a counting denoiser sees, bit-for-bit resumption from a checkpoint, the soft Bellman values
recomputed from the rewards, DTS* against best-of-N at equal NFE, and DTS's samples against the exact tilted
mixture (``GaussianMixture.tilt_linear``)."""

from __future__ import annotations

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.align import ALIGNERS, best_of_n
from steerdiff.align.rewards import Linear, Quadratic
from steerdiff.align.tree_search import tree_search
from steerdiff.align.tree_state import Forest, lookahead_levels, lookahead_steps, soft_backup, sweep_widths
from steerdiff.core.noise import randn
from steerdiff.models import GaussianMixture

MIX1 = GaussianMixture([0.5, 0.5], [[-2.0], [2.0]], 0.25)
MIX2 = GaussianMixture([0.3, 0.7], [[-1.5, 0.5], [1.5, -0.5]], 0.3)


class Counting:
    """A denoiser wrapper counting the rows it is called on."""

    def __init__(self, den):
        self.den, self.rows = den, 0

    def __call__(self, x, sigma, cond=None):
        self.rows += x.shape[0]
        return self.den(x, sigma, cond)


def _noise(groups, particles, dim=1, seed=0):
    return randn((groups * particles, dim), seeds=seed, dtype=torch.float64)


def _same(a, b) -> bool:
    return a.shape == b.shape and torch.equal(torch.nan_to_num(a, 7.0, 8.0, 9.0), torch.nan_to_num(b, 7.0, 8.0, 9.0))


@pytest.mark.parametrize("final_zero", [True, False])
def test_cost_is_what_a_counting_denoiser_sees(final_zero):
    sig = sd.sigmas.karras(8, 0.02, 20.0)
    sig = sig if final_zero else sig[:-1]
    n_steps = len(sig) - 1
    den = Counting(MIX2)
    calls = []
    res = tree_search(den, Linear([1.0, -0.5]), _noise(3, 4, 2), sig, alpha=0.5, particles=4, nfe=70, generator=3,
                      callback=calls.append)
    assert res.nfe * 3 == den.rows == sum(c["x"].shape[0] for c in calls) and res.extras["nfe_this_call"] == res.nfe
    per = res.extras["nfe_per_group"]
    assert (per <= 70).all() and (per > 70 - n_steps).all()  # stops before a rollout that would pass the budget
    # one reward call per rollout, one terminal (candidate) per rollout
    assert torch.equal(res.extras["reward_evals_per_group"], res.extras["rollouts"])
    assert torch.equal(torch.isfinite(res.log_weights).sum(1).double(), res.extras["rollouts"])
    assert res.nfe_grad == 0 and res.wall_time > 0
    # the first `particles` rollouts start from the rows of noise: a full chain each
    assert (per >= 4 * n_steps).all()


def test_soft_values_and_output_law_follow_from_the_rewards():
    sig = sd.sigmas.karras(6, 0.02, 20.0)
    res = tree_search(MIX1, Linear([1.0]), _noise(2, 3), sig, alpha=0.7, particles=3, branching=2, nfe=120,
                      generator=0, reweight=False)  # the paper's descent
    f = res.extras["tree"]
    for g in range(2):
        v = [0.0] * f.size(g)
        for n in reversed(range(f.size(g))):  # the soft Bellman backup, recomputed from the terminal rewards
            v[n] = f.reward[g][n] if f.step[g][n] == f.steps else soft_backup([v[c] for c in f.children[g][n]], 0.7)
        assert v == f.value[g]
        assert all(len(f.children[g][n]) <= (3 if n == 0 else 2) for n in range(f.size(g)))
        lw = res.log_weights[g][torch.isfinite(res.log_weights[g])]
        assert math.isclose(float(torch.logsumexp(lw, 0)), 0.0, abs_tol=1e-12)
        # the root's value is alpha log of the mean over its children of exp(v / alpha)
        assert math.isclose(float(res.log_evidence[g]) * 0.7, v[0], rel_tol=1e-12)
    # the samples are terminals of their own tree, with their rewards
    cand = res.particles_final.view(2, -1, 1)
    for g in range(2):
        assert (cand[g] == res.samples[g]).all(-1).any()
    assert torch.allclose(res.rewards, Linear([1.0])(res.samples).double())


def test_reweighted_output_uses_the_selection_probabilities_at_the_time():
    """``reweight=True`` resamples rollouts ``∝ exp(r / alpha) (1 / |C(n)|) / pi(c | n)``. After the root's
    ``P`` chains, the next rollout's selection draws a root child ``∝ exp(r_c / alpha)`` (each child's value is its
    one chain's reward), so its proposal ratio is ``log((1 / P) / softmax(r / alpha)_c)`` in closed form; the root's
    own chains are draws of the model's chain (ratio 0)."""
    sig = sd.sigmas.karras(6, 0.02, 20.0)
    n_steps, alpha = len(sig) - 1, 0.7
    res = tree_search(MIX1, Linear([1.0]), _noise(3, 3), sig, alpha=alpha, particles=3, branching=2,
                      nfe=3 * n_steps + n_steps - 1, generator=0, reweight=True, select_temperature=1.0)
    f = res.extras["tree"]
    assert res.extras["reweight"] is True
    for g in range(3):
        terms = f.terminals(g)
        assert len(terms) == 4
        first = [f.reward[g][t] / alpha for t in terms[:3]]
        assert [f.log_ratio[g][t] for t in terms[:3]] == [0.0, 0.0, 0.0]
        # the fourth rollout hangs below one of the root's children: find which
        c = terms[3]
        while f.parent[g][c] != 0:
            c = f.parent[g][c]
        k = f.children[g][0].index(c)
        expected = math.log(1 / 3) - (first[k] - float(torch.logsumexp(torch.tensor(first, dtype=torch.float64), 0)))
        assert math.isclose(f.log_ratio[g][terms[3]], expected, rel_tol=1e-12, abs_tol=1e-12)
        lw = torch.tensor([f.reward[g][t] / alpha + f.log_ratio[g][t] for t in terms], dtype=torch.float64)
        assert torch.allclose(res.log_weights[g, :4], lw - torch.logsumexp(lw, 0), rtol=0, atol=1e-12)
        assert math.isclose(float(res.log_evidence[g]), float(torch.logsumexp(lw, 0)) - math.log(4), rel_tol=1e-12)


def test_resume_from_checkpoint_equals_an_uninterrupted_run(tmp_path):
    sig = sd.sigmas.karras(7, 0.02, 20.0)
    kw = dict(alpha=0.5, particles=3, branching=3, generator=11, draws=2)
    noise, r = _noise(3, 3, 2), Quadratic.around([1.0, 2.0], [1.0, 0.0])
    full = tree_search(MIX2, r, noise, sig, nfe=150, **kw)
    ck = tmp_path / "tree.safetensors"
    part = tree_search(MIX2, r, noise, sig, nfe=60, checkpoint=ck, **kw)
    assert part.nfe < full.nfe
    assert Forest.load(ck).nfe == part.extras["nfe_per_group"].long().tolist()  # written at the end of the call
    den = Counting(MIX2)
    resumed = tree_search(den, r, noise, sig, nfe=150, resume=ck, **kw)
    again = tree_search(MIX2, r, noise, sig, nfe=150, resume=part.extras["tree"], **kw)  # in memory
    for res in (resumed, again):
        for name in ("samples", "rewards", "log_weights", "particles_final", "log_evidence"):
            assert _same(getattr(full, name), getattr(res, name)), name
        assert res.nfe == full.nfe and res.reward_evals == full.reward_evals
    assert den.rows == 3 * (full.nfe - part.nfe)  # the resumed call paid only for the new rollouts


def test_checkpoints_refuse_other_settings_and_pickles(tmp_path):
    sig = sd.sigmas.karras(5, 0.02, 20.0)
    ck = tmp_path / "t.safetensors"
    tree_search(MIX1, Linear([1.0]), _noise(1, 2), sig, alpha=1.0, particles=2, nfe=20, generator=0, checkpoint=ck)
    with pytest.raises(ValueError, match="alpha"):
        tree_search(MIX1, Linear([1.0]), _noise(1, 2), sig, alpha=2.0, particles=2, nfe=40, resume=ck)
    with pytest.raises(ValueError, match="noise"):
        tree_search(MIX1, Linear([1.0]), _noise(1, 2, seed=5), sig, alpha=1.0, particles=2, nfe=40, resume=ck)
    bad = tmp_path / "t.pt"
    bad.write_bytes(b"x")
    with pytest.raises(Exception, match="safetensors"):
        tree_search(MIX1, Linear([1.0]), _noise(1, 2), sig, alpha=1.0, particles=2, nfe=40, resume=bad)


def test_a_nonfinite_reward_is_never_output_and_is_counted():
    def half_nan(x):
        r = x.flatten(1).sum(1).double()
        return torch.where(r < 0, torch.full_like(r, math.nan), r)

    sig = sd.sigmas.karras(6, 0.02, 20.0)
    for mode in ("dts", "dts_star"):
        res = tree_search(MIX1, half_nan, _noise(2, 4), sig, alpha=1.0, mode=mode, particles=4, nfe=60, generator=0)
        cand = res.extras["candidate_rewards"]
        held = torch.arange(cand.shape[1])[None] < res.extras["rollouts"][:, None]  # not the padding
        assert torch.equal(res.nonfinite[0], (torch.isnan(cand) & held).sum(1))
        assert (res.nonfinite > 0).all() and torch.isfinite(res.rewards).all()
        assert (res.log_weights[torch.isnan(cand)] == -math.inf).all()  # zero weight for the output descent
    with pytest.raises(FloatingPointError, match="group 0"):
        tree_search(MIX1, lambda x: torch.full((x.shape[0],), math.nan, dtype=torch.float64), _noise(1, 2), sig,
                    alpha=1.0, particles=2, nfe=12, generator=0)


@pytest.mark.parametrize("kw, match", [({"mode": "mcts"}, "mode"), ({"branching": 0}, "branching"),
                                       ({"nfe": -1}, "nfe"), ({"output": "best"}, "output"),
                                       ({"draws": 0}, "draws"), ({"exploration": -1.0}, "exploration"),
                                       ({"widening": 1.5}, "widening"),
                                       ({"select_temperature": 0.0}, "select_temperature"),
                                       ({"reweight": 1}, "reweight"), ({"expand": "bfs"}, "expand"),
                                       ({"expand": "split", "lookahead": -1.0}, "lookahead"),
                                       ({"lookahead": 1.0}, "lookahead"),
                                       ({"expand": "split", "mode": "dts_star"}, "expand"),
                                       ({"expand": "split", "split_sigma": (3.0, 1.0)}, "split_sigma"),
                                       ({"expand": "split", "split_sigma": 1e-6}, "split_sigma"),
                                       ({"expand": "sweep", "lookahead_ramp": 0.0}, "lookahead_ramp"),
                                       ({"expand": "sweep", "lookahead_ramp": (1.0, -2.0)}, "lookahead_ramp"),
                                       ({"expand": "sweep", "lookahead_ramp": (1.0, 2.0, 3.0)}, "lookahead_ramp"),
                                       ({"expand": "sweep", "lookahead_ramp": math.inf}, "lookahead_ramp"),
                                       ({"expand": "split", "lookahead_ramp": 1.0}, "lookahead_ramp"),
                                       ({"expand": "sweep", "lookahead_every": 0}, "lookahead_every"),
                                       ({"expand": "sweep", "lookahead_every": 1.5}, "lookahead_every"),
                                       ({"lookahead_every": 2}, "lookahead_every"),
                                       ({"expand": "sweep", "widen": (1.0, 0)}, "widen"),
                                       ({"expand": "sweep", "widen": (0.0, 4)}, "widen"),
                                       ({"expand": "sweep", "widen": (math.nan, 4)}, "widen"),
                                       ({"expand": "sweep", "widen": (1.0, 2.5)}, "widen"),
                                       ({"expand": "sweep", "widen": 3.0}, "widen"),
                                       ({"expand": "sweep", "widen": ()}, "widen"),
                                       ({"expand": "sweep", "widen": ((1.0, 4), (2.0, 3))}, "widen"),
                                       ({"expand": "sweep", "widen": ((2.0, 4), (1.0, 0))}, "widen"),
                                       ({"expand": "split", "widen": (1.0, 4)}, "widen"),
                                       ({"widen": (1.0, 4)}, "widen")])
def test_bad_options_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        tree_search(MIX1, Linear([1.0]), _noise(1, 2), sd.sigmas.karras(4, 0.02, 20.0), alpha=1.0, particles=2,
                    **kw)


def test_registered_with_its_options_and_cost():
    spec = ALIGNERS.get("tree_search")
    assert ALIGNERS.get("dts") is spec
    assert spec.defaults()["mode"] == "dts" and spec.cost(10, 4, nfe=123) == {"nfe": 123, "nfe_grad": 0}
    res = sd.align.run("tree_search", MIX1, Linear([1.0]), _noise(2, 2), sd.sigmas.karras(4, 0.02, 20.0),
                       alpha=1.0, particles=2, nfe=16, generator=0)
    assert res.samples.shape == (2, 1) and res.nfe <= 16


def test_dts_star_finds_at_least_best_of_n_reward_at_equal_nfe():
    """DTS* (greedy selection, output the best terminal) against best-of-N with the same NFE per group: the best
    reward found, averaged over 64 independent groups, is at least best-of-N's (DTS*'s first `particles` rollouts
    are plain chains, the rest search below the best ones)."""
    sig = sd.sigmas.karras(10, 0.02, 20.0)
    r, groups, k = Quadratic.around([1.0, 1.0], [1.2, -0.4]), 64, 16
    bon = best_of_n(MIX2, r, _noise(groups, k, 2, seed=1), sig, particles=k, generator=2)
    star = tree_search(MIX2, r, _noise(groups, 4, 2, seed=1), sig, alpha=0.1, mode="dts_star", particles=4,
                       nfe=int(bon.nfe), generator=2)
    assert star.nfe <= bon.nfe
    diff = star.rewards - bon.rewards
    # a one-sided check with its standard error: DTS*'s mean best reward is not below best-of-N's
    assert diff.mean() > -2 * diff.std() / groups**0.5, (star.rewards.mean(), bon.rewards.mean())


SPLIT = dict(expand="split", lookahead=1.5, split_sigma=(0.05, 5.0))


def test_splitting_branches_in_its_window_and_looks_ahead_with_the_rollouts_own_denoised_states():
    """``expand="split"``: after the root's chains every rollout branches at a step whose sigma lies in
    ``split_sigma``; each node below such a step carries ``r(D(x, sigma)) / alpha`` recomputed here from the tree's
    cached ``D`` (one reward call each, counted in ``reward_evals``, no extra NFE: a counting denoiser sees exactly
    ``nfe``), every other node none; the soft values are still the backup of the terminal rewards."""
    sig = sd.sigmas.karras(12, 0.02, 20.0)
    r, alpha, den = Quadratic.around([1.0, 2.0], [1.0, 0.0]), 0.5, Counting(MIX2)
    res = tree_search(den, r, _noise(3, 2, 2), sig, alpha=alpha, particles=2, nfe=150, generator=4, **SPLIT)
    f = res.extras["tree"]
    window = [i for i in range(len(sig) - 1) if 0.05 <= sig[i] <= 5.0]
    assert f.split_steps() == window and res.nfe * 3 == den.rows
    for g in range(3):
        branched = [n for n in range(1, f.size(g)) if len(f.children[g][n]) > 1]
        assert branched and all(f.step[g][n] in window for n in branched)
        assert len(f.children[g][0]) == 2
        ahead = [n for n in range(f.size(g)) if f.step[g][n] - 1 in window and f.step[g][n] < f.steps]
        assert all(math.isnan(f.prior[g][n]) for n in range(f.size(g)) if n not in ahead)
        want = (r(f.den[g, ahead]) / alpha).tolist()
        assert [f.prior[g][n] for n in ahead] == pytest.approx(want, rel=1e-12, abs=1e-12)
        assert f.reward_evals[g] == f.rollouts[g] + len(ahead)
        v = [0.0] * f.size(g)
        for n in reversed(range(f.size(g))):
            v[n] = f.reward[g][n] if f.step[g][n] == f.steps else soft_backup([v[c] for c in f.children[g][n]], alpha)
        assert v == f.value[g]


def test_splitting_resumes_bit_for_bit(tmp_path):
    sig = sd.sigmas.karras(9, 0.02, 20.0)
    kw = dict(alpha=0.5, particles=2, generator=7, **SPLIT)
    noise, r = _noise(2, 2, 2), Quadratic.around([1.0, 2.0], [1.0, 0.0])
    full = tree_search(MIX2, r, noise, sig, nfe=120, **kw)
    ck = tmp_path / "split.safetensors"
    tree_search(MIX2, r, noise, sig, nfe=50, checkpoint=ck, **kw)
    resumed = tree_search(MIX2, r, noise, sig, nfe=120, resume=ck, **kw)
    for name in ("samples", "rewards", "log_weights", "particles_final", "log_evidence"):
        assert _same(getattr(full, name), getattr(resumed, name)), name
    assert resumed.reward_evals == full.reward_evals
    assert [list(map(repr, p)) for p in resumed.extras["tree"].prior] == [list(map(repr, p))
                                                                        for p in full.extras["tree"].prior]
    with pytest.raises(ValueError, match="lookahead"):  # the settings are part of the tree
        tree_search(MIX2, r, noise, sig, nfe=150, resume=ck, **{**kw, "lookahead": 2.0})


@pytest.mark.parametrize("temper", [{}, {"lookahead_ramp": (2.0, 1.5), "lookahead_every": 2}])
def test_sweeps_resample_by_the_look_ahead_increments_and_weight_children_by_their_expected_count(temper):
    """``expand="sweep"``: every iteration is ``K = particles`` chains resampled at each look-ahead step.
    Recomputed from the tree: each level of a sweep holds ``K`` nodes; a child's ``log mu`` is ``log(K p)`` for its
    parent's resampling probability ``p = softmax(h(x) - h(last look-ahead ancestor of x in its sweep))`` over the
    parent's level, ``h_j = lookahead lambda_j r(D(x)) / alpha`` (the stored look-ahead, the tree's cached ``D``
    rescored here; ``lambda_j = min(1, (s0 / sigma_j)^p)`` with ``lookahead_ramp``, else 1); with
    ``lookahead_every = 2`` the look-ahead steps are every other step counted back from the last; every sweep node
    got one batch, a sweep's start node one more; the soft values follow :meth:`Forest.sweep_value`; the cost is
    what a counting denoiser sees."""
    sig = sd.sigmas.karras(10, 0.02, 20.0)
    r, alpha, lam, K, den = Quadratic.around([1.0, 2.0], [1.0, 0.0]), 0.5, 0.7, 3, Counting(MIX2)
    res = tree_search(den, r, _noise(2, K, 2), sig, alpha=alpha, particles=K, nfe=90, generator=5, expand="sweep",
                      lookahead=lam, **temper)
    f, n_steps = res.extras["tree"], len(sig) - 1
    assert res.nfe * 2 == den.rows
    every = temper.get("lookahead_every", 1)
    s0, pw = temper.get("lookahead_ramp", (0.0, 1.0))
    level = [min(1.0, (s0 / float(s)) ** pw) if temper and s > 0 else 1.0 for s in sig]
    assert lookahead_levels(f.config) == pytest.approx(level, rel=1e-12)

    def h_before(m):  # h of m's last look-ahead ancestor within m's sweep (else the sweep's start node's, or 0)
        q = f.parent[g][m]
        while q > 0 and K * ((m - 1) // K) == K * ((q - 1) // K) + K:  # q is in m's sweep (the block before m's)
            if not math.isnan(f.prior[g][q]):
                return lam * level[f.step[g][q]] * f.prior[g][q]
            m, q = q, f.parent[g][q]
        return 0.0 if q <= 0 or math.isnan(f.prior[g][q]) else lam * level[f.step[g][q]] * f.prior[g][q]

    for g in range(2):
        # every step but the last, deterministic one (sigma_N = 0), thinned to every k-th counted back from the last
        window = list(range(n_steps - 1))[::-1][::every][::-1]
        assert lookahead_steps(f.config) == window and f.split_steps() == list(range(n_steps - 1))
        inner = [n for n in range(1, f.size(g)) if f.step[g][n] in window]
        assert all(math.isnan(f.prior[g][n]) for n in range(f.size(g)) if n not in inner)
        assert [f.prior[g][n] for n in inner] == pytest.approx((r(f.den[g, inner]) / alpha).tolist(), rel=1e-12)
        assert f.reward_evals[g] == f.rollouts[g] + len(inner) and f.rollouts[g] % K == 0 and f.rollouts[g] > K
        for n in range(1, f.size(g)):
            kids = f.children[g][n]
            if not kids:
                continue
            block = 1 + K * ((n - 1) // K)  # a sweep adds its levels as consecutive blocks of K nodes
            block_nodes = list(range(block, block + K))
            assert all(f.step[g][m] == f.step[g][n] for m in block_nodes)
            if f.step[g][n] in window:
                h = torch.tensor([lam * level[f.step[g][m]] * f.prior[g][m] - h_before(m) for m in block_nodes],
                                 dtype=torch.float64)
                want = math.log(K) + float(torch.log_softmax(h, 0)[block_nodes.index(n)])
            else:  # no look-ahead at this step: each node keeps one child
                want = 0.0
                assert sum(1 + K * ((c - 1) // K) == block + K for c in kids) == 1
            starts = 0
            for c in kids:  # a child in the block after n's came from n's sweep; any other from a sweep started at n
                if 1 + K * ((c - 1) // K) == block + K:
                    assert math.isclose(f.log_mu[g][c], want, rel_tol=1e-9, abs_tol=1e-9)
                else:
                    assert f.log_mu[g][c] == math.log(K)
                    starts += 1
            assert starts % K == 0 and f.batches[g][n] == 1 + starts // K
            assert math.isclose(f.value[g][n], f.sweep_value(g, n), rel_tol=1e-12)
        assert f.batches[g][0] == 1 and len(f.children[g][0]) == K


def test_widened_sweeps_split_each_chain_where_the_window_opens():
    """``widen=(sigma_w, K')``: a sweep's levels hold ``particles`` nodes above ``sigma_w`` and ``K'`` at and below
    it, recounted from the tree per step and per sweep; entering the wide levels without a look-ahead there
    (``split_sigma`` below ``sigma_w``), every chain gets exactly ``K' / K`` children, each weighing ``log(K' / K)``;
    every soft value follows :meth:`Forest.sweep_value`; the cost is what a counting denoiser sees (the wide levels
    cost ``K'`` NFE per step)."""
    sig = sd.sigmas.karras(10, 0.02, 20.0)
    K, K2, s_w, den = 2, 6, 3.0, Counting(MIX2)
    res = tree_search(den, Quadratic.around([1.0, 2.0], [1.0, 0.0]), _noise(2, K, 2), sig, alpha=0.5, particles=K,
                      nfe=100, generator=5, expand="sweep", lookahead=0.7, split_sigma=1.0, widen=(s_w, K2))
    f, n_steps = res.extras["tree"], len(sig) - 1
    assert res.nfe * 2 == den.rows
    widths = [K if j == 0 or float(s) > s_w else K2 for j, s in enumerate(sig)]
    assert sweep_widths(f.config) == widths and K < widths[-1]
    w = widths.index(K2)  # the first wide level's step
    for g in range(2):
        per_step = [sum(1 for n in range(1, f.size(g)) if f.step[g][n] == j) for j in range(n_steps + 1)]
        # one sweep from the root, the others from a node at a step b of the window (their levels: steps b + 1 ..)
        starts = [f.step[g][c] for n in range(1, f.size(g)) for c in f.children[g][n]
                  if f.step[g][n] < n_steps and f.log_mu[g][c] == math.log(widths[f.step[g][c]])
                  and f.step[g][c] > w]
        assert f.rollouts[g] == K2 * (1 + len(starts) // K2) and len(starts) % K2 == 0
        for j in range(n_steps + 1):
            assert per_step[j] == widths[j] + sum(K2 for s in starts[::K2] if s <= j)
        assert f.nfe[g] == sum(widths[:n_steps]) + sum(sum(widths[s:n_steps]) for s in starts[::K2])
        for n in range(1, f.size(g)):
            if f.step[g][n] == w - 1:
                assert len(f.children[g][n]) == K2 // K
                assert all(f.log_mu[g][c] == pytest.approx(math.log(K2 / K), abs=1e-12) for c in f.children[g][n])
            if f.children[g][n]:
                assert math.isclose(f.value[g][n], f.sweep_value(g, n), rel_tol=1e-12)
    assert res.nfe <= 100 and res.extras["rollouts"].min() > K2


@pytest.mark.parametrize("temper", [{}, {"lookahead_ramp": (1.0, 1.0), "lookahead_every": 3},
                                    {"widen": (2.0, 7)}, {"widen": ((2.0, 7), (0.3, 3))}])
def test_sweep_trees_estimate_the_chains_tilt_without_bias(temper):
    """The sweep tree's unnormalised measure ``exp(v(root) / alpha) * q(t)`` (``q``: the output's law) is unbiased
    for ``E_p[exp(r / alpha) f]``, the property that makes its output consistent: over 1000 trees at alpha = 1 on
    the 1-D mixture, its mean total and positive-mode mass equal those of 16000 plain chains of the same 20-step
    chain within four standard errors. Without the ``1 / mu`` weights (a uniform mean over children, as in the
    other expansions) the same trees are off by far more. The same with the look-ahead tempered
    (``lookahead_ramp``: ``lambda = min(1, 1 / sigma)``) and computed at every third step only
    (``lookahead_every=3``), and with the sweeps widened from 4 to 7 chains at sigma <= 2 (``widen``; 7 is not a
    multiple of 4, so the widening step's systematic resampling gives some chains one child and some two), and
    widened then narrowed to 3 chains at sigma <= 0.3: the counts still depend on each level's states only."""
    sig = sd.sigmas.karras(20, 0.01, 40.0)
    x = best_of_n(MIX1, Linear([1.0]), _noise(16000, 1, seed=99), sig, particles=1, generator=0).samples.flatten()
    w = x.exp()
    z_ref, zp_ref, se_ref = float(w.mean()), float((w * (x > 0)).mean()), float(w.std() / len(w) ** 0.5)
    G = 1000
    res = tree_search(MIX1, Linear([1.0]), _noise(G, 4), sig, alpha=1.0, particles=4, nfe=160, generator=1,
                      expand="sweep", lookahead=1.0, **temper)
    z = res.log_evidence.exp()
    zp = z * (res.log_weights.exp() * torch.nan_to_num((res.particles_final.view(G, -1) > 0).double(), 0.0)).sum(1)
    for est, ref in ((z, z_ref), (zp, zp_ref)):
        se = (float(est.std()) ** 2 / G + se_ref**2) ** 0.5
        assert abs(float(est.mean()) - ref) < 4 * se, (float(est.mean()), ref, se)
    f = res.extras["tree"]
    plain = []
    for g in range(G):
        v = [0.0] * f.size(g)
        for n in reversed(range(f.size(g))):
            kids = f.children[g][n]
            v[n] = (math.exp(f.reward[g][n]) if f.step[g][n] == f.steps
                    else sum(v[c] for c in kids) / len(kids) if kids else 0.0)
        plain.append(v[0])
    assert abs(sum(plain) / G - z_ref) > 10 * float(z.std()) / G**0.5


@pytest.mark.parametrize("temper", [{}, {"lookahead_ramp": 1.0, "lookahead_every": 2}, {"widen": (1.0, 5)}])
def test_sweeps_resume_bit_for_bit(tmp_path, temper):
    sig = sd.sigmas.karras(9, 0.02, 20.0)
    kw = dict(alpha=0.5, particles=3, generator=8, expand="sweep", lookahead=1.0, split_sigma=(0.05, 5.0), **temper)
    noise, r = _noise(2, 3, 2), Quadratic.around([1.0, 2.0], [1.0, 0.0])
    full = tree_search(MIX2, r, noise, sig, nfe=100, **kw)
    ck = tmp_path / "sweep.safetensors"
    tree_search(MIX2, r, noise, sig, nfe=40, checkpoint=ck, **kw)
    resumed = tree_search(MIX2, r, noise, sig, nfe=100, resume=ck, **kw)
    for name in ("samples", "rewards", "log_weights", "particles_final", "log_evidence"):
        assert _same(getattr(full, name), getattr(resumed, name)), name
    assert resumed.reward_evals == full.reward_evals and full.extras["rollouts"].min() > 3
    if temper:  # a tree grown with a ramp / widening refuses to resume without it (the settings are checked by name)
        name = next(iter(temper))
        with pytest.raises(ValueError, match=name):
            tree_search(MIX2, r, noise, sig, nfe=120, resume=ck, **{**kw, name: None})


def _tilt_case(alpha, mult, groups=400, **kw):
    sig = sd.sigmas.karras(20, 0.01, 40.0)
    res = tree_search(MIX1, Linear([1.0]), _noise(groups, 4), sig, alpha=alpha, particles=4, nfe=20 * 4 * mult,
                      generator=1, **kw)
    return res.samples.flatten()


def test_dts_without_a_reward_samples_the_model_chain():
    """With a constant reward every soft value is equal and the output descent picks children uniformly: its
    samples follow the model's chain (children are chain steps), here the mixture's two modes 50 / 50 (the
    20-step chain's mode weights are exact; a binomial bound on 400 samples)."""
    sig = sd.sigmas.karras(20, 0.01, 40.0)
    res = tree_search(MIX1, lambda x: torch.zeros(x.shape[0], dtype=x.dtype), _noise(300, 4), sig, alpha=1.0,
                      particles=4, nfe=160, generator=1)
    frac = float((res.samples > 0).double().mean())
    assert abs(frac - 0.5) < 4 * (0.25 / 300) ** 0.5


def test_dts_tilts_toward_the_exact_tilted_mixture():
    """DTS's samples lie on the tilted side: the mode weight of the exact tilt (tilt_linear) is 0.73 at alpha = 4;
    the untilted chain's is 0.5. DTS's weight exceeds the chain's by more than four binomial standard errors."""
    exact = MIX1.tilt_linear(torch.tensor([1.0]), 4.0)
    assert abs(float(exact.weights[1]) - 0.731) < 0.01
    frac = float((_tilt_case(4.0, 2, groups=300) > 0).double().mean())
    assert frac - 0.5 > 4 * (0.25 / 300) ** 0.5


def _tilt_law(alpha, mult, groups=400, **kw) -> tuple[float, float]:
    """The output's probability of the positive mode given each tree (``log_weights`` is the probability that the
    output picks each terminal), averaged over the trees, and its standard error: the output law without the
    noise of the output draws."""
    sig = sd.sigmas.karras(20, 0.01, 40.0)
    res = tree_search(MIX1, Linear([1.0]), _noise(groups, 4), sig, alpha=alpha, particles=4, nfe=20 * 4 * mult,
                      generator=1, **kw)
    cand = res.particles_final.view(groups, -1)
    plus = (res.log_weights.exp() * (cand > 0)).sum(1)
    return float(plus.mean()), float(plus.std() / groups**0.5)


def _chain_tilt(alpha, n=16000) -> tuple[float, float]:
    """The mode weight of the 20-step chain's own terminal law tilted by ``exp(x / alpha)`` (importance weights on
    ``n`` plain chains from best-of-N's sampler; the chain's modes sit at +-1.89, not +-2), and a delta-method SE."""
    x = best_of_n(MIX1, Linear([1.0]), _noise(n, 1, seed=99), sd.sigmas.karras(20, 0.01, 40.0), particles=1,
                  generator=0).samples.flatten()
    w = torch.exp(x / alpha)
    p = float((w * (x > 0)).sum() / w.sum())
    return p, float(((w / w.mean()) ** 2 * ((x > 0).double() - p) ** 2).mean() ** 0.5 / n**0.5)


@pytest.mark.slow
def test_dts_reaches_the_tilted_law_as_the_budget_grows():
    """The default DTS (rollouts allocated blind to the values; ``tests/align/test_tree_exact.py`` shows why) at
    alpha = 1. At 1x the root's chains the output is a 4-particle importance resampling (0.92); at 16x its output
    law is the chain's own tilt within three standard errors (measured 0.976 vs 0.977; the mixture's exact tilt
    0.982 is 0.005 away, the 20-step chain's discretisation), and above the 1x law by more than four."""
    exact = float(MIX1.tilt_linear(torch.tensor([1.0]), 1.0).weights[1])
    chain, chain_se = _chain_tilt(1.0)
    assert abs(chain - exact) < 0.01
    (one, one_se), (many, many_se) = _tilt_law(1.0, 1), _tilt_law(1.0, 16)
    assert abs(many - chain) < 3 * (many_se**2 + chain_se**2) ** 0.5, (many, many_se, chain, chain_se)
    assert many > one + 4 * (one_se**2 + many_se**2) ** 0.5, (one, many)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="the paper's Boltzmann selection (select_temperature=1) under-tilts at every "
                   "budget we can run: output law 0.921, 0.919, 0.919 at 1x, 4x, 16x vs the chain's tilt 0.977 "
                   "(alpha = 1); the exact 2-step computation in test_tree_exact.py shows why; see tree_search.md")
def test_the_papers_selection_approaches_the_tilted_law():
    chain, chain_se = _chain_tilt(1.0)
    law, se = _tilt_law(1.0, 16, select_temperature=1.0)
    assert abs(law - chain) < 3 * (se**2 + chain_se**2) ** 0.5, (law, chain)


@pytest.mark.slow
def test_reweighted_output_is_closer_to_the_tilt_than_the_descent():
    """With the paper's selection, at alpha = 1 and 16x the root's chains, the same trees' reweighted output law
    (``reweight=True``) is closer to the chain's tilt (0.977) than the paper's descent by more than 4 standard
    errors (neither reaches it, see tree_search.md)."""
    chain, _ = _chain_tilt(1.0)
    (rw, rw_se), (desc, desc_se) = (_tilt_law(1.0, 16, reweight=r, select_temperature=1.0) for r in (True, False))
    assert abs(rw - chain) < abs(desc - chain) - 4 * (rw_se**2 + desc_se**2) ** 0.5, (rw, desc, chain)


@pytest.mark.slow  # two processes start (about 25 s on a loaded 2-core machine)
def test_sharded_over_two_processes_equals_one_process(run_ranks, tmp_path):
    """Whole trees (groups) per rank over gloo: every output field equals the one-process run bit for bit, for the
    default open expansion, splitting and sweeps with the look-ahead, plain and widened (``widen``; each grown past
    its root's chains), and a
    rank's checkpoint resumes to the same result."""
    import json
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("tree_shard_worker.py")
    ranks = run_ranks([sys.executable, str(worker), str(tmp_path)], world=2, timeout=120, fresh=tmp_path)
    for r in ranks:
        assert r.returncode == 0, f"rank {r.rank} failed:\n{r.stderr[-3000:]}"
    for rank in range(2):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for case in ("open", "split", "sweep", "sweep_widen"):
            assert out[case]["equal"] and all(out[case]["equal"].values()), (case, out[case])
            assert out[case]["checkpoint"], case
            assert out[case]["min_rollouts"] > out[case]["particles"], (case, out[case])


@pytest.mark.slow
def test_value_blind_selection_reaches_the_tilted_law():
    """With the rollouts allocated blind to the values (``select_temperature=inf``) the output descent (a nested
    importance resampling over the tree) matches the exact tilt's mode weight within three binomial standard
    errors at 4x and 16x the root's chains, where the paper's selection under-tilts (the xfail above)."""
    exact = float(MIX1.tilt_linear(torch.tensor([1.0]), 4.0).weights[1])
    for mult in (4, 16):
        frac = float((_tilt_case(4.0, mult, select_temperature=math.inf, reweight=False) > 0).double().mean())
        assert abs(frac - exact) < 3 * (exact * (1 - exact) / 400) ** 0.5, (mult, frac, exact)


@pytest.mark.slow
def test_splitting_with_look_ahead_reaches_the_tilted_law():
    """``expand="split"`` with the look-ahead at alpha = 1: its unnormalised measure is exact in expectation
    (``test_tree_exact.py``); its output, a self-normalised resampling, carries an ``O(1 / rollouts)`` bias. At 16x
    the root's chains the output law is within 0.005 of the chain's own tilt (the size of the 20-step chain's own
    departure from the mixture's tilt; measured 0.975 vs 0.978, the default 0.976) and far above the 1x law (the
    4-particle importance resampling, 0.92)."""
    chain, _ = _chain_tilt(1.0)
    (one, one_se), (law, se) = _tilt_law(1.0, 1), _tilt_law(1.0, 16, expand="split", lookahead=1.0)
    assert abs(law - chain) < 0.005, (law, se, chain)
    assert law > one + 4 * (one_se**2 + se**2) ** 0.5, (one, law)


def test_command_line_runs_and_resumes_a_tree(tmp_path):
    """``steerdiff align --method tree_search`` takes its options from the signature (nfe, mode, checkpoint,
    resume ...): a checkpointed run continues from its file with a larger budget."""
    import json

    import click
    from click.testing import CliRunner

    from steerdiff.app.cli.align import align_cmd

    @click.group()
    def cli():
        pass

    cli.add_command(align_cmd)
    base = ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "1", "--method", "tree_search",
            "--particles", "2", "--n", "4", "--steps", "6", "--no-progress"]
    ck = tmp_path / "tree.safetensors"
    r = CliRunner().invoke(cli, base + ["--nfe", "24", "--checkpoint", str(ck), "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, base + ["--nfe", "48", "--resume", str(ck), "--mode", "dts_star", "--out",
                                        str(tmp_path / "b")])
    assert r.exit_code != 0 and "mode" in r.output  # a tree grown by DTS is not continued as DTS*
    r = CliRunner().invoke(cli, base + ["--nfe", "48", "--resume", str(ck), "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, base + ["--nfe", "30", "--expand", "sweep", "--lookahead", "1", "--split-sigma", "5",
                                        "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "c" / "metrics.json").read_text())["nfe"] <= 30
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("a", "b"))
    assert a["nfe"] <= 24 < b["nfe"] <= 48
