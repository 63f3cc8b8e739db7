"""Pipeline families as a registry: the built-in families are registered entries carrying what the pipeline
wrapper used to hard-code, and a family registered at run time is recognised by ``sd.pipelines.from_diffusers``.

The run-time family wraps a diffusers pipeline class of its own (a subclass of ``StableDiffusionPipeline``, which
the built-in ``sd`` family does not claim: ``Family.matches`` compares the exact class) and maps one more
scheduler (diffusers' LMS -> steerdiff's ``lms``). The reference for its output is independent of it: the same
components in a plain ``StableDiffusionPipeline`` through the built-in ``sd`` family, sampled with
``method="lms"``.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.pipelines import FAMILIES, SCHEDULER_METHODS, register_family
from steerdiff.pipelines.families import StableDiffusion, family_of

diffusers = pytest.importorskip("diffusers")

pytestmark = [pytest.mark.filterwarnings("ignore:the schedule starts at sigma"),  # few-step tiny schedules
              pytest.mark.filterwarnings("ignore:__array__ implementation")]  # diffusers' LMS under numpy 2


def test_builtin_families_are_registered_with_their_pieces():
    assert FAMILIES.names() == ["flux", "sd", "sd3", "sdxl"]
    assert FAMILIES.get("sd").required == ("tokenizer", "text_encoder", "vae", "unet", "scheduler")
    assert FAMILIES.get("sdxl").calibration_args == ("sample", "timestep")
    assert FAMILIES.get("sd3").calibration_args == () and FAMILIES.get("sd3").max_sequence_length == 256
    assert FAMILIES.get("flux").packed and FAMILIES.get("flux").max_sequence_length == 512
    assert FAMILIES.get("sd").max_sequence_length is None
    assert sorted(sd.pipelines.SUPPORTED) == sorted(["StableDiffusionPipeline", "StableDiffusionXLPipeline",
                                                     "StableDiffusion3Pipeline", "FluxPipeline"])
    assert SCHEDULER_METHODS["DDIMScheduler"] == "ddim"


class _MyPipeline(diffusers.StableDiffusionPipeline):
    """A diffusers-like pipeline class no built-in family claims."""


def _my_pipe(tiny, scheduler):
    base = tiny.sd("euler")
    parts = dict(base.components)
    parts["scheduler"] = scheduler
    return _MyPipeline(**parts), diffusers.StableDiffusionPipeline(**parts)


def test_a_family_registered_at_run_time_is_recognised(tiny):
    lms = diffusers.LMSDiscreteScheduler.from_config(tiny.sd("euler").scheduler.config)
    mine, plain = _my_pipe(tiny, lms)
    with pytest.raises(ValueError, match="unsupported pipeline class _MyPipeline.*StableDiffusionPipeline"):
        sd.pipelines.from_diffusers(mine)

    @register_family("my_sd")
    class MySD(StableDiffusion):
        pipeline_class = _MyPipeline
        schedulers = {**SCHEDULER_METHODS, "LMSDiscreteScheduler": "euler"}
        calibration_args = ("sample", "timestep")

    try:
        assert "my_sd" in FAMILIES and "_MyPipeline" in sd.pipelines.families.supported()
        p = sd.pipelines.from_diffusers(mine)
        assert p.family == "my_sd" and isinstance(family_of(mine), MySD)
        assert p.scheduler_method() == "euler"
        # Its pipelines compute what the built-in family computes on the same components with the same sampler.
        ref = sd.pipelines.from_diffusers(plain)
        assert ref.family == "sd" and ref.scheduler_method() == "lms"  # the sd family maps LMS to lms
        latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ours = p(["a cat", "dog"], num_inference_steps=3, guidance_scale=3.0, latents=latents, sigmas=None,
                     output_type="latent")
            want = ref(["a cat", "dog"], num_inference_steps=3, guidance_scale=3.0, latents=latents, method="euler",
                       output_type="latent")
        assert torch.equal(ours.latents, want.latents) and ours.nfe == want.nfe
        # calibration_inputs names the UNet's positional arguments from the family's calibration_args.
        items = p.calibration_inputs(["a cat"], num_inference_steps=2)
        assert items and {"sample", "timestep", "encoder_hidden_states"} <= set(items[0])
        # A second family claiming the same class is an error naming both.
        register_family("my_sd_twin")(type("Twin", (StableDiffusion,), {"pipeline_class": _MyPipeline}))
        with pytest.raises(ValueError, match="several registered families.*my_sd"):
            sd.pipelines.from_diffusers(mine)
    finally:
        FAMILIES.remove("my_sd")
        FAMILIES.remove("my_sd_twin")
    with pytest.raises(ValueError, match="unsupported pipeline class _MyPipeline"):
        sd.pipelines.from_diffusers(mine)


def test_register_family_refuses_what_is_not_a_family():
    with pytest.raises(TypeError, match="subclass of steerdiff.pipelines.Family"):
        register_family("bad")(object)
    with pytest.raises(ValueError, match="must set pipeline_class"):
        register_family("bad")(type("NoClass", (StableDiffusion,), {"pipeline_class": ""}))
    assert "bad" not in FAMILIES
