"""DDNM, PiGDM, DDRM, DiffPIR and DAPS against exact Gaussian-mixture posteriors (docs/methods/inverse.md, "DDNM" ...
"DAPS"): posterior-mean error, spread ratio and sliced W2 on a one-mode (Gaussian) and a several-mode (G1 ``y = -1.8``:
modes ``(-2, 2)`` / ``(-2, -2)``) problem, the exact consistency ``A x = y`` of the projection methods at
``sigma_y = 0``, the cost against a counting denoiser, and the options each method refuses.

Bounds: each metric's spread over repeated **exact** posterior draws of the same size (``N`` chains) gives
``exact mean + 5 sd``; on top of it each method has a bias allowance (``TOL``), about 1.5x its excess measured at 100
NFE, because none of these methods is an exact sampler. A solver that ignores the measurement (prior samples) fails
every mean bound by a wide margin (checked).
"""

import numpy as np
import pytest
import torch
from exact_refs import EXACT_CASES, exact_case

from steerdiff.app.protocols import inverse as V
from steerdiff.inverse import FunctionOperator, ImageMixture, Inpaint, Matrix, solve
from steerdiff.inverse.metrics import posterior_metrics
from steerdiff.models import GaussianMixture

N = 800
METHODS = ("ddnm", "pigdm", "ddrm", "diffpir", "daps")
RUN = {"daps": {"steps": 20}}  # 20 levels x 5 ODE steps = 100 NFE; the others 100 levels x 1 NFE
# bias allowance per method: (mean_err, |diversity - 1|, sw2)
TOL = {
    "gauss": {"ddnm": (0.03, 0.06, 0.03), "pigdm": (0.04, 0.06, 0.03), "ddrm": (0.1, 0.25, 0.08),
              "diffpir": (0.35, 0.45, 0.35), "daps": (0.3, 0.45, 0.3)},
    "g1": {"ddnm": (0.08, 0.15, 0.1), "pigdm": (0.25, 0.15, 0.3), "ddrm": (0.1, 0.15, 0.1),
           "diffpir": (0.2, 0.15, 0.15), "daps": (0.3, 0.15, 0.3)},
}




@pytest.fixture(scope="module", params=EXACT_CASES)
def case(request):
    """The problem, its posterior, and the exact-sample bounds (mean + 5 sd over 12 exact draws of N)."""
    return exact_case(request.param, N)


@pytest.mark.parametrize("method", METHODS)
def test_solver_matches_the_exact_posterior_within_sample_size_bounds(case, method):
    name, p, post, band = case
    res = solve(p.prior, p.operator, p.y, method, noise_std=p.noise_std, chains=N, generator=0, **RUN.get(method, {}))
    got = posterior_metrics(res.samples[0], post, seed=0)
    t_mean, t_div, t_sw = TOL[name][method]
    mean_b = band["mean_err"][0] + 5 * band["mean_err"][1] + t_mean
    div_b = abs(band["diversity"][0] - 1) + 5 * band["diversity"][1] + t_div
    sw_b = band["sw2"][0] + 5 * band["sw2"][1] + t_sw
    assert got["nonfinite"] == 0
    assert got["mean_err"] <= mean_b, (got, mean_b)
    assert abs(got["diversity"] - 1) <= div_b, (got, div_b)
    assert got["sw2"] <= sw_b, (got, sw_b)


def test_prior_samples_fail_the_mean_bounds(case):
    """The bounds can fail: samples of the prior (the measurement ignored) exceed every method's mean bound."""
    name, p, post, band = case
    prior = p.prior.sample(N, generator=torch.Generator().manual_seed(3))
    got = posterior_metrics(prior, post, seed=0)
    worst = band["mean_err"][0] + 5 * band["mean_err"][1] + max(t[0] for t in TOL[name].values())
    assert got["mean_err"] > worst


