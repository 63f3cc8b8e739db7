"""The align registries (``steerdiff.align.ALIGNERS``, ``TEMPERING``, ``RESAMPLERS``, ``POTENTIALS``), the dispatch
``sd.align.run``, the shared SMC options check, and ``steerdiff align`` built from the registry: an aligner
registered at run time runs through the dispatch and through the command line, and options the chosen method does
not take are refused by name."""

import json
import os
import subprocess
import sys
import textwrap

import click
import pytest
import torch
from click.testing import CliRunner

import steerdiff as sd
from steerdiff.align import ALIGNERS, POTENTIALS, RESAMPLERS, TEMPERING, AlignResult
from steerdiff.align.rewards import Linear
from steerdiff.align.smc import normalize
from steerdiff.app.cli.align import build_align_command
from steerdiff.io import load_tensors

GMM = sd.models.builtin_mixture("gmm2d")
REWARD = Linear([1.0, 0.0])
SIGMAS = sd.sigmas.karras(7, 0.002, 80.0)[:-1]  # 6 steps, ends at sigma_min > 0


def _noise(rows: int, seed: int = 3) -> torch.Tensor:
    return sd.randn((rows, 2), seeds=seed, dtype=torch.float64)


def tiny(denoiser, reward, noise, sigmas, *, alpha: float, particles: int = 2, shrink: float = 0.5, cond=None,
         generator=None, batch_size=None, progress=False) -> AlignResult:
    """A made-up aligner: per group, ``shrink`` times the denoised first particle at ``sigmas[0]``.

    Args:
        shrink: the factor applied to the denoised estimate.
    """
    x = noise[::particles] * float(sigmas[0])
    samples = shrink * denoiser(x, torch.full((x.shape[0],), float(sigmas[0]), dtype=x.dtype), cond)
    return AlignResult(samples=samples, rewards=reward(samples), method="tiny", groups=x.shape[0],
                       particles=particles, nfe=1.0, nfe_grad=0.0, reward_evals=1.0)


@pytest.fixture
def tiny_registered():
    sd.align.register_aligner("tiny", cost=lambda steps, particles, **_: {"nfe": 1, "nfe_grad": 0})(tiny)
    try:
        yield ALIGNERS.get("tiny")
    finally:
        ALIGNERS.remove("tiny")


def _cli():
    group = click.Group()
    group.add_command(build_align_command())
    return group


BASE = ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--n", "3", "--steps", "6", "--seed", "3",
        "--no-progress"]


# ------------------------------------------------------------------------------------------------ the registry
def test_every_aligner_is_registered_with_its_function_and_options():
    assert {"das", "tds", "fk", "best_of_n", "sir", "reward_guidance"} <= set(ALIGNERS.names())
    for alias, name in (("bon", "best_of_n"), ("guidance", "reward_guidance"), ("fk_steering", "fk")):
        assert ALIGNERS.get(alias) is ALIGNERS.get(name)
    fns = {"das": sd.align.das, "tds": sd.align.tds, "fk": sd.align.fk_steering, "best_of_n": sd.align.best_of_n,
           "sir": sd.align.sir, "reward_guidance": sd.align.reward_guidance}
    for name, fn in fns.items():
        spec = ALIGNERS.get(name)
        assert spec.fn is fn and spec.pipelines and spec.cost is not None
    das = ALIGNERS.get("das")
    assert das.defaults()["tempering"] == "adaptive" and das.defaults()["gradient"] is False
    assert das.options_class is sd.align.das.__globals__["SMCOptions"]
    assert "alpha" not in ALIGNERS.get("best_of_n").options and "potential" in ALIGNERS.get("fk").options
    assert ALIGNERS.get("tds").defaults()["resampler"] == "systematic"  # its own default, not DAS's
    assert not ALIGNERS.get("reward_guidance").particles and not ALIGNERS.get("reward_guidance").distributed
    assert ALIGNERS.get("das").distributed


