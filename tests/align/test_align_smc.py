"""The SMC core: log-weights, ESS, the five resamplers (U4 of the validation protocol, ``docs/methods/das.md``) and
the step functions (reweight, ancestors, reindex, propose) against hand computations."""

import math

import pytest
import torch

from steerdiff.align.run_setup import CALLBACK_KEYS
from steerdiff.align.smc import (
    RESAMPLERS,
    SMCState,
    ancestors,
    ess,
    group_uniforms,
    normalize,
    propose,
    reindex,
    resample,
    resample_groups,
    reweight,
    select_groups,
    twist_shift,
)


def test_normalize_and_ess():
    logw = torch.tensor([[0.0, math.log(3.0), -math.inf, 1000.0]], dtype=torch.float64)
    ln = normalize(logw)
    assert torch.isfinite(ln[0, [0, 1, 3]]).all() and torch.isneginf(ln[0, 2])
    torch.testing.assert_close(ln.exp().sum(1), torch.ones(1, dtype=torch.float64))
    assert abs(float(ess(ln)) - 1.0) < 1e-9  # one particle holds all the weight
    assert abs(float(ess(normalize(torch.zeros(2, 8, dtype=torch.float64)))[0]) - 8) < 1e-12
    w = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert abs(float(ess(w.log())) - 1 / (w**2).sum()) < 1e-12


@pytest.mark.parametrize("scheme", RESAMPLERS)
def test_u4_offspring_counts(scheme):
    """U4: over 10^4 draws the mean offspring count of j is P W_j (within 3 s.e.); SSP and systematic give
    floor(P W_j) or floor(P W_j) + 1 offspring."""
    P, n = 8, 10_000
    w = torch.tensor([0.31, 0.02, 0.17, 0.005, 0.2, 0.115, 0.08, 0.1], dtype=torch.float64)
    u = torch.rand(n, P, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    anc = resample(w.expand(n, P), u, scheme)
    assert anc.shape == (n, P) and int(anc.min()) >= 0 and int(anc.max()) < P
    counts = torch.zeros(n, P, dtype=torch.float64).scatter_add_(1, anc, torch.ones(n, P, dtype=torch.float64))
    mean, se = counts.mean(0), counts.std(0) / math.sqrt(n)
    assert ((mean - P * w).abs() <= 3 * se + 1e-9).all(), (scheme, mean, P * w)
    floor = (P * w).floor()
    if scheme in ("ssp", "systematic"):
        assert ((counts == floor) | (counts == floor + 1)).all()
    if scheme == "residual":
        assert (counts >= floor).all()


def test_resampling_is_exact_for_degenerate_and_uniform_weights():
    P = 6
    one_hot = torch.zeros(3, P, dtype=torch.float64)
    one_hot[:, 4] = 1.0
    uniform = torch.full((3, P), 1 / P, dtype=torch.float64)
    u = torch.rand(3, P, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for scheme in RESAMPLERS:
        assert (resample(one_hot, u, scheme) == 4).all()
        if scheme in ("ssp", "systematic", "residual"):
            assert (resample(uniform, u, scheme).sort(1).values == torch.arange(P)).all()
    with pytest.raises(ValueError, match="resampler"):
        resample(uniform, u, "bogus")


def test_group_uniforms_come_from_each_groups_generator():
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    u = group_uniforms(gens, torch.tensor([2, 0]), 4)
    ref = torch.stack([torch.rand(4, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in (3, 1)])
    torch.testing.assert_close(u, ref)


def test_reweight_matches_a_hand_computation():
    """New weights W_j e^{inc_j} / sum, evidence increment log sum_j W_j e^{inc_j}, ESS 1 / sum W^2."""
    w = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]], dtype=torch.float64)
    inc = torch.tensor([[math.log(2.0), 0.0, math.log(4.0)], [1.0, math.nan, -2.0]], dtype=torch.float64)
    bad = torch.tensor([[False, False, False], [False, False, True]])
    out = reweight(w.log(), inc, bad)
    z0 = 0.5 * 2 + 0.25 * 1 + 0.25 * 4
    new0 = torch.tensor([1.0, 0.25, 1.0], dtype=torch.float64) / z0
    torch.testing.assert_close(out.log_weights[0].exp(), new0, rtol=1e-14, atol=0)
    torch.testing.assert_close(out.log_norm[0], torch.tensor(math.log(z0), dtype=torch.float64))
    torch.testing.assert_close(out.ess[0], 1 / (new0**2).sum())
    # Group 1: the NaN increment and the flagged particle are killed; only particle 0 survives.
    assert out.killed[1].tolist() == [False, True, True] and out.killed[0].sum() == 0
    assert torch.isneginf(out.log_weights[1, 1:]).all() and float(out.log_weights[1, 0]) == 0.0
    torch.testing.assert_close(out.log_norm[1], torch.tensor(math.log(0.2) + 1.0, dtype=torch.float64))
    assert not out.dead.any()
    assert reweight(w.log(), torch.full_like(w, -math.inf)).dead.all()