@pytest.mark.parametrize("method", ["ddnm", "ddrm", "diffpir"])
def test_noiseless_projection_methods_satisfy_the_measurement_exactly(method):
    """At sigma_y = 0 DDNM, DDRM and DiffPIR end on ``A x = y`` (DDNM: ``A^+ y + (I - A^+ A) x0``), on a dense
    matrix and on a matrix-free Inpaint (DDNM uses only ``A`` and ``A^+``)."""
    p = V.g1_problems(chains=50)[0]
    A = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
    res = solve(p.prior, Matrix(A), p.y, method, noise_std=0.0, chains=50, steps=20, generator=0)
    torch.testing.assert_close(res.samples[0] @ A.T, p.y.expand(50, 1), rtol=0, atol=1e-10)
    rng = np.random.default_rng(1)
    prior = ImageMixture(GaussianMixture([0.5, 0.5], rng.normal(0, 1, (2, 16)), 0.2), (1, 4, 4))
    op = Inpaint.center((1, 4, 4), hole=2)
    x = prior.sample(2, generator=torch.Generator().manual_seed(0))
    y = op.forward(x)
    res = solve(prior, op, y, method, noise_std=0.0, chains=3, steps=10, generator=0)
    torch.testing.assert_close(op.forward(res.flat()), y.repeat_interleave(3, 0), rtol=0, atol=1e-10)


class Counting:
    """A denoiser that counts its rows and the VJPs taken through it (a hook on its output)."""

    def __init__(self, prior):
        self.prior, self.rows, self.vjp_rows = prior, 0, 0

    def __call__(self, x, sigma, cond=None):
        self.rows += x.shape[0]
        out = self.prior(x, sigma, cond)
        if out.requires_grad:
            out.register_hook(lambda g: setattr(self, "vjp_rows", self.vjp_rows + g.shape[0]))
        return out


@pytest.mark.parametrize(("method", "options", "nfe", "vjp"), [
    ("ddnm", {}, 12, 0), ("pigdm", {}, 12, 12), ("ddrm", {}, 12, 0), ("diffpir", {}, 12, 0),
    ("daps", {"ode_steps": 3, "langevin_steps": 4}, 36, 0)])
def test_cost_is_counted_exactly(method, options, nfe, vjp):
    p = V.g1_problems(chains=5)[0]
    d = Counting(p.prior)
    res = solve(d, p.operator, p.y, method, noise_std=0.2, chains=5, steps=12, generator=0, **options)
    assert d.rows == 5 * nfe and res.nfe == nfe
    assert d.vjp_rows == 5 * vjp and res.nfe_vjp == vjp
    assert res.extras["operator_calls"] == (12 * 4 if method == "daps" else 0)  # SVD-basis methods: none


class CountingMatrix(Matrix):
    """A dense operator counting its forward and pseudo-inverse applications (batched calls)."""

    calls = 0

    def _forward(self, x):
        CountingMatrix.calls += 1
        return super()._forward(x)

    def _pinv(self, y):
        CountingMatrix.calls += 1
        return super()._pinv(y)


@pytest.mark.parametrize(("method", "noise_std", "options", "per_level"), [
    ("ddnm", 0.0, {}, 2), ("daps", 0.2, {"ode_steps": 1, "langevin_steps": 3}, 3)])
def test_operator_calls_are_counted_exactly(method, noise_std, options, per_level):
    p = V.g1_problems(chains=3)[0]
    op = CountingMatrix(p.operator.A)
    CountingMatrix.calls = 0
    res = solve(p.prior, op, p.y, method, noise_std=noise_std, chains=3, steps=7, generator=0, **options)
    assert res.extras["operator_calls"] == 7 * per_level
    assert CountingMatrix.calls == 7 * per_level


@pytest.mark.parametrize(("method", "options", "name"), [
    ("ddnm", {"eta": 1.5}, "eta"), ("pigdm", {"scale": 0.0}, "scale"), ("ddrm", {"eta_b": -0.1}, "eta_b"),
    ("diffpir", {"lam": 0}, "lam"), ("diffpir", {"zeta": 2}, "zeta"), ("daps", {"ode_steps": 0}, "ode_steps"),
    ("daps", {"lr": -1.0}, "lr"), ("daps", {"lr_scale": 2.0}, "lr_scale"), ("ddrm", {"bogus": 1}, "bogus")])
