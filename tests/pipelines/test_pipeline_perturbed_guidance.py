"""Perturbation guiders on the diffusers pipelines, against diffusers' own implementations from the same components.

PAG (steerdiff.guidance.PAG) against ``StableDiffusionPAGPipeline`` / ``StableDiffusionXLPAGPipeline`` built from the
same tiny components (as diffusers' tests build them), same latents and prompts; tolerance 1e-4 relative, as
test_pipelines_vs_diffusers.py.
"""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import PAG, SEG, SLG
from steerdiff.models.perturb import (
    blurred_queries,
    identity_self_attention,
    perturbed_attention,
    seg_kernel_size,
    select_blocks,
    select_self_attention,
    skip_blocks,
)

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


# --- transformers: SD3 skip-layer guidance and PAG -------------------------------------------------------------------

def _sd3(tiny, layers=3):
    """The tiny SD3 pipeline with a ``layers``-block transformer (the last block context-pre-only, as SD3's)."""
    pipe = tiny.sd3()
    cfg = dict(pipe.transformer.config)
    torch.manual_seed(3)
    pipe.transformer = diffusers.SD3Transformer2DModel(**{**{k: v for k, v in cfg.items() if not k.startswith("_")},
                                                          "num_layers": layers}).eval()
    return pipe


@pytest.mark.parametrize("steps, skip, start, stop, scale", [(5, [1], 0.01, 0.8, 3.0), (10, [0, 2], 0.01, 0.2, 2.0),
                                                            (4, [1], 0.3, 0.35, 3.0)])
def test_slg_matches_diffusers_sd3_skip_layer_guidance(tiny, steps, skip, start, stop, scale):
    pipe = _sd3(tiny)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, seed=7)
    with torch.no_grad():
        want = pipe(PROMPTS, num_inference_steps=steps, guidance_scale=scale, latents=latents.clone(),
                    skip_guidance_layers=skip, skip_layer_guidance_scale=2.5, skip_layer_guidance_start=start,
                    skip_layer_guidance_stop=stop, output_type="latent").images
        plain = pipe(PROMPTS, num_inference_steps=steps, guidance_scale=scale, latents=latents.clone(),
                     output_type="latent").images
    out = p(PROMPTS, num_inference_steps=steps, latents=latents, output_type="latent",
            guidance=SLG(scale, slg_scale=2.5, layers=skip, perturb_start=start, perturb_stop=stop))
    n_on = sum(1 for i in range(steps) if steps * start < i < steps * stop)
    err = _rel(out.images, want)
    print(f"SLG vs StableDiffusion3Pipeline(skip_guidance_layers={skip}) steps={steps}: rel {err:.2e}")
    assert err < 1e-4
    if n_on:
        assert _rel(want, plain) > 1e-3  # the reference's SLG term is not negligible: the test can fail
    else:
        assert _rel(out.images, plain) < 1e-4
    assert out.nfe == 2 * steps + n_on  # a doubled batch per step, one more row where the window is on


def test_skip_blocks_returns_inputs_and_restores(tiny):
    tr = _sd3(tiny).transformer
    names = [n for n, _ in select_blocks(tr, [1])]
    assert names == ["transformer_blocks.1"]
    x = torch.randn(2, 4, 8, 8)
    kw = dict(encoder_hidden_states=torch.randn(2, 5, tr.config.joint_attention_dim),
              pooled_projections=torch.randn(2, tr.config.pooled_projection_dim), timestep=torch.tensor([500.0] * 2))
    with torch.no_grad():
        want = tr(x, skip_layers=[0, 1], **kw).sample
        with skip_blocks(tr, [0, 1]):
            got = tr(x, **kw).sample
        plain = tr(x, **kw).sample
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (plain - want).abs().max() > 1e-4  # restored
    assert "forward" not in vars(tr.transformer_blocks[0])
    with pytest.raises(ValueError, match="out of range"):
        SLG(3.0, layers=[3], network=tr)
    with pytest.raises(ValueError, match="'nowhere' selects no transformer block"):
        SLG(3.0, layers=["nowhere"], network=tr)
    assert SLG(3.0, layers="7, 8,single").layers == (7, 8, "single")


@pytest.mark.parametrize("layers, scale", [(["blocks.1"], 3.0), (["blocks.0", "blocks.2"], 1.0)])
def test_pag_matches_diffusers_sd3_pag_pipeline(tiny, layers, scale):
    pipe = _sd3(tiny)
    comps = {k: v for k, v in pipe.components.items() if k not in ("image_encoder", "feature_extractor")}
    ref = diffusers.StableDiffusion3PAGPipeline(**comps, pag_applied_layers=layers)
    ref.set_progress_bar_config(disable=True)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p, seed=8)
    with torch.no_grad():
        want = ref(PROMPTS, num_inference_steps=STEPS, guidance_scale=scale, pag_scale=2.5,
                   latents=latents.clone(), output_type="latent").images
    out = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent",
            guidance=PAG(scale, pag_scale=2.5, layers=layers))
    err = _rel(out.images, want)
    print(f"PAG vs StableDiffusion3PAGPipeline({layers}, w={scale}): rel {err:.2e}")
    assert err < 1e-4
    assert out.nfe == (3 if scale > 1 else 2) * STEPS


