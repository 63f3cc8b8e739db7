"""Guiders through the registry: every registered guider is built as ``cls(scale, **options)``, is the conditional
model at w = 1, and the CLI's spelling ``cfg-rescale`` is an alias."""

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import APG, CFG, GUIDERS, CFGRescale, build_guider
from steerdiff.models import builtin_mixture


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")  # 8 labelled components on a ring


def test_the_registered_guiders_and_the_alias():
    assert {"cfg", "cfg_rescale", "apg"} <= set(GUIDERS.names())
    assert GUIDERS.get("cfg") is CFG and GUIDERS.get("cfg-rescale") is CFGRescale and GUIDERS.get("apg") is APG
    with pytest.raises(ValueError, match="guidance must be one of"):
        build_guider("nope", 3.0)


@pytest.mark.parametrize("name", GUIDERS.names())
def test_every_registered_guider_is_the_conditional_model_at_w_1(gmm2d, name):
    noise, cond, sig = sd.randn((32, 2), seeds=0, dtype=torch.float64), torch.arange(32) % 8, sd.sigmas.karras(8)
    cond_only = sd.sample(gmm2d, noise, sig, method="euler", cond=cond)
    guided = sd.sample(gmm2d, noise, sig, method="euler", cond=cond, guidance=build_guider(name, 1.0))
    assert torch.allclose(guided, cond_only, atol=1e-10)


def test_build_guider_passes_the_options_on(gmm2d):
    noise, cond, sig = sd.randn((16, 2), seeds=0, dtype=torch.float64), torch.arange(16) % 8, sd.sigmas.karras(8)
    built = build_guider("apg", 5.0, eta=0.0, momentum=0.0)
    a = sd.sample(gmm2d, noise, sig, method="euler", cond=cond, guidance=built)
    b = sd.sample(gmm2d, noise, sig, method="euler", cond=cond, guidance=APG(5.0, eta=0.0, momentum=0.0))
    assert torch.equal(a, b)
