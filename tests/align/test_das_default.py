"""The library's default DAS (gradient-free, adaptive tempering; chosen on the digits validation seeds,
``docs/methods/das_diagnosis.md``) on the exact validation problems P1-P4 and MO with DAS's fast-tier bounds, at the
protocol's equal cost: 16 gradient particles, i.e. 32 gradient-free ones (the analytic mixture's VJP costs one call,
``c_b = 1``)."""

import inspect

import pytest
import torch

import steerdiff as sd
from steerdiff.align import das, particles_at_cost
from steerdiff.align.rewards import Linear
from steerdiff.app.protocols.das import (
    LIBRARY_DAS,
    PAPER_DAS,
    PROBLEMS,
    IsotropicMixture,
    run_method,
    validate,
    validation_sigmas,
)
from steerdiff.models import GaussianMixture


def test_library_das_names_the_defaults_of_das():
    defaults = {k: p.default for k, p in inspect.signature(das).parameters.items()}
    assert {k: defaults[k] for k in LIBRARY_DAS} == LIBRARY_DAS
    assert LIBRARY_DAS != PAPER_DAS


def test_default_is_gradient_free_and_costs_no_vjp():
    mix = IsotropicMixture(GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], 0.3))
    res = das(mix, Linear([1.0, 0.5]), sd.randn((4 * 8, 2), seeds=0, dtype=torch.float64), validation_sigmas(20),
              alpha=1.0, particles=8, generator=0)
    assert res.nfe_grad == 0 and res.nfe == 20 * 8  # per group: steps x particles
    assert res.extras["tempering"] == "adaptive"


def test_equal_cost_particles():
    assert particles_at_cost(16, gradient=True) == 16
    assert particles_at_cost(16, gradient=False, c_b=2.0) == 48
    assert particles_at_cost(16, gradient=False, c_b=1.0) == 32
    with pytest.raises(ValueError, match="gradient_particles"):
        particles_at_cost(0, gradient=False)
    prob_runs = [run_method(PROBLEMS["P1"](), "das", 2, particles=4, steps=5, **kw)
                 for kw in (PAPER_DAS, LIBRARY_DAS)]
    assert [r.particles for r in prob_runs] == [4, 8]
    assert prob_runs[0].cost(1.0) == prob_runs[1].cost(1.0)


@pytest.mark.parametrize("problem", ["P1", "P2", "P3", "P4"])
def test_fast_tier_default_das(problem):
    report = validate("fast", problems=(problem,), methods=("das",), das_options=LIBRARY_DAS)
    failed = [c for c in report["checks"] if not c["passed"]]
    print(problem, [(c["name"], round(c["value"], 3), c["bound"]) for c in report["checks"]])
    assert len(report["checks"]) == 2 and not failed, report["checks"]


def test_fast_tier_default_das_multi_objective():
    report = validate("fast", problems=("MO",), methods=("das",), das_options=LIBRARY_DAS)
    failed = [c for c in report["checks"] if not c["passed"]]
    assert len(report["checks"]) == 3 and not failed, failed
