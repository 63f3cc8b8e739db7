"""Samplers against the exact Gaussian mixture: distribution, convergence order, identities, batch invariance."""

import math

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.metrics import mode_weight_error, sliced_wasserstein
from steerdiff.models import builtin_mixture


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")


def _draw(mixture, method, steps, n=5000, seed=0, **kw):
    noise = sd.randn((n, mixture.dim), seeds=seed, dtype=torch.float64)
    return sd.sample(mixture, noise, sd.sigmas.karras(steps, 0.002, 80.0), method=method, **kw)


def test_heun_reproduces_mixture(gmm2d):
    x = _draw(gmm2d, "heun", 100)
    exact = [gmm2d.sample(5000, torch.Generator().manual_seed(100 + i)) for i in range(4)]
    # Spread of the metric between independent exact sample sets of the same size.
    spread = max(sliced_wasserstein(exact[i], exact[j]) for i in range(4) for j in range(i + 1, 4))
    ours = np.mean([sliced_wasserstein(x, e) for e in exact])
    assert ours <= spread, (ours, spread)
    assert mode_weight_error(x, gmm2d) < 0.02


def test_ddpm_reproduces_mixture(gmm2d):
    x = _draw(gmm2d, "ddpm", 200, generator=7)
    exact = [gmm2d.sample(5000, torch.Generator().manual_seed(200 + i)) for i in range(4)]
    spread = max(sliced_wasserstein(exact[i], exact[j]) for i in range(4) for j in range(i + 1, 4))
    assert np.mean([sliced_wasserstein(x, e) for e in exact]) <= 1.2 * spread
    assert mode_weight_error(x, gmm2d) < 0.03


def test_sampler_fails_on_wrong_target(gmm2d):
    # The distribution test above can fail: a mixture with shifted weights is detected.
    other = sd.models.GaussianMixture(gmm2d.weights.flip(0), gmm2d.means, gmm2d.covs)
    x = _draw(other, "heun", 100)
    assert mode_weight_error(x, gmm2d) > 0.05


def test_convergence_order_heun_beats_euler(gmm2d):
    noise = sd.randn((512, 2), seeds=3, dtype=torch.float64)
    sig = lambda k: sd.sigmas.karras(k, 0.01, 20.0)  # noqa: E731
    ref = sd.sample(gmm2d, noise, sig(2000), method="heun")
    steps = [8, 16, 32, 64]
    slopes = {}
    for method in ("euler", "heun"):
        errs = [(sd.sample(gmm2d, noise, sig(k), method=method) - ref).norm(dim=1).mean().item() for k in steps]
        slopes[method] = np.polyfit(np.log(steps), np.log(errs), 1)[0]
    assert slopes["euler"] < -0.7, slopes
    assert slopes["heun"] < slopes["euler"] - 0.6, slopes


def test_ddim_eta0_equals_euler(gmm2d):
    a = _draw(gmm2d, "ddim", 20, n=256)
    b = _draw(gmm2d, "euler", 20, n=256)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_ddpm_equals_ddim_eta1(gmm2d):
    a = _draw(gmm2d, "ddpm", 15, n=64, generator=11)
    b = _draw(gmm2d, "ddim", 15, n=64, generator=11, eta=1.0)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", ["euler", "heun", "ddim", "ddpm"])
def test_batch_invariance(gmm2d, method):
    eta = 0.5 if method == "ddim" else None
    big = _draw(gmm2d, method, 10, n=64, seed=0, generator=1000, eta=eta)
    for i in (0, 17, 63):
        noise = sd.randn((1, 2), seeds=[i], dtype=torch.float64)
        one = sd.sample(gmm2d, noise, sd.sigmas.karras(10, 0.002, 80.0), method=method, generator=[1000 + i], eta=eta)
        assert torch.equal(one[0], big[i])


def test_batch_invariance_neural_denoiser():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.SiLU(), torch.nn.Linear(64, 2))

    def denoiser(x, sigma, cond=None):
        return x / (1 + sigma[:, None] ** 2) + net(torch.cat([x, sigma.log()[:, None]], 1))

    sig = sd.sigmas.karras(8, 0.01, 10.0)
    big = sd.sample(denoiser, sd.randn((64, 2), seeds=0), sig, method="ddpm", generator=5)
    one = sd.sample(denoiser, sd.randn((1, 2), seeds=[40]), sig, method="ddpm", generator=[45])
    torch.testing.assert_close(one[0], big[40], rtol=1e-5, atol=1e-5)


