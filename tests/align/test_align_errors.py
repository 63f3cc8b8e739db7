"""Bad input gets clear errors; non-finite rewards or denoiser outputs are contained (DESIGN.md "Errors")."""

import math
from functools import partial

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.align import best_of_n, reward_guidance, sir, tds
from steerdiff.align import das as library_das
from steerdiff.align.rewards import Linear
from steerdiff.app.protocols.das import PAPER_DAS, IsotropicMixture, validation_sigmas
from steerdiff.models import GaussianMixture

# These tests check the paper's sampler (reward-gradient proposal, exponential tempering); the library's
# default, gradient-free DAS with adaptive tempering, is checked in tests/align/test_das_default.py.
das = partial(library_das, **PAPER_DAS)

MIX = IsotropicMixture(GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], 0.3))
SIG = validation_sigmas(12)
R = Linear([1.0, 0.0])


def noise(rows):
    return sd.randn((rows, 2), seeds=0, dtype=torch.float64)


@pytest.mark.parametrize("alpha", [0.0, -1.0, math.nan, math.inf])
def test_alpha_must_be_positive(alpha):
    for fn in (das, tds, sir, reward_guidance):
        with pytest.raises(ValueError, match="alpha"):
            fn(MIX, R, noise(8), SIG, alpha=alpha, particles=4)


def test_particles_and_noise_layout():
    with pytest.raises(ValueError, match="particles must be >= 2"):
        das(MIX, R, noise(8), SIG, alpha=1.0, particles=1)
    with pytest.raises(ValueError, match="particles must be a positive integer"):
        das(MIX, R, noise(8), SIG, alpha=1.0, particles=0)
    with pytest.raises(ValueError, match="multiple of particles=4"):
        das(MIX, R, noise(10), SIG, alpha=1.0, particles=4)
    with pytest.raises(ValueError, match="noise must be"):
        das(MIX, R, torch.zeros(8, 2, dtype=torch.int64), SIG, alpha=1.0, particles=4)
    with pytest.raises(ValueError, match="cond"):
        das(MIX, R, noise(8), SIG, alpha=1.0, particles=4, cond=torch.zeros(3, dtype=torch.int64))


@pytest.mark.parametrize("thr", [0.0, -0.1, 1.5, math.nan])
def test_ess_threshold_must_lie_in_0_1(thr):
    with pytest.raises(ValueError, match="ess_threshold"):
        das(MIX, R, noise(8), SIG, alpha=1.0, particles=4, ess_threshold=thr)


def test_other_arguments():
    kw = dict(alpha=1.0, particles=4)
    for bad, match in [(dict(resampler="x"), "resampler"), (dict(output="x"), "output"),
                       (dict(tempering="x"), "tempering"), (dict(tempering=-1.0), "exponent"),
                       (dict(tempering=[0.5] * 3), "levels"), (dict(eta=0.0), "eta"),
                       (dict(batch_size=0), "batch_size"),
                       (dict(tempering_start=1.0), "tempering_start"), (dict(gamma=-0.1), "gamma")]:
        with pytest.raises(ValueError, match=match):
            das(MIX, R, noise(8), SIG, **kw, **bad)
    with pytest.raises(ValueError, match="strictly decreasing"):
        das(MIX, R, noise(8), torch.tensor([1.0, 2.0, 0.0]), **kw)
    with pytest.raises(TypeError, match="reward must be a callable"):
        das(MIX, 3.0, noise(8), SIG, **kw)
    with pytest.raises(ValueError, match="scale_mode"):
        reward_guidance(MIX, R, noise(8), SIG, alpha=1.0, scale_mode="x")


@pytest.mark.parametrize("fn", [das, tds, best_of_n, sir, reward_guidance])
def test_reward_of_the_wrong_shape(fn):
    kw = {} if fn is best_of_n else {"alpha": 1.0}
    with pytest.raises(ValueError, match=r"reward must return shape \[B\] = \[8\]"):
        fn(MIX, lambda x: x.sum(1, keepdim=True), noise(8), SIG, particles=4, batch_size=8, **kw)
    with pytest.raises(TypeError, match="reward must return a tensor"):
        fn(MIX, lambda x: x.sum(1).tolist(), noise(8), SIG, particles=4, **kw)