# --- SEG -------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sigma", [0.7, 2.0, math.inf])
def test_seg_blurs_queries_as_the_reference_blur(tiny, sigma):
    """The perturbed layer's output equals the module run with its own processor on queries blurred by diffusers'
    ``_gaussian_blur_2d`` (the reference code's kernel, reflect padding; its branch chosen by the threshold so the
    blur runs for finite sigma and the mean for inf: diffusers' hook takes the branches the other way round)."""
    from diffusers.hooks.smoothed_energy_guidance_utils import _gaussian_blur_2d

    unet = tiny.sd().unet
    (_, attn), = select_self_attention(unet, ["mid"])
    side = 4
    h = torch.randn(2, side * side, attn.to_q.in_features)
    k = seg_kernel_size(sigma) if math.isfinite(sigma) else 1
    ref_hook = attn.to_q.register_forward_hook(
        lambda m, i, q: _gaussian_blur_2d(q.clone(), k, sigma, sigma_threshold_inf=-1.0 if math.isfinite(sigma)
                                          else math.inf))
    with torch.no_grad():
        want = attn(h)
    ref_hook.remove()
    with torch.no_grad(), blurred_queries(unet, ["mid"], sigma):
        got = attn(h)
        plain_inside = None
    with torch.no_grad():
        plain = attn(h)
    print(f"SEG sigma={sigma}: max |ours - blurred-query reference| {(got - want).abs().max():.2e}")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got - plain).abs().max() > 1e-4 and plain_inside is None  # the blur changes the layer; hooks removed
    assert not attn.to_q._forward_hooks


@pytest.mark.parametrize("family, layers", [("sd", ["mid"]), ("sd3", ["blocks.1"])])
def test_seg_on_the_pipeline(tiny, family, layers):
    """SEG(w, s): D_u + w (D_c - D_u) + s (D_c - D_p) with D_p the pipeline run under the query blur; cost 3 rows;
    at s = 0 exactly CFG. On SD3 the image-token queries of the joint attention are blurred."""
    pipe = tiny.sd() if family == "sd" else _sd3(tiny)
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    out = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent",
            guidance=SEG(3.0, seg_scale=2.0, seg_blur_sigma=1.0, layers=layers))
    assert out.nfe == 3 * STEPS
    zero = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent",
             guidance=SEG(3.0, seg_scale=0.0, layers=layers))
    cfg = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent", guidance_scale=3.0)
    torch.testing.assert_close(zero.images, cfg.images, rtol=0, atol=0)
    assert _rel(out.images, cfg.images) > 1e-4
    with pytest.raises(ValueError, match="seg_blur_sigma"):
        SEG(3.0, seg_blur_sigma=0.0)


def test_cli_offers_the_perturbation_guiders_and_their_flags():
    from click.testing import CliRunner

    from steerdiff.app.cli import main
    from steerdiff.guidance import build_guider

    shown = " ".join(CliRunner().invoke(main, ["sample", "--help"]).output.split())
    for flag in ("--slg-scale", "--perturb-start", "--perturb-stop", "--seg-scale", "--seg-blur-sigma", "--layers"):
        assert flag in shown, flag
    assert "slg (default 2.8)" in shown and "seg (default inf)" in shown
    g = build_guider("slg", 3.0, layers="7,8", perturb_start=0.1, perturb_stop=0.5, slg_scale=2.0)
    assert isinstance(g, SLG) and g.layers == (7, 8) and (g.perturb_start, g.perturb_stop) == (0.1, 0.5)
    assert build_guider("seg", 3.0, seg_blur_sigma=math.inf, layers="mid").seg_blur_sigma == math.inf


# --- FLUX and the shipped DiT ----------------------------------------------------------------------------------------

