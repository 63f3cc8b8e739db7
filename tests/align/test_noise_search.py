"""Noise search (``steerdiff.align.noise_search``; Ma et al., CVPR 2025) tested as an optimiser on the exact mixtures:
the ODE sample of each noise against a hand-written Euler loop, the best reward against the exact expected maximum of
``n`` draws from the model, monotone in the budget, zero-order against random search at equal NFE in 16-D, the cost
counted by an independent counting denoiser, and sharded runs (gloo, 2 processes) equal to one process, bitwise."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

import steerdiff as sd
from steerdiff.align import ALIGNERS, noise_search
from steerdiff.align.rewards import Quadratic
from steerdiff.app.protocols.das import PROBLEMS, IsotropicMixture, validation_sigmas

WORKER = Path(__file__).with_name("search_worker.py")


class Counting:
    """Counts the rows it is called on, independently of the library's NFE counter."""

    def __init__(self, fn):
        self.fn, self.rows = fn, 0

    def __call__(self, x, sigma, cond=None):
        self.rows += x.shape[0]
        return self.fn(x, sigma, cond)


def _problem(name="P1"):
    pr = PROBLEMS[name]()
    return pr, IsotropicMixture(pr.mixture)


def test_registered_with_options_and_a_cost_model():
    spec = ALIGNERS.get("noise_search")
    assert spec.fn is noise_search and spec.distributed
    assert {"search", "rounds", "budget", "sampler", "neighbourhood", "path_from", "path_to"} <= set(spec.options)


