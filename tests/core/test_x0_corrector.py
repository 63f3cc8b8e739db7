"""The ``x0_corrector`` hook of ``sd.sample`` (steerdiff.core.sampling.apply_x0_corrector, an argument of each
step), on every sampler that core registers.

Independent truths: a corrector that returns its input must leave every sampler bit-identical to a run without one;
a corrector whose output is a fixed image ``T`` must make every sampler's final step (to sigma = 0, where each of
them lands on ``x0-hat``) return ``T`` exactly; the DDIM / Euler step with a corrector must be the closed form
``u + (sigma'/sigma)(x - D)`` of the spec (C.2, "EDM form"), with ``D`` the uncorrected estimate.
"""

from __future__ import annotations

import pytest
import torch

import steerdiff as sd
from steerdiff.core import SAMPLERS
from steerdiff.models import builtin_mixture

CORE = sorted(n for n, s in SAMPLERS.items() if s.corrector)
# lms integrates the last `order` derivatives: only order 1 lands exactly on x0-hat on the last step
OPTIONS = {"lms": {"order": 1}}


@pytest.fixture(scope="module")
def gmm():
    return builtin_mixture("gmm2d")


def _run(gmm, method, corrector=None, sigmas=None, **kw):
    sigmas = sd.sigmas.karras(8, 0.01, 20.0) if sigmas is None else sigmas
    noise = sd.randn((16, 2), seeds=3)
    return sd.sample(gmm, noise, sigmas, method=method, generator=7, x0_corrector=corrector, **kw)


def test_core_samplers_all_honour_the_hook():
    expected = {"euler", "heun", "ddim", "ddpm", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_3m_sde", "unipc", "lms",
                "euler_ancestral"}
    assert expected <= set(CORE)


@pytest.mark.parametrize("flow_start", [False, True], ids=["karras", "inf-start"])
@pytest.mark.parametrize("method", CORE)
def test_identity_corrector_is_bit_identical(gmm, method, flow_start):
    if flow_start and not SAMPLERS.get(method).inf_start:
        pytest.skip(f"{method} is not registered for an infinite first level")
    sigmas = sd.sigmas.flow(8) if flow_start else None
    plain = _run(gmm, method, None, sigmas)
    same = _run(gmm, method, lambda d, x, s, i: d, sigmas)  # the same object
    equal = _run(gmm, method, lambda d, x, s, i: d.clone(), sigmas)  # an equal tensor: goes through x + (u - D)
    assert torch.equal(plain, same)
    assert torch.equal(plain, equal)


@pytest.mark.parametrize("method", CORE)
def test_real_corrector_sets_x0_hat(gmm, method):
    """A corrector that always answers the fixed image T: every sampler's last step (to sigma = 0) returns its x0-hat,
    so the output is T exactly; and the corrector is called once per step, in order, with the run's sigmas."""
    target = torch.tensor([0.3, -1.7])
    calls = []

    class Fixed:
        def begin(self, sigmas):
            self.sigmas = sigmas

        def __call__(self, d, x, s, i):
            assert d.shape == x.shape == (16, 2)
            calls.append((i, s))
            return target.expand_as(d).clone()

    fixed = Fixed()
    sigmas = sd.sigmas.karras(8, 0.01, 20.0)
    out = _run(gmm, method, fixed, sigmas, **OPTIONS.get(method, {}))
    assert torch.equal(out, target.expand_as(out))
    assert fixed.sigmas == sigmas.tolist()
    assert [i for i, _ in calls] == list(range(8))
    assert [s for _, s in calls] == sigmas.tolist()[:-1]
    plain = _run(gmm, method, None, sigmas, **OPTIONS.get(method, {}))
    assert not torch.allclose(plain, out)


@pytest.mark.parametrize("method", ["euler", "ddim"])
def test_step_keeps_uncorrected_eps_hat(gmm, method):
    """x' = u + (sigma'/sigma)(x - D): the step uses u as x0-hat and eps-hat = (x - D)/sigma of the raw D."""
    seen = []
    shift = torch.tensor([0.25, -0.5])

    def corr(d, x, s, i):
        u = d + shift * (i + 1)
        seen.append((x.clone(), d.clone(), u.clone(), s))
        return u

    sigmas = sd.sigmas.karras(6, 0.01, 20.0)
    out = _run(gmm, method, corr, sigmas)
    states = [x for x, *_ in seen[1:]] + [out]
    for (x, d, u, s), x_next, s_next in zip(seen, states, sigmas.tolist()[1:], strict=True):
        torch.testing.assert_close(x_next, u + (s_next / s) * (x - d), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(d, gmm(x, torch.full((16,), s)), rtol=1e-5, atol=1e-6)  # D is the raw one


def test_corrector_with_guidance_and_nfe(gmm):
    """The corrector costs no denoiser evaluation; it runs on the guided estimate."""
    cond = torch.full((16,), -1)
    x, stats = sd.sample(gmm, sd.randn((16, 2), seeds=0), sd.sigmas.karras(5, 0.01, 20.0), method="euler",
                         x0_corrector=lambda d, x, s, i: d + 0.1, return_stats=True)
    assert stats.nfe == 5
    _, stats_g = sd.sample(gmm, sd.randn((16, 2), seeds=0), sd.sigmas.karras(5, 0.01, 20.0), method="euler",
                           cond=cond, guidance=sd.guidance.CFG(2.0), x0_corrector=lambda d, x, s, i: d,
                           return_stats=True)
    assert stats_g.nfe == 10  # CFG's doubled batch, nothing more


def test_bad_correctors(gmm):
    with pytest.raises(TypeError, match="x0_corrector must be callable"):
        _run(gmm, "euler", corrector=3)
    with pytest.raises(ValueError, match=r"x0_corrector returned \(16, 3\).*step 0"):
        _run(gmm, "euler", corrector=lambda d, x, s, i: torch.zeros(16, 3))
    with pytest.raises(FloatingPointError, match="x0_corrector returned non-finite values at step 0"):
        _run(gmm, "heun", corrector=lambda d, x, s, i: d * float("nan"))


def test_sampler_without_the_hook_refuses_it(gmm):
    import steerdiff.covariance  # noqa: F401  (registers ocm-ddim, which does not honour the hook)

    with pytest.raises(ValueError, match="x0_corrector= is not supported with method='ocm-ddim'"):
        _run(gmm, "ocm-ddim", corrector=lambda d, x, s, i: d, covariance="zero")
