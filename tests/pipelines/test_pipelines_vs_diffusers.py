"""sd.pipelines.from_diffusers against the diffusers pipelines themselves, on tiny random-weight pipelines.

The reference is the diffusers pipeline's own ``__call__`` (its scheduler loop, its CFG, its VAE decode) from the
same initial latents ``L``; ours is ``Pipeline.__call__`` (steerdiff's sampler on the converted sigmas, the one
convention) or ``sd.sample`` on ``pipeline.denoiser`` with a steerdiff guider. Tolerance: 1e-4 relative.
"""

import pytest
import torch

import steerdiff as sd

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:the schedule starts at sigma")  # few-step leading spacing

PROMPTS = ["a cat", "dog"]
STEPS = 4
SCALE = 3.0


def _latents(pipeline, b=2, seed=5):
    return torch.randn((b, *pipeline.latent_shape()), generator=torch.Generator().manual_seed(seed))


def _reference(pipe, latents, output_type="latent", **kwargs):
    kwargs = {"num_inference_steps": STEPS, "guidance_scale": SCALE, **kwargs}
    with torch.no_grad():
        return pipe(PROMPTS, latents=latents.clone(), output_type=output_type, **kwargs).images


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("scheduler, prediction_type", [("ddim", "epsilon"), ("euler", "epsilon"),
                                                        ("euler", "v_prediction"), ("euler_trailing", "epsilon")])
def test_sd_matches_the_diffusers_pipeline(tiny, scheduler, prediction_type):
    pipe = tiny.sd(scheduler, prediction_type)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type="latent")
    assert _rel(ours.images, _reference(pipe, latents)) < 1e-4
    assert ours.nfe == 2 * STEPS  # CFG: one doubled batch per step
    # Decoded images: diffusers' "pt" is in [0, 1], ours in [-1, 1].
    ours_pt = p.decode(ours.latents)
    torch.testing.assert_close((ours_pt + 1) / 2, _reference(pipe, latents, "pt"), rtol=0, atol=1e-4)


def test_sd_default_sigmas_are_the_schedulers(tiny):
    # DDIM's timesteps through alphas_cumprod; Euler's own sigmas (independently computed by diffusers).
    p = sd.pipelines.from_diffusers(tiny.sd("euler"))
    euler = diffusers.EulerDiscreteScheduler.from_config(p.pipe.scheduler.config)
    euler.set_timesteps(10)
    torch.testing.assert_close(p.default_sigmas(10).float(), euler.sigmas, rtol=1e-6, atol=0)
    ddim = diffusers.DDIMScheduler.from_config(p.pipe.scheduler.config)
    ddim.set_timesteps(10)
    abar = ddim.alphas_cumprod[ddim.timesteps].double()
    torch.testing.assert_close(sd.pipelines.from_diffusers(tiny.sd("ddim")).default_sigmas(10)[:-1],
                               ((1 - abar) / abar).sqrt(), rtol=1e-9, atol=0)


@pytest.mark.parametrize("negative", [None, ["blurry", "dark"]])
def test_sdxl_matches_the_diffusers_pipeline(tiny, negative):
    # negative=None: force_zeros_for_empty_prompt makes the null embeddings zeros, as the pipeline does.
    pipe = tiny.sdxl()
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    ours = p(PROMPTS, negative_prompt=negative, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents,
             output_type="pt")
    ref = _reference(pipe, latents, "pt", negative_prompt=negative)
    torch.testing.assert_close(ours.images, ref, rtol=0, atol=1e-4)  # both in [0, 1]
    assert _rel(ours.latents, _reference(pipe, latents, negative_prompt=negative)) < 1e-4
    cond = p.encode(PROMPTS, negative)
    assert set(cond) == {"prompt_embeds", "text_embeds", "time_ids"}
    h, w = 8 * p.pipe.vae_scale_factor, 8 * p.pipe.vae_scale_factor
    assert cond["time_ids"].tolist() == [[h, w, 0, 0, h, w]] * 2
    if negative is None:
        assert bool((cond.null["prompt_embeds"] == 0).all()) and bool((cond.null["text_embeds"] == 0).all())


