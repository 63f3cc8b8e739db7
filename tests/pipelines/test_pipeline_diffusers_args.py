"""Pipeline.__call__ takes diffusers' arguments with diffusers' meaning (issue 35), checked against the diffusers
pipeline itself on the tiny random-weight pipelines (tolerances as in test_pipelines_vs_diffusers.py), and refuses
what it does not support by name."""

import math

import numpy as np
import pytest
import torch

import steerdiff as sd

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:the schedule starts at sigma")

PROMPTS = ["a cat", "dog"]
STEPS = 4
SCALE = 3.0


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _latents(p, b, seed=5):
    return torch.randn((b, *p.latent_shape()), generator=torch.Generator().manual_seed(seed))


def _theirs(pipe, prompts, latents, **kw):
    kw = {"num_inference_steps": STEPS, "guidance_scale": SCALE, "output_type": "latent", **kw}
    with torch.no_grad():
        return pipe(prompts, latents=None if latents is None else latents.clone(), **kw).images


@pytest.mark.parametrize("scheduler", ["ddim", "euler"])
def test_num_images_per_prompt_matches_diffusers(tiny, scheduler):
    pipe = tiny.sd(scheduler)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, 4)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type="latent",
             num_images_per_prompt=2, negative_prompt=["x", "y"])
    ref = _theirs(pipe, PROMPTS, latents, num_images_per_prompt=2, negative_prompt=["x", "y"])
    assert ours.images.shape[0] == 4
    assert _rel(ours.images, ref) < 1e-4
    # From a generator: the same draw of B n latents.
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, output_type="latent",
             num_images_per_prompt=2, generator=torch.Generator().manual_seed(3))
    ref = _theirs(pipe, PROMPTS, None, num_images_per_prompt=2, generator=torch.Generator().manual_seed(3))
    assert _rel(ours.images, ref) < 1e-4


def test_guidance_rescale_matches_diffusers(tiny):
    pipe = tiny.sd("euler")
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, 2)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type="latent",
             guidance_rescale=0.7)
    ref = _theirs(pipe, PROMPTS, latents, guidance_rescale=0.7)
    assert _rel(ours.images, ref) < 1e-4
    plain = _theirs(pipe, PROMPTS, latents)
    assert _rel(ref, plain) > 1e-3  # the rescale changes the result: the comparison above can fail


def test_guidance_rescale_on_sdxl_matches_diffusers(tiny):
    pipe = tiny.sdxl()
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, 2)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type="latent",
             guidance_rescale=0.5)
    assert _rel(ours.images, _theirs(pipe, PROMPTS, latents, guidance_rescale=0.5)) < 1e-4


@pytest.mark.parametrize("output_type", ["pt", "np"])
def test_output_types_pt_and_np_are_diffusers(tiny, output_type):
    pipe = tiny.sd("euler")
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, 2)
    ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type=output_type)
    ref = _theirs(pipe, PROMPTS, latents, output_type=output_type)
    assert type(ours.images) is type(ref)
    assert ours.images.shape == ref.shape
    assert ours.images.min() >= 0 and ours.images.max() <= 1
    if output_type == "np":
        assert ours.images.dtype == ref.dtype
        np.testing.assert_allclose(ours.images, ref, rtol=0, atol=1e-4)
    else:
        torch.testing.assert_close(ours.images, ref, rtol=0, atol=1e-4)
    # return_dict=False: the tuple (images,), as diffusers.
    images, = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type=output_type,
                return_dict=False)
    assert images.shape == ref.shape


def test_prompt_embeds_instead_of_prompts_match_diffusers(tiny):
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, 2)
    pos, neg = pipe.encode_prompt(PROMPTS, torch.device("cpu"), 1, True, negative_prompt=["blurry", "dark"])
    ours = p(prompt_embeds=pos, negative_prompt_embeds=neg, num_inference_steps=STEPS, guidance_scale=SCALE,
             latents=latents, output_type="latent")
    ref = _theirs(pipe, None, latents, prompt_embeds=pos, negative_prompt_embeds=neg)
    assert _rel(ours.images, ref) < 1e-4
    # Without negative_prompt_embeds: the empty prompt's, as diffusers; with num_images_per_prompt too.
    ours = p(prompt_embeds=pos, num_inference_steps=STEPS, guidance_scale=SCALE, latents=_latents(p, 4),
             output_type="latent", num_images_per_prompt=2)
    ref = _theirs(pipe, None, _latents(p, 4), prompt_embeds=pos, num_images_per_prompt=2)
    assert _rel(ours.images, ref) < 1e-4


