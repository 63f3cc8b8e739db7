"""Steering discrete diffusion against exact answers: CFG on logits (closed form for one position, enumeration over
orders for a sequence), SMC to the exact reward-tilted table, best-of-N to its order-statistic law."""

import itertools

import pytest
import torch

import steerdiff.discrete as dd

L, K = 4, 3


def _guided_law_by_orders(pc, pu, w):
    """The law of one-token-per-step unmasking with per-position CFG: the average over the L! reveal orders of the
    product of guided conditionals, each conditional ``p(x_l | x_R)`` read from the tables by summation."""
    seqs = dd.all_sequences(L, K)
    out = torch.zeros(len(seqs), dtype=torch.float64)

    cache = {}

    def cond(tab, x, l, revealed):
        key = (id(tab), l, revealed, tuple(int(x[r]) for r in revealed))
        if key in cache:
            return cache[key]
        agree = torch.ones(len(seqs), dtype=torch.bool)
        for r in revealed:
            agree &= seqs[:, r] == x[r]
        probs = torch.stack([tab[agree & (seqs[:, l] == v)].sum() for v in range(K)])
        cache[key] = probs / probs.sum()
        return cache[key]

    orders = list(itertools.permutations(range(L)))
    for n, x in enumerate(seqs):
        total = 0.0
        for order in orders:
            p = 1.0
            for k, l in enumerate(order):
                g = cond(pc, x, l, order[:k]) ** w * cond(pu, x, l, order[:k]) ** (1 - w)
                p *= float(g[x[l]] / g.sum())
            total += p
        out[n] = total / len(orders)
    return out


def test_cfg_on_one_position_is_the_geometric_tilt():
    k = 6
    tab = dd.random_table(1, k, labels=3, seed=2)
    proc = dd.make_process("absorbing", k, schedule="linear")
    model = dd.TableModel(tab, 1, proc)
    n = 12000
    for w in (0.0, 1.0, 2.5):
        x, stats = dd.sample(model, proc, 1, shape=(n, 1), method="unmask", cond=torch.full((n,), 1),
                             guidance=dd.CFG(w), generator=torch.Generator().manual_seed(3), return_stats=True)
        exact = tab[1] ** w * model.marginal ** (1 - w)
        exact = exact / exact.sum()
        assert dd.total_variation(dd.empirical(x, k), exact) < dd.tv_floor(exact, n, 0.999)
        assert stats.nfe == (2 if w not in (0.0, 1.0) else 1)


def test_cfg_on_a_sequence_matches_the_enumerated_law():
    tab = dd.random_table(L, K, labels=2, seed=4)
    proc = dd.make_process("absorbing", K, schedule="linear")
    model = dd.TableModel(tab, L, proc)
    w, n = 2.0, 12000
    exact = _guided_law_by_orders(tab[0], model.marginal, w)
    x = dd.sample(model, proc, L, shape=(n, L), method="unmask", cond=torch.zeros(n, dtype=torch.long),
                  guidance=dd.CFG(w), generator=torch.Generator().manual_seed(5))
    got = dd.empirical(x, K)
    assert dd.total_variation(got, exact) < dd.tv_floor(exact, n, 0.999)
    # Control: the guided law differs from both the conditional table and the naive joint tilt p_c^w p^(1-w).
    joint = tab[0] ** w * model.marginal ** (1 - w)
    assert dd.total_variation(got, tab[0]) > 0.05
    assert dd.total_variation(exact, joint / joint.sum()) > 0.01
    with pytest.raises(ValueError, match="scale"):
        dd.CFG(-1.0)


def _reward(x):
    return (x == 2).sum(-1).double()


@pytest.mark.parametrize("potential", ["difference", "max"])
def test_smc_reaches_the_exact_tilted_table(potential):
    tab = dd.random_table(L, K, seed=1)
    proc = dd.make_process("absorbing", K, schedule="linear")
    model = dd.TableModel(tab, L, proc)
    alpha = 1.0
    tilt = tab * torch.exp(_reward(dd.all_sequences(L, K)) / alpha)
    tilt = tilt / tilt.sum()
    res = dd.smc(model, proc, _reward, length=L, steps=L, alpha=alpha, num_samples=256, particles=32,
                 potential=potential, generator=0)
    w = res.weights()
    tv = dd.total_variation(dd.empirical(res.samples, K, w), tilt)
    kish = int(1 / float((w ** 2).sum()))  # effective size of the pooled weights
    assert tv < 1.5 * dd.tv_floor(tilt, kish, 0.99)
    assert tv < 0.2 * dd.total_variation(tab, tilt)
    assert res.nfe == 32 * L and res.ess.shape == (L + 1, 256)
    torch.testing.assert_close(res.log_evidence.exp().mean(),  # E_p[exp(r/alpha)], unbiased
                               (tab * torch.exp(_reward(dd.all_sequences(L, K)) / alpha)).sum(), rtol=0.05, atol=0)


def test_best_of_n_follows_the_order_statistic_law():
    tab = dd.random_table(L, K, seed=1)
    proc = dd.make_process("absorbing", K, schedule="linear")
    model = dd.TableModel(tab, L, proc)
    r = _reward(dd.all_sequences(L, K))
    n, m = 4, 12000
    exact = torch.zeros_like(tab)  # P(best = x) = p(x) / p(r = r(x)) * (F(r)^n - F(r-)^n); ties by first draw
    for level in torch.unique(r):
        same = r == level
        exact[same] = tab[same] / tab[same].sum() * (tab[r <= level].sum() ** n - tab[r < level].sum() ** n)
    res = dd.best_of_n(model, proc, _reward, length=L, steps=L, n=n, num_samples=m, method="unmask",
                       generator=torch.Generator().manual_seed(6))
    assert dd.total_variation(dd.empirical(res.samples, K), exact) < dd.tv_floor(exact, m, 0.999)
    assert res.nfe == n * L
    torch.testing.assert_close(res.rewards, _reward(res.samples))


@pytest.mark.slow  # two processes start (about 28 s on a loaded 2-core machine)
def test_smc_sharded_over_two_processes_equals_one_process(run_ranks, tmp_path):
    """Whole groups per rank over gloo (with CFG and labels): every field equals the one-process run bit for bit."""
    import json
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("smc_shard_worker.py")
    ranks = run_ranks([sys.executable, str(worker), str(tmp_path)], world=2, timeout=120, fresh=tmp_path)
    for r in ranks:
        assert r.returncode == 0, f"rank {r.rank} failed:\n{r.stderr[-3000:]}"
    for rank in range(2):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert all(out["equal"].values()), out