def test_nfe_and_callback(gmm2d):
    seen = []
    x, stats = _draw(gmm2d, "heun", 12, n=8, callback=seen.append, return_stats=True)
    assert stats.nfe == sd.core.nfe_of("heun", 12) == 23
    assert [c["i"] for c in seen] == list(range(12))
    assert set(seen[0]) == {"i", "sigma", "sigma_next", "x", "denoised"}
    assert seen[-1]["sigma_next"] == 0
    for method in ("euler", "ddim", "ddpm"):
        _, st = _draw(gmm2d, method, 12, n=8, return_stats=True)
        assert st.nfe == 12


def test_progress_bar(gmm2d, capsys):
    _draw(gmm2d, "euler", 5, n=4, progress=True)
    assert "euler" in capsys.readouterr().err
    _draw(gmm2d, "euler", 5, n=4, progress=False)
    assert capsys.readouterr().err == ""


def test_enable_grad(gmm2d):
    noise = sd.randn((4, 2), seeds=0, dtype=torch.float64).requires_grad_(True)
    sig = sd.sigmas.karras(6, 0.01, 10.0)
    assert sd.sample(gmm2d, noise, sig, method="euler").grad_fn is None
    out = sd.sample(gmm2d, noise, sig, method="euler", enable_grad=True)
    out.sum().backward()
    # Finite-difference check of d(sum of sample 0)/d(noise[0, 0]).
    h = 1e-6
    bumped = noise.detach().clone()
    bumped[0, 0] += h
    fd = (sd.sample(gmm2d, bumped, sig, method="euler")[0].sum() - sd.sample(gmm2d, noise.detach(), sig,
                                                                           method="euler")[0].sum()) / h
    assert math.isclose(noise.grad[0, 0].item(), fd.item(), rel_tol=1e-4, abs_tol=1e-6)


# --- guidance hook ---------------------------------------------------------------------------------------------


def test_guidance_hook_gets_cond_and_null_from_one_doubled_batch(gmm2d):
    cond = torch.tensor([0, 3, 5, 3])
    seen = []

    def combine(d_cond, d_uncond, x, sigma):
        seen.append((x.clone(), sigma.clone(), d_cond.clone(), d_uncond.clone()))
        return d_uncond + 2.0 * (d_cond - d_uncond)

    counted = sd.NFECounter(gmm2d)
    noise = sd.randn((4, 2), seeds=0, dtype=torch.float64)
    sd.sample(counted, noise, sd.sigmas.karras(6, 0.01, 10.0), method="euler", cond=cond, guidance=combine)
    assert counted.calls == 6 and counted.rows == 6 * 8  # one doubled batch per step
    for x, sigma, d_cond, d_uncond in seen:
        torch.testing.assert_close(d_cond, gmm2d(x, sigma, cond), rtol=0, atol=0)
        torch.testing.assert_close(d_uncond, gmm2d(x, sigma), rtol=0, atol=0)


def test_guidance_identity_combiner_equals_conditional_sampling(gmm2d):
    cond = torch.tensor([1, 2, 2, 7])
    noise = sd.randn((4, 2), seeds=0, dtype=torch.float64)
    sig = sd.sigmas.karras(10, 0.01, 10.0)
    a = sd.sample(gmm2d, noise, sig, cond=cond, guidance=lambda dc, du, x, s: dc)
    b = sd.sample(gmm2d, noise, sig, cond=cond)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Conditional samples land in their component.
    assert torch.equal(gmm2d.responsibilities(b).argmax(1), cond)


def test_guider_object_and_reset(gmm2d):
    class Counting:
        resets = 0
        calls = 0
        schedules = []

        def set_schedule(self, sigmas):
            assert self.resets == len(self.schedules)  # the schedule comes before the reset
            self.schedules.append(sigmas)

        def reset(self):
            self.resets += 1

        def guide(self, denoiser, x, sigma, cond):
            self.calls += 1
            return denoiser(x, sigma, cond)

    g = Counting()
    noise = sd.randn((2, 2), seeds=0, dtype=torch.float64)
    cond = torch.tensor([0, 1])
    sd.sample(gmm2d, noise, sd.sigmas.karras(5, 0.01, 10.0), method="heun", cond=cond, guidance=g)
    sd.sample(gmm2d, noise, sd.sigmas.karras(5, 0.01, 10.0), method="heun", cond=cond, guidance=g)
    assert g.resets == 2 and g.calls == 2 * 9
    torch.testing.assert_close(g.schedules[1], sd.sigmas.karras(5, 0.01, 10.0))


def test_guidance_without_cond_is_an_error(gmm2d):
    with pytest.raises(ValueError, match="cond"):
        _draw(gmm2d, "euler", 3, n=2, guidance=lambda dc, du, x, s: dc)
