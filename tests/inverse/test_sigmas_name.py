"""The inverse solvers' noise levels are ``sigmas`` (as everywhere in steerdiff); ``levels`` still works for one
release with a DeprecationWarning."""

import pytest
import torch

import steerdiff as sd
from steerdiff.core.noise import SampleNoise, make_generators
from steerdiff.inverse import Matrix, SolveContext, register_solver, solve
from steerdiff.inverse.dps import dps
from steerdiff.inverse.hybrid import variational_solve
from steerdiff.models import GaussianMixture

GMM = GaussianMixture([0.5, 0.5], [[-1.0, 0.0], [1.0, 0.5]], 0.3)
OP = Matrix(torch.tensor([[1.0, 1.0]], dtype=torch.float64)).bind((2,))
Y = torch.tensor([[0.3], [-0.2]], dtype=torch.float64)
SIG = sd.sigmas.karras(6, 0.05, 10.0).tolist()[:-1]  # positive levels (the solvers step to 0 after them)


def _noise():
    return SampleNoise(make_generators(3, 2, "cpu"))


def test_dps_takes_sigmas_and_the_old_keyword_warns():
    new = dps(GMM, OP, Y, SIG, scale=0.5, noise=_noise())
    with pytest.warns(DeprecationWarning, match="sigmas="):
        old = dps(GMM, OP, Y, levels=SIG, scale=0.5, noise=_noise())
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    with pytest.raises(TypeError, match="both sigmas= and levels="):
        dps(GMM, OP, Y, SIG, levels=SIG, scale=0.5, noise=_noise())
    with pytest.raises(TypeError, match="sigmas="):
        dps(GMM, OP, Y, scale=0.5, noise=_noise())


def test_variational_solve_takes_sigmas_and_the_old_keyword_warns():
    kw = dict(beta=0.5, lam=0.25, v=1.0, lr=0.1, weight="linear", sigma_x0=0.0)
    init = OP.pinv(Y)
    new = variational_solve(GMM, OP, Y, SIG, init, noise=_noise(), **kw)
    with pytest.warns(DeprecationWarning, match="sigmas="):
        old = variational_solve(GMM, OP, Y, levels=SIG, init=init, noise=_noise(), **kw)
    assert torch.equal(new[0], old[0])


def test_result_and_context_say_sigmas():
    seen = {}

    @register_solver("test-sigmas-name", defaults={}, check=lambda opts, op: opts)
    def run(ctx: SolveContext, opts: dict):
        seen["sigmas"] = list(ctx.sigmas)
        with pytest.warns(DeprecationWarning, match="ctx.sigmas"):
            seen["levels"] = ctx.levels
        return ctx.operator.pinv(ctx.y_rep), torch.full((ctx.rows,), -1), 0.0

    try:
        res = solve(GMM, OP, Y, method="test-sigmas-name", noise_std=0.1, sigmas=torch.tensor(SIG, dtype=torch.float64))
    finally:
        sd.inverse.SOLVERS.remove("test-sigmas-name")
    assert seen["sigmas"] == seen["levels"] == SIG
    assert torch.equal(res.sigmas, torch.tensor(SIG, dtype=torch.float64))
    with pytest.warns(DeprecationWarning, match="result.sigmas"):
        assert res.levels is res.sigmas
