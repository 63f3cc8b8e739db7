"""Samplers plug in through the registry: a sampler registered from outside core runs through ``sd.sample`` with its
NFE, options, guidance rule and statistics, and core's own samplers are registered the same way."""

import pytest
import torch

import steerdiff as sd
from steerdiff.core import SAMPLERS, denoise_checked, nfe_of, register_sampler, step_range
from steerdiff.models import builtin_mixture


@pytest.fixture
def midpoint():
    """Explicit midpoint on the probability-flow ODE (2 evaluations per step), registered by the test."""

    @register_sampler("test-midpoint", nfe=lambda steps: 2 * steps, options=("half",), guidance=True)
    def sample_midpoint(model, x, sigmas, *, callback=None, progress=False, half=0.5, **_):
        calls = 0
        for i in step_range(sigmas, progress, "midpoint"):
            s, s_next = sigmas[i], sigmas[i + 1]
            d = denoise_checked(model, x, s, i)
            s_mid = s + half * (s_next - s)
            x_mid = torch.lerp(d, x, s_mid / s)
            d_mid = denoise_checked(model, x_mid, s_mid, i)
            x = x + (s_next - s) * (x_mid - d_mid) / s_mid
            calls += 2
        return x, {"midpoint_calls": calls}

    yield sample_midpoint
    SAMPLERS.remove("test-midpoint")


def test_every_core_sampler_is_registered_with_its_cost():
    assert {"euler", "heun", "ddim", "ddpm"} <= set(SAMPLERS.names())
    assert [nfe_of(m, 10) for m in ("euler", "heun", "ddim", "ddpm")] == [10, 19, 10, 10]
    assert SAMPLERS.get("ddim").stochastic(0.5) and not SAMPLERS.get("ddim").stochastic(0.0)


def test_a_registered_sampler_runs_through_sample_and_reports_its_extras(midpoint):
    gmm = builtin_mixture("gmm2d")
    noise = sd.randn((256, 2), seeds=0, dtype=torch.float64)
    sig = sd.sigmas.karras(40, 0.002, 80.0)
    x, stats = sd.sample(gmm, noise, sig, method="test-midpoint", return_stats=True)
    assert stats.nfe == nfe_of("test-midpoint", 40) == 80 and stats.midpoint_calls == 80
    assert stats.extras == {"midpoint_calls": 80}
    ref = sd.sample(gmm, noise, sd.sigmas.karras(400, 0.002, 80.0), method="heun")  # a fine reference path
    err = (x - ref).norm(dim=1)
    assert float(err.median()) < 1e-2 and float((err < 0.05).double().mean()) > 0.97, err.max()  # same ODE path
    with pytest.raises(AttributeError, match="no attribute 'clamped'"):
        _ = stats.clamped
    half = sd.sample(gmm, noise, sig, method="test-midpoint", half=0.25)  # the sampler's own option
    assert not torch.equal(half, x)


def test_options_and_guidance_are_checked_against_the_registered_spec(midpoint):
    gmm = builtin_mixture("gmm2d")
    noise = sd.randn((4, 2), seeds=0, dtype=torch.float64)
    sig = sd.sigmas.karras(4)
    with pytest.raises(ValueError, match=r"half= applies to methods \['test-midpoint'\] only, got method='euler'"):
        sd.sample(gmm, noise, sig, method="euler", half=0.3)
    with pytest.raises(ValueError, match="unexpected keyword argument 'nonsense'"):
        sd.sample(gmm, noise, sig, method="test-midpoint", nonsense=1)
    with pytest.raises(ValueError, match="method must be one of"):
        sd.sample(gmm, noise, sig, method="nope")
    with pytest.raises(ValueError, match=r"eta applies to methods \[.*'ddim'"):
        sd.sample(gmm, noise, sig, method="test-midpoint", eta=0.5)