@pytest.mark.parametrize("scheduler", ["ddim", "euler", "dpm", "sd3"])
def test_callback_on_step_end_sees_what_diffusers_shows(tiny, scheduler):
    pipe = tiny.sd3() if scheduler == "sd3" else tiny.sd(scheduler)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, 2)
    seen = {"ours": [], "theirs": []}

    def recorder(key):
        def fn(pipeline, i, t, kwargs):
            seen[key].append((i, float(t), sorted(kwargs), kwargs["latents"].clone()))
            return kwargs
        return fn

    p(PROMPTS, num_inference_steps=STEPS, guidance_scale=SCALE, latents=latents, output_type="latent",
      callback_on_step_end=recorder("ours"), callback_on_step_end_tensor_inputs=["latents"])
    _theirs(pipe, PROMPTS, latents, callback_on_step_end=recorder("theirs"),
            callback_on_step_end_tensor_inputs=["latents"])
    assert [s[0] for s in seen["ours"]] == [s[0] for s in seen["theirs"]] == list(range(STEPS))
    for a, b in zip(seen["ours"], seen["theirs"], strict=True):
        assert math.isclose(a[1], b[1], rel_tol=1e-5, abs_tol=1e-3)
        assert a[2] == b[2] == ["latents"]
        assert _rel(a[3], b[3]) < 1e-4


def test_callback_on_step_end_refusals(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd("euler"))
    kw = {"num_inference_steps": 2, "output_type": "latent"}
    with pytest.raises(ValueError, match="callback_on_step_end_tensor_inputs"):
        p("a", callback_on_step_end=lambda *a: {}, callback_on_step_end_tensor_inputs=["prompt_embeds"], **kw)
    with pytest.raises(TypeError, match="callback_on_step_end must be callable"):
        p("a", callback_on_step_end="print", **kw)
    with pytest.raises(ValueError, match="returned new latents"):
        p("a", callback_on_step_end=lambda pipe, i, t, k: {"latents": k["latents"] * 0}, **kw)


def test_guidance_scale_zero_and_one_are_the_conditional_model_as_in_diffusers(tiny):
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, 2)
    for s in (0.0, 0.5, 1.0):
        ours = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=s, latents=latents, output_type="latent")
        assert ours.nfe == STEPS
        assert _rel(ours.images, _theirs(pipe, PROMPTS, latents, guidance_scale=s)) < 1e-4