def test_sd3_without_t5_matches_the_diffusers_pipeline(tiny):
    pipe = tiny.sd3(shift=3.0)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type="latent")
    assert _rel(ours.images, _reference(pipe, latents)) < 1e-4
    torch.testing.assert_close((p.decode(ours.latents) + 1) / 2, _reference(pipe, latents, "pt"), rtol=0, atol=1e-4)
    sch = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    sch.set_timesteps(STEPS)
    sig = p.default_sigmas(STEPS)
    assert torch.isinf(sig[0])
    torch.testing.assert_close((sig[1:] / (1 + sig[1:])).float(), sch.sigmas[1:], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("max_sequence_length", [None, 5])
def test_sd3_with_t5_matches_the_diffusers_pipeline(tiny, max_sequence_length):
    # The three-encoder embedding: CLIP states padded to T5's width, then T5's states along the sequence (256 T5
    # tokens by default, as in diffusers; 5 when max_sequence_length is given, passed to both calls).
    pipe = tiny.sd3(shift=3.0, t5=True)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    kw = {} if max_sequence_length is None else {"max_sequence_length": max_sequence_length}
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type="latent", **kw)
    assert _rel(ours.images, _reference(pipe, latents, **kw)) < 1e-4 and ours.nfe == 2 * STEPS
    torch.testing.assert_close((p.decode(ours.latents) + 1) / 2, _reference(pipe, latents, "pt", **kw), rtol=0,
                               atol=1e-4)
    cond = p.encode(PROMPTS, max_sequence_length=max_sequence_length)
    clip_tokens = pipe.tokenizer.model_max_length
    assert tuple(cond["prompt_embeds"].shape) == (2, clip_tokens + (max_sequence_length or 256),
                                                  pipe.text_encoder_3.config.d_model)
    assert cond["prompt_embeds"][:, clip_tokens:].abs().sum() > 0  # T5's states, not the no-T5 zeros
    # sd.sample with a steerdiff guider on the denoiser: CFG(w) is diffusers' guidance_scale = w.
    out = sd.sample(p.denoiser, latents, p.default_sigmas(STEPS), method="euler", cond=cond,
                    guidance=sd.guidance.CFG(SCALE))
    assert _rel(out, _reference(pipe, latents, **kw)) < 1e-4


@pytest.mark.parametrize("guider", ["cfg", "apg"])
def test_steerdiff_guiders_on_the_denoiser_match_diffusers_cfg(tiny, guider):
    # CFG(w) and APG(w, eta=1, momentum=0, no norm threshold) are both diffusers' CFG at guidance_scale = w; run
    # them through sd.sample on pipeline.denoiser with the structured condition.
    pipe = tiny.sd("euler")
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    sig = p.default_sigmas(STEPS)
    g = sd.guidance.CFG(SCALE) if guider == "cfg" else sd.guidance.APG(SCALE, eta=1.0, momentum=0.0)
    # diffusers starts Euler (leading spacing) at x = L * init_noise_sigma = L * sqrt(1 + sigma_0^2).
    s0 = float(sig[0])
    noise = latents * ((1 + s0**2) ** 0.5 / s0)
    out = sd.sample(p.denoiser, noise, sig, method="euler", cond=p.encode(PROMPTS), guidance=g)
    assert _rel(out, _reference(pipe, latents)) < 1e-4


def test_cfg_rescale_in_eps_space_matches_diffusers_guidance_rescale(tiny):
    pipe = tiny.sd("euler")
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    ours = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent",
             guidance=sd.guidance.CFGRescale(SCALE, phi=0.7, space="eps"))
    assert _rel(ours.images, _reference(pipe, latents, guidance_rescale=0.7)) < 1e-4


@pytest.mark.parametrize("scheduler", ["dpm", "unipc"])
def test_multistep_schedulers_map_to_dpmpp_2m_and_unipc(tiny, scheduler):
    pipe = tiny.sd(scheduler)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type="latent")
    assert _rel(ours.images, _reference(pipe, latents)) < 1e-4


def test_guidance_scale_at_most_one_is_the_conditional_model(tiny):
    # diffusers runs no unconditional branch at guidance_scale <= 1.
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=1.0, latents=latents, output_type="latent")
    assert ours.nfe == STEPS
    assert _rel(ours.images, _reference(pipe, latents, guidance_scale=1.0)) < 1e-4


def test_default_latents_come_from_the_generator_as_in_diffusers(tiny):
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, output_type="latent",
             generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = pipe(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, output_type="latent",
                   generator=torch.Generator().manual_seed(7)).images
    assert _rel(ours.images, ref) < 1e-4