def _flux_inputs(tr, b=2, side=4, n_txt=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = side * side
    ar = torch.arange(side, dtype=torch.float32)
    ids = torch.stack(torch.meshgrid(torch.zeros(1), ar, ar, indexing="ij"),
                      -1).reshape(n, 3).float()
    return dict(hidden_states=torch.randn(b, n, tr.config.in_channels, generator=g),
                encoder_hidden_states=torch.randn(b, n_txt, tr.config.joint_attention_dim, generator=g),
                pooled_projections=torch.randn(b, tr.config.pooled_projection_dim, generator=g),
                timestep=torch.full((b,), 0.5), img_ids=ids, txt_ids=torch.zeros(n_txt, 3),
                guidance=torch.full((b,), 3.5) if tr.config.guidance_embeds else None)


@pytest.mark.parametrize("stack", ["transformer_blocks", "single_transformer_blocks"])
def test_skip_blocks_on_flux_is_the_transformer_without_the_block(tiny, stack):
    """A FLUX double or single block skipped equals the transformer built without it (the same weights otherwise).
    (diffusers' own block-skip hook, hooks.LayerSkipConfig, returns (hidden, encoder) for FLUX blocks, whose order is
    (encoder, hidden), so it cannot serve as the reference here.)"""
    tr = tiny.flux().transformer
    cfg = {k: v for k, v in tr.config.items() if not k.startswith("_")}
    cfg["num_layers" if stack == "transformer_blocks" else "num_single_layers"] = 0
    ref = diffusers.FluxTransformer2DModel(**cfg).eval()
    state = {k: v for k, v in tr.state_dict().items() if not k.startswith(f"{stack}.")}
    ref.load_state_dict(state, strict=True)
    kw = _flux_inputs(tr)
    with torch.no_grad():
        want = ref(**kw).sample
        with skip_blocks(tr, [f"{stack}.0"] if stack != "transformer_blocks" else [0]):
            got = tr(**kw).sample
        plain = tr(**kw).sample
    print(f"FLUX {stack}.0 skipped: max |ours - transformer without it| {(got - want).abs().max():.2e}")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (plain - want).abs().max() > 1e-4


def test_pag_on_flux_attention_is_identity_among_image_tokens(tiny):
    """Under PAG an image token's attention output depends on its own tokens and the text only: changing another
    image token leaves it unchanged (double-stream: text as encoder_hidden_states; single-stream: the concatenation,
    text first, its length from the transformer's input); without the perturbation it changes."""
    tr = tiny.flux().transformer
    (_, double), = select_self_attention(tr, ["^transformer_blocks.0"])
    (_, single), = select_self_attention(tr, ["single_transformer_blocks.0"])
    g = torch.Generator().manual_seed(1)
    width = double.to_q.in_features
    img, txt = torch.randn(1, 9, width, generator=g), torch.randn(1, 3, width, generator=g)
    img2 = img.clone()
    img2[:, 5] += 1.0
    with torch.no_grad():
        plain = double(img, txt)[0], double(img2, txt)[0]
        with perturbed_attention(tr, ["^transformer_blocks.0", "single_transformer_blocks.0"]):
            a, b = double(img, txt)[0], double(img2, txt)[0]
            tr(**_flux_inputs(tr, b=1, side=3, n_txt=3))  # records the text length for the single block
            cat, cat2 = torch.cat([txt, img], 1), torch.cat([txt, img2], 1)
            s1, s2 = single(cat), single(cat2)
    keep = [i for i in range(9) if i != 5]
    torch.testing.assert_close(a[:, keep], b[:, keep], rtol=0, atol=1e-6)
    torch.testing.assert_close(s1[:, 3:][:, keep], s2[:, 3:][:, keep], rtol=0, atol=1e-6)
    assert (plain[0][:, keep] - plain[1][:, keep]).abs().max() > 1e-4
    assert (s1[:, :3] - s2[:, :3]).abs().max() > 1e-6  # the text tokens still see every image token
    assert type(double.processor).__name__ == "FluxAttnProcessor"  # restored


def test_slg_on_the_shipped_dit():
    """The shipped DiT's blocks (``blocks``) skipped: equal to its forward without them."""
    from steerdiff.models.dit import DiT

    torch.manual_seed(0)
    net = DiT(img_size=8, width=32, depth=3, heads=2, num_classes=10).eval()
    with torch.no_grad():
        for prm in net.parameters():  # zero-initialised output layers would hide every block
            prm.copy_(0.2 * torch.randn_like(prm))
    x, c, y = torch.randn(2, 1, 8, 8), torch.randn(2), torch.tensor([1, 2])
    with torch.no_grad():
        h = net.embed_tokens(x, c, y)
        for i in (0, 2):
            h = net.blocks[i](h)
        want = net.decode_tokens(h)
        with skip_blocks(net, [1]) as names:
            got = net(x, c, y)
    assert names == ["blocks.1"]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (net(x, c, y) - want).abs().max() > 1e-5


@pytest.mark.parametrize("family, layers", [
    pytest.param("flux", [0, "single_transformer_blocks.0"], marks=pytest.mark.slow), ("sd", ["mid"])])
def test_slg_on_flux_and_unet_pipelines(tiny, family, layers):
    """SLG runs on FLUX (guidance-distilled: w = 1, cond + skipped pass) and on a UNet's transformer blocks; the
    perturbed pass changes the output; cost one extra row at the steps in the window."""
    pipe = tiny.flux() if family == "flux" else tiny.sd()
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    scale = 1.0 if family == "flux" else 3.0
    g = SLG(scale, slg_scale=2.0, layers=layers, perturb_start=0.0, perturb_stop=1.0)
    out = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent", guidance=g)
    plain = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent",
              guidance=SLG(scale, slg_scale=0.0, layers=layers))
    n_on = sum(1 for i in range(STEPS) if 0 < i < STEPS)  # diffusers' strict rule: step 0 is out
    assert out.nfe == plain.nfe + n_on
    assert _rel(out.images, plain.images) > 1e-4


