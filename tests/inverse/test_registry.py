"""Solvers plug in through the registry: ``solve`` validates the shared arguments and runs a registered solver with
its own options; DPS, DR, CR and HR are registered the same way."""

import pytest
import torch

from steerdiff.inverse import SOLVERS, Matrix, SolveContext, register_solver, solve
from steerdiff.models import GaussianMixture


@pytest.fixture
def one_gaussian():
    return GaussianMixture([1.0], [[0.0, 0.0]], [[[1.0, 0.0], [0.0, 1.0]]])


@pytest.fixture
def exact_linear_gaussian():
    """A test solver: the exact posterior mean of N(0, I) under y = A x + n (it ignores the denoiser)."""

    def check(opts, operator):
        if not opts["noise_var"] > 0:
            raise ValueError("noise_var must be positive")
        return opts

    @register_solver("test-exact", defaults={"noise_var": 0.01}, check=check)
    def run(ctx: SolveContext, opts: dict):
        a = ctx.operator.A
        cov = torch.linalg.inv(torch.eye(a.shape[1], dtype=a.dtype) + a.T @ a / opts["noise_var"])
        mean = ctx.y_rep @ (a / opts["noise_var"]) @ cov
        return mean, torch.full((ctx.rows,), -1, dtype=torch.int64), 0.0

    yield
    SOLVERS.remove("test-exact")


def test_the_four_methods_are_registered():
    assert {"dps", "dr", "cr", "hr"} <= set(SOLVERS.names())
    assert SOLVERS.get("hr").defaults["beta"] == 0.2 and SOLVERS.get("dps").defaults["eta"] == 1.0


def test_a_registered_solver_runs_through_solve(one_gaussian, exact_linear_gaussian):
    op = Matrix(torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    y = torch.tensor([[2.0], [-1.0]], dtype=torch.float64)
    res = solve(one_gaussian, op, y, method="test-exact", noise_std=0.1, chains=3, noise_var=0.01)
    assert res.samples.shape == (2, 3, 2) and res.method == "test-exact" and res.nfe == 0
    assert torch.allclose(res.samples[0, 0], torch.tensor([1.0, 1.0], dtype=torch.float64) * 2 / 2.01)
    with pytest.raises(ValueError, match="noise_var must be positive"):
        solve(one_gaussian, op, y, method="test-exact", noise_std=0.1, noise_var=0.0)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['lr'\] for method 'test-exact'"):
        solve(one_gaussian, op, y, method="test-exact", noise_std=0.1, lr=0.1)
