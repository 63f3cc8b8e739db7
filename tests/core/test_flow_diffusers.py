"""Flow models through FlowDenoiser + sd.sample against diffusers' own scheduler loop, on tiny transformers.

The reference is diffusers' ``FlowMatchEulerDiscreteScheduler`` driven as its SD3 and FLUX pipelines drive it
(``set_timesteps``, then ``step(v, t, latents)`` per timestep), on random-weight ``SD3Transformer2DModel`` and
``FluxTransformer2DModel`` built from small configs; ours is ``sd.sample(method="euler")`` on
``sd.sigmas.flow(...)`` from the same unit noise, first step from ``t = 1`` (sigma = inf) included.
"""

import numpy as np
import pytest
import torch

import steerdiff as sd

diffusers = pytest.importorskip("diffusers")
FlowMatchEulerDiscreteScheduler = diffusers.FlowMatchEulerDiscreteScheduler


def _flux_mu(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5, max_shift=1.15):
    """The FLUX pipeline's ``calculate_shift`` (a line through (base_seq_len, base_shift), (max_seq_len, max_shift))."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + base_shift - m * base_seq_len


@pytest.mark.parametrize("steps", [1, 4, 28])
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_static_flow_grid_is_the_sd3_schedulers(steps, shift):
    sch = FlowMatchEulerDiscreteScheduler(shift=shift)
    sch.set_timesteps(steps)
    sig = sd.sigmas.flow(steps, shift=shift)
    t = torch.where(torch.isinf(sig), torch.ones_like(sig), sig / (1 + sig))
    torch.testing.assert_close(t.float(), sch.sigmas, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("steps, seq", [(4, 16), (20, 1024), (50, 4096)])
def test_dynamic_flow_grid_is_the_flux_schedulers(steps, seq):
    sch = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                          base_image_seq_len=256, max_image_seq_len=4096)
    sch.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=_flux_mu(seq))
    sig = sd.sigmas.flow(steps, image_seq_len=seq)
    t = torch.where(torch.isinf(sig), torch.ones_like(sig), sig / (1 + sig))
    torch.testing.assert_close(t.float(), sch.sigmas, rtol=1e-6, atol=1e-7)


def _diffusers_loop(scheduler, call, noise):
    latents = noise.clone()
    with torch.no_grad():
        for t in scheduler.timesteps:
            latents = scheduler.step(call(latents, t.expand(noise.shape[0])), t, latents).prev_sample
    return latents


def test_sd3_transformer_through_flow_denoiser_matches_diffusers_loop():
    torch.manual_seed(0)
    tr = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16, out_channels=4).eval()
    b, steps = 2, 6
    text = torch.randn(b, 5, 16, generator=torch.Generator().manual_seed(1))
    pooled = torch.randn(b, 16, generator=torch.Generator().manual_seed(2))
    noise = torch.randn(b, 4, 8, 8, generator=torch.Generator().manual_seed(3))

    def velocity(x_t, timestep, cond=None):
        return tr(hidden_states=x_t, timestep=timestep, encoder_hidden_states=text, pooled_projections=pooled).sample

    sch = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sch.set_timesteps(steps)
    ref = _diffusers_loop(sch, velocity, noise)
    seen = []
    with torch.no_grad():
        ours, stats = sd.sample(sd.FlowDenoiser(velocity, t_scale=1000.0), noise, sd.sigmas.flow(steps, shift=3.0),
                                method="euler", callback=seen.append, return_stats=True)
    assert seen[0]["sigma"] == float("inf") and stats.nfe == steps
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)
    assert (ref - noise).abs().max() > 0.1  # the loop moved: the comparison is not between two copies of the noise
    with pytest.raises(TypeError, match="whose inputs are keywords.*wrap it"):
        sd.FlowDenoiser(tr)  # called positionally, a transformer would take t for its text embedding


def test_heuns_first_step_from_inf_is_diffusers_flow_match_heun_step():
    # diffusers' FlowMatchHeunDiscreteScheduler integrates dx_t/dt = v by the trapezoid in t; our heun takes that
    # step from t = 1 (its sigma-trapezoid has no limit there) and EDM's sigma-Heun afterwards, so the two agree
    # on the first step only.
    torch.manual_seed(0)
    tr = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16, out_channels=4).eval()
    b, steps = 2, 6
    text = torch.randn(b, 5, 16, generator=torch.Generator().manual_seed(1))
    pooled = torch.randn(b, 16, generator=torch.Generator().manual_seed(2))
    noise = torch.randn(b, 4, 8, 8, generator=torch.Generator().manual_seed(3))

    def velocity(x_t, timestep, cond=None):
        return tr(hidden_states=x_t, timestep=timestep, encoder_hidden_states=text, pooled_projections=pooled).sample

    sch = diffusers.FlowMatchHeunDiscreteScheduler(shift=3.0)
    sch.set_timesteps(steps)
    latents = noise.clone()
    with torch.no_grad():
        for t in sch.timesteps[:2]:  # the predictor and corrector evaluations of the first step
            latents = sch.step(velocity(latents, t.expand(b)), t, latents).prev_sample
    sig = sd.sigmas.flow(steps, shift=3.0)
    torch.testing.assert_close(sch.sigmas[2], (sig[1] / (1 + sig[1])).float())  # both land on t_1
    seen = []
    with torch.no_grad():
        sd.sample(sd.FlowDenoiser(velocity, t_scale=1000.0), noise, sig, method="heun", callback=seen.append)
    x_t = seen[1]["x"] / (1 + seen[1]["sigma"])  # our state at sigma_1, in flow units
    torch.testing.assert_close(x_t, latents, rtol=0, atol=1e-4)
    assert (latents - noise).abs().max() > 0.1


def test_flux_transformer_with_dynamic_shift_matches_diffusers_loop():
    torch.manual_seed(0)
    tr = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=16, pooled_projection_dim=16, axes_dims_rope=(2, 2, 4)).eval()
    b, steps, h, w = 2, 6, 4, 4
    seq = h * w  # FLUX packs 2x2 latent patches into a sequence of h * w tokens of 4 * channels
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None]
    img_ids = img_ids.reshape(seq, 3)
    txt_ids = torch.zeros(5, 3)
    text = torch.randn(b, 5, 16, generator=torch.Generator().manual_seed(1))
    pooled = torch.randn(b, 16, generator=torch.Generator().manual_seed(2))
    noise = torch.randn(b, seq, 16, generator=torch.Generator().manual_seed(4))

    def velocity(x_t, t, cond=None):  # the FLUX transformer takes t in [0, 1] (the pipeline passes timestep / 1000)
        return tr(hidden_states=x_t, timestep=t, encoder_hidden_states=text, pooled_projections=pooled,
                  img_ids=img_ids, txt_ids=txt_ids).sample

    sch = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                          base_image_seq_len=256, max_image_seq_len=4096)
    sch.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=_flux_mu(seq))
    ref = _diffusers_loop(sch, lambda x, t: velocity(x, t / 1000), noise)
    with torch.no_grad():
        ours = sd.sample(sd.FlowDenoiser(velocity, t_scale=1.0), noise, sd.sigmas.flow(steps, image_seq_len=seq),
                         method="euler")
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)
    assert (ref - noise).abs().max() > 0.1