def test_one_round_is_the_best_of_the_ode_samples_of_the_given_noises():
    pr, den = _problem("P2")
    sig = validation_sigmas(12)
    noise = sd.randn((3 * 5, 2), seeds=4, dtype=torch.float64)
    res = noise_search(den, pr.reward, noise, sig, particles=5)
    # An independent Euler loop of the probability-flow ODE: x <- D + sigma' (x - D) / sigma.
    x = noise * sig[0]
    for s, s_next in zip(sig[:-1].tolist(), sig[1:].tolist(), strict=True):
        d = den(x, torch.full((x.shape[0],), s, dtype=torch.float64))
        x = d + s_next * (x - d) / s
    r = pr.reward(x).view(3, 5)
    best = r.argmax(1)
    torch.testing.assert_close(res.samples, x.view(3, 5, 2)[torch.arange(3), best], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.rewards, r.max(1).values, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sampler", ["euler", "heun", "dpmpp_2m"])
@pytest.mark.parametrize("search", ["random", "zero_order", "paths"])
def test_cost_is_counted_exactly(sampler, search):
    pr, den = _problem("P1")
    steps, G, P, R = 8, 2, 3, 3
    sig = torch.cat([validation_sigmas(steps - 1), torch.zeros(1, dtype=torch.float64)])  # ends in 0
    counting = Counting(den)
    res = noise_search(counting, pr.reward, sd.randn((G * P, 2), seeds=0, dtype=torch.float64), sig, particles=P,
                       search=search, rounds=R, sampler=sampler, generator=1, path_from=5, path_to=2)
    per_traj = {"euler": steps, "heun": 2 * steps - 1, "dpmpp_2m": steps}[sampler]
    again = per_traj if search != "paths" else {"euler": steps - 2, "heun": 2 * (steps - 2) - 1,
                                                "dpmpp_2m": steps - 2}[sampler]
    expected = P * (per_traj + (R - 1) * again)  # candidates x steps, per group
    assert counting.rows == G * expected and res.nfe == expected and res.nfe_grad == 0
    assert res.reward_evals == P * R
    cost = ALIGNERS.get("noise_search").cost(steps, P, search=search, rounds=R, sampler=sampler, path_from=5,
                                             path_to=2)
    assert cost == {"nfe": expected, "nfe_grad": 0}
    # a budget in NFE buys the most rounds that fit in it
    b = noise_search(den, pr.reward, sd.randn((G * P, 2), seeds=0, dtype=torch.float64), sig, particles=P,
                     search=search, budget=expected + again * P - 1, sampler=sampler, generator=1, path_from=5,
                     path_to=2)
    assert b.extras["rounds"] == R and b.nfe == expected


def test_random_search_reaches_the_exact_expected_maximum_of_n_model_draws():
    """With the exact denoiser the ODE pushes N(0, I) to the mixture, so random search's best reward over ``n``
    candidates is distributed as the maximum of ``n`` rewards of exact mixture samples."""
    pr, den = _problem("P2")
    G, P, R = 48, 4, 3
    res = noise_search(den, pr.reward, sd.randn((G * P, 2), seeds=1, dtype=torch.float64), validation_sigmas(40),
                       particles=P, rounds=R, generator=100)
    exact = pr.reward(pr.mixture.sample(240_000, torch.Generator().manual_seed(0))).view(-1, P * R).max(1).values
    se = math.sqrt(res.rewards.var() / G + exact.var() / exact.numel())
    assert abs(float(res.rewards.mean() - exact.mean())) < 4 * se + 0.02, (res.rewards.mean(), exact.mean(), se)


@pytest.mark.parametrize("search", ["random", "zero_order", "paths"])
def test_best_reward_increases_with_the_budget(search):
    pr, den = _problem("P3")
    G, P = 24, 4
    noise = sd.randn((G * P, 16), seeds=2, dtype=torch.float64)
    sig = validation_sigmas(10)
    means = []
    for rounds in (1, 3, 9):
        res = noise_search(den, pr.reward, noise, sig, particles=P, search=search, rounds=rounds, generator=9)
        trace = res.extras["best_per_round"]
        assert (trace[1:] >= trace[:-1]).all()  # each round keeps the best so far
        assert torch.equal(trace[-1], res.rewards)
        means.append(float(res.rewards.mean()))
    assert means[0] < means[1] < means[2], means


def test_zero_order_beats_random_search_at_equal_nfe_in_16d():
    """In 16-D a fresh noise rarely improves on the best of many; a neighbour of the best often does (Ma et al. 2025,
    Section 4: zero-order search scales better with the verifier budget)."""
    pr, den = _problem("P4")
    G, P = 24, 8
    noise = sd.randn((G * P, 16), seeds=3, dtype=torch.float64)
    runs = {s: noise_search(den, pr.reward, noise, validation_sigmas(10), particles=P, search=s, rounds=6,
                            generator=7) for s in ("random", "zero_order")}
    assert runs["random"].nfe == runs["zero_order"].nfe
    diff = runs["zero_order"].rewards - runs["random"].rewards
    assert float(diff.mean()) > 3 * float(diff.std()) / math.sqrt(G), diff


def test_bad_arguments_are_named():
    pr, den = _problem("P1")
    noise, sig = sd.randn((4, 2), seeds=0, dtype=torch.float64), validation_sigmas(6)
    with pytest.raises(ValueError, match="search must be one of"):
        noise_search(den, pr.reward, noise, sig, particles=2, search="annealing")
    with pytest.raises(ValueError, match="sampler must be deterministic"):
        noise_search(den, pr.reward, noise, sig, particles=2, sampler="ddpm")
    with pytest.raises(ValueError, match="budget"):
        noise_search(den, pr.reward, noise, sig, particles=2, budget=5)
    with pytest.raises(ValueError, match="rounds or budget"):
        noise_search(den, pr.reward, noise, sig, particles=2, budget=500, rounds=2)
    with pytest.raises(ValueError, match="path_to < path_from"):
        noise_search(den, pr.reward, noise, sig, particles=2, search="paths", rounds=2, path_from=2, path_to=3)
    with pytest.raises(ValueError, match="neighbourhood"):
        noise_search(den, pr.reward, noise, sig, particles=2, neighbourhood=0.0)


def test_a_reward_and_its_verifier_give_the_same_search():
    pr, den = _problem("P1")
    noise, sig = sd.randn((8, 2), seeds=0, dtype=torch.float64), validation_sigmas(6)
    a = noise_search(den, pr.reward, noise, sig, particles=4, search="zero_order", rounds=3, generator=2)
    v = sd.align.as_verifier(pr.reward, batch_size=3)
    b = noise_search(den, v, noise, sig, particles=4, search="zero_order", rounds=3, generator=2)
    assert torch.equal(a.samples, b.samples) and torch.equal(a.rewards, b.rewards)
    assert v.rows == 8 * 3 and b.verifier_time > 0


def test_pareto_search_picks_are_not_dominated():
    """With a Pareto verifier a group's pick is never dominated by a candidate of the last round (a dominating
    candidate would rank in a better front and replace it), and its reported reward is the verifier's weighted sum."""
    mix = PROBLEMS["P1"]().mixture
    r1, r2 = Quadratic([0.0, 2.0]), Quadratic.around([0.5, 0.0], c=[4.0, 0.0])
    G, P = 4, 6
    for rounds in (1, 3):
        pv = sd.align.ParetoVerifier([r1, r2], weights=[0.25, 0.75])
        res = noise_search(mix, pv, sd.randn((G * P, 2), seeds=0, dtype=torch.float64), validation_sigmas(6),
                           particles=P, rounds=rounds, generator=4)
        pick = torch.stack([r1(res.samples), r2(res.samples)])  # [2, G]
        cand = torch.stack([r1(res.particles_final), r2(res.particles_final)]).view(2, G, P)
        dominated = ((cand >= pick[:, :, None]).all(0) & (cand > pick[:, :, None]).any(0)).any(1)
        assert not dominated.any(), rounds
        if rounds == 1:  # the pick is one of the candidates
            assert ((cand == pick[:, :, None]).all(0)).any(1).all()
        torch.testing.assert_close(res.rewards, 0.25 * pick[0] + 0.75 * pick[1])


def test_sharded_search_equals_one_process_bitwise(run_ranks, tmp_path):
    ranks = run_ranks([sys.executable, str(WORKER), str(tmp_path)], world=2, timeout=150, fresh=tmp_path)
    for r in ranks:
        assert r.returncode == 0, f"rank {r.rank} failed:\n{r.stderr[-3000:]}"
    for rank in range(2):
        cases = json.loads((tmp_path / f"rank{rank}.json").read_text())["cases"]
        assert len(cases) == 7
        for name, case in cases.items():
            assert all(case["equal"].values()), (name, case)
            assert case["layout"] == ("particles" if "particles" in name or "unet" in name else "groups")


@pytest.mark.parametrize("family", ["sd", "sd3"])
def test_cli_pipeline_noise_search_scores_the_decoded_images(tmp_path, family):
    """``steerdiff align --pipeline --method noise_search`` on a tiny random-weight SD (VP) and SD3 (flow, sigma =
    inf first) pipeline: finite images, the reported rewards are the decoded images' red reward, and the NFE is
    particles x rounds x steps (x the evaluations per denoiser call under CFG)."""
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    import tiny_pipelines
    from click.testing import CliRunner

    from steerdiff.align.rewards import redness
    from steerdiff.app.cli import main
    from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer
    from steerdiff.io import load_tensors

    tok = tmp_path / "tok"
    write_clip_tokenizer(tok)
    {"sd": tiny_pipelines.make_sd, "sd3": tiny_pipelines.make_sd3}[family](tok).save_pretrained(tmp_path / family)
    base = ["align", "--pipeline", str(tmp_path / family), "--prompt", "a red disk", "--reward", "red", "--n", "2",
            "--steps", "3", "--no-progress", "--method", "noise_search", "--particles", "3"]
    out = tmp_path / "o"
    res = CliRunner().invoke(main, [*base, "--search", "zero_order", "--rounds", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    m = json.loads((out / "metrics.json").read_text())
    images = load_tensors(out / "samples.safetensors")["samples"]
    assert images.shape[0] == 2 and torch.isfinite(images).all()
    torch.testing.assert_close(torch.tensor(m["decoded_reward_per_image"]), redness(images), rtol=1e-4, atol=1e-5)
    assert m["nfe"] == 3 * 2 * 3 * m.get("evaluations_per_denoiser_call", 1) and m["nfe_grad"] == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_follows_the_noise(dtype):
    """Samples keep the noise's dtype; the pick agrees with the float32 run up to the half precision's rounding."""
    pr, den = _problem("P1")
    noise = sd.randn((4 * 4, 2), seeds=0)
    ref = noise_search(den, pr.reward, noise, validation_sigmas(8), particles=4, rounds=2, generator=3)
    half = noise_search(den, pr.reward, noise.to(dtype), validation_sigmas(8), particles=4, rounds=2, generator=3)
    assert half.samples.dtype == dtype and torch.isfinite(half.samples).all() and half.rewards.dtype == torch.float64
    torch.testing.assert_close(half.rewards, ref.rewards, rtol=0.05, atol=0.05)


def test_callback_sees_every_step_of_every_trajectory():
    pr, den = _problem("P1")
    seen = []
    sig = validation_sigmas(8)
    noise_search(den, pr.reward, sd.randn((6, 2), seeds=0, dtype=torch.float64), sig, particles=3,
                 search="paths", rounds=3, generator=0, path_from=5, path_to=2,
                 callback=lambda info: seen.append((info["i"], info["sigma"], info["x"].shape)))
    steps = [i for i, _, _ in seen]
    assert steps == list(range(8)) + 2 * list(range(2, 8))  # round 0 in full, then each path from sigma_2
    assert all(s == float(sig[i]) and shape == (6, 2) for i, s, shape in seen)
