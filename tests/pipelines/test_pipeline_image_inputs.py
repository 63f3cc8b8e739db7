"""Image-to-image and inpainting (``image=``, ``strength=``, ``mask_image=``) against diffusers' own image-to-image
and inpainting pipelines, built from the same components as the text-to-image pipeline, on tiny random-weight
pipelines (docs/methods/pipelines.md, "Image-to-image and inpainting").

The reference is the diffusers pipeline's ``__call__`` (its start latents, its ``get_timesteps``, its scheduler
loop and, for inpainting, its blend of the known region after every step) from the same image, mask and generator;
ours is ``Pipeline.__call__``. Tolerance: 1e-4 relative, as tests/pipelines/test_pipelines_vs_diffusers.py.
"""

import math

import pytest
import torch

import steerdiff as sd

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:the schedule starts at sigma")

PROMPTS = ["a cat", "dog"]
STEPS = 5
SCALE = 3.0


def _sd3_16(tiny):
    """A tiny SD3 pipeline with 16 latent channels: diffusers' SD3 inpainting pipeline blends the known region only
    for a 16-channel transformer (SD3's own width), so the comparison needs one."""
    pipe = tiny.sd3(shift=3.0)
    torch.manual_seed(3)
    vae = diffusers.AutoencoderKL(
        block_out_channels=(8, 8), in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), latent_channels=16, norm_num_groups=4,
        sample_size=16, scaling_factor=0.5, shift_factor=0.1).eval()
    torch.manual_seed(2)
    tr = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=32, out_channels=16).eval()
    out = diffusers.StableDiffusion3Pipeline(**{**pipe.components, "vae": vae, "transformer": tr})
    out.set_progress_bar_config(disable=True)
    return out


def _text2img(tiny, family, scheduler="ddim"):
    return {"sd": lambda: tiny.sd(scheduler), "sdxl": tiny.sdxl, "sd3": lambda: _sd3_16(tiny),
            "flux": tiny.flux}[family]()


CLASSES = {
    "sd": ("StableDiffusionImg2ImgPipeline", "StableDiffusionInpaintPipeline"),
    "sdxl": ("StableDiffusionXLImg2ImgPipeline", "StableDiffusionXLInpaintPipeline"),
    "sd3": ("StableDiffusion3Img2ImgPipeline", "StableDiffusion3InpaintPipeline"),
    "flux": ("FluxImg2ImgPipeline", "FluxInpaintPipeline"),
}


def _theirs(pipe, family, inpaint):
    cls = getattr(diffusers, CLASSES[family][inpaint])
    extra = {"requires_safety_checker": False} if family == "sd" else {}
    out = cls(**pipe.components, **extra)
    out.set_progress_bar_config(disable=True)
    return out


def _kw(family, **kw):
    base = {"num_inference_steps": STEPS, "guidance_scale": SCALE, "output_type": "latent"}
    if family == "flux":
        base.update(guidance_scale=3.5, height=16, width=16, max_sequence_length=6)
    if family == "sd3":
        base.update(height=16, width=16)
    return {**base, **kw}


def _image(seed=1, b=2):
    return torch.rand((b, 3, 16, 16), generator=torch.Generator().manual_seed(seed))


def _mask(b=1):
    """Not binary and not on the latent grid: the processor binarizes at 0.5, the interpolation picks nearest."""
    m = torch.zeros((b, 1, 16, 16))
    m[..., 3:12, 1:9] = 0.8
    m[..., 12:, :] = 0.3  # below 0.5: kept
    return m


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _run(p, pipe, family, inpaint, gen, **kw):
    args = {"image": _image(), **({"mask_image": _mask()} if inpaint else {}), **_kw(family, **kw)}
    ours = p(PROMPTS, generator=gen(), **args)
    with torch.no_grad():
        ref = _theirs(pipe, family, inpaint)(PROMPTS, generator=gen(), **args).images
    return ours, ref


def _steps_run(family, strength, steps=STEPS):
    if family in ("sd3", "flux"):  # get_timesteps with a fractional init_timestep
        return steps - int(max(steps - steps * strength, 0))
    return min(int(steps * strength), steps)


