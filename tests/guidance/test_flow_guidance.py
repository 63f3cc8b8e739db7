"""Guiders and Compose on a flow schedule from sigma = inf, against the exact mixture.

Independent truths: the exact conditional mixture (``GaussianMixture.restrict``); the mixture rewritten as a
conditional velocity network ``v = (x_t - E[x0 | x_t, c]) / t`` wrapped by ``FlowDenoiser``, which a guider must not
be able to tell from the mixture itself; AND composition on a factorised mixture, exact at every sigma (inf
included: the prior means compose linearly).
"""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core import FlowDenoiser, nfe_of
from steerdiff.guidance import APG, CFG, CFGRescale, Compose
from steerdiff.models import GaussianMixture, builtin_mixture

INF = math.inf


def _velocity_net(mixture):
    def net(x_t, t, cond=None):
        tt = t.to(torch.float64)[:, None]
        one = tt == 1
        keep = torch.where(one, torch.ones_like(tt), 1 - tt)
        sigma = torch.where(one, torch.full_like(tt, INF), tt / keep)
        return (x_t - mixture(x_t / keep, sigma[:, 0], cond)) / tt
    return net


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")


GUIDERS = {
    "cfg": lambda: CFG(3.0),
    "apg": lambda: APG(3.0, eta=0.0, norm_threshold=2.0, momentum=-0.5),
    "cfg_rescale": lambda: CFGRescale(3.0, phi=0.7),
}


@pytest.mark.parametrize("method", ["euler", "heun", "ddpm"])
@pytest.mark.parametrize("name", sorted(GUIDERS))
def test_a_guided_flow_model_from_inf_is_the_guided_mixture(gmm2d, name, method):
    flow = FlowDenoiser(_velocity_net(gmm2d), t_scale=1.0)
    sig = sd.sigmas.flow(10, shift=3.0)
    noise = sd.randn((32, 2), seeds=0, dtype=torch.float64)
    cond = torch.arange(32) % 8
    kw = {"generator": 5} if method == "ddpm" else {}
    a, sa = sd.sample(flow, noise, sig, method=method, cond=cond, guidance=GUIDERS[name](), return_stats=True, **kw)
    b = sd.sample(gmm2d, noise, sig, method=method, cond=cond, guidance=GUIDERS[name](), **kw)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert sa.nfe == 2 * nfe_of(method, 10)
    assert torch.isfinite(a).all()


def test_cfg_at_w1_from_inf_samples_the_exact_conditional(gmm2d):
    sig = sd.sigmas.flow(12, shift=3.0)
    noise = sd.randn((16, 2), seeds=1, dtype=torch.float64)
    x = sd.sample(gmm2d, noise, sig, method="heun", cond=torch.full((16,), 3), guidance=CFG(1.0))
    torch.testing.assert_close(x, sd.sample(gmm2d.restrict(torch.tensor(3)), noise, sig, method="heun"),
                               rtol=0, atol=1e-10)


def test_and_composition_from_inf_follows_the_exact_joint_conditional():
    levels = (-2.0, 0.0, 2.0)
    combos = [(a, b) for a in range(3) for b in range(3)]
    gmm = GaussianMixture(torch.ones(9), [[levels[a], levels[b]] for a, b in combos], 0.3**2, labels=combos)
    attrs = {"a": ["m2", "z", "p2"], "b": ["m2", "z", "p2"]}
    guider = Compose("a=p2 & b=m2", 1.0, attrs)
    sig = sd.sigmas.flow(16, shift=3.0)
    noise = sd.randn((64, 2), seeds=2, dtype=torch.float64)
    x = sd.sample(gmm, noise, sig, method="euler", cond=guider.cond(64), guidance=guider)
    joint = sd.sample(gmm.restrict(torch.tensor([2, 0])), noise, sig, method="euler")
    torch.testing.assert_close(x, joint, rtol=0, atol=1e-8)


def test_a_guidance_window_at_the_start_of_a_flow_schedule_covers_the_inf_step(gmm2d):
    sig = sd.sigmas.flow(10, shift=3.0)
    noise = sd.randn((8, 2), seeds=3, dtype=torch.float64)
    cond = torch.arange(8)
    x, stats = sd.sample(gmm2d, noise, sig, method="euler", cond=cond, guidance=CFG(3.0, stop=0.1),
                         return_stats=True)
    assert stats.nfe == 10 + 1  # guided (2 evaluations) at step 0 only, the sigma = inf step
    plain = sd.sample(gmm2d, noise, sig, method="euler", cond=cond)
    assert (x - plain).abs().max() > 1e-3  # the one guided step changed the samples


@pytest.mark.parametrize("make", [lambda: CFGRescale(3.0, space="eps"), lambda: APG(3.0, space="eps")],
                         ids=["cfg_rescale", "apg"])
def test_eps_space_guiders_refuse_sigma_inf_clearly(gmm2d, make):
    with pytest.raises(ValueError, match=r"space='eps'.*cannot be inverted at sigma = inf.*at step 0"):
        sd.sample(gmm2d, sd.randn((4, 2), seeds=0, dtype=torch.float64), sd.sigmas.flow(4), method="euler",
                  cond=torch.arange(4), guidance=make())
