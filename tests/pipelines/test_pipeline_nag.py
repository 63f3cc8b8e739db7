"""NAG (steerdiff.guidance.NAG) on a guidance-distilled tiny FLUX pipeline: the plain call at phi = 1, invariants of
the two-branch attention (the positive branch is FLUX's own attention; a negative equal to the positive text changes
nothing), the negative prompt moving the output away from its content at one network row per step, processors
restored, bad options named."""

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import NAG
from steerdiff.models.nag import capture_text, nag_attention, nag_combine

diffusers = pytest.importorskip("diffusers")

PROMPT, NEGATIVE = ["a cat"], ["dog"]  # words of the tiny T5 vocabulary
STEPS = 3


@pytest.fixture(scope="module")
def flux(tiny):
    pipe = tiny.flux(guidance_embeds=True)
    return pipe, sd.pipelines.from_diffusers(pipe)


def _latents(p, seed=3):
    return torch.randn((1, *p.latent_shape()), generator=torch.Generator().manual_seed(seed))


def _processors(tr):
    return {n: m.processor for n, m in tr.named_modules() if type(m).__name__ == "FluxAttention"}


def _inputs(pipe, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, 16, generator=g)
    emb, pooled, txt_ids = pipe.encode_prompt(PROMPT, None, max_sequence_length=16)
    neg, _, _ = pipe.encode_prompt(NEGATIVE, None, max_sequence_length=16)
    img_ids = pipe._prepare_latent_image_ids(1, 4, 4, torch.device("cpu"), torch.float32)
    kw = dict(hidden_states=x, timestep=torch.tensor([0.6]), guidance=torch.tensor([3.5]), encoder_hidden_states=emb,
              pooled_projections=pooled, txt_ids=txt_ids, img_ids=img_ids, return_dict=False)
    return kw, neg


def test_nag_combine_closed_form():
    g = torch.Generator().manual_seed(0)
    zp, zn = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    # no clip (tau large), alpha = 1: the extrapolation phi Z+ - (phi - 1) Z-
    torch.testing.assert_close(nag_combine(zp, zn, 3.0, 1e9, 1.0), 3 * zp - 2 * zn)
    # clipped: the L1 norm ratio of the normalised feature is exactly min(r, tau)
    z = nag_combine(zp, zn, 6.0, 1.5, 1.0)
    r = (6 * zp - 5 * zn).abs().sum(-1) / zp.abs().sum(-1)
    torch.testing.assert_close(z.abs().sum(-1) / zp.abs().sum(-1), r.clamp(max=1.5))
    # alpha blends; phi = 1 is Z+; a per-sample phi
    torch.testing.assert_close(nag_combine(zp, zn, 3.0, 1e9, 0.25), 0.25 * (3 * zp - 2 * zn) + 0.75 * zp)
    torch.testing.assert_close(nag_combine(zp, zn, 1.0, 2.5, 0.25), zp)
    per = nag_combine(zp, zn, torch.tensor([1.0, 3.0]), 1e9, 1.0)
    torch.testing.assert_close(per, torch.stack([zp[0], 3 * zp[1] - 2 * zn[1]]))


@torch.no_grad()
def test_two_branch_attention_invariants(flux):
    pipe, _ = flux
    tr = pipe.transformer
    kw, neg = _inputs(pipe)
    plain = tr(**kw)[0]
    # phi = 1: the positive branch alone is FLUX's own attention (the negative text never reaches the image)
    with nag_attention(tr, neg, 1.0, 2.5, 0.25):
        torch.testing.assert_close(tr(**kw)[0], plain, rtol=1e-5, atol=1e-6)
    # the negative text equal to the positive: Z- = Z+, nothing moves at any phi
    with nag_attention(tr, kw["encoder_hidden_states"], 7.0, 2.5, 0.5):
        torch.testing.assert_close(tr(**kw)[0], plain, rtol=1e-5, atol=1e-6)
    # a different negative moves it; capture_text reads the input without running the network
    with nag_attention(tr, neg, 5.0, 2.5, 0.25):
        assert (tr(**kw)[0] - plain).abs().max() > 1e-3
    got = capture_text(tr, lambda: tr(**{**kw, "encoder_hidden_states": neg}))
    assert got is neg


def test_scale_one_is_the_plain_call(flux):
    _, p = flux
    lat = _latents(p)
    run = dict(num_inference_steps=STEPS, latents=lat, output_type="latent", max_sequence_length=16)
    plain = p(PROMPT, **run)
    out = p(PROMPT, negative_prompt=NEGATIVE, guidance=NAG(1.0), **run)
    assert torch.equal(out.images, plain.images)
    assert out.nfe == STEPS


