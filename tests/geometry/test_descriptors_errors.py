"""Bad input to the local descriptors gets a ValueError naming the argument."""

import numpy as np
import pytest
import torch
from torch import nn

import steerdiff as sd
from steerdiff.geometry import GeneratorMap, local_descriptors

F64 = torch.float64


@pytest.fixture
def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)).double()


@pytest.fixture
def z():
    return torch.randn(3, 6, dtype=F64)


@pytest.mark.parametrize("G", [
    lambda x: x.detach() * 2.0,                                   # cut from the graph
    lambda x: torch.from_numpy(np.tanh(x.detach().numpy())),     # through numpy
    lambda x: (x > 0).long(),                                    # integer output
])
def test_a_map_not_differentiable_in_z_is_refused_naming_G(G, z):
    with pytest.raises(ValueError, match=r"^G: .*not differentiable"):
        local_descriptors(G, z, map_kind="decoder")


def test_a_denoiser_run_without_grad_is_refused(z):
    gmm = sd.models.GaussianMixture([1.0], torch.zeros(1, 6, dtype=F64), torch.ones(1, dtype=F64))

    def frozen(x, sigma, cond=None):
        with torch.no_grad():
            return gmm(x, sigma)

    with pytest.raises(ValueError, match="^G: .*denoiser's output"):
        local_descriptors(frozen, z, sigmas=sd.sigmas.karras(4, 0.002, 10.0))


@pytest.mark.parametrize("tol", [0.0, -1e-3, float("nan"), float("inf")])
def test_rank_tol_must_be_positive(net, z, tol):
    with pytest.raises(ValueError, match="rank_tol"):
        local_descriptors(net, z, map_kind="decoder", rank_tol=tol)


def test_sketch_dim_larger_than_the_output_is_refused(net, z):
    with pytest.raises(ValueError, match="sketch_dim=5 is larger than the output dimension D=4"):
        local_descriptors(net, z, map_kind="decoder", sketch_dim=5)


def test_sketch_dim_larger_than_the_latent_is_refused(net, z):
    with pytest.raises(ValueError, match="sketch_dim=7 is larger than the latent dimension k=6"):
        local_descriptors(net, z, map_kind="decoder", sketch_dim=7)


@pytest.mark.parametrize("kwargs,name", [
    ({"sketch_dim": 0}, "sketch_dim"), ({"delta_radius": 0.0}, "delta_radius"), ({"delta_radius": -1}, "delta_radius"),
    ({"n_vertices": 3}, "n_vertices"), ({"n_vertices": 14}, "n_vertices"), ({"batch_size": 0}, "batch_size"),
    ({"map_kind": "vae"}, "map_kind"),
])
def test_other_bad_arguments_are_named(net, z, kwargs, name):
    kwargs = {"map_kind": "decoder", **kwargs}
    with pytest.raises(ValueError, match=name):
        local_descriptors(net, z, **kwargs)


def test_the_denoiser_map_needs_sigma_and_the_generator_a_deterministic_sampler(z):
    gmm = sd.models.GaussianMixture([1.0], torch.zeros(1, 6, dtype=F64), torch.ones(1, dtype=F64))
    with pytest.raises(ValueError, match="sigma="):
        local_descriptors(gmm, z, map_kind="denoiser")
    with pytest.raises(ValueError, match="sigma must be a positive"):
        local_descriptors(gmm, z, map_kind="denoiser", sigma=-1.0)
    with pytest.raises(ValueError, match="deterministic"):
        GeneratorMap(gmm, method="ddpm")


def test_latents_must_be_a_float_batch(net):
    with pytest.raises(ValueError, match="z must be"):
        local_descriptors(net, torch.zeros(6, dtype=torch.long), map_kind="decoder")


def test_the_denoiser_map_at_a_fixed_sigma_is_the_posterior_shrinkage():
    """For N(0, s2 I), D(x, sigma) = s2 / (s2 + sigma^2) x: psi = k log(s2 / (s2 + sigma^2))."""
    gmm = sd.models.GaussianMixture([1.0], torch.zeros(1, 6, dtype=F64), torch.full((1,), 0.5, dtype=F64))
    d = local_descriptors(gmm, torch.randn(2, 6, dtype=F64), map_kind="denoiser", sigma=0.3)
    assert torch.allclose(d.psi, torch.full((2,), 6 * np.log(0.5 / 0.59), dtype=F64), rtol=1e-12)
    assert d.info["map"] == "denoiser" and d.info["sigma"] == 0.3