@pytest.mark.parametrize("family", ["sd", "sdxl", "sd3", "flux"])
def test_image_to_image_matches_diffusers(tiny, family):
    # strength 0.7 at 5 steps: SD / SDXL run int(3.5) = 3 steps, SD3 / FLUX 5 - int(1.5) = 4.
    pipe = _text2img(tiny, family)
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _run(p, pipe, family, False, lambda: torch.Generator().manual_seed(7), strength=0.7)
    cfg = 1 if family == "flux" else 2
    assert ours.nfe == cfg * _steps_run(family, 0.7)
    assert _rel(ours.images, ref) < 1e-4


@pytest.mark.parametrize("family", ["sd", "sdxl", "sd3", "flux"])
@pytest.mark.parametrize("strength", [0.6, 1.0])
def test_inpainting_matches_diffusers(tiny, family, strength):
    # strength 1: SD / SDXL start from the noise alone (diffusers' is_strength_max), the flow families at t = 1.
    pipe = _text2img(tiny, family)
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _run(p, pipe, family, True, lambda: torch.Generator().manual_seed(7), strength=strength)
    assert _rel(ours.images, ref) < 1e-4


def test_inpainting_default_strengths_are_diffusers(tiny):
    # SD inpainting: 1.0; SDXL inpainting: 0.9999 (int(5 * 0.9999) = 4 steps, from the image); img2img 0.8 / 0.3.
    for family in ("sd", "sdxl"):
        pipe = _text2img(tiny, family)
        p = sd.pipelines.from_diffusers(pipe)
        for inpaint in (False, True):
            ours, ref = _run(p, pipe, family, inpaint, lambda: torch.Generator().manual_seed(3))
            assert _rel(ours.images, ref) < 1e-4
    assert ours.nfe == 2 * 4


def _known(p, pipe, generator):
    """The image latents z0 and the latent mask, computed here from diffusers' own processors and VAE."""
    proc = diffusers.image_processor.VaeImageProcessor(vae_scale_factor=pipe.vae_scale_factor, do_normalize=False,
                                                      do_binarize=True, do_convert_grayscale=True)
    m = torch.nn.functional.interpolate(proc.preprocess(_mask(), height=16, width=16), size=(8, 8))
    x = pipe.image_processor.preprocess(_image())
    with torch.no_grad():
        z0 = pipe.vae.encode(x).latent_dist.sample(generator) * pipe.vae.config.scaling_factor
    return z0, m


@pytest.mark.parametrize("method", [None, "heun", "dpmpp_2m", "unipc", "ddpm"])
def test_inpainting_keeps_the_known_region_with_any_sampler(tiny, method):
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    kw = {} if method is None else {"method": method}
    out = p(PROMPTS, image=_image(), mask_image=_mask(), strength=0.8, generator=torch.Generator().manual_seed(7),
            **_kw("sd", **kw))
    z0, m = _known(p, pipe, torch.Generator().manual_seed(7))
    assert set(m.unique().tolist()) == {0.0, 1.0} and 0 < float(m.mean()) < 1
    keep = (1 - m).expand_as(z0).bool()
    torch.testing.assert_close(out.latents[keep], z0[keep], rtol=0, atol=1e-5)
    # the masked region is generated: neither the image nor the same as image-to-image from the same start
    assert float((out.latents - z0)[~keep].abs().mean()) > 1e-2
    img2img = p(PROMPTS, image=_image(), strength=0.8, generator=torch.Generator().manual_seed(7), **_kw("sd", **kw))
    assert float((out.latents - img2img.latents)[~keep].abs().mean()) > 1e-4


@pytest.mark.parametrize("scheduler", ["dpm", "unipc", "euler"])
def test_inpainting_with_other_schedulers_matches_diffusers(tiny, scheduler):
    # Multistep schedulers keep their history across the blend (the blend changes the state only).
    pipe = tiny.sd(scheduler)
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _run(p, pipe, "sd", True, lambda: torch.Generator().manual_seed(7), strength=0.8)
    assert _rel(ours.images, ref) < 1e-4


def test_image_inputs_with_lists_of_generators_and_images_per_prompt(tiny):
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    for inpaint in (False, True):
        def gens():
            return [torch.Generator().manual_seed(20 + i) for i in range(4)]
        ours, ref = _run(p, pipe, "sd", inpaint, gens, strength=0.6, num_images_per_prompt=2)
        assert ours.images.shape[0] == 4 and _rel(ours.images, ref) < 1e-4


