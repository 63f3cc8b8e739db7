"""The exact checks of the local descriptors (spec B.5 checks 1-4, float64) against closed forms and brute-force counts.

1. linear maps: psi = sum log s_i, nu = number of non-zero s_i, delta = 0 (no units);
2. one-hidden-layer ReLU: autograd J = W2 diag(1[W1 z + b1 > 0]) W1; psi and nu equal within one region; delta = the
   brute-force count of hyperplanes w_i^T z + b_i = 0 whose sign changes over the vertex set;
3. delta(r1) <= delta(r2) for r1 < r2 with the same directions (first-layer units only);
4. the sketch with m = k gives the exact psi.
Plus the generator map of a Gaussian prior, whose Jacobian is a closed-form product of per-step factors.
"""

import math

import pytest
import torch
from torch import nn

import steerdiff as sd
from steerdiff.geometry import jacobian, local_descriptors, neighbourhood

F64 = torch.float64


def _orthonormal(n, m, seed):
    q, _ = torch.linalg.qr(torch.randn(n, m, generator=torch.Generator().manual_seed(seed), dtype=F64))
    return q


def _linear(k=16, d=64, zeros=0, seed=0):
    s = torch.linspace(0.3, 3.0, k, dtype=F64)
    s[k - zeros:] = 0.0
    a = _orthonormal(d, k, seed) @ torch.diag(s) @ _orthonormal(k, k, seed + 1).T
    b = torch.randn(d, generator=torch.Generator().manual_seed(seed + 2), dtype=F64)
    return a, b, s


def test_linear_map_psi_is_the_sum_of_log_singular_values():
    a, b, s = _linear()
    z = torch.randn(5, 16, dtype=F64, generator=torch.Generator().manual_seed(3))
    d = local_descriptors(lambda x: x @ a.T + b, z, map_kind="decoder")
    truth = s.log().sum()
    assert torch.allclose(d.psi, truth.expand(5), rtol=1e-8, atol=0)
    assert d.nu.tolist() == [16] * 5
    assert d.delta.tolist() == [0] * 5 and d.delta_per_layer == {}  # a plain function has no units
    assert torch.allclose(d.singular_values, s.flip(0).expand(5, 16), rtol=1e-10, atol=1e-12)


def test_linear_map_with_four_zero_singular_values_has_rank_12():
    a, b, s = _linear(zeros=4)
    layer = nn.Linear(16, 64).double()
    with torch.no_grad():
        layer.weight.copy_(a)
        layer.bias.copy_(b)
    z = torch.randn(4, 16, dtype=F64, generator=torch.Generator().manual_seed(4))
    d = local_descriptors(layer, z, map_kind="decoder")
    assert d.nu.tolist() == [12] * 4
    assert torch.allclose(d.psi, s[:12].log().sum().expand(4), rtol=1e-8, atol=0)
    assert d.delta.tolist() == [0] * 4  # a linear layer has no activation units


def _relu_net(k, h, d, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(k, h), nn.ReLU(), nn.Linear(h, d)).double()


def test_relu_jacobian_equals_the_masked_weight_product():
    net = _relu_net(6, 40, 10)
    w1, b1, w2 = net[0].weight.detach(), net[0].bias.detach(), net[2].weight.detach()
    z = torch.randn(7, 6, dtype=F64, generator=torch.Generator().manual_seed(1))
    jac, _ = jacobian(net, z)
    for i in range(7):
        mask = ((w1 @ z[i] + b1) > 0).to(F64)
        assert torch.allclose(jac[i], w2 @ torch.diag(mask) @ w1, atol=1e-10, rtol=0)


def test_psi_and_nu_are_constant_inside_one_linear_region():
    net = _relu_net(6, 40, 10)
    w1, b1 = net[0].weight.detach(), net[0].bias.detach()
    z = torch.randn(1, 6, dtype=F64, generator=torch.Generator().manual_seed(2))
    pre = w1 @ z[0] + b1
    # a step well inside the region: smaller than the distance to the nearest hyperplane
    margin = (pre.abs() / w1.norm(dim=1)).min()
    step = torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(5))
    z2 = z + 0.5 * margin * step / step.norm()
    assert torch.equal(w1 @ z2[0] + b1 > 0, pre > 0)
    d = local_descriptors(net, torch.cat([z, z2]), map_kind="decoder", delta_radius=None)
    assert d.nu[0] == d.nu[1]
    assert abs(float(d.psi[0] - d.psi[1])) < 1e-12


@pytest.mark.parametrize("include_center", [True, False])
def test_delta_equals_the_brute_force_hyperplane_count(include_center):
    k, h = 5, 64
    net = _relu_net(k, h, 8, seed=1)
    w1, b1 = net[0].weight.detach(), net[0].bias.detach()
    z = torch.randn(6, k, dtype=F64, generator=torch.Generator().manual_seed(6))
    radius, n_vertices, seed = 0.4, 8, 11
    d = local_descriptors(net, z, map_kind="decoder", delta_radius=radius, n_vertices=n_vertices, seed=seed,
                          include_center=include_center, batch_size=16)
    verts = neighbourhood(z, radius, n_vertices, torch.Generator().manual_seed(seed), include_center)
    for i in range(6):
        signs = (verts[i] @ w1.T + b1) > 0  # [V, h]
        crossing = int((signs.any(0) & ~signs.all(0)).sum())
        assert int(d.delta[i]) == crossing
    assert 0 < int(d.delta.sum()) < 6 * h  # the test is not vacuous
    assert d.units_per_layer == {"1": h}


