"""Dynamical Diffusion (Guo et al., ICLR 2025): the exact unit tests (1)-(6) of section A.9 of
shared/methods/temporal_geometry_control.md, every core sampler through the A.5 wrapper, and bad inputs."""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core.registry import SAMPLERS
from steerdiff.metrics.forecast import crps_fair
from steerdiff.models import EDMPrecond, FrameContext, FrameMixer
from steerdiff.temporal import DyDiffDenoiser, forecast, mix, mixing_matrix, theta_bar, unmix

# ---------------------------------------------------------------------------------------------------------------
# helpers: explicit matrices (float64), independent of mix / unmix


def explicit_mix(v: torch.Tensor, theta: float) -> torch.Tensor:
    m = mixing_matrix(theta, v.shape[1])
    return torch.einsum("st,bt...->bs...", m, v.double())


def explicit_unmix(w: torch.Tensor, theta: float) -> torch.Tensor:
    m = mixing_matrix(theta, w.shape[1])
    flat = w.double().reshape(w.shape[0], w.shape[1], -1)
    return torch.linalg.solve(m, flat).reshape(w.shape)


def random_frame_mixer(frames=6, frame=(5,), n_context=2, seed=0, width=32) -> EDMPrecond:
    torch.manual_seed(seed)
    net = FrameMixer(frames, list(frame), n_context, width=width, blocks=2, fourier_dim=8, emb_dim=16)
    with torch.no_grad():  # the output layer starts at zero; make the network non-trivial
        net.out.weight.normal_(0, 0.3)
        net.out.bias.normal_(0, 0.1)
    return EDMPrecond(net, sigma_data=1.0).eval()


# ---------------------------------------------------------------------------------------------------------------
# (1) unmix(mix(v)) = v; mix equals the explicit lower-triangular matrix


@pytest.mark.parametrize("theta", [0.5, 0.9, 1.0])
def test_1_unmix_inverts_mix(theta):
    v = torch.randn(4, 16, 3, 2, generator=torch.Generator().manual_seed(1))
    w = mix(v, torch.full((4,), theta))
    assert w.dtype == torch.float32
    assert (unmix(w, theta) - v).abs().max() < 1e-5
    assert (w.double() - explicit_mix(v, theta)).abs().max() < 1e-5
    assert (unmix(w, theta).double() - explicit_unmix(w, theta)).abs().max() < 1e-4


