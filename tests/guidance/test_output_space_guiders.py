"""The output-space guiders of 2025 (CFG-Zero*, TCFG, MAMBO-G, FDG) against diffusers' guider classes, and their
invariants.

Reference: ``diffusers.guiders`` 0.42 (ClassifierFreeZeroStarGuidance, TangentialClassifierFreeGuidance,
MagnitudeAwareGuidance, FrequencyDecoupledGuidance; FDG needs kornia, a test reference installed with --no-deps).
diffusers combines the network's own predictions (eps for SD, the flow velocity for SD3 / FLUX); steerdiff's
guiders combine D and convert, so the comparison is made in each space over a whole schedule of steps, with the
step-indexed parts (zero-init, the start/stop window) exercised.
"""

from __future__ import annotations

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import CFG, FDG, MAMBOG, TCFG, CFGZeroStar, build_guider
from steerdiff.guidance.fdg import collapse_pyramid, laplacian_pyramid
from steerdiff.guidance.spaces import from_space, to_space, zero_prediction

guiders = pytest.importorskip("diffusers.guiders")

N_STEPS = 6
SIGMAS = sd.sigmas.karras(N_STEPS, 0.05, 20.0)


class Toy:
    """A class-conditional denoiser with a null condition (-1), nonlinear in x so that the conditional and null
    predictions are not parallel."""

    num_classes = (3,)

    def __call__(self, x, sigma, cond):
        rows = (-1, *([1] * (x.ndim - 1)))
        s = sigma.view(rows).to(x.dtype)
        k = cond.view(rows).to(x.dtype)
        shift = torch.where(k >= 0, 0.3 * (k + 1) * torch.sin(x * (k + 2)), torch.zeros_like(x))
        return x / (1 + s**2) + shift + 0.1 * torch.cos(3 * x)


def _inputs(seed=0, shape=(3, 4, 16, 16)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64) * 3, torch.tensor([0, 1, 2])


def _diffusers_run(ref, ours, space, x, cond, sigmas=SIGMAS):
    """Max relative difference between ``ours`` (a steerdiff guider) and ``ref`` (a diffusers guider) over every
    step of the schedule, compared in ``space``."""
    model = Toy()
    ours.set_schedule(sigmas)
    worst = 0.0
    for i in range(len(sigmas) - 1):
        sig = torch.full((x.shape[0],), float(sigmas[i]), dtype=torch.float64)
        got = to_space(ours.guide(model, x, sig, cond, step=i), x, sig, space)
        pc = to_space(model(x, sig, cond), x, sig, space)
        pu = to_space(model(x, sig, torch.full_like(cond, -1)), x, sig, space)
        ref.set_state(step=i, num_inference_steps=len(sigmas) - 1, timestep=None)
        want = ref.forward(pc, pu).pred
        # relative to the predictions' scale (the zero-init steps' reference is exactly 0)
        worst = max(worst, float((got - want).abs().max() / torch.maximum(want.abs().max(), pc.abs().max())))
    return worst


@pytest.mark.parametrize("space", ["eps", "v"])
@pytest.mark.parametrize("original", [False, True])
def test_cfg_zero_star_equals_diffusers(space, original):
    x, cond = _inputs()
    s = 4.0
    ref = guiders.ClassifierFreeZeroStarGuidance(guidance_scale=s, zero_init_steps=2,
                                                 use_original_formulation=original)
    w = sd.guidance.conventions.to_w(s, "diffusers_original" if original else "diffusers")
    assert _diffusers_run(ref, CFGZeroStar(w, zero_init_steps=2, space=space), space, x, cond) < 1e-6


@pytest.mark.parametrize("space", ["eps", "v"])
def test_tcfg_equals_diffusers(space, monkeypatch):
    x, cond = _inputs(1)
    ref = guiders.TangentialClassifierFreeGuidance(guidance_scale=5.0, start=0.2, stop=0.8)
    # diffusers takes the SVD in float32 (measured: 2.8e-5 here, scaled by w) ...
    assert _diffusers_run(ref, TCFG(5.0, space=space, start=0.2, stop=0.8), space, x, cond) < 1e-4
    # ... and with its float32 cast made float64 the two agree to rounding
    monkeypatch.setattr(torch.Tensor, "float", lambda self: self.double())
    assert _diffusers_run(ref, TCFG(5.0, space=space, start=0.2, stop=0.8), space, x, cond) < 1e-11


