"""Verifiers (``steerdiff.align.verifiers``): the interface over the existing rewards (same results, bit for bit),
micro-batching and cost counters, the weighted and Pareto composites (non-dominated sorting against a brute-force
definition), and the verifier's seconds reported by every aligner (``AlignResult.verifier_time``, ``cost_axes``)."""

import itertools
import time

import pytest
import torch

import steerdiff as sd
from steerdiff.align import AlignResult, ParetoVerifier, Verifier, WeightedVerifier, as_verifier
from steerdiff.align.rewards import Quadratic, WeightedSum, ink, symmetry
from steerdiff.align.verifiers import crowding_distance, non_dominated_ranks, pareto_scores
from steerdiff.app.protocols.das import PROBLEMS, IsotropicMixture, validation_sigmas


def test_as_verifier_adapts_any_reward_and_keeps_a_verifier():
    q = Quadratic([1.0, 2.0])
    v = as_verifier(q)
    x = torch.randn(7, 2, dtype=torch.float64)
    assert isinstance(v, Verifier) and v.differentiable and torch.equal(v(x), q(x))
    assert as_verifier(v) is v
    assert as_verifier(ink).name == "ink" and as_verifier(q, name="q").name == "q"
    w = as_verifier([(0.5, ink), (2.0, symmetry)])
    img = torch.rand(5, 1, 4, 4) * 2 - 1
    assert isinstance(w, WeightedVerifier)
    torch.testing.assert_close(w(img), WeightedSum([(0.5, ink), (2.0, symmetry)])(img))
    assert w.components(img).shape == (2, 5)
    with pytest.raises(TypeError, match="reward must be callable"):
        as_verifier(3)


def test_micro_batches_counters_and_gradients():
    q = Quadratic([1.0, 3.0])
    x = torch.randn(10, 2, dtype=torch.float64, requires_grad=True)
    v = as_verifier(q, batch_size=3, device="cpu")
    out = v(x)
    assert torch.equal(out, q(x)) and v.calls == 4 and v.rows == 10 and v.seconds > 0
    (g,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(g, -(x * torch.tensor([1.0, 3.0], dtype=torch.float64)))
    v.reset_cost()
    assert v.cost() == {"calls": 0, "rows": 0, "seconds": 0.0}
    with pytest.raises(ValueError, match="batch_size"):
        as_verifier(q, batch_size=0)
    with pytest.raises(ValueError, match=r"must return scores of shape \[B\]"):
        as_verifier(lambda z: z)(x)


def test_inputs_go_to_the_verifier_device_and_scores_come_back():
    seen = []

    class Probe(Verifier):
        def score(self, x):
            seen.append((x.device, x.dtype))
            return x.flatten(1).sum(1)

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(4, 3)
    out = Probe(device=dev)(x)
    assert seen == [(torch.device(dev, 0) if dev == "cuda" else torch.device("cpu"), torch.float32)]
    assert out.device == x.device


def _brute_ranks(v):
    """Front index by the definition: peel the points no remaining point dominates."""
    n = v.shape[1]
    left, rank, front = set(range(n)), [None] * n, 0
    while left:
        now = [i for i in left if not any(all(v[:, j] >= v[:, i]) and any(v[:, j] > v[:, i]) for j in left)]
        for i in now:
            rank[i] = front
        left -= set(now)
        front += 1
    return rank


def test_non_dominated_sorting_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    for m, n in itertools.product((2, 3), (1, 5, 17)):
        v = torch.randint(0, 4, (m, n), generator=g).double()  # ties included
        assert non_dominated_ranks(v).tolist() == _brute_ranks(v)


def test_pareto_scores_order_by_front_then_crowding():
    v = torch.tensor([[0.0, 1.0, 2.0, 3.0, 0.5, 1.0], [3.0, 2.0, 1.0, 0.0, 0.5, 0.5]])
    rank = non_dominated_ranks(v)
    assert rank.tolist() == [0, 0, 0, 0, 2, 1]
    c = crowding_distance(v, rank)
    assert torch.isinf(c[[0, 3]]).all() and torch.isfinite(c[[1, 2]]).all()
    s = pareto_scores(v)
    assert s[:4].min() > s[5] > s[4]
    assert s[0] > s[1] and s[3] > s[2]  # extremes of a front before its interior points


def test_pareto_verifier_scalar_is_its_weighted_sum():
    q1, q2 = Quadratic([1.0, 0.0]), Quadratic([0.0, 1.0])
    p = ParetoVerifier([q1, q2], weights=[0.3, 0.7])
    x = torch.randn(6, 2, dtype=torch.float64)
    torch.testing.assert_close(p(x), 0.3 * q1(x) + 0.7 * q2(x))
    torch.testing.assert_close(p.components(x), torch.stack([q1(x), q2(x)]))
    assert p.rank(x).shape == (6,)
    with pytest.raises(ValueError, match="at least two"):
        ParetoVerifier([q1])


def _slow(reward, pause=2e-3):
    def r(x):
        time.sleep(pause)
        return reward(x)

    return r


@pytest.mark.parametrize("method,options", [("das", dict(alpha=1.0)), ("das", dict(alpha=1.0, gradient=True)),
                                            ("best_of_n", {}), ("fk", dict(alpha=1.0)),
                                            ("noise_search", dict(rounds=2, generator=0)), ("sir", dict(alpha=1.0)),
                                            ("tds", dict(alpha=1.0)), ("tree_search", dict(alpha=1.0, nfe=40))])
def test_every_aligner_reports_the_verifier_seconds(method, options):
    pr = PROBLEMS["P1"]()
    den, sig = IsotropicMixture(pr.mixture), validation_sigmas(5)
    noise = sd.randn((8, 2), seeds=0, dtype=torch.float64)
    plain = sd.align.run(method, den, pr.reward, noise, sig, particles=4, **{"generator": 1, **options})
    v = as_verifier(_slow(pr.reward))
    res = sd.align.run(method, den, v, noise, sig, particles=4, **{"generator": 1, **options})
    assert torch.equal(res.samples, plain.samples)  # a verifier is a reward: the same run
    assert res.verifier_time >= v.calls * 2e-3 * 0.9 and res.verifier_time <= res.model_time <= res.wall_time
    assert 0 <= res.denoiser_time < res.model_time
    axes = res.cost_axes(c_b=2.0)
    assert axes["nfe"] == res.nfe and axes["nfe_vjp"] == res.nfe + 2.0 * res.nfe_grad
    assert axes["wall_time"] == res.wall_time and axes["verifier_time"] == res.verifier_time
    assert res.summary()["verifier_time_s"] == res.verifier_time


def test_result_defaults_to_no_verifier_time():
    r = AlignResult(samples=torch.zeros(1, 2), rewards=torch.zeros(1), method="x", groups=1, particles=1, nfe=3,
                    nfe_grad=1, reward_evals=1)
    assert r.verifier_time == 0.0 and r.cost_axes(1.0)["nfe_vjp"] == 4
