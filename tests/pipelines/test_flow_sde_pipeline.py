"""DAS and FK steering with a flow SDE's moves (``sde=``, docs/methods/flow_sde.md) on a tiny SD3 pipeline
(flow transformer, latent denoiser from ``sigma = inf``): they run, stay finite, cost ``P * steps`` denoiser calls
and take other moves than the default ancestral kernel."""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.align import das, fk_steering
from steerdiff.core.flow_sde import FlowSDE


# (the tiny FLUX pipeline takes minutes here at its default latent size: SD3 stands for the flow families)
@pytest.mark.parametrize("family,sde", [("sd3", "rbf"), ("sd3", FlowSDE("vp", 1.5))])
def test_das_and_fk_on_a_tiny_flow_pipeline(tiny, family, sde):
    from steerdiff.pipelines import bind, on_images

    pipe = sd.pipelines.from_diffusers(getattr(tiny, family)())
    den, labels = bind(pipe, pipe.encode(["a red disk"]))
    P, steps = 3, 4

    def redness(images):
        return images[:, 0].mean((1, 2)) - images[:, 2].mean((1, 2))

    reward = on_images(pipe, redness, differentiable=False)
    noise = sd.randn((P, *pipe.latent_shape()), seeds=0)
    sig = pipe.default_sigmas(steps)
    assert math.isinf(sig[0])
    for fn in (fk_steering, das):
        res = fn(den, reward, noise, sig, alpha=0.1, particles=P, cond=labels, generator=0, sde=sde)
        plain = fn(den, reward, noise, sig, alpha=0.1, particles=P, cond=labels, generator=0)
        assert torch.isfinite(res.particles_final).all() and res.nfe == P * steps and res.nfe_grad == 0
        assert not torch.allclose(res.particles_final, plain.particles_final)
