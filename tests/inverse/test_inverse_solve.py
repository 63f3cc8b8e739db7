"""``solve``: shapes and costs, equivalences (beta = 1 is DR, beta = 0 is CR), per-chain randomness, the DPS NaN
guard, nonlinear and Poisson measurements, and clear errors for bad input."""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.inverse import (
    HDR,
    Downsample,
    Inpaint,
    Matrix,
    NoAdjointError,
    PoissonNoise,
    exact_posterior,
    measure,
    solve,
    task_operator,
)
from steerdiff.models import GaussianMixture

F64 = torch.float64


@pytest.fixture(scope="module")
def g1():
    prior = GaussianMixture([0.4, 0.1, 0.3, 0.2], [[2, 2], [2, -2], [-2, 2], [-2, -2]], 0.3, labels=[0, 1, 2, 3])
    return prior, Matrix(torch.tensor([[1.0, 0.0]], dtype=F64))


Y3 = torch.tensor([[1.9], [-1.0], [0.3]], dtype=F64)


@pytest.mark.parametrize("method", ["dps", "dr", "cr", "hr"])
def test_shapes_costs_and_callback(g1, method):
    prior, op = g1
    calls = []
    opts = {"scale": 0.2} if method == "dps" else {}
    res = solve(prior, op, Y3, method, noise_std=0.2, chains=5, steps=20, callback=calls.append, **opts)
    assert res.samples.shape == (3, 5, 2) and res.samples.dtype == F64
    assert res.nfe == 20 and res.nfe_vjp == (20 if method == "dps" else 0) and len(calls) == 20
    assert res.mean().shape == (3, 2) and res.std().shape == (3, 2) and res.n_nonfinite == 0
    assert res.summary()["chains"] == 5 and res.chi2(op, Y3).shape == (3, 5)


def test_beta_one_is_dr_and_beta_zero_is_cr(g1):
    prior, op = g1
    kw = dict(noise_std=0.2, chains=4, steps=30, generator=7)
    for beta, method in ((1.0, "dr"), (0.0, "cr")):  # at equal options: HR's default caps its step (HR_LR_CAP)
        for cap in (None, 1.0):
            torch.testing.assert_close(solve(prior, op, Y3, "hr", beta=beta, lr_cap=cap, **kw).samples,
                                       solve(prior, op, Y3, method, lr_cap=cap, **kw).samples, rtol=0, atol=0)


def test_dps_paper_step_form_is_the_code_form_with_twice_zeta(g1):
    prior, op = g1
    kw = dict(noise_std=0.2, chains=3, steps=30, generator=4)
    code = solve(prior, op, Y3, "dps", scale=0.4, **kw).samples
    paper = solve(prior, op, Y3, "dps", scale=0.2, step_form="paper", **kw).samples  # zeta' grad||r||^2 / ||r||
    torch.testing.assert_close(paper, code)


@pytest.mark.parametrize("method", ["dps", "hr"])
def test_a_chain_does_not_depend_on_its_batch(g1, method):
    prior, op = g1
    opts = {"scale": 0.2} if method == "dps" else {}
    batch = solve(prior, op, Y3, method, noise_std=0.2, chains=2, steps=30, generator=0, **opts).samples
    alone = solve(prior, op, Y3[1:2], method, noise_std=0.2, chains=2, steps=30, generator=[2, 3], **opts).samples
    # DPS exactly; DR/CR/HR up to Adam's eps against gradients carrying 1/B (the published code's .mean() scaling)
    torch.testing.assert_close(alone[0], batch[1], rtol=0, atol=0 if method == "dps" else 1e-4)


def test_condition_restricts_a_labelled_mixture(g1):
    prior, op = g1
    y = torch.tensor([[0.0]], dtype=F64)  # y = 0 keeps all four modes; the label picks one
    res = solve(prior, op, y, "dps", noise_std=0.2, chains=40, steps=30, scale=0.2, cond=torch.tensor([3]))
    assert (res.samples[0, :, 1] < 0).float().mean() > 0.9  # component 3 is (-2, -2)


class NaNRow:
    """The G1 prior, but row ``row`` of every batch turns NaN below ``sigma_nan``."""

    def __init__(self, prior, row, sigma_nan):
        self.prior, self.row, self.sigma_nan = prior, row, sigma_nan
        self.sample_shape = prior.sample_shape

    def __call__(self, x, sigma, cond=None):
        d = self.prior(x, sigma, cond)
        if float(sigma[0]) < self.sigma_nan:
            d = d.clone()
            d[self.row] = math.nan
        return d


