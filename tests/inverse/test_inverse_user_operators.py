"""Operators users would pass (docs/methods/inverse.md, "Operators"): a subclass defining only ``_forward`` and
``_adjoint`` with m != d, a ``[m, d]`` matrix, a pair ``(forward, adjoint)`` and a plain forward function; each is
checked against the same problem posed with :class:`Matrix` and against the exact linear-Gaussian posterior."""

import warnings

import pytest
import torch

from steerdiff.inverse import (
    FunctionOperator,
    Matrix,
    NoPinvError,
    Operator,
    as_operator,
    exact_posterior,
    measure,
    posterior_metrics,
    solve,
)
from steerdiff.models import GaussianMixture

F64 = torch.float64
A = torch.tensor([[1.0, -0.5, 0.25], [0.0, 1.0, 2.0]], dtype=F64)  # m = 2 measurements of d = 3 unknowns


@pytest.fixture(scope="module")
def prior():
    means = torch.tensor([[1.5, 0.0, -1.0], [-1.5, 0.5, 1.0], [0.0, -1.5, 0.0]], dtype=F64)
    return GaussianMixture([0.5, 0.3, 0.2], means, 0.2)


@pytest.fixture(scope="module")
def y(prior):
    x = prior.sample(3, generator=torch.Generator().manual_seed(0))
    return measure(Matrix(A), x, 0.1, generator=1)


class TwoRows(Operator):
    """A user's linear operator: only the documented ``_forward`` and ``_adjoint`` (no ``_measurement_size``)."""

    def _forward(self, x):
        return x @ A.to(x).T

    def _adjoint(self, v):
        return v @ A.to(v)


def _pair():
    return (lambda x: x @ A.to(x).T), (lambda v: v @ A.to(v))


@pytest.mark.parametrize("make", [lambda: TwoRows((3,)), lambda: TwoRows(), lambda: A, lambda: A.numpy(), _pair,
                                  lambda: list(_pair())],
                         ids=["subclass", "subclass-unbound", "tensor", "numpy", "pair", "pair-list"])
def test_user_linear_operator_is_the_matrix(prior, y, make):
    """Each form gives the measurements, matrix, pseudo-inverse, exact posterior and solver chains of Matrix(A)."""
    op = as_operator(make()).bind((3,))
    ref = Matrix(A)
    assert op.m == 2 and op.d == 3 and op.is_linear
    torch.testing.assert_close(op.matrix(), A)
    torch.testing.assert_close(op.pinv(y), y @ torch.linalg.pinv(A).T)  # Moore-Penrose, not the adjoint
    for post, post_ref in zip(exact_posterior(prior, make(), y, 0.1), exact_posterior(prior, ref, y, 0.1),
                              strict=True):
        torch.testing.assert_close(post.weights, post_ref.weights)
        torch.testing.assert_close(post.means, post_ref.means)
    kw = dict(noise_std=0.1, chains=3, steps=20, generator=5)
    for method, opts in (("hr", {}), ("dr", {"init": "adjoint"}), ("dps", {"scale": 0.3})):
        torch.testing.assert_close(solve(prior, make(), y, method, **kw, **opts).samples,
                                   solve(prior, ref, y, method, **kw, **opts).samples)


def test_pair_operator_samples_the_exact_posterior(prior, y):
    """HR through a (forward, adjoint) pair against the exact posterior, with G1's absolute rules for HR (mean-err
    <= 0.2, mode-weight TV <= 0.12, averaged over the measurements; docs/methods/inverse.md, "Exact-posterior
    checks")."""
    res = solve(prior, _pair(), y, "hr", noise_std=0.1, chains=400, generator=0)
    posts = exact_posterior(prior, A, y, 0.1)
    metrics = [posterior_metrics(res.samples[i], post) for i, post in enumerate(posts)]
    assert sum(m["mean_err"] for m in metrics) / len(metrics) <= 0.2
    assert sum(m["tv"] for m in metrics) / len(metrics) <= 0.12
    assert res.n_nonfinite == 0


