"""RB-Modulation's SOC corrector (steerdiff.control.RBModulation; spec C.2, C.7 unit tests).

Independent truths: plain sampling itself (lam_style = 0 or M = 0 must reproduce it), Adam's first step (a step of
exactly ``lr`` per coordinate: ``m_hat / sqrt(v_hat) = sign(g)``), the Stable Cascade ``DDIMSampler`` update written in
VP coordinates (spec section 0), a backward hook on the denoiser, and batch independence.
"""

from __future__ import annotations

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.app.protocols.rbmod import BackwardCounter
from steerdiff.control import RBModulation, style_guidance
from steerdiff.control import rbm as rbm_module
from steerdiff.control.styles import reference_image
from steerdiff.core import SampleNoise, make_generators

SIGMAS = sd.sigmas.karras(20, 0.002, 40.0)


def _cond(n=20):
    return torch.arange(10).repeat_interleave(n // 10)


def _sample(model, corrector=None, n=20, method="ddim", sigmas=SIGMAS, **kw):
    return sd.sample(model, sd.randn((n, 1, 8, 8), seeds=0), sigmas, method=method, cond=_cond(n),
                     x0_corrector=corrector, generator=5, **kw)


@pytest.mark.parametrize("method", ["ddim", "ddpm", "heun"])
@pytest.mark.parametrize("params", [{"lam_style": 0.0, "lam_prox": 0.0}, {"lam_style": 0.0, "lam_prox": 1.0},
                                    {"M": 0}], ids=["lam0-prox0", "lam0-prox1", "M0"])
def test_off_is_plain_sampling(model, psi, ref, method, params):
    plain = _sample(model, method=method)
    out = _sample(model, RBModulation(psi, reference=ref, cost="squared", eta=0.2, **params), method=method)
    torch.testing.assert_close(out, plain, rtol=0, atol=1e-6)


_OVERSHOOT = ("measured: with the official re-entry (eps-hat from the uncorrected D) at eta = 0.2 Adam's fixed-size "
              "first steps overshoot on the late steps, whose loss is already small; the loss falls on 14 of 20 steps "
              "here (17 of 20 with 300 samples; 15 of 20 comparing the loop's own last iterate); with the default "
              "consistent re-entry it falls on 20 of 20 (docs/methods/rb_modulation.md, 'The class-accuracy gap')")


@pytest.mark.parametrize("reentry,eta", [("consistent", 0.05), ("consistent", 0.1), ("consistent", 0.2),
                                         ("official", 0.05), ("official", 0.1),
                                         pytest.param("official", 0.2, marks=pytest.mark.xfail(strict=True,
                                                                                               reason=_OVERSHOOT))])
def test_inner_loss_falls(model, psi, ref, reentry, eta):
    rbm = RBModulation(psi, reference=ref, cost="squared", M=3, eta=eta, lam_prox=1.0, record=True, reentry=reentry)
    _sample(model, rbm, n=30)
    assert len(rbm.records) == 20
    falls = [r.losses[-1] < r.losses[0] for r in rbm.records]
    assert sum(falls) >= 0.9 * len(falls), [r.losses for r in rbm.records]


def test_lr_schedule(model, psi, ref, monkeypatch):
    """The optimiser of step i is built with lr = eta (1 - i / N), fresh at every step."""
    made = []

    class SpyAdam(torch.optim.Adam):
        def __init__(self, params, lr):
            made.append(lr)
            super().__init__(params, lr=lr)

    monkeypatch.setattr(rbm_module, "Adam", SpyAdam)
    eta, n = 0.15, 20
    _sample(model, RBModulation(psi, reference=ref, cost="squared", eta=eta, tau=None))
    assert made == pytest.approx([eta * (1 - i / n) for i in range(n)], rel=1e-12)
    made.clear()
    _sample(model, RBModulation(psi, reference=ref, cost="squared", eta=eta, tau=7))
    assert len(made) == 7  # tau: only steps i < tau are corrected


def test_adam_first_step_has_size_lr(psi, ref):
    """M = 1, lam_prox = 0: Adam's first update is lr * g / (|g| + eps), i.e. lr per coordinate wherever |g| >> eps."""
    rbm = RBModulation(psi, reference=ref, cost="squared", M=1, eta=0.3, lam_prox=0.0)
    rbm.begin(list(range(11)))  # N = 10
    d = reference_image("thin", 3).repeat(4, 1, 1, 1) + 0.01 * torch.randn(4, 1, 8, 8, generator=torch.Generator()
                                                                           .manual_seed(0))
    for i in (0, 4, 9):
        u = rbm(d, d, 1.0, i)
        lr = 0.3 * (1 - i / 10)
        ratio = (u - d).abs() / lr  # |g| / (|g| + 1e-8): 1 up to Adam's eps, never above
        assert float(ratio.max()) <= 1 + 1e-5
        assert float(((ratio - 1).abs() < 1e-4).float().mean()) >= 0.95


def _vp_ddim(x, d, u, s, s_next, eta, z):
    """Stable Cascade's DDIMSampler step (gdf/samplers.py) in VP coordinates, mapped back to EDM (spec section 0):
    a = sqrt(alphabar), b = sqrt(1 - alphabar); eps-hat from the uncorrected D; x0-hat = u."""
    a, b = 1 / math.sqrt(1 + s**2), s / math.sqrt(1 + s**2)
    a2, b2 = 1 / math.sqrt(1 + s_next**2), s_next / math.sqrt(1 + s_next**2)
    x_vp = a * x
    eps = (x_vp - a * d) / b
    tau = eta * math.sqrt(b2**2 / b**2) * math.sqrt(1 - a**2 / a2**2) if eta > 0 else 0.0
    x_vp_next = a2 * u + math.sqrt(max(b2**2 - tau**2, 0.0)) * eps + tau * z
    return x_vp_next / a2


@pytest.mark.parametrize("method,eta", [("ddim", 0.0), ("ddim", 0.5), ("ddim", 1.0), ("ddpm", None)])
def test_edm_step_is_the_vp_ddim_formula(model, psi, ref, method, eta):
    n, steps = 10, 8
    sigmas = sd.sigmas.karras(steps, 0.002, 40.0)
    seen = []
    rbm = RBModulation(psi, reference=ref, cost="squared", eta=0.2)

    def corrector(d, x, s, i):
        u = rbm(d, x, s, i)
        seen.append((x.clone(), d.clone(), u.clone(), s))
        return u

    corrector.begin = rbm.begin
    out = _sample(model, corrector, n=n, method=method, sigmas=sigmas, eta=eta)
    # the same per-sample noise stream the sampler draws from (one draw per step, seeds 5 + row)
    noise = SampleNoise(make_generators(5, n, torch.device("cpu")))
    states = [x for x, *_ in seen[1:]] + [out]
    eff_eta = 1.0 if method == "ddpm" else eta
    for (x, d, u, s), x_next, s_next in zip(seen, states, sigmas.tolist()[1:], strict=True):
        stochastic = eff_eta > 0 and s_next > 0
        z = noise.randn_like(x) if stochastic else torch.zeros_like(x)
        want = _vp_ddim(x.double(), d.double(), u.double(), s, s_next, eff_eta if s_next > 0 else 0.0, z.double())
        torch.testing.assert_close(x_next.double(), want, rtol=1e-5, atol=1e-5)
    assert any(not torch.equal(u, d) for _, d, u, _ in seen)  # the corrector did act


def test_no_denoiser_backward(model, psi, ref):
    counter = BackwardCounter(model)
    try:
        _sample(model, RBModulation(psi, reference=ref, cost="squared", eta=0.2))
        assert counter.count == 0
        # the hook does fire on a backward through the denoiser: plain gradient guidance needs one per step
        _sample(model, None, guidance=style_guidance(psi, 1.0, reference=ref, cost="squared"))
        assert counter.count == 20
    finally:
        counter.remove()
    assert all(p.grad is None for p in model.parameters())


def test_batch_independence(model, psi, ref):
    """Per-sample losses are summed, so a sample does not depend on the rest of its batch."""
    full = _sample(model, RBModulation(psi, reference=ref, cost="squared", eta=0.2), n=20)
    rbm = RBModulation(psi, reference=ref, cost="squared", eta=0.2)
    part = sd.sample(model, sd.randn((20, 1, 8, 8), seeds=0)[:5], SIGMAS, method="ddim", cond=_cond(20)[:5],
                     x0_corrector=rbm)
    torch.testing.assert_close(part, full[:5], rtol=1e-5, atol=1e-5)


def test_steers_towards_reference(model, psi, ref):
    rbm = RBModulation(psi, reference=ref, cost="squared", eta=0.2)
    plain, styled = _sample(model), _sample(model, rbm)
    with torch.no_grad():
        assert rbm.style_cost(styled).mean() < 0.5 * rbm.style_cost(plain).mean()


def test_bad_inputs(psi, ref):
    with pytest.raises(ValueError, match="eta .* must be a finite number > 0"):
        RBModulation(psi, reference=ref, eta=0.0)
    with pytest.raises(ValueError, match="eta .* must be a finite number > 0"):
        RBModulation(psi, reference=ref, eta=-0.1)
    with pytest.raises(ValueError, match="M must be an integer >= 0"):
        RBModulation(psi, reference=ref, M=-1)
    with pytest.raises(ValueError, match="lam_prox must be a finite number >= 0"):
        RBModulation(psi, reference=ref, lam_prox=-1.0)
    with pytest.raises(ValueError, match="exactly one of reference="):
        RBModulation(psi)
    with pytest.raises(ValueError, match="cost must be one of"):
        RBModulation(psi, reference=ref, cost="l1")
    with pytest.raises(TypeError, match="descriptor must be callable"):
        RBModulation("csd", reference=ref)
    # a descriptor returning the wrong shape: caught on the reference, and on a batch
    with pytest.raises(ValueError, match=r"descriptor must return a floating-point embedding \[B, k\].*got \(1,\)"):
        RBModulation(lambda x: x.flatten(1).mean(1), reference=ref)
    flaky = {"n": 0}

    def wrong_rows(x):
        flaky["n"] += 1
        return psi(x) if flaky["n"] == 1 else psi(x)[:1]

    rbm = RBModulation(wrong_rows, reference=ref, cost="squared")
    rbm.begin([3.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"descriptor must return .*got \(1, 3\) for a batch of B=4"):
        rbm(torch.zeros(4, 1, 8, 8), torch.zeros(4, 1, 8, 8), 3.0, 0)
    rbm = RBModulation(psi, reference_embedding=torch.zeros(1, 5), cost="squared")
    rbm.begin([3.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"reference embedding has shape \(1, 5\)"):
        rbm(torch.zeros(4, 1, 8, 8), torch.zeros(4, 1, 8, 8), 3.0, 0)
    with pytest.raises(RuntimeError, match="needs the run's schedule"):
        RBModulation(psi, reference=ref)(torch.zeros(2, 1, 8, 8), torch.zeros(2, 1, 8, 8), 1.0, 0)


@pytest.mark.parametrize("method", sorted(n for n, s in sd.core.SAMPLERS.items() if s.corrector))
def test_runs_with_every_sampler(model, psi, ref, method):
    """RB-Mod as the x0_corrector of every sampler that takes the hook: the style cost falls well below plain's."""
    rbm = RBModulation(psi, reference=ref, cost="squared", eta=0.2)
    plain, styled = _sample(model, method=method), _sample(model, rbm, method=method)
    assert torch.isfinite(styled).all()
    with torch.no_grad():
        assert rbm.style_cost(styled.clamp(-1, 1)).mean() < 0.5 * rbm.style_cost(plain.clamp(-1, 1)).mean()


@pytest.mark.parametrize("method", ["ddim", "ddpm"])
def test_consistent_reentry_is_the_corrected_denoiser(model, psi, ref, method):
    """The default re-entry is the sampler run on the composition denoiser-then-corrector (one evaluation per step,
    so the step index is the call's); the official one moves the state by u - D instead and differs."""
    sig = SIGMAS.tolist()
    rbm = RBModulation(psi, reference=ref, cost="squared", eta=0.1)
    calls = []

    def composed(x, sigma, cond=None):
        i = len(calls)
        calls.append(i)
        return rbm(model(x, sigma, cond), x, float(sig[i]), i)

    rbm.begin(sig)
    want = sd.sample(composed, sd.randn((20, 1, 8, 8), seeds=0), SIGMAS, method=method, cond=_cond(20), generator=5)
    got = _sample(model, RBModulation(psi, reference=ref, cost="squared", eta=0.1), method=method)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    official = _sample(model, RBModulation(psi, reference=ref, cost="squared", eta=0.1, reentry="official"),
                       method=method)
    assert (official - got).abs().max() > 1e-3


def test_reentry_is_checked(psi, ref):
    with pytest.raises(ValueError, match="reentry"):
        RBModulation(psi, reference=ref, reentry="spec")