def test_dps_guards_and_counts_nonfinite_chains(g1):
    prior, op = g1
    kw = dict(noise_std=0.2, chains=3, steps=30, scale=0.2, generator=0)
    good = solve(prior, op, Y3[:1], "dps", **kw)
    with pytest.warns(RuntimeWarning, match="1 of 3 chains turned non-finite"):
        bad = solve(NaNRow(prior, 1, 1.0), op, Y3[:1], "dps", **kw)
    assert bad.n_nonfinite == 1 and bad.nonfinite.tolist() == [[False, True, False]]
    first = int((bad.sigmas < 1.0).nonzero()[0])
    assert bad.dead_at[0, 1] == first  # the level where it turned non-finite is recorded
    assert torch.isnan(bad.samples[0, 1]).all()  # kept, as NaN, never dropped
    torch.testing.assert_close(bad.samples[0, [0, 2]], good.samples[0, [0, 2]])  # the others are untouched
    torch.testing.assert_close(bad.mean()[0], good.samples[0, [0, 2]].mean(0))
    with pytest.warns(RuntimeWarning, match="2 of 2"):
        diverged = solve(prior, op, Y3[:1], "dps", noise_std=0.2, chains=2, steps=10, scale=1e308)
    assert diverged.n_nonfinite == 2 and torch.isnan(diverged.samples).all()


def test_variational_methods_name_the_step_of_a_nan_denoiser(g1):
    prior, op = g1
    with pytest.raises(FloatingPointError, match=r"step 22 \(sigma=0\.864"):
        solve(NaNRow(prior, 0, 1.0), op, Y3, "hr", noise_std=0.2, steps=30)


def test_nonlinear_hdr_and_poisson_measurements():
    prior = GaussianMixture([0.5, 0.5], [[0.3] * 4, [-0.3] * 4], 0.05)
    x0 = prior.sample(3, generator=torch.Generator().manual_seed(0))
    op = HDR((4,))
    y = measure(op, x0, 0.02, generator=1)
    prior_fit = (y[:, None] - op(prior.sample(300, generator=torch.Generator().manual_seed(5)))).square().sum(-1)
    for method, opts in (("dps", {"scale": 0.1}), ("hr", {}), ("dr", {})):
        res = solve(prior, op, y, method, noise_std=0.02, chains=4, steps=50, **opts)
        assert res.n_nonfinite == 0 and res.residual(op, y).mean() < 0.05 * prior_fit.mean()
        assert (res.mean() - x0).abs().max() < 0.15
    # Poisson: DPS weights its residual norm by Lambda; counts are simulated per row
    lin = Matrix(torch.eye(4, dtype=F64))
    yp = measure(lin, x0, noise=PoissonNoise(), generator=2)
    # the Lambda-norm is ~9x the plain one at these counts, so the step is ~9x smaller than a Gaussian run's
    res = solve(prior, lin, yp, "dps", noise=PoissonNoise(), chains=4, steps=50, scale=0.02)
    plain = solve(prior, lin, yp, "dps", noise_std=0.06, chains=4, steps=50, scale=0.02)
    assert res.n_nonfinite == 0 and not torch.allclose(res.samples, plain.samples)
    assert (res.mean() - x0).abs().max() < 0.2 and res.noise_std == PoissonNoise().std


def test_digits_unet_runs_every_method():
    model = sd.models.load("digits").eval().requires_grad_(False)
    x0 = sd.data.digits.load_digits("test")[0][:2]
    for task in ("inpaint-center", "sr2"):
        op = task_operator(task)
        y = measure(op, x0, 0.05, generator=0)
        for method in ("dps", "dr", "cr", "hr"):
            res = solve(model, op, y, method, noise_std=0.05, chains=2, steps=8)
            assert res.samples.shape == (2, 2, 1, 8, 8) and torch.isfinite(res.samples).all()


