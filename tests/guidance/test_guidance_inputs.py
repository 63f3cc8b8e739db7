"""Bad input to guiders, the guider registry, Compose expressions and the scale converters: a clear error naming
the argument and the expected form, raised before the denoiser is called."""

import pytest
import torch

from steerdiff.core import NFECounter
from steerdiff.guidance import APG, CFG, CFGRescale, Compose, build_guider, compose_oracle, w_from_diffusers
from steerdiff.guidance.compose_expr import Lit, Not, parse
from steerdiff.models import GaussianMixture, builtin_mixture

ATTRS = {"a": ["m2", "z", "p2"], "b": ["m2", "z", "p2"]}


def _grid_mixture():
    combos = [(a, b) for a in range(3) for b in range(3)]
    return GaussianMixture(torch.ones(9), [[2.0 * a - 2, 2.0 * b - 2] for a, b in combos], 0.09, labels=combos)


@pytest.mark.parametrize("sigma,got", [(1.0, "float"), (torch.tensor(1.0, dtype=torch.float64), r"\(\)"),
                                       (torch.ones(3, dtype=torch.float64), r"\(3,\)"),
                                       (torch.ones(4, dtype=torch.long), "int64")])
def test_sigma_must_be_a_float_tensor_per_row(sigma, got):
    gmm = builtin_mixture("gmm2d")
    x, c = torch.zeros(4, 2, dtype=torch.float64), torch.arange(4)
    for g in (CFG(3.0), CFGRescale(3.0), APG(3.0)):
        counter = NFECounter(gmm)
        with pytest.raises(ValueError, match=rf"sigma must be a floating-point tensor \[B\] with B=4.*got .*{got}"):
            g.guide(counter, x, sigma, c)
        assert counter.calls == 0
    compose = Compose("a=p2", 2.0, ATTRS)
    with pytest.raises(ValueError, match="sigma must be a floating-point tensor"):
        compose.guide(_grid_mixture(), x, sigma, compose.cond(4))


def test_x_must_be_a_tensor():
    with pytest.raises(ValueError, match=r"x must be a tensor \[B, \*shape\], got list"):
        CFG(3.0).guide(builtin_mixture("gmm2d"), [[0.0, 0.0]], torch.ones(1), torch.zeros(1).long())


def test_unknown_guider_options_list_the_accepted_ones():
    with pytest.raises(TypeError, match=r"guider 'cfg': .*'phi'.*it takes \['scale', 'start', 'stop'"):
        build_guider("cfg", 3.0, phi=0.7)
    with pytest.raises(TypeError, match=r"guider 'apg': .*'beta'.*'momentum'"):
        build_guider("apg", 3.0, beta=-0.5)
    with pytest.raises(TypeError, match=r"APG.from_config: .*'bogus'.*it takes"):
        APG.from_config({"scale": 3.0, "bogus": 1})
    with pytest.raises(TypeError, match="config must be a dict of CFG arguments"):
        CFG.from_config("scale=3")


@pytest.mark.parametrize("attributes,match", [
    ({"a": 3.5}, r"attributes\['a'\] must be a list of value names or a number of values K, got float"),
    ({"a": "abc"}, r"attributes\['a'\] must be a list of value names .* got str 'abc'"),
    ({"a": 0}, r"attributes\['a'\]: a number of values must be >= 1, got 0"),
    ({"a b": 2}, r"'a b' cannot be written in an expression"),
    ({"a": ["x y", "z"]}, r"'x y' cannot be written in an expression"),
])
def test_bad_attributes(attributes, match):
    with pytest.raises(ValueError, match=match):
        Compose("a=0", 1.0, attributes)


def test_a_value_asked_and_negated_is_contradictory():
    """``a=p2 & !a=p2`` has no sample (the oracle says so); its score terms would cancel into the unconditional
    model, so the guider refuses it like the oracle."""
    with pytest.raises(ValueError, match="contradictory expression: slot 0 asked to be value 2 and not to be it"):
        Compose("a=p2 & !a=p2", 2.0, ATTRS)
    with pytest.raises(ValueError, match="contradictory"):
        Compose("a=p2 & a!={z,p2}", 2.0, ATTRS)
    with pytest.raises(ValueError, match="satisfied by no component"):
        compose_oracle(_grid_mixture(), "a=p2 & !a=p2", ATTRS)
    assert len(Compose("a=p2 & !a=z", 2.0, ATTRS).terms) == 2  # redundant, not contradictory


def test_double_negation_cancels():
    assert parse("!!a=p2", ATTRS) == Lit(0, (2,))
    assert parse("!a!=p2", ATTRS) == Lit(0, (2,))
    assert parse("!!!b=z", ATTRS) == Not(Lit(1, (1,)))
    assert Compose("!!a=p2 & !!!b=z", 2.0, ATTRS).terms == Compose("a=p2 & !b=z", 2.0, ATTRS).terms


def test_compose_cond_must_be_a_tensor():
    g = Compose("a=p2", 2.0, ATTRS)
    with pytest.raises(ValueError, match=r"cond must be compose.cond\(B\), an integer tensor \[B, 2\], got list"):
        g.guide(_grid_mixture(), torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, dtype=torch.float64),
                [[2, -1], [2, -1]])


def test_use_original_formulation_must_be_a_bool():
    with pytest.raises(TypeError, match="use_original_formulation must be a bool, got str"):
        w_from_diffusers(3.0, "no")
    assert w_from_diffusers(3.0, True) == 4.0 and w_from_diffusers(3.0, False) == 3.0