def test_bad_options_are_named(method, options, name):
    p = V.g1_problems(chains=2)[0]
    with pytest.raises(ValueError, match=name):
        solve(p.prior, p.operator, p.y, method, noise_std=0.2, chains=2, steps=3, **options)


def test_refusals_name_the_reason():
    p = V.g1_problems(chains=2)[0]
    square = FunctionOperator(lambda x: x.square().sum(1, keepdim=True), shape=(2,))  # no adjoint: nonlinear
    for method in ("ddnm", "pigdm", "ddrm", "diffpir"):
        with pytest.raises(ValueError, match="linear"):
            solve(p.prior, square, p.y, method, noise_std=0.2, chains=2, steps=3)
    res = solve(p.prior, square, p.y, "daps", noise_std=0.2, chains=2, steps=3, lr=1e-3, langevin_steps=5)
    assert torch.isfinite(res.samples).all()  # a nonlinear operator runs with a given lr (autograd gradient)
    with pytest.raises(ValueError, match="noise_std > 0"):
        solve(p.prior, p.operator, p.y, "daps", noise_std=0.0, chains=2, steps=3)
    # a flow schedule's first level inf is taken (tests/inverse/test_flow_inverse_new_solvers.py checks the runs)
    res = solve(p.prior, p.operator, p.y, "ddrm", noise_std=0.2, chains=2, sigmas=[float("inf"), 1.0, 0.1])
    assert torch.isfinite(res.samples).all()


