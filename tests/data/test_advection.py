"""The stochastic advection-diffusion sequences of the DyDiff validation (A.9 of
shared/methods/temporal_geometry_control.md): determinism, prefix stability, the forcing's size, and the oracle
against independent truths (an integer shift without diffusion is a roll; the oracle's error matches its closed
form)."""

import dataclasses

import numpy as np
import pytest
import torch

from steerdiff.data import advection as A


@pytest.mark.parametrize("dims", [1, 2])
def test_shapes_determinism_prefix_stability(dims):
    spec = A.spec_for(dims)
    x = A.simulate(6, seed=3, spec=spec)
    assert x.shape == (6, 10, *spec.frame_shape) and x.dtype == torch.float32
    assert torch.equal(x, A.simulate(6, seed=3, spec=spec))
    assert torch.equal(x[:2], A.simulate(2, seed=3, spec=spec))
    assert not torch.equal(x, A.simulate(6, seed=4, spec=spec))
    assert torch.equal(A.training_stream(3, dims)(0, 6), A.simulate(6, 3, 1, spec))  # step 0 -> key 1
    test = A.test_set(dims, n=4)
    assert torch.equal(test, A.simulate(4, A.TEST_SEED, 0, spec))


@pytest.mark.parametrize("dims", [1, 2])
def test_forcing_has_the_stated_std(dims):
    spec = A.spec_for(dims)
    x = A.simulate(3000, seed=0, spec=spec)
    resid = x[:, 1:2] - A.oracle_mean(x[:, :1], 1, spec)  # one step: the forcing / 0.6
    assert (resid * A.SCALE).std().item() == pytest.approx(spec.forcing_std, rel=0.03)


def test_integer_advection_without_diffusion_is_a_roll():
    spec = dataclasses.replace(A.SPEC_1D, velocity=(1.0,), kappa=0.0)
    ctx = torch.randn(3, 4, 32, dtype=torch.float64)
    mean = A.oracle_mean(ctx, 3, spec)
    for h in range(1, 4):
        assert torch.allclose(mean[:, h - 1], torch.roll(ctx[:, -1], h, dims=-1), atol=1e-10)
    spec2 = dataclasses.replace(A.SPEC_2D, velocity=(1.0, 2.0), kappa=0.0)
    ctx2 = torch.randn(2, 4, 16, 16, dtype=torch.float64)
    assert torch.allclose(A.oracle_mean(ctx2, 1, spec2)[:, 0], torch.roll(ctx2[:, -1], (1, 2), dims=(-2, -1)),
                          atol=1e-10)


@pytest.mark.parametrize("dims", [1, 2])
def test_oracle_error_matches_closed_form_and_beats_persistence(dims):
    spec = A.spec_for(dims)
    x = A.simulate(3000, seed=1, spec=spec)
    ctx, fut = x[:, :4], x[:, 4:]
    err = ((A.oracle_mean(ctx, spec=spec) - fut) ** 2).flatten(2).mean((0, 2))
    np.testing.assert_allclose(err.numpy(), A.oracle_mse(spec=spec).numpy(), rtol=0.06)
    pers = ((A.persistence(ctx, spec=spec) - fut) ** 2).mean()
    assert err.mean() < 0.6 * pers


def test_bad_inputs():
    with pytest.raises(ValueError, match="dims"):
        A.spec_for(3)
    with pytest.raises(ValueError, match="seed"):
        A.simulate(2, seed=-1)
    with pytest.raises(ValueError, match="n must"):
        A.simulate(-2)
    with pytest.raises(ValueError, match="context must"):
        A.oracle_mean(torch.zeros(2, 4, 31))
    with pytest.raises(ValueError, match="velocity"):
        A.AdvectionSpec(dims=2, velocity=(1.0,))