BAD = [
    ({"guidance_scale": float("nan")}, ValueError, "guidance_scale must be a finite number >= 0"),
    ({"guidance_scale": -5.0}, ValueError, "guidance_scale must be a finite number >= 0"),
    ({"guidance_scale": float("inf")}, ValueError, "guidance_scale must be a finite number >= 0"),
    ({"guidance_scale": "7"}, ValueError, "guidance_scale must be a finite number >= 0"),
    ({"generator": "x"}, TypeError, "generator must be a torch.Generator"),
    ({"generator": 3}, TypeError, "generator must be a torch.Generator"),
    ({"generator": [torch.Generator(), "x"]}, TypeError, "generator must be a torch.Generator"),
    ({"num_images_per_prompt": 0}, ValueError, "num_images_per_prompt must be an integer >= 1"),
    ({"num_images_per_prompt": 1.5}, ValueError, "num_images_per_prompt must be an integer >= 1"),
    ({"guidance_rescale": 1.5}, ValueError, r"guidance_rescale must be a number in \[0, 1\]"),
    ({"guidance_rescale": float("nan")}, ValueError, r"guidance_rescale must be a number in \[0, 1\]"),
    ({"guidance_rescale": 0.7, "guidance": sd.guidance.CFG(2.0)}, ValueError, "guidance_rescale or guidance="),
    ({"callback": lambda *a: None}, TypeError, r"callback= is not supported by steerdiff's Pipeline \(sd"),
    ({"callback_steps": 1}, TypeError, "callback_steps= is not supported"),
    ({"mask_image": torch.zeros(1, 1, 16, 16)}, ValueError, "mask_image applies with image= only"),
    ({"masked_image_latents": torch.zeros(1, 4, 8, 8)}, TypeError, "masked_image_latents= is not supported"),
    ({"strength": 0.5}, ValueError, "strength applies with image= only"),
    ({"clip_skip": 1}, TypeError, r"clip_skip= \(an argument of diffusers' StableDiffusionPipeline\) is not "),
    ({"timesteps": [999, 500]}, TypeError, "timesteps= .an argument of diffusers' StableDiffusionPipeline"),
    ({"cross_attention_kwargs": {"scale": 0.5}}, TypeError, "cross_attention_kwargs= .an argument of diffusers'"),
    ({"ip_adapter_image": None}, TypeError, "ip_adapter_image= .an argument of diffusers'"),
    ({"foo": 1}, TypeError, r"steerdiff's Pipeline \(sd\) got an unexpected keyword argument 'foo'"),
    ({"return_dict": "no"}, TypeError, "return_dict must be True or False"),
    ({"prompt_embeds": torch.zeros(2, 4)}, ValueError, "prompt or prompt_embeds, not both"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD)
def test_bad_arguments_are_named(tiny, kwargs, error, match):
    p = sd.pipelines.from_diffusers(tiny.sd("euler"))
    with pytest.raises(error, match=match):
        p(PROMPTS, num_inference_steps=2, output_type="latent", **kwargs)


def test_bad_embeds_and_prompts_are_named(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd("euler"))
    kw = {"num_inference_steps": 2, "output_type": "latent"}
    with pytest.raises(ValueError, match="pass prompt .* or prompt_embeds"):
        p(**kw)
    with pytest.raises(ValueError, match=r"prompt_embeds must be a float tensor \[B, seq, dim\]"):
        p(prompt_embeds=torch.zeros(2, 4), **kw)
    pos = p.encode(PROMPTS)["prompt_embeds"]
    with pytest.raises(ValueError, match="negative_prompt_embeds has shape"):
        p(prompt_embeds=pos, negative_prompt_embeds=pos[:1], **kw)
    with pytest.raises(ValueError, match="negative_prompt_embeds needs prompt_embeds"):
        p(PROMPTS, negative_prompt_embeds=pos, **kw)
    with pytest.raises(ValueError, match="prompt_embeds must have the text encoder's shape"):
        p(prompt_embeds=pos[:, :3], **kw)
    with pytest.raises(ValueError, match=r"latents must be a tensor of shape \(4, 4, 8, 8\)"):
        p(PROMPTS, num_images_per_prompt=2, latents=_latents(p, 2), **kw)
    with pytest.raises(ValueError, match="generator is a list of 2 but the batch has 4 images"):
        p(PROMPTS, num_images_per_prompt=2, generator=[torch.Generator(), torch.Generator()], **kw)


def test_arguments_other_families_lack_are_named(tiny):
    p3 = sd.pipelines.from_diffusers(tiny.sd3())
    with pytest.raises(TypeError, match=r"guidance_rescale= \(not an argument of diffusers' StableDiffusion3Pipeline"):
        p3("a", num_inference_steps=2, output_type="latent", guidance_rescale=0.7)
    with pytest.raises(TypeError, match="prompt_embeds= is supported by steerdiff's Pipeline for the sd family only"):
        p3(prompt_embeds=torch.zeros(1, 4, 8), num_inference_steps=2, output_type="latent")
    pv = sd.pipelines.from_diffusers(tiny.sd("euler", "v_prediction"))
    with pytest.raises(ValueError, match="guidance_rescale on a 'v_prediction' pipeline"):
        pv("a", num_inference_steps=2, output_type="latent", guidance_rescale=0.7)


def test_progress_bar_on_by_default_and_set_progress_bar_config_disables_it(tiny, capsys):
    p = sd.pipelines.from_diffusers(tiny.sd("euler"))
    p("a", num_inference_steps=3, output_type="latent")
    assert "/3 [" in capsys.readouterr().err  # tqdm's "k/3 [elapsed<remaining, ...]"
    p.set_progress_bar_config(disable=True)
    p("a", num_inference_steps=3, output_type="latent")
    assert "/3 [" not in capsys.readouterr().err
    p.set_progress_bar_config(disable=False)
    p("a", num_inference_steps=3, output_type="latent", progress=False)  # the call's own choice wins
    assert "/3 [" not in capsys.readouterr().err
    with pytest.raises(TypeError, match="takes disable= only"):
        p.set_progress_bar_config(desc="x")


def _img2img(pipe):
    return diffusers.StableDiffusionImg2ImgPipeline(**pipe.components, requires_safety_checker=False)


@pytest.mark.parametrize("scheduler", ["ddim", "euler"])
@pytest.mark.parametrize("generators", [False, True])
def test_image_to_image_matches_diffusers_img2img(tiny, scheduler, generators):
    pipe = tiny.sd(scheduler)
    p = sd.pipelines.from_diffusers(pipe)
    image = torch.rand((2, 3, 16, 16), generator=torch.Generator().manual_seed(1))

    def gen():
        if generators:
            return [torch.Generator().manual_seed(10 + i) for i in range(2)]
        return torch.Generator().manual_seed(7)

    kw = {"num_inference_steps": 5, "guidance_scale": SCALE, "strength": 0.6, "output_type": "latent"}
    ours = p(PROMPTS, image=image, generator=gen(), **kw)
    with torch.no_grad():
        ref = _img2img(pipe)(PROMPTS, image=image, generator=gen(), **kw).images
    assert ours.nfe == 2 * 3  # the last int(5 * 0.6) = 3 steps
    assert _rel(ours.images, ref) < 1e-4
    # The run starts from the image: a strength of 1 differs from it, and images in, images out (pt).
    with torch.no_grad():
        ref_pt = _img2img(pipe)(PROMPTS, image=image, generator=gen(), **{**kw, "output_type": "pt"}).images
    torch.testing.assert_close(p(PROMPTS, image=image, generator=gen(), **{**kw, "output_type": "pt"}).images,
                               ref_pt, rtol=0, atol=1e-4)


def test_image_to_image_refusals(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd("euler"))
    image = torch.rand((1, 3, 16, 16))
    kw = {"num_inference_steps": 4, "output_type": "latent"}
    with pytest.raises(ValueError, match=r"strength must be a number in \(0, 1\]"):
        p("a", image=image, strength=1.5, **kw)
    with pytest.raises(ValueError, match=r"strength must be a number in \(0, 1\]"):
        p("a", image=image, strength=float("nan"), **kw)
    with pytest.raises(ValueError, match="strength applies with image= only"):
        p("a", strength=0.5, **kw)
    with pytest.raises(ValueError, match="pass image= or latents=, not both"):
        p("a", image=image, latents=torch.zeros(1, 4, 8, 8), **kw)
    with pytest.raises(ValueError, match=r"image must be PIL images or a float tensor \[B, 3, H, W\]"):
        p("a", image=torch.zeros(3, 16, 16), **kw)
    with pytest.raises(ValueError, match=r"image must be PIL images or a float tensor"):
        p("a", image="cat.png", **kw)
    with pytest.raises(ValueError, match="do not divide the batch of 3"):
        p(["a", "b", "c"], image=torch.rand((2, 3, 16, 16)), **kw)
    with pytest.raises(ValueError, match="the image is 16x16"):
        p("a", image=image, height=32, **kw)
    with pytest.raises(ValueError, match=r"mask_image must be PIL images or a float tensor \[B, 1, H, W\]"):
        p("a", image=image, mask_image=image, **kw)


def test_callback_on_step_end_in_image_to_image_matches_diffusers(tiny):
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)
    image = torch.rand((2, 3, 16, 16), generator=torch.Generator().manual_seed(1))
    seen = {"ours": [], "theirs": []}

    def recorder(key):
        def fn(pipeline, i, t, kwargs):
            seen[key].append((i, float(t), kwargs["latents"].clone()))
            return kwargs
        return fn

    kw = {"num_inference_steps": 5, "guidance_scale": SCALE, "strength": 0.6, "output_type": "latent", "image": image}
    p(PROMPTS, generator=torch.Generator().manual_seed(7), callback_on_step_end=recorder("ours"), **kw)
    with torch.no_grad():
        _img2img(pipe)(PROMPTS, generator=torch.Generator().manual_seed(7), callback_on_step_end=recorder("theirs"),
                       **kw)
    assert [s[0] for s in seen["ours"]] == [s[0] for s in seen["theirs"]] == [0, 1, 2]
    for a, b in zip(seen["ours"], seen["theirs"], strict=True):
        assert math.isclose(a[1], b[1], rel_tol=1e-5, abs_tol=1e-3)
        assert _rel(a[2], b[2]) < 1e-4


