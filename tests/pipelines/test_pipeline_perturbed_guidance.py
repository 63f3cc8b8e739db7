"""Perturbation guiders on the diffusers pipelines, against diffusers' own implementations from the same components.

PAG (steerdiff.guidance.PAG) against ``StableDiffusionPAGPipeline`` / ``StableDiffusionXLPAGPipeline`` built from the
same tiny components (as diffusers' tests build them), same latents and prompts; tolerance 1e-4 relative, as
test_pipelines_vs_diffusers.py.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import PAG
from steerdiff.models.perturb import identity_self_attention, select_self_attention

diffusers = pytest.importorskip("diffusers")

PROMPTS = ["a cat", "dog"]
STEPS = 4


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _latents(p, seed=5):
    return torch.randn((len(PROMPTS), *p.latent_shape()), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family, layers, scale", [("sd", ["mid"], 3.0), ("sd", ["down_blocks.1", "up"], 1.0),
                                                   ("sdxl", ["mid"], 3.0)])
def test_pag_matches_diffusers_pag_pipeline(tiny, family, layers, scale):
    pipe = tiny.sd() if family == "sd" else tiny.sdxl()
    cls = diffusers.StableDiffusionPAGPipeline if family == "sd" else diffusers.StableDiffusionXLPAGPipeline
    ref_pipe = cls(**pipe.components, pag_applied_layers=layers)
    ref_pipe.set_progress_bar_config(disable=True)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    with torch.no_grad():
        want = ref_pipe(PROMPTS, num_inference_steps=STEPS, guidance_scale=scale, pag_scale=2.5,
                        latents=latents.clone(), output_type="latent").images
    out = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent",
            guidance=PAG(scale, pag_scale=2.5, layers=layers))
    assert _rel(out.images, want) < 1e-4
    # cost: a doubled batch and the perturbed pass (3 rows per sample and step), 2 rows without CFG
    assert out.nfe == (3 if scale > 1 else 2) * STEPS
    # the processors are restored: a plain call afterwards is the plain pipeline
    plain = p(PROMPTS, num_inference_steps=STEPS, guidance_scale=scale, latents=latents, output_type="latent")
    with torch.no_grad():
        plain_ref = pipe(PROMPTS, num_inference_steps=STEPS, guidance_scale=scale, latents=latents.clone(),
                         output_type="latent").images
    assert _rel(plain.images, plain_ref) < 1e-4


def test_pag_at_scale_zero_is_cfg(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd())
    latents = _latents(p)
    a = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent", guidance=PAG(3.0, pag_scale=0))
    b = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent", guidance_scale=3.0)
    torch.testing.assert_close(a.images, b.images, rtol=0, atol=0)


def test_identity_self_attention_is_the_value_path_and_restores(tiny):
    """Inside the context the selected layer returns to_out(to_v(h)) (+ residual handling); outside, the original
    processor is back, also after an exception."""
    unet = tiny.sd().unet
    (name, attn), = select_self_attention(unet, ["mid"])
    before = attn.processor
    h = torch.randn(2, 16, attn.to_q.in_features)
    with identity_self_attention(unet, ["mid"]) as names:
        assert names == [name]
        got = attn(h)
    want = attn.to_out[1](attn.to_out[0](attn.to_v(h)))
    if attn.residual_connection:
        want = want + h
    torch.testing.assert_close(got, want / attn.rescale_output_factor)
    assert attn.processor is before
    with pytest.raises(RuntimeError), identity_self_attention(unet, ["mid"]):
        raise RuntimeError
    assert attn.processor is before


def test_layer_ids_are_checked(tiny):
    unet = tiny.sd().unet
    with pytest.raises(ValueError, match="'nowhere' selects no self-attention layer"):
        PAG(3.0, layers=["nowhere"], network=unet)
    with pytest.raises(ValueError, match="layers must be"):
        PAG(3.0, layers=[])
    assert PAG(3.0, layers="mid, up").layers == ("mid", "up")  # the CLI's comma-separated form
    # "down_blocks.1" must not select down_blocks.10 (diffusers' rule for ids ending in a number)
    names = [n for n, _ in select_self_attention(unet, ["down_blocks.1"])]
    assert names and all(".down_blocks.10" not in "." + n for n in names)


def test_pag_needs_attention_layers():
    model = sd.models.load("digits")
    with pytest.raises(ValueError, match="no network with self-attention layers"):
        sd.sample(model, sd.randn((2, 1, 8, 8), seeds=0), sd.sigmas.karras(3, 0.01, 80.0), cond=torch.arange(2),
                  guidance=PAG(2.0))