def test_inpainting_callback_and_images_match_diffusers(tiny):
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    seen = {"ours": [], "theirs": []}

    def recorder(key):
        def fn(pipeline, i, t, kwargs):
            seen[key].append((i, float(t), kwargs["latents"].clone()))
            return kwargs
        return fn

    ours, ref = _run(p, pipe, "sd", True, lambda: torch.Generator().manual_seed(7), strength=0.6, output_type="pt")
    torch.testing.assert_close(ours.images, ref, rtol=0, atol=1e-4)
    _run(p, pipe, "sd", True, lambda: torch.Generator().manual_seed(7), strength=0.6)
    args = {"image": _image(), "mask_image": _mask(), **_kw("sd", strength=0.6)}
    p(PROMPTS, generator=torch.Generator().manual_seed(7), callback_on_step_end=recorder("ours"), **args)
    with torch.no_grad():
        _theirs(pipe, "sd", True)(PROMPTS, generator=torch.Generator().manual_seed(7),
                                  callback_on_step_end=recorder("theirs"), **args)
    assert [s[0] for s in seen["ours"]] == [s[0] for s in seen["theirs"]] == [0, 1, 2]
    for a, b in zip(seen["ours"], seen["theirs"], strict=True):
        assert math.isclose(a[1], b[1], rel_tol=1e-5, abs_tol=1e-3)
        assert _rel(a[2], b[2]) < 1e-4


def test_a_callers_x0_corrector_still_runs_under_the_blend(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd("ddim"))
    calls = []

    def corrector(denoised, x, sigma, i):
        calls.append(i)
        return denoised

    p("a", image=_image(b=1), mask_image=_mask(), strength=0.6, x0_corrector=corrector, **_kw("sd"))
    assert calls == [0, 1, 2]


