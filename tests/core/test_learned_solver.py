"""The learned few-step solver (steerdiff/core/learned_solver.py) on exact mixtures: at its initial parameters it is
DPM-Solver++ 2M (k-diffusion's ``sample_dpmpp_2m``, and ours from sigma = inf on a flow model); fitted on some noises
it lowers the endpoint error against the fine ODE solution, and the distance to the mixture, on other noises."""

from __future__ import annotations

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core.learned_solver import LearnedSolver, dpmpp_2m_weights, fit_learned_solver
from steerdiff.core.schedule_opt import reference_solution
from steerdiff.metrics.distributions import sliced_wasserstein
from steerdiff.models.gmm import builtin_mixture
from tests.core.test_samplers_vs_kdiffusion import _kd_model, _load_kdiffusion_sampling
from tests.exact_refs import mixture_as_flow


def test_initial_solver_is_kdiffusion_dpmpp_2m():
    kd = _load_kdiffusion_sampling()
    mix = builtin_mixture("gmm16d")
    sig = sd.sigmas.karras(7, 0.002, 80.0, 7.0)
    noise = sd.core.randn((64, mix.dim), seeds=5, dtype=torch.float64)
    sol = LearnedSolver.dpmpp_2m(sig)
    x = sd.sample(mix, noise, sol.sigmas, method="learned", solver=sol)
    ref = kd.sample_dpmpp_2m(_kd_model(mix), noise * sig[0], sig, disable=True)
    assert (x - ref).abs().max() <= 1e-10 * ref.abs().max()


def test_initial_solver_is_dpmpp_2m_from_sigma_inf():
    flow_model = mixture_as_flow(builtin_mixture("gmm2d"), amp=0.3)
    sig = sd.sigmas.flow(6, grid="flux")
    assert math.isinf(sig[0])
    noise = sd.core.randn((64, 2), seeds=9, dtype=torch.float64)
    sol = LearnedSolver.dpmpp_2m(sig)
    x = sd.sample(flow_model, noise, sol.sigmas, method="learned", solver=sol)
    ref = sd.sample(flow_model, noise, sig, method="dpmpp_2m")
    assert (x - ref).abs().max() <= 1e-12


def test_weights_are_exact_on_a_polynomial_in_lambda():
    # Second order: a data prediction linear in lambda = -log sigma is extrapolated exactly by the 2M weights (rows
    # with history), i.e. sum_j B_ij = 1 and sum_j B_ij lambda_j = the midpoint rule's lambda_i + h_i / 2.
    sig = torch.tensor([80.0, 9.0, 1.3, 0.2, 0.01, 0.0], dtype=torch.float64)
    b = dpmpp_2m_weights(sig)
    lam = -torch.log(sig[:-1])
    assert torch.allclose(b.sum(1), torch.ones(5, dtype=torch.float64))
    for i in (1, 2, 3):
        h = math.log(float(sig[i] / sig[i + 1]))
        assert float(b[i] @ lam) == pytest.approx(float(lam[i]) + h / 2, rel=1e-12)


@pytest.fixture(scope="module")
def fitted():
    mix = builtin_mixture("gmm2d")
    init = sd.sigmas.karras(5, 0.002, 80.0, 7.0)
    return mix, init, fit_learned_solver(mix, init, n=128, seed=0, iters=80, batch=64, ref_steps=100)


def test_fit_lowers_held_out_endpoint_error_and_distance(fitted):
    mix, init, sol = fitted
    noise = sd.core.randn((1000, mix.dim), seeds=10**6, dtype=torch.float64)  # not the fitting seeds
    ref = reference_solution(mix, noise, 80.0, 0.002, ref_steps=200)
    exact = mix.sample(1000, generator=torch.Generator().manual_seed(3))
    x0 = sd.sample(mix, noise, init, method="dpmpp_2m")
    x1 = sd.sample(mix, noise, sol.sigmas, method="learned", solver=sol)
    e0, e1 = (x0 - ref).pow(2).mean(), (x1 - ref).pow(2).mean()
    assert e1 < 0.5 * e0, (e1, e0)
    assert sliced_wasserstein(x1, exact) < sliced_wasserstein(x0, exact)
    assert sol.meta["loss"] <= sol.meta["init_loss"]
    assert float(sol.sigmas[0]) == 80.0 and float(sol.sigmas[-1]) == 0.0
    assert (sol.sigmas[1:] < sol.sigmas[:-1]).all()