def test_bad_input_gets_clear_errors(g1):
    prior, op = g1
    ok = dict(noise_std=0.2, steps=5)
    with pytest.raises(ValueError, match=r"y must have shape \[M, 1\]"):
        solve(prior, op, torch.zeros(3, 2, dtype=F64), "hr", **ok)
    with pytest.raises(ValueError, match="NaN"):
        solve(prior, op, torch.tensor([[math.nan]], dtype=F64), "dps", scale=0.2, **ok)
    with pytest.raises(ValueError, match="noise_std must be a finite number >= 0"):
        solve(prior, op, Y3, "hr", noise_std=-0.1)
    with pytest.raises(ValueError, match="noise_std is required"):
        solve(prior, op, Y3, "hr")
    with pytest.raises(ValueError, match="method must be one of"):
        solve(prior, op, Y3, "no-such-solver", **ok)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['beta'\] for method 'dr'"):
        solve(prior, op, Y3, "dr", beta=0.5, **ok)
    with pytest.raises(ValueError, match="beta must lie in"):
        solve(prior, op, Y3, "hr", beta=1.5, **ok)
    with pytest.raises(ValueError, match="with Poisson noise pass scale="):  # the step rule is for Gaussian noise
        solve(prior, op, Y3, "dps", noise="poisson", steps=5)
    with pytest.raises(ValueError, match="scale must be a positive number, one per level, 'auto' or 'config'"):
        solve(prior, op, Y3, "dps", scale="rule", **ok)
    with pytest.raises(ValueError, match="scale='config': DPS has no published step size"):
        solve(prior, op, Y3, "dps", scale="config", **ok)
    with pytest.raises(ValueError, match="chains"):
        solve(prior, op, Y3, "hr", chains=0, **ok)
    with pytest.raises(ValueError, match="init must have shape"):
        solve(prior, op, Y3, "hr", init=torch.zeros(2, 2, dtype=F64), **ok)
    with pytest.raises(ValueError, match="strictly decreasing"):
        solve(prior, op, Y3, "hr", noise_std=0.2, sigmas=torch.tensor([1.0, 2.0]))
    image_prior = sd.inverse.ImageMixture(GaussianMixture([1.0], [[0.0] * 64], 1.0), (1, 8, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(7, 7\) does not fit"):
        solve(image_prior, Inpaint(torch.ones(7, 7)), torch.zeros(1, 49, dtype=F64), "hr", **ok)
    with pytest.raises(ValueError, match="not divisible"):
        solve(sd.inverse.ImageMixture(GaussianMixture([1.0], [[0.0] * 63], 1.0), (1, 7, 9)), Downsample(2),
              torch.zeros(1, 12, dtype=F64), "hr", **ok)
    hdr = HDR((2,))
    with pytest.raises(NoAdjointError, match="HDR.*nonlinear.*adjoint"):
        solve(prior, hdr, torch.zeros(1, 2, dtype=F64), "hr", init="adjoint", **ok)
    with pytest.raises(NoAdjointError, match="nonlinear"):
        exact_posterior(prior, hdr, torch.zeros(1, 2, dtype=F64), 0.1)


def test_predicted_noise_chain_stays_calibrated_with_an_exact_prior_and_grows_with_an_overconfident_one(g1):
    """HR feeds eps_hat forward (docs/methods/inverse.md, "CR and HR"). With the exact mixture denoiser its rms
    stays near 1 at every level; a denoiser whose noise estimate is 1.3x too large makes the chain grow level after
    level (the mechanism behind HR's divergence under the tiny MLP digits prior)."""
    from steerdiff.app.protocols.inverse import predicted_noise_rms

    prior, op = g1
    exact = predicted_noise_rms(prior, op, Y3, chains=4)
    assert len(exact["rms"]) == 100 and max(exact["rms"]) < 1.6 and exact["rms"][0] > 0.9

    def overconfident(x, sigma, cond=None):
        return x - 1.3 * (x - prior(x, sigma, cond))

    with pytest.warns(RuntimeWarning, match="amplifies its own noise estimate"):
        grown = predicted_noise_rms(overconfident, op, Y3, chains=4)
    assert grown["max"] > 20 * max(exact["rms"])
    assert grown["rms"][50] > grown["rms"][25] > grown["rms"][5]  # it compounds from level to level


def test_noise_feedback_gain_is_at_most_one_for_an_exact_denoiser_and_flags_a_non_monotone_one():
    """d eps_hat / d eps = I - dD/dx; for an exact denoiser dD/dx = Cov[x0|x] / sigma^2 (symmetric PSD, and below I
    for a Gaussian prior), so HR's noise recursion cannot expand; an over-estimated noise (eps_hat x 1.6) shows up as
    negative Jacobian eigenvalues and a loop gain sqrt(1 - beta) * 1.6 > 1."""
    from steerdiff.app.protocols.inverse import noise_feedback_gain

    cov = torch.diag(torch.tensor([0.5, 0.1, 1.0, 0.02], dtype=F64))
    prior = GaussianMixture([1.0], torch.zeros(1, 4, dtype=F64), cov[None])
    x0 = prior.sample(6, generator=torch.Generator().manual_seed(0))
    for sigma in (2.0, 0.5, 0.05):
        exact = noise_feedback_gain(prior, x0, sigma)
        # the Gaussian's Jacobian is diag(c / (c + sigma^2)), independent of x
        lam = cov.diagonal() / (cov.diagonal() + sigma**2)
        assert min(exact["min_eig"]) == pytest.approx(float(lam.min()), abs=1e-9)
        assert max(exact["gain"]) == pytest.approx(float((1 - lam).max()), abs=1e-9) and max(exact["gain"]) <= 1

        def noisy(x, s, cond=None):
            return x - 1.6 * (x - prior(x, s, cond))

        bad = noise_feedback_gain(noisy, x0, sigma)
        assert max(bad["gain"]) == pytest.approx(1.6 * float((1 - lam).max()), abs=1e-9)
        if sigma >= 0.5:  # where the prior's own shrinkage is small, the 1.6x error makes the loop expand
            assert min(bad["min_eig"]) < 0 and max(bad["loop_gain"]) > 1.0


def test_hr_warns_once_when_its_reused_noise_blows_up_and_stays_silent_with_an_exact_prior(g1):
    import warnings

    prior, op = g1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the exact denoiser never trips it
        solve(prior, op, Y3, "hr", noise_std=0.2, chains=4, generator=0)

    def overconfident(x, sigma, cond=None):
        return x - 1.3 * (x - prior(x, sigma, cond))

    with pytest.warns(RuntimeWarning, match="amplifies its own noise estimate") as record:
        solve(overconfident, op, Y3, "hr", noise_std=0.2, chains=4, generator=0)
    assert sum("amplifies" in str(w.message) for w in record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DR draws fresh noise every level: nothing to warn about
        solve(overconfident, op, Y3, "dr", noise_std=0.2, chains=4, generator=0)


def test_digits_prior_loads_a_saved_model_by_name_or_directory(tmp_path):
    from steerdiff.app.protocols import inverse as V
    from steerdiff.models.io import load, save

    shipped = V.digits_prior("mlp")
    by_name = V.digits_prior("model:digits_mlp")
    save(load("digits_mlp"), tmp_path / "copy")
    by_dir = V.digits_prior(f"model:{tmp_path / 'copy'}")
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.full((3,), 0.5)
    with torch.no_grad():
        ref = shipped(x, sigma)
        assert torch.equal(by_name(x, sigma), ref) and torch.equal(by_dir(x, sigma), ref)
    assert not any(p.requires_grad for p in by_dir.parameters())
    for bad in ("model:", "vae"):
        with pytest.raises(ValueError, match="model:<name or directory>"):
            V.digits_prior(bad)


def test_more_bad_inputs_get_clear_errors_before_any_denoiser_call(g1):
    """Half-precision or empty measurements, a nonlinear operator without a pseudo-inverse, a non-array init: each a
    ValueError/TypeError naming the argument, raised before the denoiser runs."""
    prior, op = g1
    calls = []

    def counted(x, sigma, cond=None):
        calls.append(1)
        return prior(x, sigma, cond)

    counted.sample_shape = prior.sample_shape
    ok = dict(noise_std=0.2, steps=5)
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(ValueError, match=r"y must be float32 or float64.*y\.float\(\)"):
            solve(counted, op, Y3.to(dtype), "hr", **ok)
    with pytest.raises(ValueError, match=r"y must have shape \[M, 1\] with M >= 1"):
        solve(counted, op, torch.zeros(0, 1, dtype=F64), "hr", **ok)
    with pytest.raises(TypeError, match="init must be one of"):
        solve(counted, op, Y3, "hr", init=[[0.0, 0.0]], **ok)
    with pytest.raises(ValueError, match="chains must be a positive integer"):
        solve(counted, op, Y3, "hr", chains=2.0, **ok)

    class Squash(sd.inverse.Operator):
        is_linear = False

        def _forward(self, x):
            return torch.tanh(x[:, :1])

    with pytest.raises(sd.inverse.NoPinvError, match="init='zeros'"):
        solve(counted, Squash(), Y3 / 4, "hr", **ok)
    assert not calls
    with pytest.raises(ValueError, match="x0 contains NaN"):
        measure(op, torch.full((2, 2), math.nan, dtype=F64), 0.1)


def test_numeric_arguments_accept_numpy_and_tensor_scalars(g1):
    """noise_std as a 0-d tensor or numpy float, chains / steps as numpy ints, lr as numpy float32, init as a numpy
    array: the same run as with Python numbers and a tensor."""
    import numpy as np

    prior, op = g1
    init = np.zeros((3, 2))
    ref = solve(prior, op, Y3, "hr", noise_std=0.2, chains=2, steps=6, lr=0.25, init=torch.from_numpy(init))
    for noise_std in (torch.tensor(0.2), np.float64(0.2)):
        res = solve(prior, op, Y3, "hr", noise_std=noise_std, chains=np.int64(2), steps=np.int64(6),
                    lr=np.float32(0.25), init=init)
        torch.testing.assert_close(res.samples, ref.samples, rtol=1e-6, atol=1e-6)
        assert res.noise_std == pytest.approx(0.2)
    torch.testing.assert_close(measure(op.A, Y3.new_zeros(3, 2), 0.1, generator=0),
                               measure(op, Y3.new_zeros(3, 2), 0.1, generator=0))
