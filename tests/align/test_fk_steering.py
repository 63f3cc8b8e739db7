"""FK steering (``steerdiff.align.fk_steering``, ``docs/methods/fk_steering.md``) against independent truth: the
closed-form tilted mixtures P1-P4 and MO, the telescoping of the difference potentials, importance resampling, the
cost accounting, bad input and the CLI."""

import json
import math

import click
import pytest
import torch
from click.testing import CliRunner

import steerdiff as sd
from steerdiff.align import fk_steering, sir
from steerdiff.align.fk import POTENTIALS, log_potentials
from steerdiff.align.rewards import Linear, Quadratic
from steerdiff.align.smc import normalize
from steerdiff.app.cli.align import align_cmd
from steerdiff.app.protocols.das import CRITERIA, PROBLEMS, IsotropicMixture, evaluate, mo, validation_sigmas
from steerdiff.models import GaussianMixture

MIX = IsotropicMixture(GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], 0.3))
R = Linear([1.0, 0.0])


def noise(rows: int, d: int = 2, seed: int = 0) -> torch.Tensor:
    return sd.randn((rows, d), seeds=seed, dtype=torch.float64)


def run_problem(prob, groups: int, potential: str = "difference", particles: int = 16, seed: int = 0):
    """One output per group on the protocol's grid (100 stochastic steps to sigma = 0.002), as DAS's fast tier."""
    x = sd.randn((groups * particles, prob.mixture.dim), seeds=seed * 10**7, dtype=torch.float64)
    res = fk_steering(IsotropicMixture(prob.mixture), prob.sampler_reward, x, validation_sigmas(100),
                      alpha=prob.alpha, particles=particles, potential=potential, generator=seed * 10**7 + 5 * 10**6,
                      batch_size=None)
    return res, evaluate(prob, res.samples)


# ------------------------------------------------------------------------------------------------ exact targets
# DAS's fast-tier bounds (``steerdiff.app.protocols.das.CRITERIA`` + 0.05), at DAS's fast-tier sizes for the 2-D
# problems (1024 groups) and half of them in 16-D (256 groups), P = 16, one seed.
@pytest.mark.parametrize("name", ["P1", "P2", "P3", "P4"])
def test_difference_potential_samples_the_tilted_mixture(name):
    prob = PROBLEMS[name]()
    res, ev = run_problem(prob, 1024 if prob.mixture.dim == 2 else 256)
    rel, tv = CRITERIA[name]
    print(f"{name} fk difference: relerr {ev['relerr']:.3f} TV {ev['mode_tv']:.3f}")
    assert ev["relerr"] <= rel + 0.05 and ev["mode_tv"] <= tv + 0.05, ev
    assert res.nfe == 16 * 100 and res.nfe_grad == 0 and res.n_nonfinite == 0


def test_difference_potential_multi_objective():
    """MO (w = 0.5, the rewards given as a list of (weight, reward) pairs): DAS's bounds on both objectives."""
    prob = mo(0.5)
    _, ev = run_problem(prob, 1024)
    for m in (1, 2):
        assert ev[f"r{m}_abserr"] <= 0.15 * abs(ev[f"r{m}_exact"]) + 0.1, ev
    assert ev["mode_tv"] <= 0.1, ev


@pytest.mark.parametrize("potential", ["max", "sum"])
def test_max_and_sum_run_and_tilt_toward_the_reward(potential):
    """Not held to the target's bounds (their corrected final weights degenerate at P = 16): they run, tilt the base
    (E r = -10.4 under the model on P1) toward the reward, and their errors are printed (the methods page lists
    them)."""
    prob = PROBLEMS["P1"]()
    res, ev = run_problem(prob, 256, potential=potential)
    print(f"P1 fk {potential}: relerr {ev['relerr']:.3f} TV {ev['mode_tv']:.3f} E r {ev['mean_reward']:.3f} "
          f"(exact {ev['exact_reward']:.3f})")
    assert torch.isfinite(res.samples).all() and res.nfe_grad == 0
    assert ev["mean_reward"] > -2.0


