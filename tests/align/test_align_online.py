"""Online black-box optimisation (O1 of the validation protocol, ``docs/methods/das.md``) and the LinUCB surrogate."""

import torch

import steerdiff as sd
from steerdiff.align import LinUCBSurrogate, das, online_das
from steerdiff.align.online import quadratic_features
from steerdiff.app.protocols.das import IsotropicMixture, evaluate, p1, validation_sigmas


def test_surrogate_fits_a_quadratic_and_its_bonus_shrinks():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g, dtype=torch.float64) * 3
    truth = p1().reward
    s = LinUCBSurrogate(quadratic_features, ridge=1e-3, bonus=0.1).fit(x[:20], truth(x[:20]))
    probe = torch.randn(10, 2, generator=g, dtype=torch.float64)
    torch.testing.assert_close(s.mean(probe), truth(probe), atol=1e-3, rtol=0)
    u20 = s.uncertainty(probe)
    s.fit(x, truth(x))
    assert (s.uncertainty(probe) < u20).all()
    # Differentiable (DAS uses its gradient) and optimistic.
    v = probe.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(s(v).sum(), v)
    assert torch.isfinite(grad).all() and (s(probe) >= s.mean(probe)).all()


def test_o1_online_das_on_p1():
    """O1: P1 with r hidden; 8 rounds x 16 queries (round 1: the plain model); DAS (P = 16) on ridge + LinUCB.
    Pass: round 8's sampler has E[r] relerr <= 0.25 (measured on 256 draws of it) and improves on round 1."""
    prob = p1()
    den, sig = IsotropicMixture(prob.mixture), validation_sigmas(100)
    calls = {"n": 0, "grad": False}

    def oracle(x):  # a black box: never differentiated
        calls["n"] += x.shape[0]
        calls["grad"] |= x.requires_grad
        return prob.reward(x).numpy()

    out = online_das(den, oracle, sig, (2,), alpha=prob.alpha, rounds=8, queries=16, particles=16, seed=0,
                     dtype=torch.float64, batch_size=None)
    assert calls["n"] == 8 * 16 and not calls["grad"] and len(out.round_surrogates) == 8
    res = das(den, out.round_surrogates[-1], sd.randn((256 * 16, 2), seeds=99, dtype=torch.float64), sig,
              alpha=prob.alpha, particles=16, generator=5, batch_size=None)
    ev = evaluate(prob, res.samples)
    mean = out.mean_rewards
    assert ev["relerr"] <= 0.25, ev
    assert ev["mean_reward"] > mean[0] and mean[-1] > mean[0], (ev, mean)