def test_encode_images_round_trips_through_the_vae_scaling(tiny):
    # encode_images applies (z - shift) * scale; decode undoes it: decode(encode(x)) = the VAE's own round trip.
    pipe = tiny.sd3()
    p = sd.pipelines.from_diffusers(pipe)
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    z = p.encode_images(x)
    with torch.no_grad():
        mean = pipe.vae.encode(x).latent_dist.mean
        ref = pipe.vae.decode(mean).sample.clamp(-1, 1)
    cfg = pipe.vae.config
    torch.testing.assert_close(z, (mean - cfg.shift_factor) * cfg.scaling_factor, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p.decode(z), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("guidance_embeds", [True, False])
def test_flux_matches_the_diffusers_pipeline(tiny, guidance_embeds):
    # guidance_scale is FLUX's embedded guidance (not CFG): one evaluation per step.
    pipe = tiny.flux(guidance_embeds)
    p = sd.pipelines.from_diffusers(pipe)
    kw = {"num_inference_steps": STEPS, "guidance_scale": 3.5, "height": 16, "width": 16, "max_sequence_length": 6}
    latents = torch.randn((2, *p.latent_shape(16, 16)), generator=torch.Generator().manual_seed(5))
    ours = p(PROMPTS, latents=latents, output_type="latent", **kw)
    with torch.no_grad():
        ref = pipe(PROMPTS, latents=latents.clone(), output_type="latent", **kw).images
        ref_pt = pipe(PROMPTS, latents=latents.clone(), output_type="pt", **kw).images
        ref_gen = pipe(PROMPTS, output_type="latent", generator=torch.Generator().manual_seed(3), **kw).images
    assert _rel(ours.images, ref) < 1e-4 and ours.nfe == STEPS
    torch.testing.assert_close((p.decode(ours.latents, 16, 16) + 1) / 2, ref_pt, rtol=0, atol=1e-4)
    ours_gen = p(PROMPTS, output_type="latent", generator=torch.Generator().manual_seed(3), **kw)
    assert _rel(ours_gen.images, ref_gen) < 1e-4  # default latents: drawn VAE-shaped, then packed, as in diffusers


def test_flux_cfg_guider_matches_true_cfg(tiny):
    # The FLUX pipeline's true_cfg_scale with a negative prompt is u + s (c - u) on the velocity: CFG(s) here.
    pipe = tiny.flux()
    p = sd.pipelines.from_diffusers(pipe)
    kw = {"num_inference_steps": STEPS, "guidance_scale": 3.5, "height": 16, "width": 16, "max_sequence_length": 6,
          "negative_prompt": ["blurry", "blurry"]}
    latents = torch.randn((2, *p.latent_shape(16, 16)), generator=torch.Generator().manual_seed(5))
    ours = p(PROMPTS, latents=latents, output_type="latent", guidance=sd.guidance.CFG(2.0), **kw)
    with torch.no_grad():
        ref = pipe(PROMPTS, latents=latents.clone(), output_type="latent", true_cfg_scale=2.0, **kw).images
    assert _rel(ours.images, ref) < 1e-4 and ours.nfe == 2 * STEPS
    sig = p.default_sigmas(STEPS, 16, 16)
    sch = diffusers.FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config)
    m = (1.15 - 0.5) / (4096 - 256)  # the FLUX pipeline's calculate_shift at 16 latent tokens
    sch.set_timesteps(STEPS, sigmas=[1 - i / STEPS for i in range(STEPS)], mu=16 * m + 0.5 - m * 256)
    torch.testing.assert_close((sig[1:] / (1 + sig[1:])).float(), sch.sigmas[1:], rtol=1e-6, atol=1e-7)


def test_ddim_trailing_spacing_that_diffusers_steps_inconsistently_warns(tiny):
    """diffusers' DDIM steps to ``t - 1000 // n``; with trailing spacing that is the next listed timestep only when n
    divides 1000. Where it is not (n = 3: timesteps 999, 666, 332 step to 666, 333, -1), our schedule cannot
    reproduce diffusers and says so; where it is (n = 4), it is silent and matches (the test above)."""
    import warnings

    p = sd.pipelines.from_diffusers(tiny.sd("ddim"))
    p.pipe.scheduler = diffusers.DDIMScheduler.from_config(p.pipe.scheduler.config, timestep_spacing="trailing")
    with pytest.warns(RuntimeWarning, match="steps from each timestep to timestep - 333"):
        p.default_sigmas(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p.default_sigmas(4)
        sd.pipelines.from_diffusers(tiny.sd("ddim")).default_sigmas(3)  # leading spacing: consistent at any n