def test_negative_prompt_moves_away_at_one_row_per_step(flux):
    pipe, p = flux
    before = _processors(pipe.transformer)
    lat = _latents(p)
    run = dict(num_inference_steps=STEPS, latents=lat, output_type="latent", max_sequence_length=16)
    plain = p(PROMPT, **run).images
    plain_neg = p(NEGATIVE, **run).images
    # a strong setting: the tiny random network's text dependence is weak (plain(P) vs plain(N): 1.3 % apart)
    out = p(PROMPT, negative_prompt=NEGATIVE, guidance=NAG(10.0, nag_tau=10.0, nag_alpha=1.0), **run)
    # one network row per sample and step, and one (stopped) read of the negative text per trajectory
    assert out.nfe == STEPS + 1
    assert (out.images - plain).norm() > 1e-2
    assert (out.images - plain_neg).norm() > (plain - plain_neg).norm() + 5e-4
    # processors restored
    assert _processors(pipe.transformer) == before


def test_processors_restored_after_an_exception(flux):
    pipe, _ = flux
    tr = pipe.transformer
    before = _processors(tr)
    kw, neg = _inputs(pipe)
    with pytest.raises(ValueError, match="negative text"):  # a negative of the wrong width: refused in the call
        with nag_attention(tr, neg[..., :4], 5.0, 2.5, 0.25), torch.no_grad():
            tr(**kw)
    assert _processors(tr) == before
    assert not tr._forward_pre_hooks


def test_bad_options_named(flux):
    pipe, _ = flux
    with pytest.raises(ValueError, match="scale"):
        NAG(0.5)
    with pytest.raises(ValueError, match="nag_tau"):
        NAG(5.0, nag_tau=0.5)
    with pytest.raises(ValueError, match="nag_alpha"):
        NAG(5.0, nag_alpha=1.5)
    with pytest.raises(ValueError, match="nope"):
        NAG(5.0, layers=["nope"], network=pipe.transformer)
    with pytest.raises(ValueError, match="FluxAttention"):
        NAG(5.0, network=torch.nn.Linear(2, 2))
    assert NAG(5.0, layers="single_transformer_blocks", network=pipe.transformer).layers == (
        "single_transformer_blocks",)


def test_registry_and_cli_flags(flux):
    from steerdiff.app.cli._guiders import GUIDER_FLAGS, guider_parameters, offered
    from steerdiff.guidance import GUIDERS, build_guider

    assert GUIDERS.get("nag") is NAG and offered("nag", NAG)
    assert {"nag_tau", "nag_alpha", "layers"} <= set(GUIDER_FLAGS) & set(guider_parameters(NAG))
    g = build_guider("nag", 4.0, nag_tau=3.0, nag_alpha=0.5, layers="transformer_blocks.0, single_transformer_blocks")
    assert g.config["scale"] == 4.0 and g.config["nag_tau"] == 3.0 and g.config["nag_alpha"] == 0.5
    assert g.layers == ("transformer_blocks.0", "single_transformer_blocks")
    assert NAG.from_config(g.config).config == g.config


@torch.no_grad()
def test_unet_cross_attention(tiny):
    """NAG on a UNet's cross-attention (SD): the same invariants, and the negative prompt moving the pipeline's
    output away from the plain output for it at one row per step."""
    pipe = tiny.sd()
    unet = pipe.unet
    before = {n: m.processor for n, m in unet.named_modules() if hasattr(m, "processor")}
    emb, neg = pipe.encode_prompt(["a cat"], "cpu", 1, True, ["dog"])
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([500])
    plain = unet(x, t, encoder_hidden_states=emb).sample
    with nag_attention(unet, neg, 1.0, 2.5, 0.25):
        torch.testing.assert_close(unet(x, t, encoder_hidden_states=emb).sample, plain, rtol=1e-5, atol=1e-6)
    with nag_attention(unet, emb, 6.0, 2.5, 0.5):
        torch.testing.assert_close(unet(x, t, encoder_hidden_states=emb).sample, plain, rtol=1e-5, atol=1e-6)
    with nag_attention(unet, neg, 6.0, 2.5, 0.5, layers=["up_blocks"]) as names:
        assert names and all(n.startswith("up_blocks") and n.endswith("attn2") for n in names)
        assert (unet(x, t, encoder_hidden_states=emb).sample - plain).abs().max() > 1e-4
    assert {n: m.processor for n, m in unet.named_modules() if hasattr(m, "processor")} == before
    p = sd.pipelines.from_diffusers(pipe)
    lat = torch.randn((1, *p.latent_shape()), generator=torch.Generator().manual_seed(1))
    run = dict(num_inference_steps=STEPS, latents=lat, output_type="latent", guidance_scale=1.0)
    a, b = p(["a cat"], **run).images, p(["dog"], **run).images
    out = p(["a cat"], negative_prompt=["dog"], guidance=NAG(10.0, nag_tau=10.0, nag_alpha=1.0), **run)
    assert out.nfe == STEPS + 1
    assert (out.images - b).norm() > (a - b).norm()