def test_save_load_round_trip_and_refusals(fitted, tmp_path):
    mix, init, sol = fitted
    path = tmp_path / "solver.safetensors"
    sol.save(path)
    back = LearnedSolver.load(path)
    for name in ("sigmas", "gamma", "beta", "shift"):
        assert torch.equal(getattr(back, name), getattr(sol, name))
    assert back.meta["n"] == 128
    noise = sd.core.randn((8, mix.dim), seeds=1, dtype=torch.float64)
    assert torch.equal(sd.sample(mix, noise, back.sigmas, method="learned", solver=str(path)),
                       sd.sample(mix, noise, sol.sigmas, method="learned", solver=sol))
    with pytest.raises(ValueError, match="solver's own schedule"):
        sd.sample(mix, noise, init, method="learned", solver=sol)
    with pytest.raises(ValueError, match="needs solver="):
        sd.sample(mix, noise, init, method="learned")
    other = tmp_path / "other.safetensors"
    sd.io.save_tensors({"sigmas": init}, other)
    with pytest.raises(ValueError, match="not a learned solver"):
        LearnedSolver.load(other)
    with pytest.raises(ValueError, match="iters"):
        fit_learned_solver(mix, init, iters=-1)
    with pytest.raises(ValueError, match="batch"):
        fit_learned_solver(mix, init, batch=0)


def test_cli_learned_schedule_then_sample_with_it(tmp_path):
    from click.testing import CliRunner

    from steerdiff.app.cli import main

    out = tmp_path / "solver.safetensors"
    r = CliRunner().invoke(main, ["schedule", "--model", "gmm2d", "--sampler", "dpmpp_2m", "--steps", "3", "--n", "32",
                                  "--sweeps", "1", "--ref-steps", "20", "--learned", "--iters", "5", "--batch", "16",
                                  "--out", str(out),
                                  "--no-progress"])
    assert r.exit_code == 0, r.output
    sol = LearnedSolver.load(out)
    assert sol.steps == 3 and sol.meta["model"] == "gmm2d" and sol.meta["loss"] <= sol.meta["init_loss"]
    r = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--solver", str(out), "--n", "16", "--out",
                                  str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code == 0, r.output
    import json

    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["nfe"] == 3 and metrics["schedule"]["kind"] == "learned"
    assert metrics["schedule"]["sigmas"] == sol.sigmas.tolist()
    for extra, name in ((["--method", "euler"], "--method"), (["--rho", "3"], "--rho")):
        r = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--solver", str(out), *extra, "--out",
                                      str(tmp_path / "o2")])
        assert r.exit_code != 0 and name in r.output, r.output
    r = CliRunner().invoke(main, ["schedule", "--model", "gmm2d", "--sampler", "euler", "--learned", "--out",
                                  str(tmp_path / "x.safetensors")])
    assert r.exit_code != 0 and "--sampler" in r.output


def test_fit_from_sigma_inf_on_a_flow_model():
    flow_model = mixture_as_flow(builtin_mixture("gmm2d"), amp=0.3)
    flow_model.sample_shape = (2,)  # what a shipped model carries; the fit draws its noises in this shape
    sol = fit_learned_solver(flow_model, sd.sigmas.flow(4, grid="flux"), n=64, iters=30, batch=32, ref_steps=50,
                             dtype=torch.float64)
    assert math.isinf(sol.sigmas[0]) and sol.shift[0] == 0 and (sol.sigmas[2:] < sol.sigmas[1:-1]).all()
    assert sol.meta["loss"] < 0.9 * sol.meta["init_loss"]
    noise = sd.core.randn((16, 2), seeds=77, dtype=torch.float64)
    assert torch.isfinite(sd.sample(flow_model, noise, sol.sigmas, method="learned", solver=sol)).all()