def test_plain_forward_function_runs_dps_and_refuses_pinv_clearly(prior, y):
    fwd = _pair()[0]
    kw = dict(noise_std=0.1, chains=2, steps=15, generator=3)
    torch.testing.assert_close(solve(prior, fwd, y, "dps", scale=0.3, **kw).samples,
                               solve(prior, Matrix(A), y, "dps", scale=0.3, **kw).samples)
    assert not as_operator(fwd).is_linear
    # no published step: DPS's rule, with the Jacobian's norm at 0 (power iteration) for the function
    torch.testing.assert_close(solve(prior, fwd, y, "dps", **kw).samples,
                               solve(prior, Matrix(A), y, "dps", **kw).samples, rtol=1e-4, atol=1e-6)
    with pytest.raises(NoPinvError, match="init='zeros'"):
        solve(prior, fwd, y, "hr", **kw)
    torch.testing.assert_close(solve(prior, fwd, y, "hr", init="zeros", **kw).samples,
                               solve(prior, Matrix(A), y, "hr", init="zeros", **kw).samples)
    nonlinear = solve(prior, lambda x: torch.tanh(x @ A.to(x).T), torch.tanh(y), "dps", scale=0.3, **kw)
    assert torch.isfinite(nonlinear.samples).all()


def test_bad_user_operators_get_clear_errors(prior, y):
    ok = dict(noise_std=0.1, steps=5)
    fwd, adj = _pair()
    with pytest.raises(ValueError, match="adjoint does not match forward"):
        solve(prior, (fwd, lambda v: 2 * adj(v)), y, "hr", **ok)
    with pytest.raises(ValueError, match="forward is not linear"):
        solve(prior, (lambda x: fwd(x) ** 2, adj), y, "hr", **ok)
    with pytest.raises(ValueError, match=r"adjoint must map \[B, m\]"):
        solve(prior, (fwd, lambda v: v), y, "hr", **ok)
    with pytest.raises(TypeError, match="pair"):
        solve(prior, (fwd, adj, adj), y, "hr", **ok)
    with pytest.raises(TypeError, match=r"\[m, d\] matrix"):
        solve(prior, "blur", y, "hr", **ok)
    with pytest.raises(ValueError, match=r"must be \[m, d\]"):
        solve(prior, A[None], y, "hr", **ok)
    with pytest.raises(ValueError, match="not differentiable"):  # a numpy round trip loses the graph
        solve(prior, lambda x: torch.from_numpy(fwd(x).detach().numpy()), y, "dps", scale=0.3, **ok)
    with pytest.raises(ValueError, match=r"y must have shape \[M, 2\]"):
        solve(prior, TwoRows(), y[:, :1], "hr", **ok)

    class WrongBatch(TwoRows):
        def _forward(self, x):
            return super()._forward(x)[:1]

    with pytest.raises(ValueError, match=r"returned \(1, 2\), expected 3 x 2 values"):
        solve(prior, WrongBatch(), y, "dps", scale=0.3, **ok)

    class NoAdjoint(Operator):
        def _forward(self, x):
            return x[:, :2]

    with pytest.raises(NotImplementedError, match="defines no _adjoint.*is_linear = False"):
        solve(prior, NoAdjoint(), y, "hr", **ok)
    big = FunctionOperator(lambda x: x[:, :2], lambda v: torch.cat([v, v.new_zeros(v.shape[0], 4998)], 1), (5000,))
    with pytest.raises(NoPinvError, match="init='adjoint'"):
        big.pinv(torch.zeros(1, 2))
    with pytest.raises(ValueError, match="has no sample shape.*FunctionOperator"):
        solve(lambda x, s, c=None: x, fwd, y, "dps", scale=0.3, **ok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FunctionOperator(fwd, adj, (3,)).m == 2
