"""Bad input to sd.pipelines (clear errors before expensive work) and sd.pipelines.load's safety rules."""

import json
import warnings

import pytest
import torch

import steerdiff as sd

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")


def test_unsupported_pipeline_class_is_named(tiny):
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, block_out_channels=(8,),
                                 down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",), norm_num_groups=4)
    pipe = diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler())
    with pytest.raises(ValueError, match=r"DDPMPipeline.*StableDiffusionPipeline.*StableDiffusionXLPipeline"):
        sd.pipelines.from_diffusers(pipe)
    with pytest.raises(ValueError, match="unsupported pipeline class object"):
        sd.pipelines.from_diffusers(object())


@pytest.mark.parametrize("component", ["tokenizer", "vae", "text_encoder"])
def test_missing_component(tiny, component):
    pipe = tiny.sd()
    setattr(pipe, component, None)
    with pytest.raises(ValueError, match=f"missing.*'{component}'"):
        sd.pipelines.from_diffusers(pipe)


def test_prompt_and_latent_checks(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd())
    with pytest.raises(ValueError, match="negative_prompts has 3 entries but prompts has 2"):
        p.encode(["a", "b"], ["x", "y", "z"])
    with pytest.raises(TypeError, match="prompts must be a string"):
        p.encode(3)
    with pytest.raises(ValueError, match=r"latents must be a tensor of shape \(2, 4, 8, 8\)"):
        p(["a", "b"], latents=torch.zeros(1, 4, 8, 8), num_inference_steps=2)
    with pytest.raises(ValueError, match="height must be a positive multiple of 2"):
        p.latent_shape(15, 16)
    with pytest.raises(ValueError, match="output_type"):
        p("a", output_type="numpy")
    with pytest.raises(ValueError, match="max_sequence_length applies to SD3 and FLUX"):
        p.encode("a", max_sequence_length=8)
    with pytest.raises(ValueError, match="embedded_guidance applies to guidance-distilled FLUX"):
        p.encode("a", embedded_guidance=3.5)
    with pytest.raises(ValueError, match="z must be a latent tensor"):
        p.decode(torch.zeros(1, 16, 16))
    assert p.latent_shape(32, 16) == (4, 16, 8)
    # One negative prompt serves every row.
    c = p.encode(["a", "b"], "x")
    torch.testing.assert_close(c.null["prompt_embeds"][0], c.null["prompt_embeds"][1])


def test_unknown_scheduler_lists_the_supported(tiny):
    pipe = tiny.sd()
    pipe.scheduler = diffusers.PNDMScheduler.from_config(pipe.scheduler.config)
    p = sd.pipelines.from_diffusers(pipe)
    with pytest.raises(ValueError, match=r"PNDMScheduler.*DDIMScheduler.*UniPCMultistepScheduler"):
        p("a", num_inference_steps=2)


def test_half_weights_are_not_upcast(tiny):
    # from_diffusers keeps the user's modules as they are (tests/pipelines/test_pipeline_device_dtype.py runs them).
    pipe = tiny.sd()
    pipe.unet.half()
    weight = next(pipe.unet.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sd.pipelines.from_diffusers(pipe)
    assert next(pipe.unet.parameters()) is weight and weight.dtype == torch.float16


def test_load_round_trip(tiny, tmp_path):
    pipe = tiny.sd("euler")
    pipe.save_pretrained(tmp_path / "p")
    loaded = sd.pipelines.load(tmp_path / "p")
    assert loaded.family == "sd"
    original = sd.pipelines.from_diffusers(pipe)
    latents = torch.randn((1, *original.latent_shape()), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "the schedule starts at sigma")
        a = original("a cat", num_inference_steps=3, guidance_scale=2.0, latents=latents, output_type="latent")
        b = loaded("a cat", num_inference_steps=3, guidance_scale=2.0, latents=latents, output_type="latent")
    torch.testing.assert_close(a.images, b.images, rtol=0, atol=0)


def _fake_dir(tmp_path, index, files):
    d = tmp_path / "fake"
    d.mkdir()
    (d / "model_index.json").write_text(json.dumps(index))
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


SD_INDEX = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
            "vae": ["diffusers", "AutoencoderKL"], "scheduler": ["diffusers", "DDIMScheduler"],
            "safety_checker": [None, None]}


def test_load_refuses_pickle_only_weights_without_unpickling(tmp_path):
    # Not a valid pickle: were it unpickled, the error would be an UnpicklingError, not this message.
    d = _fake_dir(tmp_path, SD_INDEX, {"unet/diffusion_pytorch_model.bin": b"this would fail if unpickled",
                                       "unet/config.json": b"{}"})
    with pytest.raises(ValueError, match=r"component 'unet' has only pickle weights \['diffusion_pytorch_model.bin'\]"):
        sd.pipelines.load(d)


@pytest.mark.parametrize("index, match", [
    ({**SD_INDEX, "_class_name": "MyCustomPipeline"}, "not a diffusers pipeline"),
    ({**SD_INDEX, "unet": ["my_module", "MyUNet"]}, "custom component code"),
    ({**SD_INDEX, "unet": ["diffusers", "NoSuchClass"]}, "custom component code"),
])
def test_load_refuses_custom_code(tmp_path, index, match):
    with pytest.raises(ValueError, match=match):
        sd.pipelines.load(_fake_dir(tmp_path, index, {}))


def test_load_needs_a_pipeline_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sd.pipelines.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no model_index.json"):
        sd.pipelines.load(tmp_path)