@pytest.mark.parametrize("space", ["eps", "v"])
@pytest.mark.parametrize("alpha", [0.0, 2.0, 8.0])
def test_mambo_equals_diffusers(space, alpha):
    # diffusers' mambo_guidance takes torch.norm over dims [1, 2, 3] of a 4-D prediction, which torch refuses
    # (matrix_norm needs 2 dims): it runs on packed 3-D predictions [B, seq, C] (FLUX) only. Compared there.
    x, cond = _inputs(2, shape=(3, 64, 16))
    ref = guiders.MagnitudeAwareGuidance(guidance_scale=7.0, alpha=alpha)
    assert _diffusers_run(ref, MAMBOG(7.0, alpha=alpha, space=space), space, x, cond) < 1e-6


@pytest.mark.parametrize("levels,parallel", [(2, 1.0), (3, 1.0), (2, 0.3)])
def test_fdg_equals_diffusers(levels, parallel):
    pytest.importorskip("kornia")
    x, cond = _inputs(3, shape=(3, 4, 32, 32))
    high, low = 9.0, 3.0
    ours = FDG(high, low_scale=low, levels=levels, parallel_weight=parallel, space="eps")
    ref = guiders.FrequencyDecoupledGuidance(guidance_scales=ours.level_scales(),
                                             parallel_weights=None if parallel == 1.0 else parallel)
    assert _diffusers_run(ref, ours, "eps", x, cond) < 1e-5