def test_the_vertices_are_z_plus_minus_r_times_orthonormal_directions():
    z = torch.randn(3, 7, dtype=F64)
    verts = neighbourhood(z, 0.25, 10, torch.Generator().manual_seed(0))
    assert verts.shape == (3, 11, 7) and torch.equal(verts[:, 0], z)
    u = (verts[:, 1:6] - z[:, None]) / 0.25
    assert torch.allclose(verts[:, 6:], z[:, None] - 0.25 * u, atol=1e-14)
    gram = u @ u.transpose(1, 2)
    assert torch.allclose(gram, torch.eye(5, dtype=F64).expand(3, 5, 5), atol=1e-12)


def test_delta_grows_with_the_radius_for_first_layer_units():
    net = _relu_net(4, 128, 6, seed=2)
    z = torch.randn(10, 4, dtype=F64, generator=torch.Generator().manual_seed(7))
    radii = [0.05, 0.1, 0.3, 0.6, 1.2]
    deltas = [local_descriptors(net, z, map_kind="decoder", delta_radius=r, seed=3).delta for r in radii]
    for lo, hi in zip(deltas, deltas[1:], strict=False):
        assert bool((lo <= hi).all())
    assert int(deltas[-1].sum()) > int(deltas[0].sum())


@pytest.mark.parametrize("k,d", [(8, 12), (8, 8)])  # forward products (D > m) and reverse mode (D <= m)
def test_a_full_sketch_gives_the_exact_psi(k, d):
    net = _relu_net(k, 48, d, seed=3)
    z = torch.randn(5, k, dtype=F64, generator=torch.Generator().manual_seed(8))
    exact = local_descriptors(net, z, map_kind="decoder", delta_radius=None)
    sketch = local_descriptors(net, z, map_kind="decoder", delta_radius=None, sketch_dim=k)
    assert torch.allclose(sketch.psi, exact.psi, atol=1e-6, rtol=0)
    assert torch.equal(sketch.nu, exact.nu)
    small = local_descriptors(net, z, map_kind="decoder", delta_radius=None, sketch_dim=3)
    assert small.singular_values.shape == (5, 3) and bool((small.nu <= 3).all())


def _gaussian_prior(k, s2):
    return sd.models.GaussianMixture([1.0], torch.zeros(1, k, dtype=F64), torch.full((1,), s2, dtype=F64))


def _ddim_factor(sig, s2, extra=lambda s: 0.0):
    """The scalar Jacobian of the EDM-DDIM (eta 0) map of a N(0, s2 I) prior: x_T = sigma_max z, then per step
    x' = D + (s'/s)(x - D) with D = (s2 / (s2 + s^2) + extra(s)) x."""
    f = sig[0]
    for s, s1 in zip(sig[:-1], sig[1:], strict=False):
        dfac = s2 / (s2 + s**2) + extra(s)
        f *= dfac + (s1 / s) * (1 - dfac)
    return f


def test_the_generator_map_of_a_gaussian_prior_has_the_closed_form_jacobian():
    k, s2 = 6, 0.7
    sig = sd.sigmas.karras(8, 0.002, 40.0)
    z = sd.randn((3, k), seeds=0, dtype=F64)
    d = local_descriptors(_gaussian_prior(k, s2), z, sigmas=sig, method="ddim")
    f = _ddim_factor(sig.tolist(), s2)
    assert torch.allclose(d.psi, torch.full((3,), k * math.log(abs(f)), dtype=F64), rtol=1e-10, atol=0)
    assert d.info["map"] == "generator" and d.info["steps"] == 8


def test_the_guided_generator_map_has_the_closed_form_jacobian():
    """Reward r(x, sigma) = -c |x|^2 / 2 on the noisy state: D_g = D - rho sigma^2 c x, so the guided DDIM map is
    again a scalar multiple of the identity; its Jacobian goes through the guidance term (create_graph)."""
    k, s2, c, rho = 5, 0.8, 0.05, 1.5
    sig = sd.sigmas.karras(6, 0.002, 10.0)

    def reward(x, sigma, cond=None):
        return -0.5 * c * (x**2).sum(1)

    guide = sd.guidance.RewardGuidance(reward, rho=rho, create_graph=True)
    z = sd.randn((2, k), seeds=1, dtype=F64)
    d = local_descriptors(_gaussian_prior(k, s2), z, sigmas=sig, guidance=guide)
    f = _ddim_factor(sig.tolist(), s2, extra=lambda s: -rho * s**2 * c)
    assert torch.allclose(d.psi, torch.full((2,), k * math.log(abs(f)), dtype=F64), rtol=1e-10, atol=0)
    plain = local_descriptors(_gaussian_prior(k, s2), z, sigmas=sig)
    f0 = _ddim_factor(sig.tolist(), s2)
    assert torch.allclose(plain.psi, torch.full((2,), k * math.log(abs(f0)), dtype=F64), rtol=1e-10, atol=0)


def test_the_sampler_jacobian_matches_central_differences_on_a_relu_denoiser():
    torch.manual_seed(0)
    net = sd.models.MLP(dim=16, hidden=[32, 32], noise_input="raw", activation="relu")
    den = sd.models.EDMPrecond(net, sigma_data=0.6).double()
    with torch.no_grad():
        for p in den.parameters():
            p.normal_(0, 0.3)
    g = sd.geometry.GeneratorMap(den, sigmas=sd.sigmas.karras(5, 0.002, 10.0))
    z = sd.randn((1, 16), seeds=2, dtype=F64)
    jac, _ = jacobian(g, z)
    h = 1e-7
    for j in range(0, 16, 5):
        e = torch.zeros_like(z)
        e[0, j] = h
        with torch.no_grad():
            fd = (g(z + e) - g(z - e))[0] / (2 * h)
        assert torch.allclose(jac[0, :, j], fd, atol=1e-6, rtol=1e-6)