def test_1_theta_per_batch_element():
    v = torch.randn(3, 7, 4, dtype=torch.float64)
    thetas = torch.tensor([0.3, 0.75, 1.0], dtype=torch.float64)
    w = mix(v, thetas)
    for i, t in enumerate(thetas.tolist()):
        assert torch.allclose(w[i : i + 1], explicit_mix(v[i : i + 1], t), atol=1e-12)
    assert torch.allclose(unmix(w, thetas), v, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# (2) rows of M have unit norm; the schedule values quoted in A.2


@pytest.mark.parametrize("theta", [0.001, 0.3, 0.5, 0.745, 1.0])
def test_2_rows_unit_norm(theta):
    m = mixing_matrix(theta, 16)
    assert torch.allclose(m.norm(dim=1), torch.ones(16, dtype=torch.float64), atol=1e-6)
    assert torch.equal(m, m.tril())


def test_2_theta_bar_schedule():
    # A.2: r = 0.5 gives theta_bar = 1.0, 0.999, 0.745, 0.500 at sigma = 0.0094, 0.045, 1.02, 35.6
    tb = theta_bar(torch.tensor([0.0094, 0.045, 1.02, 35.6]), 0.5)
    assert torch.allclose(tb, torch.tensor([1.0, 0.999, 0.745, 0.500]), atol=1.5e-3)
    assert theta_bar(torch.tensor([math.inf]), 0.5).item() == 0.5
    assert theta_bar(torch.tensor([0.0]), 0.7).item() == 1.0
    assert theta_bar(torch.tensor([1e6]), 1.0).item() == pytest.approx(1e-3)  # A.10 clamp


# ---------------------------------------------------------------------------------------------------------------
# (3) r = 0: the wrapper is the wrapped network, bit for bit


def test_3_r0_is_bit_identical():
    net = random_frame_mixer()
    dy = DyDiffDenoiser(net, r=0.0)
    y = torch.randn(5, 6, 5)
    sigma = torch.tensor([0.01, 0.3, 1.0, 7.0, 80.0])
    ctx = torch.randn(5, 2, 5)
    with torch.no_grad():
        assert torch.equal(dy(y, sigma, ctx), net(y, sigma, FrameContext(ctx)))
        assert torch.equal(dy(y, sigma, FrameContext(ctx)), net(y, sigma, ctx))
        assert not torch.equal(DyDiffDenoiser(net, r=0.5)(y, sigma, ctx), net(y, sigma, ctx))


# ---------------------------------------------------------------------------------------------------------------
# (4) the VP-DDIM loop of A.5 (discrete cosine schedule, random eps-net) == EDM-DDIM on y with DyDiffDenoiser


def cosine_schedule(T=1000, s=0.008):
    """``make_beta_schedule("cosine")`` and the ``cosine-r`` gamma schedule, the repo's way (betas, cumprod)."""
    t = torch.arange(T + 1, dtype=torch.float64) / T
    f = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    betas = (1 - f[1:] / f[:-1]).clamp(max=0.999)
    alphabar = torch.cumprod(1 - betas, 0)
    return f, alphabar


def theta_schedule(f, r):
    g = r * f / f[0] + (1 - r)
    gammas = (1 - g[1:] / g[:-1]).clamp(0, 0.999)
    return torch.cumprod(1 - gammas, 0)


class RandomEpsNet(torch.nn.Module):
    """A random VP eps-network ``eps(x_vp, t)`` on ``[B, S, d]`` that couples all frames."""

    def __init__(self, frames, d, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        n = frames * d
        self.w1 = torch.randn(n, 64, generator=g, dtype=torch.float64) / math.sqrt(n)
        self.w2 = torch.randn(64, n, generator=g, dtype=torch.float64) / 8
        self.wt = torch.randn(64, generator=g, dtype=torch.float64)

    def forward(self, x_vp, t):
        h = torch.tanh(x_vp.flatten(1) @ self.w1 + torch.outer(t.double() / 1000, self.wt))
        return (h @ self.w2).reshape(x_vp.shape)


def test_4_vp_ddim_loop_equals_edm_ddim_on_y():
    frames, d, r, b = 6, 4, 0.5, 3
    f, alphabar = cosine_schedule()
    thetas = theta_schedule(f, r)
    sig_table = ((1 - alphabar) / alphabar).sqrt()
    # A.2's quoted values: sigma(t) = 0.0094, 0.045, 1.02, 35.6 at t = 1, 21, 501, 981
    assert torch.allclose(sig_table[[1, 21, 501, 981]], torch.tensor([0.0094, 0.045, 1.02, 35.6], dtype=torch.float64),
                          rtol=1e-2)
    ts = list(range(981, 0, -20))  # 981, 961, ..., 1 (50 steps)
    eps_net = RandomEpsNet(frames, d)
    z = torch.randn(b, frames, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    # --- the paper's loop, VP form, explicit matrices
    def M(t):
        return mixing_matrix(float(thetas[t]), frames)

    def apply(m, v):
        return torch.einsum("st,btd->bsd", m, v)

    def solve(m, v):
        return torch.linalg.solve(m, v)

    x = apply(M(ts[0]), z)
    for i, t in enumerate(ts):
        ab = alphabar[t]
        eps = eps_net(x, torch.full((b,), float(t)))
        x0 = solve(M(t), (x - (1 - ab).sqrt() * eps) / ab.sqrt())
        e = solve(M(t), eps)
        if i + 1 < len(ts):
            tn = ts[i + 1]
            abn, mn = alphabar[tn], M(tn)
            x = abn.sqrt() * apply(mn, x0 + ((1 - abn) / abn).sqrt() * e)
        else:  # alphabar_prev = theta_bar_prev = 1
            x = x0
    vp_result = x

    # --- EDM DDIM on y with the wrapper; the mixed-space denoiser D~(x) = x - sigma eps(x_vp, t(sigma))
    sigmas = torch.cat([sig_table[ts], torch.zeros(1, dtype=torch.float64)])

    def mixed_denoiser(xm, sigma, cond=None):
        t = torch.stack([(sig_table - s).abs().argmin() for s in sigma])
        assert torch.allclose(sig_table[t], sigma, rtol=1e-12)
        x_vp = xm / (1 + sigma**2).sqrt()[:, None, None]
        return xm - sigma[:, None, None] * eps_net(x_vp, t.double())

    # the wrapper's theta_bar(sigma) must match the repo's gamma-cumprod schedule at these levels
    assert torch.allclose(theta_bar(sig_table[ts], r), thetas[ts], atol=1e-9)
    dy = DyDiffDenoiser(mixed_denoiser, r=r, n_context=2)
    noise = z / (alphabar[ts[0]].sqrt() * sigmas[0])  # y_T = M^-1 x_T / sqrt(abar) = z / sqrt(abar)
    edm_result = sd.sample(dy, noise, sigmas, method="ddim")
    assert (edm_result - vp_result).abs().max() < 1e-4


# ---------------------------------------------------------------------------------------------------------------
# (5) empirical covariance of mix(eps) matches M M^T


def test_5_mixed_noise_covariance():
    frames, theta = 8, 0.6
    eps = torch.randn(20000, frames, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    w = mix(eps, theta)
    emp = w.T @ w / w.shape[0]
    m = mixing_matrix(theta, frames)
    ref = m @ m.T
    assert torch.linalg.norm(emp - ref) / torch.linalg.norm(ref) < 0.05
    assert torch.allclose(torch.diagonal(ref), torch.ones(frames, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------------------------
# (6) fair CRPS: PWM == pairwise, and a point ensemble scores its MAE


def test_6_fair_crps_forms_and_point_ensemble():
    g = torch.Generator().manual_seed(6)
    ens = torch.randn(5, 7, 3, 4, generator=g, dtype=torch.float64)
    obs = torch.randn(5, 3, 4, generator=g, dtype=torch.float64)
    pwm = crps_fair(ens, obs, member_dim=1, reduction="none", method="pwm")
    pair = crps_fair(ens, obs, member_dim=1, reduction="none", method="pairwise")
    assert (pwm - pair).abs().max() < 1e-6
    point = obs[:, None].expand(-1, 6, -1, -1) + 0.0 * ens[:, :6]
    target = torch.randn(5, 3, 4, generator=g, dtype=torch.float64)
    assert crps_fair(point, target).item() == pytest.approx((obs - target).abs().mean().item(), abs=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# every core sampler runs through the wrapper and equals ordinary sampling of y (A.5 theorem), on an exact Gaussian


def gaussian_pair(frames=5, d=3, r=0.5, seed=0):
    """The exact y-denoiser of x0 ~ N(0, C) and the exact mixed-space denoiser E[M x0 | M (x0 + sigma eps)]."""
    g = torch.Generator().manual_seed(seed)
    n = frames * d
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    cov = a @ a.T / n + 0.1 * torch.eye(n, dtype=torch.float64)
    eye = torch.eye(n, dtype=torch.float64)

    def y_denoiser(y, sigma, cond=None):
        out = [cov @ torch.linalg.solve(cov + s**2 * eye, v.flatten()) for v, s in zip(y, sigma, strict=True)]
        return torch.stack(out).reshape(y.shape)

    def mixed_denoiser(x, sigma, cond=None):
        out = []
        for v, s in zip(x, sigma, strict=True):
            m = torch.kron(mixing_matrix(float(theta_bar(s, r)), frames), torch.eye(d, dtype=torch.float64))
            out.append(m @ cov @ torch.linalg.solve(cov + s**2 * eye, torch.linalg.solve(m, v.flatten())))
        return torch.stack(out).reshape(x.shape)

    return y_denoiser, mixed_denoiser


SAMPLER_NAMES = [name for name, spec in SAMPLERS.items() if not spec.required]


def test_sampler_list_is_the_core_one():
    assert {"euler", "heun", "ddim", "ddpm"} <= set(SAMPLER_NAMES)
    assert any(n.startswith("dpmpp") for n in SAMPLER_NAMES) and any(n.startswith("unipc") for n in SAMPLER_NAMES)


@pytest.mark.parametrize("method", SAMPLER_NAMES)
def test_every_sampler_through_the_wrapper_equals_sampling_y(method):
    frames, d = 5, 3
    y_den, mixed_den = gaussian_pair(frames, d)
    dy = DyDiffDenoiser(mixed_den, r=0.5, n_context=2)
    noise = sd.randn((3, frames, d), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(6, 0.01, 20.0)
    a = sd.sample(dy, noise, sigmas, method=method, generator=7)
    b = sd.sample(y_den, noise, sigmas, method=method, generator=7)
    assert torch.isfinite(a).all()
    assert (a - b).abs().max() < 1e-8 * (1 + b.abs().max())


# ---------------------------------------------------------------------------------------------------------------
# forecast, save/load, bad inputs


def test_forecast_shape_members_and_batch_independence():
    net = random_frame_mixer(frames=6, frame=(5,), n_context=2)
    dy = DyDiffDenoiser(net, r=0.5)
    ctx = torch.randn(3, 2, 5)
    ens = forecast(dy, ctx, members=4, steps=3)
    assert ens.shape == (3, 4, 4, 5)
    one = forecast(dy, ctx[1:2], members=4, steps=3, seed=4)  # case 1 of the batch used seeds 4..7
    assert torch.allclose(one[0], ens[1], atol=1e-5)
    full = forecast(dy, ctx[0], members=2, steps=3, future_only=False)
    assert full.shape == (1, 2, 6, 5)


def test_save_load_roundtrip(tmp_path):
    dy = DyDiffDenoiser(random_frame_mixer(), r=0.3)
    sd.models.save(dy, tmp_path / "m")
    back = sd.temporal.load_forecaster(tmp_path / "m")
    assert back.r == 0.3 and back.n_context == 2
    y, s, c = torch.randn(2, 6, 5), torch.tensor([0.5, 3.0]), torch.randn(2, 2, 5)
    with torch.no_grad():
        assert torch.equal(back(y, s, c), dy(y, s, c))
    sd.models.save(random_frame_mixer(), tmp_path / "plain")
    with pytest.raises(ValueError, match="not a DyDiff forecaster"):
        sd.temporal.load_forecaster(tmp_path / "plain")


def test_bad_inputs():
    net = random_frame_mixer(frames=6, frame=(5,), n_context=2)
    for bad in (0, 6, 7, -1):
        with pytest.raises(ValueError, match="n_context"):
            DyDiffDenoiser(net, r=0.5, n_context=bad)
        with pytest.raises(ValueError, match="n_context"):
            FrameMixer(6, [5], bad)
    for bad in (-0.1, 1.5, float("nan"), "0.5"):
        with pytest.raises(ValueError, match="r must"):
            DyDiffDenoiser(net, r=bad)
        with pytest.raises(ValueError, match="r must"):
            theta_bar(torch.tensor([1.0]), bad)
    dy = DyDiffDenoiser(net, r=0.5)
    y, s = torch.randn(2, 6, 5), torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="frames have shape"):
        dy(y, s, torch.randn(2, 2, 4))  # context frames of another shape
    with pytest.raises(ValueError, match="n_context"):
        dy(y, s, torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="y must have shape"):
        dy(torch.randn(2, 6, 4), s)
    with pytest.raises(ValueError, match="context must"):
        forecast(dy, torch.randn(2, 2, 4))
    with pytest.raises(ValueError, match="members"):
        forecast(dy, torch.randn(2, 2, 5), members=0)
    with pytest.raises(ValueError, match="at least 2 members"):
        crps_fair(torch.randn(3, 1, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="theta_bar must lie"):
        mix(torch.randn(2, 3), torch.tensor([0.0, 0.5]))
    with pytest.raises(ValueError, match="sequence"):
        mix(torch.randn(3), 0.5)
