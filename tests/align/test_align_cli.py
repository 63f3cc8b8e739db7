"""``steerdiff align`` end to end (a click group built here; the main CLI registers the command)."""

import json

import click
import pytest
from click.testing import CliRunner

from steerdiff.app.cli.align import align_cmd
from steerdiff.models.io import shipped_models


@click.group()
def cli():
    pass


cli.add_command(align_cmd)


def test_align_mixture_reports_error_to_exact(tmp_path):
    out = tmp_path / "o"
    res = CliRunner().invoke(cli, ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "1",
                                   "--particles", "8", "--n", "256", "--steps", "30", "--out", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["method"] == "das" and m["nfe"] == 8 * 30 and len(m["ess_frac_per_step"]) == 31
    assert m["relerr_to_exact"] < 0.15 and m["mode_tv_to_exact"] < 0.1
    assert (out / "samples.png").read_bytes()[:4] == b"\x89PNG"
    for method in ("bon", "sir", "guidance", "tds"):
        parts = [] if method == "guidance" else ["--particles", "4"]  # guidance: one chain per output
        r = CliRunner().invoke(cli, ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--method", method,
                                     *parts, "--n", "8", "--steps", "10", "--out", str(tmp_path / method),
                                     "--no-progress"])
        assert r.exit_code == 0, (method, r.output)


def test_align_default_is_gradient_free_and_gradient_flag_gives_the_paper_sampler(tmp_path):
    base = ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "1", "--particles", "4", "--n", "8",
            "--steps", "10", "--no-progress"]
    r = CliRunner().invoke(cli, base + ["--out", str(tmp_path / "default")])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "default" / "metrics.json").read_text())
    assert m["nfe_grad"] == 0 and m["nfe"] == 4 * 10
    r = CliRunner().invoke(cli, base + ["--gradient", "--tempering", "exp", "--out", str(tmp_path / "paper")])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "paper" / "metrics.json").read_text())
    assert m["nfe_grad"] > 0 and m["nfe"] == 4 * 10
    lam = m["lambda_per_step"]
    assert lam == sorted(lam) and lam[-1] == 1.0  # the exp schedule rises to 1


def test_align_bad_input(tmp_path):
    base = ["align", "--model", "gmm2d", "--steps", "5", "--n", "2", "--out", str(tmp_path), "--no-progress"]
    r = CliRunner().invoke(cli, base + ["--reward", "bogus"])
    assert r.exit_code != 0 and "unknown reward" in r.output
    r = CliRunner().invoke(cli, base + ["--reward", "linear:1,0", "--alpha", "0"])
    assert r.exit_code != 0 and "alpha" in r.output
    r = CliRunner().invoke(cli, base + ["--reward", "linear:1,0", "--particles", "1"])
    assert r.exit_code != 0 and "particles" in r.output
    r = CliRunner().invoke(cli, base + ["--reward", "linear:1,0", "--ess-threshold", "2"])
    assert r.exit_code != 0 and "ess_threshold" in r.output
    r = CliRunner().invoke(cli, base + ["--reward", "class:3"])
    assert r.exit_code != 0 and "image model" in r.output
    r = CliRunner().invoke(cli, ["align", "--model", "nope", "--reward", "ink", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "nope" in r.output


@pytest.mark.skipif("digits" not in shipped_models(), reason="shipped digits model not available")
def test_align_digits_with_progress_bar(tmp_path):
    out = tmp_path / "d"
    res = CliRunner().invoke(cli, ["align", "--model", "digits", "--reward", "class:3", "--alpha", "0.1",
                                   "--particles", "4", "--n", "2", "--steps", "6", "--out", str(out),
                                   "--progress"])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["nfe"] == 4 * 6 and 0 <= m["class_accuracy"] <= 1 and "ess_frac_per_step" in m
    assert (out / "samples.png").exists()


def test_reward_dimension_is_checked_before_sampling(tmp_path):
    """A linear reward with one coefficient per sample entry fits; any other size is a clear error: from the spec
    parser and the shape check (before sampling), from the reward itself (API), and as a --reward error (CLI)."""
    import torch

    import steerdiff as sd
    from steerdiff.align.rewards import Linear, WeightedSum, check_reward_shape, from_spec, ink

    gmm = sd.models.builtin_mixture("gmm2d")
    assert float(from_spec("linear:1,0", sample_shape=(2,))(torch.tensor([[3.0, 4.0]]))) == 3.0
    check_reward_shape(WeightedSum([(1.0, Linear([1.0, 0.0])), (0.5, ink)]), (2,))
    check_reward_shape(ink, (1, 8, 8))
    for spec, shape in (("linear:1", (2,)), ("linear:1,0,0", (2,)), ("linear:1,0", (1, 8, 8)),
                        ("0.5*linear:1,0+ink", (3,))):
        with pytest.raises(ValueError, match=r"reward .*entries"):
            from_spec(spec, sample_shape=shape)
    with pytest.raises(ValueError, match="different sample sizes"):
        check_reward_shape(WeightedSum([(1.0, Linear([1.0])), (1.0, Linear([1.0, 0.0]))]), (2,))
    with pytest.raises(ValueError, match="finite"):
        Linear([1.0, float("nan")])
    noise = sd.randn((4, 2), seeds=0, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"1 coefficient\(s\) but the samples have 2 entries"):
        sd.align.das(gmm, Linear([1.0]), noise, sd.sigmas.karras(5)[:-1], alpha=1.0, particles=2)
    r = CliRunner().invoke(cli, ["align", "--model", "gmm2d", "--reward", "linear:1", "--n", "2", "--steps", "3",
                                 "--out", str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code == 2 and "--reward" in r.output and "(2 entries)" in r.output, r.output
    assert not (tmp_path / "o").exists()  # refused before any sampling or output
