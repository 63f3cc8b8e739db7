"""Best-of-N, SIR, reward guidance and TDS: their defining behaviour and costs."""

from functools import partial

import torch

import steerdiff as sd
from steerdiff.align import best_of_n, reward_guidance, sir, tds
from steerdiff.align import das as library_das
from steerdiff.align.rewards import Linear
from steerdiff.app.protocols.das import PAPER_DAS, IsotropicMixture, validation_sigmas
from steerdiff.models import GaussianMixture

# These tests check the paper's sampler (reward-gradient proposal, exponential tempering); the library's
# default, gradient-free DAS with adaptive tempering, is checked in tests/align/test_das_default.py.
das = partial(library_das, **PAPER_DAS)

MIX = IsotropicMixture(GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], 0.3))
SIG, R = validation_sigmas(20), Linear([1.0, 0.5])


def noise(rows):
    return sd.randn((rows, 2), seeds=0, dtype=torch.float64)


def test_best_of_n_picks_the_best_of_the_plain_chains():
    b = best_of_n(MIX, R, noise(40), SIG, particles=8, generator=3)
    s = sir(MIX, R, noise(40), SIG, alpha=1.0, particles=8, generator=3)
    chains = s.particles_final.view(5, 8, 2)  # the same chains (same noise and seeds)
    torch.testing.assert_close(b.samples, chains[torch.arange(5), R(s.particles_final).view(5, 8).argmax(1)])
    assert b.samples.shape == (5, 2) and b.nfe == 8 * 20 and b.nfe_grad == 0 and b.reward_evals == 8
    torch.testing.assert_close(s.log_weights.exp().sum(1), torch.ones(5, dtype=torch.float64))


def test_guidance_with_zero_scale_is_the_plain_chain():
    g = reward_guidance(MIX, R, noise(16), SIG, alpha=1.0, scale=0.0, generator=3)
    s = sir(MIX, R, noise(16), SIG, alpha=1.0, particles=1, generator=3)
    torch.testing.assert_close(g.samples, s.particles_final)
    assert g.nfe == 20 and g.nfe_grad == 20
    # Guidance moves toward the reward; the notebook's unscaled mode is a different update.
    up = reward_guidance(MIX, R, noise(256), SIG, alpha=1.0, generator=3)
    plain = reward_guidance(MIX, R, noise(256), SIG, alpha=1.0, scale=0.0, generator=3)
    assert float(up.rewards.mean()) > float(plain.rewards.mean()) + 0.3
    const = reward_guidance(MIX, R, noise(16), SIG, alpha=1.0, scale=0.01, scale_mode="const", generator=3)
    assert not torch.allclose(const.samples, g.samples)
    grouped = reward_guidance(MIX, R, noise(16), SIG, alpha=1.0, particles=4, generator=3)
    assert grouped.groups == 4 and grouped.nfe == 4 * 20


def test_tds_resamples_every_step_and_das_does_not():
    t = tds(MIX, R, noise(32), SIG, alpha=1.0, particles=8, generator=0)
    assert t.resampled.all() and (t.lambdas == 1).all()
    d = das(MIX, R, noise(32), SIG, alpha=1.0, particles=8, generator=0)
    assert not d.resampled.all() and float(d.lambdas[0].max()) == 0.0


def test_equal_cost_accounting():
    P, c_b = 8, 1.0
    d = das(MIX, R, noise(4 * P), SIG, alpha=1.0, particles=P, generator=0)
    k = int(P * (1 + c_b))
    b = best_of_n(MIX, R, noise(4 * k), SIG, particles=k, generator=0)
    g = reward_guidance(MIX, R, noise(4 * P), SIG, alpha=1.0, particles=P, generator=0)
    assert d.cost(c_b) == b.cost(c_b) == g.cost(c_b) == P * 20 * (1 + c_b)