@pytest.mark.parametrize("name,options", [
    ("das", dict(alpha=0.5, gradient=True, tempering="exp")), ("tds", dict(alpha=0.5)),
    ("fk", dict(alpha=0.5, potential="max")), ("best_of_n", {}), ("sir", dict(alpha=0.5)),
    ("reward_guidance", dict(alpha=0.5, scale=2.0, particles=1)),
])
def test_run_dispatches_bit_identically_and_the_cost_model_matches(name, options):
    spec = ALIGNERS.get(name)
    p = options.get("particles", 4)
    kw = dict(options, particles=p, generator=7)
    noise = _noise(3 * p)
    via = sd.align.run(name, GMM, REWARD, noise, SIGMAS, **kw)
    direct = spec.fn(GMM, REWARD, noise, SIGMAS, **kw)
    assert torch.equal(via.samples, direct.samples)
    cost = spec.cost(len(SIGMAS) - 1, p, **{k: v for k, v in options.items() if k != "particles"})
    assert via.nfe == cost["nfe"]
    assert via.nfe_grad <= cost["nfe_grad"] and (via.nfe_grad > 0) == (cost["nfe_grad"] > 0)


def test_run_names_an_unknown_method_and_an_option_the_method_does_not_take():
    with pytest.raises(ValueError, match=r"method must be one of \[.*'das'.*'fk'.*\], got 'nope'"):
        sd.align.run("nope", GMM, REWARD, _noise(4), SIGMAS, alpha=1.0)
    with pytest.raises(TypeError, match=r"aligner 'fk' does not take option\(s\) \['gradient'\]; it takes \[.*"
                                        r"'potential'.*\]"):
        sd.align.run("fk", GMM, REWARD, _noise(4), SIGMAS, alpha=1.0, gradient=True)
    with pytest.raises(TypeError, match=r"aligner 'best_of_n' does not take option\(s\) \['alpha'\]"):
        sd.align.run("bon", GMM, REWARD, _noise(4), SIGMAS, alpha=1.0)
    with pytest.raises(TypeError, match=r"aligner 'das' needs option\(s\) \['alpha'\]"):
        sd.align.run("das", GMM, REWARD, _noise(4), SIGMAS)


def test_an_aligner_needs_the_common_calling_shape():
    def bad(x, reward, noise, sigmas, *, alpha):
        return None

    def kwargs(denoiser, reward, noise, sigmas, **options):
        return None

    with pytest.raises(TypeError, match="denoiser, reward, noise, sigmas"):
        sd.align.register_aligner("bad")(bad)
    with pytest.raises(TypeError, match="named keyword arguments"):
        sd.align.register_aligner("bad")(kwargs)
    assert "bad" not in ALIGNERS


def test_an_aligner_registered_at_run_time_runs_through_run(tiny_registered):
    noise = _noise(6)
    res = sd.align.run("tiny", GMM, REWARD, noise, SIGMAS, alpha=1.0, particles=2, shrink=0.25)
    s0 = float(SIGMAS[0])
    expected = 0.25 * GMM(noise[[0, 2, 4]] * s0, torch.full((3,), s0, dtype=torch.float64))
    assert torch.equal(res.samples, expected)
    with pytest.raises(TypeError, match=r"'tiny' does not take option\(s\) \['tempering'\]"):
        sd.align.run("tiny", GMM, REWARD, noise, SIGMAS, alpha=1.0, tempering="exp")


