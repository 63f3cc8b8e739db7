"""The AYS-style schedule optimiser (steerdiff/core/schedule_opt.py) on exact mixtures: the truth is the ODE solution
from the same noise on a fine grid and the mixture's own samples; the optimised schedule is scored on held-out noise."""

import json
import math

import pytest
import torch
from click.testing import CliRunner

import steerdiff as sd
from steerdiff.core.schedule_opt import (
    OptimisedSchedule,
    endpoint_error,
    load_sigmas,
    optimise_schedule,
    reference_solution,
)
from steerdiff.metrics.distributions import sliced_wasserstein
from steerdiff.models.gmm import builtin_mixture


@pytest.fixture(scope="module")
def held_out():
    mix = builtin_mixture("gmm2d")
    noise = sd.core.randn((1000, mix.dim), seeds=10**6, dtype=torch.float64)  # not the optimiser's seeds
    ref = reference_solution(mix, noise, 80.0, 0.002, ref_steps=200)
    exact = mix.sample(1000, generator=torch.Generator().manual_seed(3))
    return mix, noise, ref, exact


@pytest.mark.parametrize("sampler", ["euler", "dpmpp_2m"])
@pytest.mark.parametrize("steps", [5, 10])
def test_optimised_beats_karras_on_held_out_noise(held_out, sampler, steps):
    mix, noise, ref, exact = held_out
    res = optimise_schedule(mix, sampler, steps, n=256, seed=0)
    kar = sd.sigmas.karras(steps, 0.002, 80.0, 7.0)
    assert res.nfe == sd.core.nfe_of(sampler, steps) == steps
    e_opt = endpoint_error(mix, noise, res.sigmas, sampler, ref)
    e_kar = endpoint_error(mix, noise, kar, sampler, ref)
    assert e_opt < 0.8 * e_kar, (e_opt, e_kar)
    with torch.no_grad():
        x_opt = sd.sample(mix, noise, res.sigmas, method=sampler)
        x_kar = sd.sample(mix, noise, kar, method=sampler)
    w_opt, w_kar = sliced_wasserstein(x_opt, exact), sliced_wasserstein(x_kar, exact)
    assert w_opt < w_kar, (w_opt, w_kar)


def test_schedule_shape_endpoints_and_determinism():
    mix = builtin_mixture("gmm1d")
    a = optimise_schedule(mix, "heun", 4, n=64, seed=5, sweeps=2)
    b = optimise_schedule(mix, "heun", 4, n=64, seed=5, sweeps=2)
    assert torch.equal(a.sigmas, b.sigmas)
    s = sd.sigmas.check_sigmas(a.sigmas)  # strictly decreasing, ends in 0
    assert s.numel() == 5 and s[0] == 80.0 and s[-2] >= 0.002
    assert a.loss <= a.init_loss and a.history == sorted(a.history, reverse=True)


def test_bad_arguments_are_named():
    mix = builtin_mixture("gmm1d")
    with pytest.raises(ValueError, match="stochastic"):
        optimise_schedule(mix, "euler_ancestral", 5, n=8)
    with pytest.raises(ValueError, match="steps"):
        optimise_schedule(mix, "euler", 1, n=8)
    with pytest.raises(ValueError, match="method"):
        optimise_schedule(mix, "nope", 5, n=8)


def test_json_round_trip_keeps_inf(tmp_path):
    sig = torch.tensor([math.inf, 3.0, 0.5, 0.0], dtype=torch.float64)
    OptimisedSchedule(sig, "euler", 3, 3, 0.1, 0.2).save(tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text())["sigmas"][0] == "inf"
    assert torch.equal(load_sigmas(tmp_path / "s.json"), sig)
    (tmp_path / "bad.json").write_text("[1.0, 2.0, 0.0]")
    with pytest.raises(ValueError, match="decreasing"):
        load_sigmas(tmp_path / "bad.json")


def test_cli_schedule_then_sample_with_it(tmp_path):
    from steerdiff.app.cli import main

    out = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["schedule", "--model", "gmm2d", "--sampler", "euler", "--steps", "3", "--n", "32",
                                  "--sweeps", "1", "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    sig = load_sigmas(out)
    r = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--method", "euler", "--sigmas", str(out), "--n", "16",
                                  "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["nfe"] == 3 and metrics["schedule"]["sigmas"] == sig.tolist()
    r = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--sigmas", str(out), "--rho", "3", "--out",
                                  str(tmp_path / "o2")])
    assert r.exit_code != 0 and "--rho" in r.output
