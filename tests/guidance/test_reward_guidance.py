"""RewardGuidance (D + rho sigma^2 grad_x r) and the shared reward gradient, against closed forms on a Gaussian prior.

For N(mu, S) the denoiser is affine, D(x) = mu + S (S + sigma^2 I)^-1 (x - mu), so a linear reward a^T x on the
noisy state shifts D by rho sigma^2 a and a linear reward a^T x0 on D(x) by rho sigma^2 (S (S + sigma^2 I)^-1)^T a.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import GUIDERS, RewardGuidance, build_guider, reward_gradient

F64 = torch.float64


@pytest.fixture(scope="module")
def gauss():
    torch.manual_seed(0)
    a = torch.randn(3, 3, dtype=F64)
    cov = a @ a.T + 0.5 * torch.eye(3, dtype=F64)
    mu = torch.tensor([0.3, -1.0, 2.0], dtype=F64)
    return sd.models.GaussianMixture([1.0], mu[None], cov[None]), mu, cov


def _null(b):
    return torch.full((b,), -1, dtype=torch.long)


def test_a_linear_noisy_reward_shifts_D_by_rho_sigma2_a(gauss):
    gmm, _, _ = gauss
    a = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    x, sigma = torch.randn(4, 3, dtype=F64), torch.tensor([0.1, 0.5, 1.0, 3.0], dtype=F64)
    g = RewardGuidance(lambda x, s, c: x @ a, rho=1.5)
    out = g.guide(gmm, x, sigma, _null(4))
    assert torch.allclose(out, gmm(x, sigma) + 1.5 * sigma[:, None] ** 2 * a, atol=1e-12)


def test_a_linear_clean_reward_goes_through_the_denoiser(gauss):
    gmm, _, cov = gauss
    a = torch.tensor([0.2, 1.0, -1.0], dtype=F64)
    x, sigma = torch.randn(3, 3, dtype=F64), torch.tensor([0.2, 0.7, 2.0], dtype=F64)
    out = RewardGuidance(lambda x0: x0 @ a, rho=-0.8, kind="clean").guide(gmm, x, sigma, _null(3))
    for i in range(3):
        s2 = float(sigma[i]) ** 2
        gain = cov @ torch.linalg.inv(cov + s2 * torch.eye(3, dtype=F64))  # dD/dx
        assert torch.allclose(out[i], gmm(x[i:i + 1], sigma[i:i + 1])[0] - 0.8 * s2 * gain.T @ a, atol=1e-10)


def test_the_shared_reward_gradient_matches_the_closed_form_and_drops_bad_rows():
    q = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=F64)
    x = torch.randn(5, 2, dtype=F64)

    def r(v):
        out = -0.5 * torch.einsum("bi,ij,bj->b", v, q, v)
        return torch.where(torch.arange(5) == 3, torch.full_like(out, float("nan")), out), v.sum()

    val, grad, aux = reward_gradient(r, x)
    assert torch.allclose(grad[[0, 1, 2, 4]], -(x @ q)[[0, 1, 2, 4]], atol=1e-12)
    assert torch.equal(grad[3], torch.zeros(2, dtype=F64)) and torch.isnan(val[3])
    assert not grad.requires_grad and not val.requires_grad and float(aux) == pytest.approx(float(x.sum()))


def test_create_graph_keeps_the_gradient_differentiable():
    x = torch.randn(4, 2, dtype=F64, requires_grad=True)
    _, grad, _ = reward_gradient(lambda v: (v**3).sum(1), x, create_graph=True)  # grad = 3 v^2
    (hess_diag,) = torch.autograd.grad(grad.sum(), x)
    assert torch.allclose(hess_diag, 6 * x.detach(), atol=1e-12)


def test_rho_0_is_the_plain_sampler_and_nfe_is_unchanged(gauss):
    gmm, _, _ = gauss
    noise, sig = sd.randn((8, 3), seeds=0, dtype=F64), sd.sigmas.karras(10, 0.002, 20.0)
    plain, s0 = sd.sample(gmm, noise, sig, method="ddim", return_stats=True)
    same = sd.sample(gmm, noise, sig, method="ddim", cond=_null(8), guidance=RewardGuidance(lambda x, s, c: x[:, 0],
                                                                                             rho=0.0))
    assert torch.equal(plain, same)
    guided, s1 = sd.sample(gmm, noise, sig, method="ddim", cond=_null(8), return_stats=True,
                           guidance=RewardGuidance(lambda x, s, c: x[:, 0], rho=1.0))
    assert s1.nfe == s0.nfe == 10
    assert float((guided[:, 0] - plain[:, 0]).mean()) > 0  # pushed up the rewarded coordinate


def test_the_ddim_run_of_a_linear_noisy_reward_on_a_gaussian_is_closed_form():
    """1-D N(0, s2): with r = a x on the noisy state each DDIM step is x' = D + (s'/s)(x - D), D = s2/(s2+s^2) x +
    rho s^2 a, an affine recursion computed here by hand."""
    s2, a, rho = 0.6, 0.7, 1.3
    gmm = sd.models.GaussianMixture([1.0], torch.zeros(1, 1, dtype=F64), torch.full((1,), s2, dtype=F64))
    sig = sd.sigmas.karras(7, 0.002, 5.0).tolist()
    noise = sd.randn((4, 1), seeds=3, dtype=F64)
    out = sd.sample(gmm, noise, torch.tensor(sig, dtype=F64), method="ddim", cond=_null(4),
                    guidance=RewardGuidance(lambda x, s, c: a * x[:, 0], rho=rho))
    x = noise[:, 0] * sig[0]
    for s, s1 in zip(sig[:-1], sig[1:], strict=False):
        d = s2 / (s2 + s**2) * x + rho * s**2 * a
        x = d + (s1 / s) * (x - d)
    assert torch.allclose(out[:, 0], x, atol=1e-12)


def test_the_registry_form_uses_rho_equal_w_minus_1(gauss):
    gmm, _, _ = gauss
    assert "reward" in GUIDERS.names()
    x, sigma = torch.randn(4, 3, dtype=F64), torch.full((4,), 0.5, dtype=F64)
    r = lambda x, s, c: x.sum(1)  # noqa: E731
    a = build_guider("reward", 2.5, reward=r).guide(gmm, x, sigma, _null(4))
    b = RewardGuidance(r, rho=1.5).guide(gmm, x, sigma, _null(4))
    assert torch.equal(a, b)
    assert torch.equal(build_guider("reward", 1.0).guide(gmm, x, sigma, _null(4)), gmm(x, sigma))
    with pytest.raises(ValueError, match="needs reward="):
        build_guider("reward", 2.0)


def test_the_window_limits_guidance_to_part_of_the_schedule(gauss):
    gmm, _, _ = gauss
    sig = sd.sigmas.karras(10, 0.002, 20.0)
    noise = sd.randn((4, 3), seeds=1, dtype=F64)
    r = lambda x, s, c: x[:, 1]  # noqa: E731
    off = sd.sample(gmm, noise, sig, method="ddim", cond=_null(4), guidance=RewardGuidance(r, 2.0, start=0.5, stop=0.5))
    assert torch.equal(off, sd.sample(gmm, noise, sig, method="ddim"))


@pytest.mark.parametrize("kwargs,match", [
    ({"reward": 3.0}, "reward must be a callable"), ({"rho": float("nan")}, "rho"), ({"rho": "1"}, "rho"),
    ({"kind": "latent"}, "kind"), ({"clip": 0.0}, "clip"),
])
def test_bad_arguments(kwargs, match):
    args = {"reward": lambda x, s, c: x.sum(1), "rho": 1.0, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        RewardGuidance(**args)
