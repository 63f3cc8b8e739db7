"""``sample --schedule``: every registered schedule (steerdiff.core.sigmas.SCHEDULES) and its options, on the grid
the schedule function computes; ``auto`` and ``flow`` as before."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

import steerdiff as sd
from steerdiff import core
from steerdiff.app.cli import main
from steerdiff.core.sigmas import SCHEDULES


@pytest.fixture
def grids(monkeypatch):
    """The sigmas every core.sample call of the command received."""
    seen = []
    real = core.sample

    def spy(model, x, sigmas, *args, **kwargs):
        seen.append(torch.as_tensor(sigmas, dtype=torch.float64).clone())
        return real(model, x, sigmas, *args, **kwargs)

    monkeypatch.setattr(core, "sample", spy)
    return seen


def _run(tmp_path, *argv, model="gmm2d", steps=4):
    out = tmp_path / "o"
    res = CliRunner().invoke(main, ["sample", "--model", model, "--steps", str(steps), "--n", "8", "--no-progress",
                                    "--method", "euler", *argv, "--out", str(out)])
    return res, out


def _edm_table(lo=0.002, hi=80.0):  # ComfyUI's ModelSamplingContinuousEDM: 1000 levels log-uniform
    return torch.linspace(math.log(lo), math.log(hi), 1000, dtype=torch.float64).exp()


CASES = [
    (["--schedule", "exponential", "--sigma-max", "20"],
     lambda n: [20 * (0.002 / 20) ** (k / (n - 1)) for k in range(n)] + [0.0]),
    (["--schedule", "polyexponential"], lambda n: torch.exp(torch.linspace(math.log(80), math.log(0.002), n,
                                                                           dtype=torch.float64)).tolist() + [0.0]),
    (["--schedule", "polyexponential", "--rho", "2"],
     lambda n: SCHEDULES.get("polyexponential")(n, 0.002, 80.0, rho=2.0)),
    (["--schedule", "kl_optimal", "--sigma-min", "0.01"],
     lambda n: [math.tan((1 - k / (n - 1)) * math.atan(80) + k / (n - 1) * math.atan(0.01)) for k in range(n)]
     + [0.0]),
    (["--schedule", "sgm_uniform"], lambda n: SCHEDULES.get("sgm_uniform")(n, table=_edm_table())),
    (["--schedule", "simple", "--sigma-max", "10"],
     lambda n: [_edm_table(hi=10.0)[-(1 + int(k * 1000 / n))].item() for k in range(n)] + [0.0]),
    (["--schedule", "beta", "--schedule-option", "alpha=0.5", "--schedule-option", "beta=0.7"],
     lambda n: SCHEDULES.get("beta")(n, table=_edm_table(), alpha=0.5, beta=0.7)),
    (["--schedule", "linear_quadratic", "--sigma-max", "5"],
     lambda n: SCHEDULES.get("linear_quadratic")(n, sigma_max=5.0)),
    (["--schedule", "ays_sdxl"], lambda n: [14.6146412293, 6.3184485287, 3.7681790315, 2.1811480769, 1.3405244945,
                                            0.8620721141, 0.5550693289, 0.3798540708, 0.2332364134, 0.1114188177,
                                            0.0][: n + 1]),
]


@pytest.mark.parametrize("argv,want", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_registered_schedules_run_on_the_grid_their_function_computes(tmp_path, grids, argv, want):
    steps = 10 if "ays_sdxl" in argv else 5
    res, out = _run(tmp_path, *argv, steps=steps)
    assert res.exit_code == 0, res.output
    got = grids[-1]
    expect = torch.as_tensor(want(steps), dtype=torch.float64)
    assert got.shape == expect.shape and torch.allclose(got, expect, rtol=1e-12, atol=0), (got, expect)
    record = json.loads((out / "metrics.json").read_text())["schedule"]
    assert record["kind"] == argv[1]


def test_every_registered_schedule_is_offered_and_runs(tmp_path, grids):
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--schedule", "nope", "--out", str(tmp_path)])
    assert res.exit_code == 2
    for name in ("auto", "flow", *SCHEDULES.names()):
        assert name in res.output, (name, res.output)
    for name in SCHEDULES.names():
        res, _ = _run(tmp_path, "--schedule", name, steps=3)
        assert res.exit_code == 0, (name, res.output)
        assert grids[-1][-1] == 0 and torch.all(grids[-1][1:] < grids[-1][:-1])


def test_a_schedule_registered_at_run_time_is_offered(tmp_path, grids):
    def halves(steps: int, sigma_max: float = 80.0):
        return torch.tensor([sigma_max / 2**k for k in range(steps)] + [0.0], dtype=torch.float64)

    SCHEDULES.add("halves_test", halves)
    try:
        res, out = _run(tmp_path, "--schedule", "halves_test", "--sigma-max", "8", steps=3)
        assert res.exit_code == 0, res.output
        assert grids[-1].tolist() == [8.0, 4.0, 2.0, 0.0]
        res, _ = _run(tmp_path, "--schedule", "halves_test", "--rho", "3")
        assert res.exit_code == 2 and "--rho" in res.output
    finally:
        SCHEDULES.remove("halves_test")


@pytest.mark.parametrize("argv,flag", [
    (["--schedule", "exponential", "--rho", "3"], "--rho"),  # exponential has no rho
    (["--schedule", "ays_sd15", "--sigma-max", "10"], "--sigma-max"),  # a preset has no range
    (["--schedule", "simple", "--shift", "2"], "--shift"),
    (["--schedule", "beta", "--schedule-option", "gamma=1"], "--schedule-option"),  # beta's options: alpha, beta
    (["--schedule", "beta", "--schedule-option", "alpha"], "--schedule-option"),
    (["--schedule", "beta", "--schedule-option", "alpha=-1"], "--schedule-option"),  # the schedule's own check
    (["--schedule", "karras", "--schedule-option", "rho=3"], "--schedule-option"),  # rho has its flag
    (["--schedule", "flow", "--schedule-option", "x=1"], "--schedule-option"),
    (["--schedule", "kl_optimal", "--sigma-min", "0.01", "--sigma-max", "0.005"], "--sigma-m"),
])
def test_options_the_schedule_does_not_read_are_refused_naming_them(tmp_path, argv, flag):
    res, out = _run(tmp_path, *argv)
    assert res.exit_code == 2 and flag in res.output and "Traceback" not in res.output, res.output
    assert not out.exists()


def test_table_schedules_use_the_models_table():
    """A VP model's own per-timestep sigmas; a flow model's ComfyUI table of shifted times (converted after)."""
    from steerdiff.app.cli._schedules import _table
    from steerdiff.core.sigmas import sigmas_from_alphas_cumprod

    abar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
    vp = core.VPDenoiser(lambda x, t, cond=None: x, abar)
    got, in_t = _table(vp, 0.002, 80.0, 1.0)
    assert torch.equal(got, sigmas_from_alphas_cumprod(abar)) and not in_t
    flow_model = core.FlowDenoiser(lambda x, t, cond=None: x)
    got, in_t = _table(flow_model, 0.002, 80.0, 3.0)
    u = torch.arange(1, 1001, dtype=torch.float64) / 1000
    assert in_t and torch.allclose(got, 3 * u / (1 + 2 * u), rtol=1e-15) and got[-1] == 1


def test_auto_and_flow_keep_working(tmp_path, grids):
    res, out = _run(tmp_path)
    assert res.exit_code == 0, res.output
    assert torch.allclose(grids[-1], sd.sigmas.karras(4, 0.002, 80.0), rtol=1e-12)
    res, out = _run(tmp_path, "--schedule", "flow", "--shift", "3")
    assert res.exit_code == 0, res.output
    assert torch.equal(grids[-1], core.sigmas.flow(4, 3.0, grid="flux"))