def test_pyramid_is_exactly_invertible_and_linear():
    x, _ = _inputs(4, shape=(2, 3, 32, 16))
    y, _ = _inputs(5, shape=(2, 3, 32, 16))
    for levels in (2, 3):
        bands = laplacian_pyramid(x, levels)
        assert [tuple(b.shape[2:]) for b in bands] == [(32 // 2**k, 16 // 2**k) for k in range(levels)]
        torch.testing.assert_close(collapse_pyramid(bands), x, rtol=0, atol=1e-12)
        both = laplacian_pyramid(2 * x - y, levels)
        for b, bx, by in zip(both, bands, laplacian_pyramid(y, levels), strict=True):
            torch.testing.assert_close(b, 2 * bx - by, rtol=0, atol=1e-12)


@pytest.mark.parametrize("space", ["D", "eps", "v"])
def test_fdg_with_equal_band_scales_is_cfg(space):
    x, cond = _inputs(6)
    sig = torch.full((3,), 2.0, dtype=torch.float64)
    got = FDG(4.0, low_scale=4.0, levels=3, space=space).guide(Toy(), x, sig, cond)
    torch.testing.assert_close(got, CFG(4.0).guide(Toy(), x, sig, cond), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("space", ["D", "eps", "v"])
def test_spaces_round_trip(space):
    x, _ = _inputs(7)
    d = torch.randn_like(x)
    sig = torch.tensor([0.3, 4.0, math.inf], dtype=torch.float64)
    back = from_space(to_space(d, x, sig, space), x, sig, space, torch.float64)
    rows = slice(0, 2) if space == "eps" else slice(0, 3)  # eps does not determine D at sigma = inf
    torch.testing.assert_close(back[rows], d[rows], rtol=1e-12, atol=1e-12)
    if space == "eps":
        assert torch.isnan(back[2]).all()


def test_zero_prediction_freezes_the_state():
    """Zero eps: an Euler step leaves x where it is; zero velocity: the flow state x / (1 + sigma) stays."""
    x, _ = _inputs(8)
    s, s_next = 3.0, 1.5
    sig = torch.full((3,), s, dtype=torch.float64)
    d = zero_prediction(x, sig, "eps", torch.float64)
    torch.testing.assert_close(x + (s_next - s) * (x - d) / s, x)
    d = zero_prediction(x, sig, "v", torch.float64)
    x_next = d + s_next * (x - d) / s  # Euler in sigma from the flow's D
    torch.testing.assert_close(x_next / (1 + s_next), x / (1 + s), rtol=1e-12, atol=1e-12)


def test_cfg_zero_star_zero_init_costs_no_evaluation():
    model = sd.models.load("digits").eval()
    noise = sd.randn((4, 1, 8, 8), seeds=0)
    sig = sd.sigmas.karras(8, 0.002, 80.0)
    cond = torch.arange(4)
    _, plain = sd.sample(model, noise, sig, method="euler", cond=cond, guidance=CFGZeroStar(3.0, zero_init_steps=0),
                         return_stats=True)
    _, zeroed = sd.sample(model, noise, sig, method="euler", cond=cond, guidance=CFGZeroStar(3.0, zero_init_steps=2),
                          return_stats=True)
    assert plain.nfe - zeroed.nfe == 2 * 2  # two steps of a doubled batch not evaluated


def test_per_sample_scales_are_rows_of_scalar_runs():
    x, cond = _inputs(9)
    sig = torch.full((3,), 1.5, dtype=torch.float64)
    scales = [0.0, 3.0, 7.5]
    for cls, kw in ((CFGZeroStar, {"zero_init_steps": 0}), (TCFG, {}), (MAMBOG, {"alpha": 2.0})):
        batch = cls(scales, **kw).guide(Toy(), x, sig, cond)
        for b, w in enumerate(scales):
            one = cls(w, **kw).guide(Toy(), x[b:b + 1], sig[b:b + 1], cond[b:b + 1])
            torch.testing.assert_close(batch[b:b + 1], one, rtol=1e-10, atol=1e-10)


def test_eps_space_refuses_a_flow_schedule_from_infinity():
    flow = torch.tensor([math.inf, 3.0, 1.0, 0.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="space='eps'.*sigma = inf"):
        TCFG(3.0, space="eps").set_schedule(flow)
    TCFG(3.0, space="v").set_schedule(flow)  # the velocity is defined there


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="space"):
        TCFG(3.0, space="x0")
    with pytest.raises(ValueError, match="zero_init_steps"):
        CFGZeroStar(3.0, zero_init_steps=-1)
    with pytest.raises(ValueError, match="alpha"):
        MAMBOG(3.0, alpha=-1.0)
    with pytest.raises(ValueError, match="levels"):
        FDG(3.0, levels=1)
    with pytest.raises(TypeError, match="scale"):
        FDG([1.0, 2.0])
    x, cond = _inputs(10, shape=(3, 1, 8, 8))
    with pytest.raises(ValueError, match="levels=3 needs H and W"):
        FDG(3.0, levels=3).guide(Toy(), x, torch.ones(3, dtype=torch.float64), cond)


@pytest.mark.parametrize("name", ["cfg_zero_star", "tcfg", "mambo", "fdg"])
def test_registered_and_run_in_sample_on_digits(name):
    """Each guider from the registry in sd.sample on the shipped digits model: finite samples, and more class
    accuracy than the unguided model would be too slow to check here; the cost is 2 evaluations per guided step."""
    model = sd.models.load("digits").eval()
    g = build_guider(name, 3.0)
    x, stats = sd.sample(model, sd.randn((4, 1, 8, 8), seeds=1), sd.sigmas.karras(6, 0.002, 80.0), method="euler",
                         cond=torch.arange(4), guidance=g, return_stats=True)
    assert torch.isfinite(x).all()
    zeroed = getattr(g, "zero_init_steps", 0)
    assert stats.nfe == 2 * (6 - zeroed)


def test_cli_offers_the_guiders_with_their_options(tmp_path):
    import json

    from click.testing import CliRunner

    from steerdiff.app.cli import main

    base = ["sample", "--model", "digits", "--class", "3", "--n", "4", "--steps", "5", "--scale", "3"]
    for extra in (["--guidance", "cfg-zero-star", "--zero-init-steps", "1", "--space", "v"],
                  ["--guidance", "tcfg"], ["--guidance", "mambo", "--alpha", "2"],
                  ["--guidance", "fdg", "--low-scale", "1.5", "--space", "D"]):
        out = tmp_path / extra[1]
        res = CliRunner().invoke(main, [*base, *extra, "--out", str(out)])
        assert res.exit_code == 0, res.output
        summary = json.loads((out / "metrics.json").read_text())
        assert summary["guidance"]["name"].replace("-", "_") == extra[1].replace("-", "_")
        if extra[1] == "cfg-zero-star":  # heun, 5 steps: 9 evaluations, the 2 of step 0 zeroed; doubled batch
            assert summary["guidance"]["zero_init_steps"] == 1 and summary["nfe"] == 2 * (9 - 2)
    res = CliRunner().invoke(main, [*base, "--guidance", "cfg", "--alpha", "2", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "--alpha does not apply to --guidance cfg" in res.output
    res = CliRunner().invoke(main, [*base, "--guidance", "apg", "--space", "v", "--out", str(tmp_path / "y")])
    assert res.exit_code != 0 and "space" in res.output
