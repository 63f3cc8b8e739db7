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


# Options a guider needs besides its scale, and the condition it reads (Compose's query is its expression, one
# attribute value here: at w = 1 the composed model is that value's conditional model).
# CFG-Zero*'s zero-init and the perturbation of PAG / SLG / SEG are not CFG: they act whatever w (as diffusers'
# guider and PAG pipeline do), so the w = 1 identity is checked on the CFG part.
OPTIONS = {"compose": {"expr": "a0=3", "attributes": {"a0": 8}}, "cfg_zero_star": {"zero_init_steps": 0},
           "pag": {"pag_scale": 0.0}, "autoguidance": {"weak": "digits_weak"}, "slg": {"slg_scale": 0.0},
           "seg": {"seg_scale": 0.0}}
CONDS = {"compose": torch.full((32,), 3)}


@pytest.mark.parametrize("name", GUIDERS.names())
def test_every_registered_guider_is_the_conditional_model_at_w_1(gmm2d, name):
    noise, sig = sd.randn((32, 2), seeds=0, dtype=torch.float64), sd.sigmas.karras(8)
    cond = CONDS.get(name, torch.arange(32) % 8)
    cond_only = sd.sample(gmm2d, noise, sig, method="euler", cond=cond)
    guided = sd.sample(gmm2d, noise, sig, method="euler", cond=cond,
                       guidance=build_guider(name, 1.0, **OPTIONS.get(name, {})))
    assert torch.allclose(guided, cond_only, atol=1e-10)


def test_compose_is_a_registered_guider_built_like_the_others(gmm2d):
    """``build_guider("compose", w, expr=..., attributes=...)`` is ``Compose(w, expr=...)``, and the expression-first
    order of earlier releases builds the same guider; both sample the same numbers as a directly built one."""
    from steerdiff.guidance import Compose, Guider

    assert GUIDERS.get("compose") is Compose and issubclass(Compose, Guider)
    attrs = {"a0": 8}
    built = build_guider("compose", 2.5, expr="a0=3 & !a0=5", attributes=attrs)
    old_order = Compose("a0=3 & !a0=5", 2.5, attrs)
    assert built.config == old_order.config == Compose(2.5, "a0=3 & !a0=5", attrs).config
    assert built.terms == old_order.terms and built.null_coef == old_order.null_coef
    noise, sig = sd.randn((16, 2), seeds=0, dtype=torch.float64), sd.sigmas.karras(8)
    a = sd.sample(gmm2d, noise, sig, method="heun", cond=built.cond(16), guidance=built)
    b = sd.sample(gmm2d, noise, sig, method="heun", cond=old_order.cond(16), guidance=old_order)
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="it takes"):
        build_guider("compose", 2.0, expr="a0=3", attributes=attrs, phi=0.7)
    with pytest.raises(ValueError, match="empty expression"):
        build_guider("compose", 2.0, attributes=attrs)


def test_build_guider_passes_the_options_on(gmm2d):
    noise, cond, sig = sd.randn((16, 2), seeds=0, dtype=torch.float64), torch.arange(16) % 8, sd.sigmas.karras(8)
    built = build_guider("apg", 5.0, eta=0.0, momentum=0.0)
    a = sd.sample(gmm2d, noise, sig, method="euler", cond=cond, guidance=built)
    b = sd.sample(gmm2d, noise, sig, method="euler", cond=cond, guidance=APG(5.0, eta=0.0, momentum=0.0))
    assert torch.equal(a, b)