def test_inpaint_svd_is_matrix_free_and_matches_the_dense_one():
    """Inpaint's SVD is a permutation: the same samples as the dense SVD where both exist (the solvers that draw
    their noise in x-space), and DDRM runs beyond the dense limit (80 x 80) with ``A x = y`` exactly."""
    from steerdiff.inverse.linear import MaskSpectral, Spectral

    rng = np.random.default_rng(2)
    prior = ImageMixture(GaussianMixture([0.5, 0.5], rng.normal(0, 1, (2, 16)), 0.3), (1, 4, 4))
    op = Inpaint.center((1, 4, 4), hole=2)
    y = op.forward(prior.sample(1, generator=torch.Generator().manual_seed(0)))
    for method in ("ddnm", "pigdm", "diffpir"):
        fast = solve(prior, op, y, method, noise_std=0.1, chains=4, steps=15, generator=0)
        assert isinstance(op._spectral_cache[(op.shape, torch.float64, torch.device("cpu"))], MaskSpectral)
        dense = Inpaint.center((1, 4, 4), hole=2)
        dense._spectral_cache = {(dense.shape, torch.float64, torch.device("cpu")):
                                 Spectral(dense, torch.float64, torch.device("cpu"), method)}
        slow = solve(prior, dense, y, method, noise_std=0.1, chains=4, steps=15, generator=0)
        assert not any(isinstance(v, MaskSpectral) for v in dense._spectral_cache.values())
        torch.testing.assert_close(fast.samples, slow.samples, rtol=1e-9, atol=1e-9)

    class StdNormal:  # the N(0, I) prior's exact denoiser on 80 x 80 images
        sample_shape = (1, 80, 80)

        def __call__(self, x, sigma, cond=None):
            return x / (1 + sigma.reshape(-1, 1, 1, 1) ** 2)

    big = Inpaint.random((1, 80, 80), keep=0.3, seed=0)
    y = torch.randn(1, big.bind((1, 80, 80)).m, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    res = solve(StdNormal(), big, y, "ddrm", noise_std=0.0, chains=2, steps=5, generator=0)
    torch.testing.assert_close(big.bind((1, 80, 80)).forward(res.flat()), y.expand(2, -1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_state_dtype_follows_the_measurement(method):
    """float32 measurements give float32 chains (the SVD is cast to the state's dtype), finite. (The draws differ
    between dtypes, so the samples are not compared.)"""
    p = V.g1_problems(chains=4)[0]
    for dtype in (torch.float32, torch.float64):
        res = solve(p.prior, Matrix(p.operator.A.to(dtype)), p.y.to(dtype), method, noise_std=0.2, chains=4,
                    steps=10, generator=0)
        assert res.samples.dtype == dtype and torch.isfinite(res.samples).all()


@pytest.mark.parametrize(("method", "noise_std"), [("pigdm", 0.1), ("diffpir", 0.1), ("diffpir", 0.0)])
def test_conjugate_gradients_match_the_svd(method, noise_std):
    """The matrix-free path (``linsolve="cg"``, the default beyond 4096 unknowns) gives the SVD path's samples on a
    problem small enough for both (CG converges in at most m = 2 iterations here; the noise is drawn in x-space)."""
    p = V.g2_problem(0, chains=4)
    runs = {ls: solve(p.prior, p.operator, p.y, method, noise_std=noise_std, chains=4, steps=12, generator=0,
                      linsolve=ls) for ls in ("svd", "cg")}
    assert runs["svd"].options["linsolve"] == "svd" and runs["cg"].extras["operator_calls"] > 0
    torch.testing.assert_close(runs["cg"].samples, runs["svd"].samples, rtol=1e-7, atol=1e-7)
    with pytest.raises(ValueError, match="linsolve"):
        solve(p.prior, p.operator, p.y, method, noise_std=0.1, chains=1, steps=2, linsolve="lu")


def test_large_operators_use_cg_or_are_refused_by_name():
    """Beyond 4096 unknowns (80 x 80 average pooling): PiGDM and DiffPIR switch to CG, DDRM and DDNM+ (which need
    the SVD) are refused with an error naming the method."""
    from steerdiff.inverse import AvgPoolSR
    from steerdiff.inverse.base import NoPinvError

    class StdNormal:
        sample_shape = (1, 80, 80)

        def __call__(self, x, sigma, cond=None):
            return x / (1 + sigma.reshape(-1, 1, 1, 1) ** 2)

    op = AvgPoolSR(2)
    y = torch.zeros(1, 1600, dtype=torch.float64)
    for method in ("pigdm", "diffpir"):
        res = solve(StdNormal(), op, y, method, noise_std=0.1, chains=1, steps=3, generator=0, cg_iters=5)
        assert res.options["linsolve"] == "cg" and torch.isfinite(res.samples).all()
    for method in ("ddrm", "ddnm"):
        with pytest.raises(NoPinvError, match=method):
            solve(StdNormal(), op, y, method, noise_std=0.1, chains=1, steps=3)


def test_daps_local_rule_on_a_linear_map_seen_as_nonlinear_equals_the_linear_rule():
    """DAPS's step rule for an operator without an adjoint uses the local Jacobian's norm at each level's ``x0h``
    (power iteration by central differences + VJP). On a linear map hidden behind a forward-only operator the
    Jacobian is the matrix everywhere, so every level's per-row step must equal the linear rule's (``||A||_2^2``
    from the SVD), and the samples must follow (same noise draws: the power iteration has its own stream)."""
    p = V.g1_problems(chains=16)[0]
    assert isinstance(p.operator, Matrix)
    mat = p.operator.A
    hidden = FunctionOperator(lambda x: x.flatten(1) @ mat.T.to(x.dtype), shape=p.operator.shape)
    kw = {"noise_std": 0.2, "chains": 16, "steps": 6, "generator": 3, "langevin_steps": 20}
    lin = solve(p.prior, p.operator, p.y, "daps", **kw)
    loc = solve(p.prior, hidden, p.y, "daps", **kw)
    assert loc.extras["jacobian_iterations"] == 10 + 3 * 5
    for a, b in zip(lin.extras["lr"], loc.extras["lr"], strict=True):
        torch.testing.assert_close(b.flatten(), torch.full_like(b.flatten(), a), rtol=2e-3, atol=0)
    torch.testing.assert_close(loc.samples, lin.samples, rtol=0, atol=1e-3)