def test_seg_on_flux_blurs_the_image_queries_only(tiny):
    """FLUX: the double-stream block's queries are the image tokens' (blurred whole); the single-stream block's are
    ``[text, image]``: the text queries are kept, the image queries blurred as blur_queries on their 4 x 4 grid.
    Forward hooks run in registration order: one registered before the context sees the raw queries of the same
    pass, one registered inside it (after SEG's) the blurred ones."""
    from steerdiff.models.perturb import blur_queries

    tr = tiny.flux().transformer
    (_, single), = select_self_attention(tr, ["single_transformer_blocks.0"])
    (_, double), = select_self_attention(tr, ["^transformer_blocks.0"])
    seen: dict = {}

    def capture(key):
        return lambda mod, inp, q: seen.__setitem__(key, q.clone())

    hooks = [single.to_q.register_forward_hook(capture("s_raw")), double.to_q.register_forward_hook(capture("d_raw"))]
    with torch.no_grad(), blurred_queries(tr, ["single_transformer_blocks.0", "^transformer_blocks.0"], 1.5):
        hooks += [single.to_q.register_forward_hook(capture("s")), double.to_q.register_forward_hook(capture("d"))]
        tr(**_flux_inputs(tr, b=1, side=4, n_txt=3))
    for h in hooks:
        h.remove()
    assert seen["d_raw"].shape[1] == 16 and seen["s_raw"].shape[1] == 19
    torch.testing.assert_close(seen["d"], blur_queries(seen["d_raw"], (4, 4), 1.5), rtol=0, atol=0)
    raw = seen["s_raw"]
    torch.testing.assert_close(seen["s"], torch.cat([raw[:, :3], blur_queries(raw[:, 3:], (4, 4), 1.5)], 1),
                               rtol=0, atol=0)
    assert (seen["s"][:, 3:] - raw[:, 3:]).abs().max() > 1e-4 and (seen["d"] - seen["d_raw"]).abs().max() > 1e-4
    assert not single.to_q._forward_hooks and not double.to_q._forward_hooks


@pytest.mark.parametrize("n, start, stop", [(10, 0.01, 0.2), (7, 0.0, 1.0), (4, 0.3, 0.35), (9, 0.2, 0.6)])
def test_slg_window_by_sigma_is_the_step_rule(n, start, stop):
    """Without a step index (a direct call) the window is placed by sigma; it selects the same steps as diffusers'
    rule N * start < i < N * stop on the index."""
    sigmas = sd.sigmas.karras(n, 0.01, 80.0)
    g = SLG(3.0, layers=[0], perturb_start=start, perturb_stop=stop, sigmas=sigmas)
    for i in range(n):
        by_step = g._perturb_rows(sigmas[i:i + 1].repeat(2), step=i)
        by_sigma = g._perturb_rows(sigmas[i:i + 1].repeat(2))
        assert by_step is (n * start < i < n * stop) and by_sigma is by_step, (i, by_step, by_sigma)


@pytest.mark.slow
def test_pag_and_seg_on_the_flux_pipeline(tiny):
    """PAG and SEG run on the guidance-distilled FLUX pipeline at w = 1 (cond + perturbed pass: 2 rows per step),
    change its output, and leave the processors and hooks as they were."""
    pipe = tiny.flux()
    p = sd.pipelines.from_diffusers(pipe)
    latents = _latents(p)
    procs = {n: type(m.processor) for n, m in select_self_attention(pipe.transformer, [".*"])}
    plain = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent")
    for g in (PAG(1.0, pag_scale=2.0, layers=["single_transformer_blocks.0"]),
              SEG(1.0, seg_scale=2.0, seg_blur_sigma=1.0, layers=["^transformer_blocks.0"])):
        out = p(PROMPTS, num_inference_steps=STEPS, latents=latents, output_type="latent", guidance=g)
        assert out.nfe == 2 * STEPS and _rel(out.images, plain.images) > 1e-4
    assert procs == {n: type(m.processor) for n, m in select_self_attention(pipe.transformer, [".*"])}