def test_ancestors_reproduce_offspring_counts_and_leave_other_groups_alone():
    """``ancestors`` is a pure map (log-weights, uniforms) -> indices: the resampled rows equal ``resample`` on the
    same uniforms (sorted, with floor(P W) or floor(P W) + 1 copies for SSP), the other rows are the identity."""
    P = 8
    w = torch.tensor([0.31, 0.02, 0.17, 0.005, 0.2, 0.115, 0.08, 0.1], dtype=torch.float64)
    logw = torch.stack([w.log(), torch.full((P,), -math.log(P), dtype=torch.float64), w.flip(0).log()])
    groups = torch.tensor([0, 2])
    u = torch.rand(2, P, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    anc = ancestors(logw, groups, u, "ssp")
    assert anc[1].tolist() == list(range(P))
    torch.testing.assert_close(anc[groups], resample(logw[groups].exp(), u, "ssp"))
    for g in (0, 2):
        counts = torch.bincount(anc[g], minlength=P).double()
        floor = (P * logw[g].exp()).floor()
        assert ((counts == floor) | (counts == floor + 1)).all() and int(counts.sum()) == P
        assert (anc[g].diff() >= 0).all()  # each ancestor's copies are adjacent


def test_select_groups():
    e = torch.tensor([8.0, 3.9, 4.0, 7.0])
    killed = torch.zeros(4, 8, dtype=torch.bool)
    killed[3, 5] = True
    assert select_groups(e, killed, 0.5).tolist() == [False, True, False, True]
    assert select_groups(e, killed, 1.0).all()


def _state(G=2, P=4, d=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(G * P, d, generator=g, dtype=torch.float64)
    st = SMCState.start(x, torch.arange(G * P), G, P, steps=5)
    st.denoised, st.grad = x + 1, x * 2
    st.reward = torch.randn(G, P, generator=g, dtype=torch.float64)
    st.log_twist = torch.randn(G, P, generator=g, dtype=torch.float64)
    st.log_proposal = torch.randn(G, P, generator=g, dtype=torch.float64)
    return st


def test_reindex_moves_every_per_particle_quantity_with_its_particle():
    st = _state()
    before = {k: getattr(st, k).clone() for k in ("x", "cond", "denoised", "grad", "reward", "log_twist",
                                                  "log_proposal", "log_weights")}
    anc = torch.tensor([[3, 3, 0, 1], [0, 2, 2, 2]])
    reindex(st, anc)
    rows = torch.tensor([3, 3, 0, 1, 4, 6, 6, 6])
    for k in ("x", "cond", "denoised", "grad"):
        torch.testing.assert_close(getattr(st, k), before[k][rows])
    for k in ("reward", "log_twist"):
        torch.testing.assert_close(getattr(st, k).flatten(), before[k].flatten()[rows])
    # The proposal term was consumed by the weights already; the weights are the caller's.
    torch.testing.assert_close(st.log_proposal, before["log_proposal"])
    torch.testing.assert_close(st.log_weights, before["log_weights"])


def test_resample_groups_uses_each_groups_generator_and_resets_its_weights():
    st = _state(G=3)
    st.log_weights = normalize(torch.randn(3, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    old = st.log_weights.clone()
    x = st.x.clone()
    gens = [torch.Generator().manual_seed(s) for s in (11, 12, 13)]
    do = torch.tensor([True, False, True])
    anc = resample_groups(st, do, gens, "systematic")
    ref_u = torch.stack([torch.rand(4, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                         for s in (11, 13)])
    torch.testing.assert_close(anc[[0, 2]], resample(old[[0, 2]].exp(), ref_u, "systematic"))
    assert anc[1].tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(st.log_weights[[0, 2]], torch.full((2, 4), -math.log(4), dtype=torch.float64))
    torch.testing.assert_close(st.log_weights[1], old[1])
    torch.testing.assert_close(st.x, x[(anc + 4 * torch.arange(3)[:, None]).flatten()])
    assert resample_groups(st, torch.zeros(3, dtype=torch.bool), gens, "ssp") is None


class _Fixed:
    """A noise source returning preset draws (what SampleNoise gives one row at a time)."""

    def __init__(self, z):
        self.z, self.calls = z, 0

    def randn_like(self, x):
        self.calls += 1
        return self.z


def test_propose_log_ratio_is_the_difference_of_the_two_gaussian_log_densities():
    g = torch.Generator().manual_seed(2)
    x, d = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64)
    z, grad = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64)
    s, s1, alpha = 2.0, 1.2, 0.7
    lam = torch.tensor([0.3, 0.9], dtype=torch.float64)[[0, 0, 1, 1, 1]]
    x1, ratio = propose(x, d, s, s1, 1.0, _Fixed(z), lambda tau: tau**2 * lam[:, None] * grad / alpha)
    tau2 = s1**2 * (s**2 - s1**2) / s**2
    mu = d + (s1**2 / s**2) * (x - d)
    delta = tau2 * lam[:, None] * grad / alpha
    torch.testing.assert_close(x1, mu + delta + math.sqrt(tau2) * z)
    log_p = -((x1 - mu) ** 2).sum(1) / (2 * tau2)
    log_q = -((x1 - mu - delta) ** 2).sum(1) / (2 * tau2)
    torch.testing.assert_close(ratio, log_p - log_q, rtol=1e-10, atol=1e-12)
    # No shift: the plain kernel, no ratio; a step to sigma = 0 is x = D and draws no noise.
    plain, none = propose(x, d, s, s1, 1.0, _Fixed(z))
    torch.testing.assert_close(plain, mu + math.sqrt(tau2) * z)
    assert none is None
    src = _Fixed(z)
    last, none = propose(x, d, s, 0.0, 1.0, src, lambda tau: grad)
    assert last is d and none is None and src.calls == 0


def test_twist_shift_is_kappa_tau2_lambda_grad_over_alpha_per_group():
    grad = torch.ones(6, 2, dtype=torch.float64)
    delta = twist_shift(grad, torch.tensor([0.5, 1.0], dtype=torch.float64), alpha=0.25, kappa=2.0)(0.1)
    expected = torch.tensor([0.5] * 3 + [1.0] * 3, dtype=torch.float64)[:, None] * 2.0 * 0.01 / 0.25
    torch.testing.assert_close(delta, expected.expand(6, 2))


def test_every_sampler_calls_back_with_the_one_shape():
    import steerdiff as sd
    from steerdiff.align import best_of_n, das, reward_guidance, sir, tds
    from steerdiff.align.rewards import Linear
    from steerdiff.app.protocols.das import IsotropicMixture, validation_sigmas
    from steerdiff.models import GaussianMixture

    mix = IsotropicMixture(GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], 0.3))
    noise = sd.randn((8, 2), seeds=0, dtype=torch.float64)
    for fn, kw in ((das, {"alpha": 1.0}), (tds, {"alpha": 1.0}), (sir, {"alpha": 1.0}), (best_of_n, {}),
                   (reward_guidance, {"alpha": 1.0})):
        for sig in (validation_sigmas(5), sd.sigmas.karras(5, 0.002, 80.0)):
            seen = []
            fn(mix, Linear([1.0, 0.0]), noise, sig, particles=4, callback=seen.append, generator=0, **kw)
            assert [tuple(info) for info in seen] == [CALLBACK_KEYS] * (len(sig) - 1), fn.__name__
            assert [info["i"] for info in seen] == list(range(len(sig) - 1))
            if fn in (das, tds, reward_guidance):
                assert all(info["reward"].shape == (2, 4) for info in seen if info["reward"] is not None)