# ------------------------------------------------------------------------------------------------ the command line
def test_the_command_offers_and_runs_an_aligner_registered_at_run_time(tiny_registered, tmp_path):
    cli = _cli()
    help_ = CliRunner().invoke(cli, ["align", "--help"]).output
    assert "tiny" in help_ and "--shrink" in help_ and "The factor applied to the denoised estimate" in help_
    out = tmp_path / "tiny"
    r = CliRunner().invoke(cli, [*BASE, "--method", "tiny", "--particles", "2", "--shrink", "0.25", "--out", str(out)])
    assert r.exit_code == 0, r.output
    samples = load_tensors(out / "samples.safetensors")["samples"]
    noise = sd.randn((6, 2), seeds=3, dtype=torch.float64)
    s0 = float(sd.sigmas.karras(7, 0.002, 80.0)[0])
    assert torch.equal(samples, 0.25 * GMM(noise[[0, 2, 4]] * s0, torch.full((3,), s0, dtype=torch.float64)))
    m = json.loads((out / "metrics.json").read_text())
    assert m["method"] == "tiny" and m["shrink"] == 0.25 and m["nfe"] == 1
    r = CliRunner().invoke(cli, [*BASE, "--method", "tiny", "--tempering", "exp", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--tempering: not an option of --method tiny" in r.output, r.output
    r = CliRunner().invoke(cli, [*BASE, "--method", "tiny", "--eta", "0.5", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--eta: not an option of --method tiny (tiny takes --shrink, --alpha" in r.output
    assert "tiny" not in CliRunner().invoke(_cli_without_tiny(), ["align", "--help"]).output


def _cli_without_tiny():
    ALIGNERS.remove("tiny")
    try:
        return _cli()
    finally:
        sd.align.register_aligner("tiny")(tiny)


def test_a_plugin_imported_before_the_command_line_is_offered(tmp_path):
    """A module registering an aligner, imported before ``steerdiff.app.cli``: the command built at import has it."""
    (tmp_path / "my_align_plugin.py").write_text(textwrap.dedent('''
        import torch
        import steerdiff as sd

        @sd.align.register_aligner("mean_of_denoised")
        def mean_of_denoised(denoiser, reward, noise, sigmas, *, particles: int = 2, cond=None, offset: float = 0.0):
            """Per group, the mean of the particles' denoised estimates at sigmas[0], plus offset."""
            s0 = float(sigmas[0])
            d = denoiser(noise * s0, torch.full((noise.shape[0],), s0, dtype=noise.dtype), cond)
            x = d.view(-1, particles, *d.shape[1:]).mean(1) + offset
            return sd.align.AlignResult(samples=x, rewards=reward(x), method="mean_of_denoised", groups=x.shape[0],
                                        particles=particles, nfe=particles, nfe_grad=0, reward_evals=1)
    '''))
    out = tmp_path / "o"
    code = ("import my_align_plugin; from steerdiff.app.cli import main; main(["
            + ", ".join(repr(a) for a in [*BASE, "--method", "mean_of_denoised", "--offset", "1.5", "--out", str(out)])
            + "])")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    samples = load_tensors(out / "samples.safetensors")["samples"]
    noise = sd.randn((3 * 16, 2), seeds=3, dtype=torch.float64)  # --particles defaults to 16
    s0 = float(sd.sigmas.karras(7, 0.002, 80.0)[0])
    d = GMM(noise * s0, torch.full((48,), s0, dtype=torch.float64))
    assert torch.equal(samples, d.view(3, 16, 2).mean(1) + 1.5)


@pytest.mark.parametrize("method,extra,option", [
    ("fk", ["--gradient"], "--gradient"),
    ("fk", ["--no-gradient"], "--gradient"),
    ("bon", ["--tempering", "exp"], "--tempering"),
    ("guidance", ["--particles", "8"], "--particles"),
    ("bon", ["--alpha", "0.5"], "--alpha"),
    ("das", ["--scale", "2"], "--scale"),
    ("tds", ["--potential", "max"], "--potential"),
    ("sir", ["--resampler", "ssp"], "--resampler"),
    ("das", ["--scale-mode", "const"], "--scale-mode"),
])
def test_an_option_the_method_does_not_take_is_refused(tmp_path, method, extra, option):
    out = tmp_path / "o"
    r = CliRunner().invoke(_cli(), [*BASE, "--method", method, *extra, "--out", str(out)])
    name = ALIGNERS.get(method).name
    assert r.exit_code == 2 and f"{option}: not an option of --method {method} ({name} takes" in r.output, r.output
    assert not out.exists()  # refused before any sampling or output


def test_options_at_their_default_are_not_refused(tmp_path):
    r = CliRunner().invoke(_cli(), [*BASE, "--method", "bon", "--alpha", "0.1", "--scale", "1", "--particles", "2",
                                    "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output


def test_given_options_reach_the_method(tmp_path):
    """--resampler and --ess-threshold given for TDS are used (they were dropped before): the run equals the API's."""
    out = tmp_path / "tds"
    r = CliRunner().invoke(_cli(), [*BASE, "--method", "tds", "--alpha", "0.5", "--particles", "4", "--resampler",
                                    "multinomial", "--ess-threshold", "0.5", "--out", str(out)])
    assert r.exit_code == 0, r.output
    api = sd.align.tds(GMM, REWARD, sd.randn((12, 2), seeds=3, dtype=torch.float64), SIGMAS, alpha=0.5,
                       particles=4, resampler="multinomial", ess_threshold=0.5, generator=3 + 10**9, batch_size=256)
    assert torch.equal(load_tensors(out / "samples.safetensors")["samples"], api.samples)
    m = json.loads((out / "metrics.json").read_text())
    assert m["resampler"] == "multinomial" and m["output"] == "sample_one"


# ------------------------------------------------------------------------------------------------ the other registries
def test_a_tempering_schedule_registered_at_run_time():
    @sd.align.register_tempering("half")
    def half(k, gamma, span):
        return torch.full((k.numel(),), 0.5, dtype=torch.float64)

    try:
        res = sd.align.das(GMM, REWARD, _noise(8), SIGMAS, alpha=1.0, particles=4, tempering="half", generator=0)
        assert torch.equal(res.lambdas[:-1], torch.full_like(res.lambdas[:-1], 0.5))
        assert bool((res.lambdas[-1] == 1).all())
        assert "half" in TEMPERING
    finally:
        TEMPERING.remove("half")
    names = r"\['adaptive', 'constant', 'exp', 'sigma', 'zero'\]"
    with pytest.raises(ValueError, match=r"tempering must be one of " + names):
        sd.align.das(GMM, REWARD, _noise(8), SIGMAS, alpha=1.0, particles=4, tempering="half")


def test_a_resampler_registered_at_run_time():
    """An identity "resampler" (every particle its own ancestor): resampling at every step moves nothing."""

    @sd.align.register_resampler("keep")
    def keep(w, u):
        return torch.arange(w.shape[1]).repeat(w.shape[0], 1)

    seen = []
    try:
        sd.align.das(GMM, REWARD, _noise(8), SIGMAS, alpha=1.0, particles=4, resampler="keep", ess_threshold=1.0,
                     generator=0, callback=lambda info: seen.append(info["ancestors"]))
        anc = [a for a in seen if a is not None]
        assert len(anc) == len(SIGMAS) - 1 and all(torch.equal(a, torch.arange(4).repeat(2, 1)) for a in anc)
    finally:
        RESAMPLERS.remove("keep")
    with pytest.raises(ValueError, match=r"resampler must be one of \['multinomial', 'residual', 'ssp', 'stratified', "
                                         r"'systematic'\], got 'keep'"):
        sd.align.fk_steering(GMM, REWARD, _noise(8), SIGMAS, alpha=1.0, particles=4, resampler="keep")


def test_an_fk_potential_registered_at_run_time():
    """A potential that is always 1 (log G = 0): no step reweights, so no group resamples and the final weights are
    the tilt ``r(x_N) / alpha`` of the final particles alone (importance resampling)."""

    @sd.align.register_potential("flat")
    def flat(rho, carried):
        return torch.zeros_like(rho), carried

    try:
        res = sd.align.fk_steering(GMM, REWARD, _noise(8), SIGMAS, alpha=0.5, particles=4, potential="flat",
                                   generator=0)
        assert not res.resampled.any()
        expected = normalize((REWARD(res.particles_final) / 0.5).view(2, 4))
        torch.testing.assert_close(res.log_weights, expected, rtol=0, atol=1e-12)
        assert POTENTIALS.get("flat").initial == 0.0
    finally:
        POTENTIALS.remove("flat")


# ------------------------------------------------------------------------------------------------ shared SMC check
@pytest.mark.parametrize("bad,match", [
    (dict(ess_threshold=True), r"ess_threshold must lie in \(0, 1\]"),
    (dict(ess_threshold=0.0), r"ess_threshold must lie in \(0, 1\]"),
    (dict(resampler="x"), r"resampler must be one of \['multinomial'"),
    (dict(output="x"), r"output must be one of \('sample_one'"),
    (dict(particles=1), "particles must be >= 2 for SMC"),
])
def test_one_smc_options_check_for_das_tds_and_fk(bad, match):
    p = bad.get("particles", 4)
    for fn in (sd.align.das, sd.align.tds, sd.align.fk_steering):
        with pytest.raises(ValueError, match=match):
            fn(GMM, REWARD, _noise(2 * p), SIGMAS, alpha=1.0, **(dict(particles=4) | bad))