def test_black_box_reward_needs_gradient_false():
    def numpy_reward(x):
        return torch.from_numpy(np.asarray(x.detach().numpy()[:, 0]))

    with pytest.raises(ValueError, match="gradient=False"):
        das(MIX, numpy_reward, noise(8), SIG, alpha=1.0, particles=4)
    res = das(MIX, numpy_reward, noise(8), SIG, alpha=1.0, particles=4, gradient=False)
    assert res.nfe_grad == 0 and torch.isfinite(res.samples).all()


def _nan_for(rows_bad):
    """Linear reward, NaN (or inf) for the flagged particles (by their x0 coordinate sign)."""

    def r(x):
        out = x[:, 0].clone()
        return torch.where(rows_bad(x), torch.full_like(out, math.nan), out)

    return r


def test_nan_reward_for_some_particles_does_not_poison_the_others():
    P, G = 8, 4
    seeds = list(range(G * P))
    # NaN wherever the denoised estimate has x2 > 0.3: those particles are killed, counted and replaced.
    r = _nan_for(lambda x: x[:, 1] > 0.3)
    res = das(MIX, r, noise(G * P), SIG, alpha=1.0, particles=P, generator=seeds, output="weighted")
    assert res.n_nonfinite > 0 and torch.isfinite(res.particles_final).all()
    assert torch.isfinite(res.log_weights.exp()).all() and torch.isfinite(res.log_evidence).all()
    assert (res.resampled | (res.nonfinite[:-1] == 0)).all()  # a step with a killed particle resamples its group
    # A reward that is NaN / +inf only in group 0 leaves groups 1..3 exactly as in the clean run.
    clean = das(MIX, R, noise(G * P), SIG, alpha=1.0, particles=P, generator=seeds, output="weighted")
    first = das(MIX, _nan_first_rows(P), noise(G * P), SIG, alpha=1.0, particles=P, generator=seeds,
                output="weighted")
    assert first.nonfinite[:, 0].sum() > 0 and first.nonfinite[:, 1:].sum() == 0
    torch.testing.assert_close(first.particles_final[P:], clean.particles_final[P:])
    torch.testing.assert_close(first.log_weights[1:], clean.log_weights[1:])


def _nan_first_rows(P):
    calls = {"n": 0}

    def r(x):
        out = x[:, 0].clone()
        calls["n"] += 1
        if calls["n"] % 3 == 0:  # every third call, the first two particles of group 0 are NaN / +inf
            out[0], out[1] = math.nan, math.inf
        return out

    return r


def test_all_particles_non_finite_is_a_clear_error():
    with pytest.raises(FloatingPointError, match=r"every particle of group 0 .* step 0"):
        das(MIX, lambda x: torch.full((x.shape[0],), math.nan, dtype=x.dtype) + 0 * x[:, 0], noise(8), SIG,
            alpha=1.0, particles=4)
    with pytest.raises(FloatingPointError, match="non-finite for every sample"):
        best_of_n(MIX, lambda x: torch.full((x.shape[0],), math.nan, dtype=x.dtype), noise(8), SIG, particles=4)


def test_nan_from_the_denoiser_kills_only_those_particles():
    def flaky(x, sigma, cond=None):
        d = MIX(x, sigma)
        if float(sigma[0]) < 5:  # at low noise, rows with x1 > 3 come back NaN
            d = torch.where((x[:, :1] > 3), torch.full_like(d, math.nan), d)
        return d

    res = das(flaky, R, noise(64), SIG, alpha=1.0, particles=8, generator=0)
    assert res.n_nonfinite > 0 and torch.isfinite(res.samples).all()


def test_baselines_survive_partial_nan_rewards():
    r = _nan_for(lambda x: x[:, 1] > 0.5)
    g = reward_guidance(MIX, r, noise(32), SIG, alpha=1.0, generator=0)
    assert torch.isfinite(g.samples).all() and g.n_nonfinite > 0
    b = best_of_n(MIX, r, noise(32), SIG, particles=8, generator=0)
    assert torch.isfinite(b.rewards).all()
    s = sir(MIX, r, noise(32), SIG, alpha=1.0, particles=8, generator=0)
    assert torch.isfinite(s.rewards).all()