BAD = [
    ({"strength": 0.0}, ValueError, r"strength must be a number in \(0, 1\]"),
    ({"strength": 1.5}, ValueError, r"strength must be a number in \(0, 1\]"),
    ({"strength": "0.5"}, ValueError, r"strength must be a number in \(0, 1\]"),
    ({"strength": True}, ValueError, r"strength must be a number in \(0, 1\]"),
    ({"strength": 0.1}, ValueError, "strength=0.1 runs no step of a 5-step schedule"),
    ({"mask_image": torch.zeros(2, 3, 16, 16)}, ValueError, r"mask_image must be PIL images or a float tensor \[B, 1"),
    ({"mask_image": torch.zeros(1, 1, 16, 16, dtype=torch.long)}, ValueError, "mask_image must be PIL images"),
    ({"mask_image": torch.full((1, 1, 16, 16), 2.0)}, ValueError, r"mask_image must lie in \[0, 1\]"),
    ({"mask_image": torch.full((1, 1, 16, 16), float("nan"))}, ValueError, r"mask_image must lie in \[0, 1\]"),
    ({"mask_image": torch.zeros(3, 1, 16, 16)}, ValueError, "mask_image has 3 images, which do not divide the batch"),
    ({"mask_image": "mask.png"}, ValueError, "mask_image must be PIL images or a float tensor"),
    ({"image": torch.rand(3, 3, 16, 16)}, ValueError, "image has 3 images, which do not divide the batch of 2"),
    ({"image": torch.rand(2, 16, 16)}, ValueError, r"image must be PIL images or a float tensor \[B, 3, H, W\]"),
    ({"image": None}, ValueError, "mask_image applies with image= only"),
    ({"latents": torch.zeros(2, 4, 8, 8)}, ValueError, "pass image= or latents=, not both"),
    ({"masked_image_latents": torch.zeros(2, 4, 8, 8)}, TypeError, "masked_image_latents= is not supported"),
    ({"padding_mask_crop": 4}, TypeError, "padding_mask_crop= is not supported"),
    ({"generator": [torch.Generator()]}, ValueError, "generator is a list of 1 but the batch has 2 images"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD)
def test_bad_image_mask_and_strength_are_named(tiny, kwargs, error, match):
    p = sd.pipelines.from_diffusers(tiny.sd("ddim"))
    args = {"image": _image(), "mask_image": _mask(), **_kw("sd"), **kwargs}
    with pytest.raises(error, match=match):
        p(PROMPTS, **args)


def _nine_channels(pipe, cls):
    unet = diffusers.UNet2DConditionModel(**{**pipe.unet.config, "in_channels": 9}).eval()
    components = {**pipe.components, "unet": unet}
    extra = {"requires_safety_checker": False} if cls is diffusers.StableDiffusionPipeline else {}
    text2img = cls(**components, **extra)
    inpaint = (diffusers.StableDiffusionInpaintPipeline(**components, **extra) if extra else
               diffusers.StableDiffusionXLInpaintPipeline(**components))
    inpaint.set_progress_bar_config(disable=True)
    return text2img, inpaint


@pytest.mark.parametrize("family", ["sd", "sdxl"])
@pytest.mark.parametrize("strength", [0.6, 1.0])
def test_nine_channel_inpainting_unets_match_diffusers(tiny, family, strength):
    # The UNet takes [latents, mask, masked image latents]: no blend, the masked image's latents as input.
    base = tiny.sd("ddim") if family == "sd" else tiny.sdxl()
    cls = diffusers.StableDiffusionPipeline if family == "sd" else diffusers.StableDiffusionXLPipeline
    text2img, inpaint = _nine_channels(base, cls)
    p = sd.pipelines.from_diffusers(text2img)
    args = {"image": _image(), "mask_image": _mask(), **_kw(family), "strength": strength}
    ours = p(PROMPTS, generator=torch.Generator().manual_seed(7), **args)
    with torch.no_grad():
        ref = inpaint(PROMPTS, generator=torch.Generator().manual_seed(7), **args).images
    assert _rel(ours.images, ref) < 1e-4
    assert ours.nfe == 2 * _steps_run(family, strength)
    with pytest.raises(TypeError, match="takes 9 input channels .an inpainting network"):
        p(PROMPTS, **_kw(family))
    with pytest.raises(TypeError, match="image= without mask_image= on a 9-channel UNet2DConditionModel"):
        p(PROMPTS, image=_image(), **_kw(family))


def test_the_blend_reads_nothing_from_the_device_per_step(tiny):
    # Host reads (a device sync each on CUDA) of inpainting beyond text-to-image: a fixed count for the checks of the
    # image and mask before the loop, none per step (tests/host_sync.py counts them on CPU).
    from host_sync import count_host_reads

    p = sd.pipelines.from_diffusers(tiny.sd("ddim"))
    p.set_progress_bar_config(disable=True)
    extra = {"image": _image(b=1), "mask_image": _mask(), "strength": 1.0}

    def reads(steps, **kw):
        return count_host_reads(lambda: p("a", num_inference_steps=steps, output_type="latent",
                                          generator=torch.Generator().manual_seed(0), **kw))[1]

    assert reads(3, **extra) - reads(3) == reads(6, **extra) - reads(6)


def test_sdxl_image_to_image_at_the_images_own_size_matches_diffusers(tiny):
    # 24x24, not the pipeline's 16x16: the run and SDXL's time ids (original / target size) take the image's size.
    pipe = tiny.sdxl()
    p = sd.pipelines.from_diffusers(pipe)
    args = {"image": torch.rand((2, 3, 24, 24), generator=torch.Generator().manual_seed(4)), **_kw("sdxl"),
            "strength": 0.8}
    ours = p(PROMPTS, generator=torch.Generator().manual_seed(7), **args)
    with torch.no_grad():
        ref = _theirs(pipe, "sdxl", False)(PROMPTS, generator=torch.Generator().manual_seed(7), **args).images
    assert tuple(ours.images.shape[-2:]) == (12, 12) and _rel(ours.images, ref) < 1e-4


def test_pil_image_and_mask_match_diffusers(tiny):
    from PIL import Image

    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    image = Image.fromarray((_image(b=1)[0].permute(1, 2, 0).numpy() * 255).astype("uint8"))
    mask = Image.fromarray((_mask()[0, 0].numpy() * 255).astype("uint8"), mode="L")
    args = {"image": image, "mask_image": mask, **_kw("sd"), "strength": 0.6}
    ours = p("a cat", generator=torch.Generator().manual_seed(7), **args)
    with torch.no_grad():
        ref = _theirs(pipe, "sd", True)("a cat", generator=torch.Generator().manual_seed(7), **args).images
    assert _rel(ours.images, ref) < 1e-4