MORE_BAD = [
    ({"num_inference_steps": 0}, "num_inference_steps must be an integer >= 1"),
    ({"num_inference_steps": 2.5}, "num_inference_steps must be an integer >= 1"),
    ({"num_inference_steps": "4"}, "num_inference_steps must be an integer >= 1"),
    ({"negative_prompt": ["a", "b", "c"]}, "negative_prompt has 3 entries but prompt has 2"),
    ({"latents": torch.full((2, 4, 8, 8), float("nan"))}, "latents must be finite"),
    ({"sigmas": "x"}, "sigmas must be a decreasing schedule of numbers"),
    ({"sigmas": [1.0, "a", 0.0]}, "sigmas must be a decreasing schedule of numbers"),
    ({"image": torch.full((1, 3, 16, 16), float("nan"))}, "image must be finite"),
]


@pytest.mark.parametrize("kwargs, match", MORE_BAD)
def test_more_bad_arguments_are_named(tiny, kwargs, match):
    p = sd.pipelines.from_diffusers(tiny.sd("euler"))
    with pytest.raises(ValueError, match=match):
        p(PROMPTS, num_inference_steps=kwargs.pop("num_inference_steps", 2), output_type="latent", **kwargs)


def test_sigmas_as_a_list_are_the_tensor(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd("euler"))
    latents = _latents(p, 2)
    sig = p.default_sigmas(3)
    a = p(PROMPTS, sigmas=sig, latents=latents, output_type="latent").images
    b = p(PROMPTS, sigmas=sig.tolist(), latents=latents, output_type="latent").images
    torch.testing.assert_close(a, b, rtol=0, atol=0)
