"""DAS's proposal caps ``grad_clip`` and ``shift_clip`` (``docs/methods/das_diagnosis.md``): the default is today's
sampler bit for bit, the weights stay exact for the capped move, and the tilted mixtures are still sampled."""

import math
from functools import partial

import pytest
import torch

import steerdiff as sd
from steerdiff.align import das as library_das
from steerdiff.align.das import clip_grad, clip_shift
from steerdiff.align.rewards import Quadratic
from steerdiff.align.smc import ancestral_coeffs, normalize
from steerdiff.app.protocols.das import CRITERIA, PAPER_DAS, PROBLEMS, IsotropicMixture, evaluate, validation_sigmas
from steerdiff.models import GaussianMixture

# These tests check the paper's sampler (reward-gradient proposal, exponential tempering); the library's
# default, gradient-free DAS with adaptive tempering, is checked in tests/align/test_das_default.py.
das = partial(library_das, **PAPER_DAS)

MIX = IsotropicMixture(GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], 0.3))
R = Quadratic.around([1.0, 0.5], c=[1.0, 0.0])


def noise(rows: int, d: int = 2, seed: int = 0) -> torch.Tensor:
    return sd.randn((rows, d), seeds=seed, dtype=torch.float64)


def _run(**kw):
    return das(MIX, R, noise(4 * 8), validation_sigmas(30), alpha=0.3, particles=8, generator=3, batch_size=None,
               output="weighted", **kw)


def test_default_is_unchanged():
    """None (the default) and caps that never bind give the very same run as before the options existed."""
    base = _run()
    for kw in ({"grad_clip": None, "shift_clip": None}, {"grad_clip": 1e30}, {"shift_clip": 1e30},
               {"grad_clip": 1e30, "shift_clip": 1e30}):
        other = _run(**kw)
        assert torch.equal(other.particles_final, base.particles_final), kw
        assert torch.equal(other.log_weights, base.log_weights), kw
        assert torch.equal(other.log_evidence, base.log_evidence), kw
        assert torch.equal(other.resampled, base.resampled), kw


def test_caps_bind_and_change_the_run():
    norms = []
    res = _run(grad_clip=0.05, callback=lambda info: norms.append(float((info["grad"] * 0.3).norm(dim=1).max()))
               if info["grad"] is not None else None)
    assert max(norms) > 0.05  # the cap is active somewhere...
    assert not torch.equal(res.particles_final, _run().particles_final)  # ...and changes the moves
    assert not torch.equal(_run(shift_clip=0.05).particles_final, _run().particles_final)


def test_clip_helpers():
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(clip_grad(g, 1.0), torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]],
                                                                dtype=torch.float64))
    assert clip_grad(g, None) is g
    delta = clip_shift(lambda tau: g * tau, 0.5)(2.0)  # cap 0.5 * tau * sqrt(2) = 1.414
    torch.testing.assert_close(delta.norm(dim=1), torch.tensor([math.sqrt(2), 1.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("kw", [{"grad_clip": 0.2}, {"shift_clip": 0.0005}])
def test_final_weight_is_exact_for_the_capped_move(kw):
    """As ``test_final_increment`` in ``test_align_das.py``: the last weight is ``r(x_N)/alpha - log psi_{N-1}`` plus
    the closed-form ``log p - log q`` of the shift actually made, here the capped one (recomputed here from the
    uncapped gradient the callback reports)."""
    alpha, P = 0.7, 8
    sig = sd.sigmas.karras(12, 0.002, 80.0)[:-1]
    seen = {}

    def grab(info):
        seen.update({k: (v.clone() if torch.is_tensor(v) else v) for k, v in info.items()})

    res = das(MIX, R, noise(3 * P), sig, alpha=alpha, particles=P, output="weighted", generator=4, callback=grab, **kw)
    keep, s_up = ancestral_coeffs(seen["sigma"], seen["sigma_next"], 1.0)
    mean = torch.lerp(seen["denoised"], seen["x"], keep)
    g = seen["grad"] * alpha  # grad_x r
    if "grad_clip" in kw:
        g = g * (kw["grad_clip"] / g.norm(dim=1, keepdim=True)).clamp(max=1.0)
    delta = s_up**2 * g / alpha  # lambda_N = 1
    if "shift_clip" in kw:
        delta = delta * (kw["shift_clip"] * s_up * math.sqrt(2) / delta.norm(dim=1, keepdim=True)).clamp(max=1.0)
    free = s_up**2 * seen["grad"]
    assert float((delta - free).abs().max()) > 0.1 * float(free.abs().max())  # the cap binds on the last move
    xN = res.particles_final
    z = (xN - mean - delta) / s_up
    inc = R(xN).view(3, P) / alpha - seen["log_twist"]
    inc = inc + (-(delta * z).sum(1) / s_up - (delta * delta).sum(1) / (2 * s_up**2)).view(3, P)
    torch.testing.assert_close(res.log_weights, normalize(seen["log_weights"] + inc), rtol=1e-9, atol=1e-9)


# The exact targets: DAS's fast-tier bounds (``CRITERIA`` + 0.05) at the fast-tier size in 2-D (1024 groups) and
# 256 groups in 16-D, P = 16, 100 steps, with caps that bind strongly.
@pytest.mark.parametrize("name,kw", [("P1", {"shift_clip": 0.05}), ("P1", {"grad_clip": 0.5}),
                                     ("P4", {"shift_clip": 0.05}), ("P4", {"grad_clip": 0.5})])
def test_capped_das_samples_the_tilted_mixture(name, kw):
    prob = PROBLEMS[name]()
    groups = 1024 if prob.mixture.dim == 2 else 256
    x = sd.randn((groups * 16, prob.mixture.dim), seeds=0, dtype=torch.float64)
    res = das(IsotropicMixture(prob.mixture), prob.sampler_reward, x, validation_sigmas(100), alpha=prob.alpha,
              particles=16, generator=5 * 10**6, batch_size=None, **kw)
    ev = evaluate(prob, res.samples)
    rel, tv = CRITERIA[name]
    print(f"{name} das {kw}: relerr {ev['relerr']:.3f} TV {ev['mode_tv']:.3f}")
    assert ev["relerr"] <= rel + 0.05 and ev["mode_tv"] <= tv + 0.05, ev


@pytest.mark.parametrize("kw", [{"grad_clip": 0}, {"grad_clip": -1.0}, {"shift_clip": math.nan},
                                {"shift_clip": math.inf}, {"grad_clip": True}, {"shift_clip": "1"}])
def test_bad_caps_are_rejected(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        _run(**kw)
