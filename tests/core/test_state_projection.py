"""The state projection of ``sd.sample``'s ``x0_corrector`` (``project(x, sigma, i)``, steerdiff.core.sampling.
project_state): applied to the state at the start of every step (before its evaluation) and to the final state, on
every sampler that core registers with ``corrector=True``.

Independent truths: an identity projection leaves every sampler bit-identical; a projection that pins coordinate 0
to ``a + sigma e`` (inpainting's known region) makes every sampler end on ``a`` there; Euler with the projection is
the hand-written loop ``x_{i+1} = euler_step(P(x_i))``.
"""

from __future__ import annotations

import pytest
import torch

import steerdiff as sd
from steerdiff.core import SAMPLERS
from steerdiff.core.sampling import euler_step
from steerdiff.models import builtin_mixture

CORE = sorted(n for n, s in SAMPLERS.items() if s.corrector)


@pytest.fixture(scope="module")
def gmm():
    return builtin_mixture("gmm2d")


class Pin:
    """Identity on D; pins coordinate 0 of the state to ``a + sigma e`` (``a`` at sigma = 0)."""

    def __init__(self, a, e, identity=False):
        self.a, self.e, self.identity, self.seen = a, e, identity, []

    def __call__(self, denoised, x, sigma, i):
        return denoised

    def project(self, x, sigma, i):
        self.seen.append(i)
        if self.identity:
            return x
        y = x.clone()
        y[:, 0] = self.a + sigma * self.e
        return y


def _run(gmm, method, corrector=None):
    noise = sd.randn((16, 2), seeds=3)
    return sd.sample(gmm, noise, sd.sigmas.karras(8, 0.01, 20.0), method=method, generator=7, x0_corrector=corrector)


@pytest.mark.parametrize("method", CORE)
def test_identity_projection_is_bit_identical_and_pinning_lands_on_the_pin(gmm, method):
    a, e = torch.full((16,), 0.7, dtype=torch.float64), sd.randn((16,), seeds=5).double()
    pin = Pin(a, e, identity=True)
    torch.testing.assert_close(_run(gmm, method, pin), _run(gmm, method), rtol=0, atol=0)
    assert pin.seen == list(range(9))  # every step's start and the end
    out = _run(gmm, method, Pin(a.float(), e.float()))
    torch.testing.assert_close(out[:, 0], a.float(), rtol=0, atol=0)


def test_euler_with_a_projection_is_the_hand_written_loop(gmm):
    sig = sd.sigmas.karras(6, 0.01, 20.0).tolist()
    noise = sd.randn((8, 2), seeds=1)
    pin = Pin(torch.full((8,), -0.4), torch.ones(8))
    x = noise * sig[0]
    for i in range(6):
        x = pin.project(x, sig[i], i)
        x = euler_step(x, gmm(x, torch.full((8,), sig[i])), sig[i], sig[i + 1])
    x = pin.project(x, 0.0, 6)
    out = sd.sample(gmm, noise, torch.tensor(sig), method="euler", x0_corrector=pin)
    torch.testing.assert_close(out, x, rtol=1e-6, atol=1e-6)


def test_a_projection_of_the_wrong_shape_is_named(gmm):
    class Bad(Pin):
        def project(self, x, sigma, i):
            return x[:, :1]

    with pytest.raises(ValueError, match=r"x0_corrector.project returned \(16, 1\)"):
        _run(gmm, "euler", Bad(None, None))