# ------------------------------------------------------------------------------------------------ the potentials
def test_difference_potentials_telescope():
    """Pure: the difference potentials after the first multiply to ``exp((r_0 - r_T) / alpha)`` (r_T the first
    look-ahead reward, r_0 the final one); with the corrected final potential every kind multiplies to
    ``exp(r_0 / alpha)``."""
    g = torch.Generator().manual_seed(0)
    rho, final = torch.randn(37, 5, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    diff = log_potentials("difference", rho, final)
    assert diff.shape == (38, 5)
    torch.testing.assert_close(diff[1:].sum(0), final - rho[0])
    torch.testing.assert_close(diff[1:-1], rho[1:] - rho[:-1])
    torch.testing.assert_close(log_potentials("max", rho, final)[:-1], rho.cummax(0).values)
    torch.testing.assert_close(log_potentials("sum", rho, final)[:-1], rho.cumsum(0))
    for p in POTENTIALS:
        torch.testing.assert_close(log_potentials(p, rho, final).sum(0), final)


def test_the_run_telescopes_without_resampling():
    """A run that never resamples (ESS threshold below 1 / P): for every potential the final weights are
    ``normalize(r(x_N) / alpha)`` and the particles are SIR's plain chains (same generators); for ``difference`` the
    weights after a potential step are ``normalize(r(D(x_i)) / alpha)`` and from the first step to the end they
    change by ``exp((r_0 - r_T) / alpha)``."""
    r, P, G, alpha, sig = Quadratic.around([1.0, 0.5], c=[1.0, 0.0]), 8, 3, 0.7, validation_sigmas(20)
    ref = sir(MIX, r, noise(G * P), sig, alpha=alpha, particles=P, generator=4)
    for potential in POTENTIALS:
        seen = []

        def grab(info, seen=seen):
            if info["reward"] is not None:
                seen.append((info["log_weights"].clone(), info["reward"].clone()))

        res = fk_steering(MIX, r, noise(G * P), sig, alpha=alpha, particles=P, potential=potential,
                          resample_every=3, ess_threshold=1e-6, generator=4, output="weighted", callback=grab)
        assert not res.resampled.any() and len(seen) == 6 == len(res.extras["potential_steps"])
        torch.testing.assert_close(res.particles_final, ref.particles_final)
        r0 = r(res.particles_final).view(G, P)
        torch.testing.assert_close(res.log_weights, normalize(r0 / alpha))
        if potential == "difference":
            for logw, rho in seen:
                torch.testing.assert_close(logw, normalize(rho / alpha))
            first_w, r_T = seen[0]
            torch.testing.assert_close(normalize(res.log_weights - first_w), normalize((r0 - r_T) / alpha))


def test_weighing_only_at_the_end_is_importance_resampling():
    """``resample_every = steps``: one potential, at the last step, and no resampling there (the ESS threshold below
    1 / P): the final weight is ``exp(r(x_N) / alpha)`` and the output SIR's draw with K = P (same generators)."""
    sig = validation_sigmas(15)
    a = fk_steering(MIX, R, noise(64 * 8), sig, alpha=1.0, particles=8, resample_every=15, ess_threshold=1e-6,
                    generator=5)
    b = sir(MIX, R, noise(64 * 8), sig, alpha=1.0, particles=8, generator=5)
    assert a.extras["potential_steps"] == [14] and not a.resampled.any() and a.reward_evals == 2 * 8
    torch.testing.assert_close(a.particles_final, b.particles_final)
    torch.testing.assert_close(a.log_weights, b.log_weights)
    torch.testing.assert_close(a.samples, b.samples)


def test_costs_interval_and_adaptive_resampling():
    P, G, steps = 8, 4, 20
    sig = validation_sigmas(steps)  # ends at sigma = 0.002 > 0: the final reward is a new call
    res = fk_steering(MIX, R, noise(G * P), sig, alpha=0.5, particles=P, resample_every=5, ess_threshold=1.0,
                      generator=0)
    assert res.method == "fk" and res.extras["potential_steps"] == [4, 9, 14, 19]
    assert res.nfe == P * steps and res.nfe_grad == 0 and res.reward_evals == P * 5 and res.cost() == P * steps
    assert res.resampled[[4, 9, 14, 19]].all() and res.resampled.sum() == 4 * G  # only (and always) there
    assert torch.isnan(res.ess[[0, 1, 2, 3, 5]]).all() and torch.isfinite(res.ess[[4, 9, 14, 19, 20]]).all()
    assert res.samples.shape == (G, 2) and (res.lambdas[:4] == 0).all() and (res.lambdas[4:] == 1).all()
    adaptive = fk_steering(MIX, R, noise(G * P), sig, alpha=0.5, particles=P, ess_threshold=0.5, generator=0)
    assert 0 < adaptive.resampled.sum() < steps * G  # resampled only where the ESS fell below P / 2
    low = adaptive.ess[:-1][adaptive.resampled]
    assert (low < 0.5 * P).all()
    # Ending in 0 with the last step a potential step: x_N = D(x_{N-1}) and its reward is reused.
    zero = fk_steering(MIX, R, noise(G * P), sd.sigmas.karras(steps, 0.002, 80.0), alpha=0.5, particles=P,
                       generator=0)
    assert zero.reward_evals == P * steps and zero.nfe == P * steps


def test_groups_are_independent_and_micro_batches_do_not_matter():
    P, sig = 8, validation_sigmas(12)
    seeds = list(range(50, 50 + 3 * P))
    full = fk_steering(MIX, R, noise(3 * P, seed=seeds), sig, alpha=0.5, particles=P, generator=seeds,
                       output="weighted", batch_size=None)
    one = fk_steering(MIX, R, noise(P, seed=seeds[P:2 * P]), sig, alpha=0.5, particles=P, generator=seeds[P:2 * P],
                      output="weighted", batch_size=None)
    torch.testing.assert_close(one.particles_final, full.particles_final[P:2 * P])
    small = fk_steering(MIX, R, noise(3 * P, seed=seeds), sig, alpha=0.5, particles=P, generator=seeds,
                        output="weighted", batch_size=5)
    torch.testing.assert_close(small.particles_final, full.particles_final)


# ------------------------------------------------------------------------------------------------ non-finite values
def test_non_finite_particles_are_killed_and_replaced():
    P, G, sig = 8, 4, validation_sigmas(12)

    def r(x):  # NaN where the denoised estimate has x2 > 0.3
        return torch.where(x[:, 1] > 0.3, torch.full_like(x[:, 0], math.nan), x[:, 0])

    res = fk_steering(MIX, r, noise(G * P), sig, alpha=1.0, particles=P, generator=0, output="weighted")
    assert res.n_nonfinite > 0 and torch.isfinite(res.particles_final).all()
    assert (res.resampled | (res.nonfinite[:-1] == 0)).all()

    def flaky(x, sigma, cond=None):  # NaN from the denoiser between potential steps too
        d = MIX(x, sigma)
        return torch.where(x[:, :1] > 3, torch.full_like(d, math.nan), d) if float(sigma[0]) < 5 else d

    res = fk_steering(flaky, R, noise(64), sig, alpha=1.0, particles=8, resample_every=4, generator=0)
    assert res.n_nonfinite > 0 and torch.isfinite(res.samples).all()
    with pytest.raises(FloatingPointError, match=r"fk: every particle of group 0 .* step 0"):
        fk_steering(MIX, lambda x: torch.full((x.shape[0],), math.nan, dtype=x.dtype), noise(8), sig, alpha=1.0,
                    particles=4)


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_input_names_the_argument():
    sig, kw = validation_sigmas(10), dict(alpha=1.0, particles=4)
    with pytest.raises(ValueError, match=r"potential must be one of \['difference', 'max', 'sum'\], got 'diff'"):
        fk_steering(MIX, R, noise(8), sig, potential="diff", **kw)
    for every in (0, -1, 11, 2.5, True):
        with pytest.raises(ValueError, match=r"resample_every must be an integer in \[1, steps\] = \[1, 10\]"):
            fk_steering(MIX, R, noise(8), sig, resample_every=every, **kw)
    for bad, match in [(dict(alpha=0.0), "alpha"), (dict(alpha=math.nan), "alpha"), (dict(particles=1), "particles"),
                       (dict(ess_threshold=0.0), "ess_threshold"), (dict(ess_threshold=1.5), "ess_threshold"),
                       (dict(resampler="x"), "resampler"), (dict(output="x"), "output"), (dict(eta=0.0), "eta"),
                       (dict(batch_size=0), "batch_size")]:
        with pytest.raises(ValueError, match=match):
            fk_steering(MIX, R, noise(8), sig, **(kw | bad))
    with pytest.raises(ValueError, match="multiple of particles=4"):
        fk_steering(MIX, R, noise(10), sig, **kw)
    with pytest.raises(ValueError, match="strictly decreasing"):
        fk_steering(MIX, R, noise(8), torch.tensor([1.0, 2.0, 0.0]), **kw)
    with pytest.raises(ValueError, match=r"reward must return shape \[B\] = \[8\]"):
        fk_steering(MIX, lambda x: x.sum(1, keepdim=True), noise(8), sig, batch_size=8, **kw)


# ------------------------------------------------------------------------------------------------ CLI
@click.group()
def cli():
    pass


cli.add_command(align_cmd)


def test_cli_method_fk(tmp_path):
    out = tmp_path / "fk"
    base = ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "1", "--method", "fk", "--no-progress"]
    res = CliRunner().invoke(cli, base + ["--particles", "8", "--n", "256", "--steps", "30", "--out", str(out)])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["method"] == "fk" and m["potential"] == "difference" and m["nfe"] == 8 * 30 and m["nfe_grad"] == 0
    assert len(m["ess_frac_per_step"]) == 31 and m["relerr_to_exact"] < 0.15 and m["mode_tv_to_exact"] < 0.1
    r = CliRunner().invoke(cli, base + ["--potential", "max", "--resample-every", "5", "--particles", "4", "--n", "8",
                                        "--steps", "10", "--out", str(tmp_path / "max")])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "max" / "metrics.json").read_text())
    assert m["potential"] == "max" and m["potential_steps"] == [4, 9]
    r = CliRunner().invoke(cli, base + ["--potential", "bogus", "--out", str(tmp_path / "b")])
    assert r.exit_code != 0 and "--potential" in r.output
    r = CliRunner().invoke(cli, base + ["--resample-every", "11", "--steps", "10", "--n", "2",
                                        "--out", str(tmp_path / "c")])
    assert r.exit_code != 0 and "resample_every" in r.output