def test_multiscale_loss_is_l2_at_one_scale_and_averages_block_means():
    from steerdiff.core.learned_solver import endpoint_loss

    g = torch.Generator().manual_seed(0)
    ref, x = torch.randn(6, 2, 8, 8, generator=g, dtype=torch.float64), torch.randn(6, 2, 8, 8, generator=g,
                                                                                  dtype=torch.float64)
    l2 = endpoint_loss(None, ref, None, "l2")
    assert float(endpoint_loss(None, ref, None, "multiscale", scales=(1,))(x, None)) == float(l2(x, None))
    idx = torch.tensor([4, 1])
    assert float(endpoint_loss(None, ref, None, "multiscale", scales=(1,))(x[idx], idx)) == pytest.approx(
        float((x[idx] - ref[idx]).pow(2).mean()), rel=1e-12)

    def blocks(d, k):  # k x k block means by reshaping (independent of avg_pool2d)
        return d.reshape(6, 2, 8 // k, k, 8 // k, k).mean((3, 5))

    d = x - ref
    want = sum(blocks(d, k).pow(2).mean() for k in (1, 2, 4)) / 3
    assert float(endpoint_loss(None, ref, None, "multiscale", scales=(1, 2, 4))(x, None)) == pytest.approx(
        float(want), rel=1e-12)
    with pytest.raises(ValueError, match="multiscale"):
        endpoint_loss(None, ref.flatten(1), None, "multiscale")
    with pytest.raises(ValueError, match="scales"):
        endpoint_loss(None, ref, None, "multiscale", scales=(0, 2))
    with pytest.raises(ValueError, match="loss"):
        endpoint_loss(None, ref, None, "l1")


def test_denoiser_loss_on_a_gaussian_is_the_posterior_mean_map():
    # One Gaussian N(mu, C): D(x, s) = mu + C (C + s^2 I)^{-1} (x - mu) is affine, so the shared noise cancels and
    # the loss is mean |A (x - r)|^2 with A = C (C + s^2 I)^{-1} (closed form, no noise draw involved).
    from steerdiff.core.learned_solver import endpoint_loss
    from steerdiff.models.gmm import GaussianMixture

    g = torch.Generator().manual_seed(1)
    m = torch.randn(3, 3, generator=g, dtype=torch.float64)
    cov = m @ m.T + 0.1 * torch.eye(3, dtype=torch.float64)
    mu = torch.randn(1, 3, generator=g, dtype=torch.float64)
    gauss = GaussianMixture(torch.ones(1, dtype=torch.float64), mu, cov[None])
    ref, x = torch.randn(50, 3, generator=g, dtype=torch.float64), torch.randn(50, 3, generator=g, dtype=torch.float64)
    s = 0.7
    a = cov @ torch.linalg.inv(cov + s**2 * torch.eye(3, dtype=torch.float64))
    want = ((x - ref) @ a.T).pow(2).mean()
    dist = endpoint_loss(gauss, ref, None, "denoiser", loss_sigma=s, seed=3)
    assert float(dist(x, None)) == pytest.approx(float(want), rel=1e-9)
    idx = torch.tensor([7, 2, 30])
    assert float(dist(x[idx], idx)) == pytest.approx(float(((x[idx] - ref[idx]) @ a.T).pow(2).mean()), rel=1e-9)
    with pytest.raises(ValueError, match="loss_sigma"):
        fit_learned_solver(gauss, sd.sigmas.karras(3, 0.002, 80.0, 7.0), loss="denoiser", loss_sigma=0.0)
    with pytest.raises(ValueError, match="loss"):
        fit_learned_solver(gauss, sd.sigmas.karras(3, 0.002, 80.0, 7.0), loss="ssim")


def test_fit_with_denoiser_loss_lowers_it_on_held_out_noises():
    from steerdiff.core.learned_solver import endpoint_loss

    mix = builtin_mixture("gmm2d")
    init = sd.sigmas.karras(4, 0.002, 80.0, 7.0)
    sol = fit_learned_solver(mix, init, n=128, seed=0, iters=40, batch=64, ref_steps=100, loss="denoiser",
                             loss_sigma=0.5)
    assert sol.meta["objective"] == "denoiser" and sol.meta["loss"] <= sol.meta["init_loss"]
    noise = sd.core.randn((500, mix.dim), seeds=10**6, dtype=torch.float64)  # not the fitting seeds
    ref = reference_solution(mix, noise, 80.0, 0.002, ref_steps=200)
    dist = endpoint_loss(mix, ref, None, "denoiser", loss_sigma=0.5, seed=5)
    x0 = sd.sample(mix, noise, init, method="dpmpp_2m")
    x1 = sd.sample(mix, noise, sol.sigmas, method="learned", solver=sol)
    assert dist(x1, None) < 0.7 * dist(x0, None), (dist(x1, None), dist(x0, None))


def test_ld3_slack_fit_and_the_cli_options(tmp_path):
    # LD3's relaxed objective: the solver may start anywhere in a ball around each noise during the fit; the solver it
    # returns still runs from the noise itself and must beat its start there on held-out noises.
    from click.testing import CliRunner

    from steerdiff.app.cli import main

    mix = builtin_mixture("gmm2d")
    init = sd.sigmas.karras(4, 0.002, 80.0, 7.0)
    sol = fit_learned_solver(mix, init, n=128, seed=0, iters=40, batch=64, ref_steps=100, slack=0.05)
    assert sol.meta["slack"] == 0.05 and sol.meta["loss"] < sol.meta["init_loss"]
    noise = sd.core.randn((500, mix.dim), seeds=10**6, dtype=torch.float64)
    ref = reference_solution(mix, noise, 80.0, 0.002, ref_steps=200)
    e0 = (sd.sample(mix, noise, init, method="dpmpp_2m") - ref).pow(2).mean()
    e1 = (sd.sample(mix, noise, sol.sigmas, method="learned", solver=sol) - ref).pow(2).mean()
    assert e1 < 0.5 * e0, (e1, e0)
    with pytest.raises(ValueError, match="slack"):
        fit_learned_solver(mix, init, slack=-0.1)
    out = tmp_path / "s.safetensors"
    r = CliRunner().invoke(main, ["schedule", "--model", "gmm2d", "--sampler", "dpmpp_2m", "--steps", "3", "--n", "32",
                                  "--sweeps", "1", "--ref-steps", "20", "--learned", "--iters", "3", "--batch", "16",
                                  "--loss", "denoiser", "--loss-sigma", "0.3", "--slack", "0.02", "--out", str(out),
                                  "--no-progress"])
    assert r.exit_code == 0, r.output
    meta = LearnedSolver.load(out).meta
    assert (meta["objective"], meta["loss_sigma"], meta["slack"]) == ("denoiser", 0.3, 0.02)
    r = CliRunner().invoke(main, ["schedule", "--model", "gmm2d", "--sampler", "dpmpp_2m", "--loss", "denoiser",
                                  "--out", str(tmp_path / "x.json")])
    assert r.exit_code != 0 and "--learned" in r.output, r.output


class _MixtureAsImage:
    """A mixture in R^16 seen as 1x4x4 images (exact denoiser; images for the band family)."""

    sample_shape = (1, 4, 4)

    def __init__(self):
        self.mix = builtin_mixture("gmm16d")

    def __call__(self, x, sigma, cond=None):
        return self.mix(x.flatten(1), sigma, cond).view_as(x)


def test_high_pass_is_the_detail_below_the_blocks():
    from steerdiff.core.learned_solver import high_pass

    g = torch.Generator().manual_seed(0)
    y = torch.randn(3, 2, 4, 6, generator=g, dtype=torch.float64)
    h = high_pass(y, 2)
    blocks = h.reshape(3, 2, 2, 2, 3, 2).mean((3, 5))  # block means of the detail: zero
    assert blocks.abs().max() < 1e-15
    coarse = torch.randn(3, 2, 2, 3, generator=g, dtype=torch.float64).repeat_interleave(2, 2).repeat_interleave(2, 3)
    assert high_pass(coarse, 2).abs().max() < 1e-15  # block-constant images have no detail
    assert torch.allclose(high_pass(y + coarse, 2), h, atol=1e-14)  # linear, and the low part is exactly the blocks
    with pytest.raises(ValueError, match="band_pool"):
        high_pass(y, 4)


def test_band_family_at_zero_is_the_plain_solver_bit_for_bit_and_matches_its_definition(tmp_path):
    from steerdiff.core.learned_solver import high_pass, run_solver

    model = _MixtureAsImage()
    sig = sd.sigmas.karras(5, 0.002, 80.0, 7.0)
    noise = sd.core.randn((32, 1, 4, 4), seeds=3, dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    plain = LearnedSolver(sig.clone(), 0.05 * torch.randn(5, generator=g, dtype=torch.float64),
                          torch.tril(0.05 * torch.randn(5, 5, generator=g, dtype=torch.float64)),
                          0.1 * torch.randn(5, generator=g, dtype=torch.float64))
    band = plain.with_band(2)
    x_plain = sd.sample(model, noise, sig, method="learned", solver=plain)
    assert torch.equal(sd.sample(model, noise, sig, method="learned", solver=band), x_plain)
    # the fitting path (tensor coefficients, every band term computed) too
    ev, sw, dw = plain.coefficients()
    f = lambda z, s, _i: model(z, s.expand(z.shape[0]))  # noqa: E731
    bc = band.band_coefficients()
    assert torch.equal(run_solver(f, noise * 80.0, ev, sw, dw, band=(2, *bc)), run_solver(f, noise * 80.0, ev, sw, dw))
    # non-zero corrections: coarse blocks follow the plain weights, the detail the summed ones (independent loop)
    band.band_gamma = 0.3 * torch.randn(5, generator=g, dtype=torch.float64)
    band.band_beta = torch.tril(0.3 * torch.randn(5, 5, generator=g, dtype=torch.float64))
    summed = LearnedSolver(sig.clone(), plain.gamma + band.band_gamma, plain.beta + band.band_beta, plain.shift)
    ev, sw_lo, dw_lo = plain.coefficients()
    _, sw_hi, dw_hi = summed.coefficients()
    x, outs = noise * 80.0, []
    for i in range(5):
        outs.append(model(x, ev[i].expand(32)))
        lo = x * sw_lo[i] + sum(outs[j] * dw_lo[i, j] for j in range(i + 1))
        hi = x * sw_hi[i] + sum(outs[j] * dw_hi[i, j] for j in range(i + 1))
        x = lo - high_pass(lo, 2) + high_pass(hi, 2)
    got = sd.sample(model, noise, sig, method="learned", solver=band)
    assert (got - x).abs().max() <= 1e-12 * x.abs().max()
    assert (got - x_plain).abs().max() > 1e-3  # the corrections do act
    path = tmp_path / "band.safetensors"
    band.save(path)
    back = LearnedSolver.load(path)
    assert back.band_pool == 2 and torch.equal(back.band_beta, band.band_beta)
    assert torch.equal(sd.sample(model, noise, sig, method="learned", solver=back), got)
    with pytest.raises(ValueError, match="images"):
        sd.sample(builtin_mixture("gmm16d"), noise.flatten(1), sig, method="learned", solver=band)
    with pytest.raises(ValueError, match="go together"):
        LearnedSolver(sig, plain.gamma, plain.beta, plain.shift, band_pool=2)


def test_band_fit_halves_the_held_out_endpoint_error():
    model = _MixtureAsImage()
    init = sd.sigmas.karras(4, 0.002, 80.0, 7.0)
    sol = fit_learned_solver(model, init, n=128, seed=0, iters=40, batch=64, ref_steps=100, band_pool=2,
                             dtype=torch.float64)
    assert sol.band_pool == 2 and sol.meta["band_pool"] == 2 and sol.band_beta.abs().max() > 0
    noise = sd.core.randn((500, 1, 4, 4), seeds=10**6, dtype=torch.float64)
    ref = reference_solution(model, noise, 80.0, 0.002, ref_steps=200)
    e0 = (sd.sample(model, noise, init, method="dpmpp_2m") - ref).pow(2).mean()
    e1 = (sd.sample(model, noise, sol.sigmas, method="learned", solver=sol) - ref).pow(2).mean()
    assert e1 < 0.5 * e0, (e1, e0)
    with pytest.raises(ValueError, match="band_pool"):
        fit_learned_solver(model, init, band_pool=3)
    with pytest.raises(ValueError, match="band_pool"):
        fit_learned_solver(builtin_mixture("gmm2d"), init, band_pool=2)


def test_moment_distance_closed_forms_and_moment_fit():
    from steerdiff.core.learned_solver import moment_distance

    g = torch.Generator().manual_seed(4)
    a = torch.randn(40, 3, generator=g, dtype=torch.float64)
    assert float(moment_distance(a, a)) == 0.0
    assert float(moment_distance(a + 0.5, a)) == pytest.approx(0.25, rel=1e-12)  # a shift moves the mean only
    # scaling by s multiplies the covariance: (s^2 - 1)^2 mean(C^2), C the unbiased covariance (torch.cov)
    c = torch.cov(a.T)
    assert float(moment_distance(2 * a - a.mean(0), a)) == pytest.approx(float(9 * c.pow(2).mean()), rel=1e-10)
    with pytest.raises(ValueError, match="moment_distance"):
        moment_distance(a, a[:5])
    mix = builtin_mixture("gmm2d")
    init = sd.sigmas.karras(4, 0.002, 80.0, 7.0)
    sol = fit_learned_solver(mix, init, n=128, seed=0, iters=40, batch=64, ref_steps=100, moment_weight=1.0)
    assert sol.meta["moment_weight"] == 1.0 and sol.meta["loss"] < sol.meta["init_loss"]
    noise = sd.core.randn((500, mix.dim), seeds=10**6, dtype=torch.float64)
    ref = reference_solution(mix, noise, 80.0, 0.002, ref_steps=200)
    e0 = (sd.sample(mix, noise, init, method="dpmpp_2m") - ref).pow(2).mean()
    x1 = sd.sample(mix, noise, sol.sigmas, method="learned", solver=sol)
    assert (x1 - ref).pow(2).mean() < 0.5 * e0
    with pytest.raises(ValueError, match="moment_weight"):
        fit_learned_solver(mix, init, moment_weight=-1.0)


def test_cli_band_family_and_moment_options(tmp_path):
    from click.testing import CliRunner

    from steerdiff.app.cli import main

    out = tmp_path / "band.safetensors"
    base = ["schedule", "--sampler", "dpmpp_2m", "--steps", "3", "--n", "4", "--sweeps", "1", "--evals", "2",
            "--ref-steps", "10", "--no-progress"]
    r = CliRunner().invoke(main, [*base, "--model", "digits", "--learned", "--iters", "2", "--batch", "4",
                                  "--band-pool", "2", "--moment-weight", "1.5", "--out", str(out)])
    assert r.exit_code == 0, r.output
    sol = LearnedSolver.load(out)
    assert sol.band_pool == 2 and sol.meta["band_pool"] == 2 and sol.meta["moment_weight"] == 1.5
    r = CliRunner().invoke(main, ["sample", "--model", "digits", "--solver", str(out), "--n", "2", "--out",
                                  str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, [*base, "--model", "gmm2d", "--learned", "--band-pool", "2", "--out",
                                  str(tmp_path / "x.safetensors")])
    assert r.exit_code != 0 and "--band-pool" in r.output, r.output
    r = CliRunner().invoke(main, [*base, "--model", "gmm2d", "--moment-weight", "1", "--out", str(tmp_path / "x.json")])
    assert r.exit_code != 0 and "--learned" in r.output, r.output
