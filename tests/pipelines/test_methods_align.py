"""Rewards on decoded images and the alignment samplers on a tiny SD pipeline (steerdiff.pipelines.methods).

Independent truths: the latent reward's gradient through the VAE decoder equals central finite differences of
``reward(decode(z))`` (float64 VAE); best-of-N returns the particle whose reward, recomputed here on
``pipeline.decode``, is the largest; a group's particles do not depend on the other groups' prompts (the label ->
row mapping survives the samplers' reindexing); DAS's ESS lies in [1, P] and its NFE is the step count.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.pipelines import bind, on_images

STEPS = 4


def redness(images):
    """Mean red minus mean blue channel, per image (differentiable)."""
    return images[:, 0].mean((1, 2)) - images[:, 2].mean((1, 2))


@pytest.fixture(scope="module")
def pipe(tiny):
    return sd.pipelines.from_diffusers(tiny.sd("ddim"))


def test_decoded_reward_gradient_matches_finite_differences(tiny):
    raw = tiny.sd("ddim")
    raw.vae.double()
    p = sd.pipelines.from_diffusers(raw)
    reward = on_images(p, redness)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, *p.latent_shape(), generator=g, dtype=torch.float64) * 0.5
    zr = z.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(reward(zr).sum(), zr)
    v = torch.randn(z.shape, generator=g, dtype=torch.float64)
    h = 1e-5
    fd = (redness(p.decode(z + h * v)) - redness(p.decode(z - h * v))) / (2 * h)
    torch.testing.assert_close((grad * v).flatten(1).sum(1), fd, rtol=1e-5, atol=1e-9)


def test_reward_that_ignores_the_gradient_is_refused(pipe):
    def detached(images):
        return redness(images).detach()

    cond = pipe.encode(["a red disk"])
    den, labels = bind(pipe, cond)
    noise = sd.randn((2, *pipe.latent_shape()), seeds=0)
    with pytest.raises(ValueError, match="detached.*without a gradient"):
        sd.align.das(den, on_images(pipe, detached), noise, pipe.default_sigmas(STEPS), alpha=0.1, particles=2,
                     cond=labels, gradient=True)
    with pytest.raises(ValueError, match="black box"):
        sd.align.das(den, on_images(pipe, redness, differentiable=False), noise, pipe.default_sigmas(STEPS),
                     alpha=0.1, particles=2, cond=labels, gradient=True)


def test_best_of_n_picks_the_max_decoded_reward_and_keeps_rows_with_their_prompt(pipe):
    prompts = ["a red disk", "a blue square"]
    cond = pipe.encode(prompts)
    den, labels = bind(pipe, cond)
    P = 3
    noise = sd.randn((2 * P, *pipe.latent_shape()), seeds=0)
    sig = pipe.default_sigmas(STEPS)

    def black_box(images):  # numpy: no gradient, used through differentiable=False
        return torch.as_tensor(redness(images).numpy())

    res = sd.align.best_of_n(den, on_images(pipe, black_box, differentiable=False), noise, sig, particles=P,
                             cond=labels, generator=0)
    recomputed = redness(pipe.decode(res.particles_final)).view(2, P)
    best = recomputed.argmax(1)
    torch.testing.assert_close(res.samples, res.particles_final.view(2, P, *noise.shape[1:])[[0, 1], best])
    torch.testing.assert_close(res.rewards, recomputed.max(1).values.double(), rtol=1e-5, atol=1e-6)
    assert res.nfe == STEPS * P
    # Group 1 alone (its prompt, its noise rows and seeds) gives the same particles: labels map to the right rows.
    den1, labels1 = bind(pipe, pipe.encode(prompts[1:]))
    alone = sd.align.best_of_n(den1, on_images(pipe, black_box, differentiable=False), noise[P:], sig, particles=P,
                               cond=labels1, generator=list(range(P, 2 * P)))
    torch.testing.assert_close(alone.particles_final, res.particles_final[P:], rtol=1e-4, atol=1e-5)


def test_das_tds_and_reward_guidance_run_on_decoded_rewards(pipe):
    cond = pipe.encode(["a red disk", "a square"], negative_prompts="blurry")
    den, labels = bind(pipe, cond)
    P = 2
    noise = sd.randn((2 * P, *pipe.latent_shape()), seeds=1)
    sig = pipe.default_sigmas(STEPS)
    reward = on_images(pipe, redness)
    das = sd.align.das(den, reward, noise, sig, alpha=0.05, particles=P, cond=labels, generator=0, gradient=True,
                       tempering="exp")
    assert das.samples.shape == (2, *pipe.latent_shape()) and torch.isfinite(das.samples).all()
    ess = das.ess[torch.isfinite(das.ess)]
    assert ess.numel() > 0 and (ess >= 1 - 1e-6).all() and (ess <= P + 1e-6).all()
    assert das.nfe == STEPS * P and das.nfe_grad > 0
    tds = sd.align.tds(den, reward, noise, sig, alpha=0.05, particles=P, cond=labels, generator=0)
    assert torch.isfinite(tds.samples).all() and tds.nfe == STEPS * P
    rg = sd.align.reward_guidance(den, reward, noise, sig, alpha=0.05, cond=labels.repeat_interleave(P), generator=0)
    assert rg.samples.shape == noise.shape and torch.isfinite(rg.samples).all()
    # Black-box DAS (weights only, the default) runs with the gradient-free reward.
    bb = sd.align.das(den, on_images(pipe, redness, differentiable=False), noise, sig, alpha=0.05, particles=P,
                      cond=labels, generator=0)
    assert torch.isfinite(bb.samples).all() and bb.nfe_grad == 0


def test_online_das_with_a_black_box_oracle_on_one_prompt(pipe):
    den, _ = bind(pipe, pipe.encode(["a red disk"]), default_row=0)
    oracle = on_images(pipe, redness, differentiable=False)
    # Linear features: the default quadratic ones of a 256-dim latent would need a 33k x 33k Gram matrix.
    surrogate = sd.align.LinUCBSurrogate(features=lambda v: torch.cat([v.new_ones(v.shape[0], 1), v.flatten(1)], 1))
    out = sd.align.online_das(den, oracle, pipe.default_sigmas(STEPS), pipe.latent_shape(), alpha=0.1, rounds=2,
                              queries=2, particles=2, seed=0, surrogate=surrogate)
    x = torch.cat(out.queries)
    assert x.shape == (4, *pipe.latent_shape()) and torch.isfinite(x).all()
    torch.testing.assert_close(torch.cat(out.rewards).double(), redness(pipe.decode(x)).double(), rtol=1e-5,
                               atol=1e-6)
    assert out.nfe > 0


def test_row_labels_and_bad_inputs(pipe):
    cond = pipe.encode(["a red disk", "a square"], negative_prompts=["blurry", "grey"])
    den, labels = bind(pipe, cond)
    assert labels.tolist() == [0, 1] and den.sample_shape == pipe.latent_shape()
    x = sd.randn((4, *pipe.latent_shape()), seeds=0)
    sigma = torch.full((4,), 3.0)
    with torch.no_grad():
        got = den(x, sigma, torch.tensor([1, 0, -1, -1]))
        want = pipe.denoiser(x, sigma, sd.pipelines.TextCond.cat([cond.index([1, 0]), cond.null.index([0, 1])]))
    torch.testing.assert_close(got, want)  # label i = row i; -1 at position j = the null of row j mod B
    with pytest.raises(ValueError, match="row labels"):
        den(x, sigma, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(TypeError, match="TextCond"):
        bind(pipe, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="callable"):
        on_images(pipe, "redness")
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        on_images(pipe, lambda im: im.mean())(x)
