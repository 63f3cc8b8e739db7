"""NAG (steerdiff.guidance.NAG) on SD3's joint attention (MM-DiT): one joint-attention layer against a hand-written
float64 attention and NAG's feature rule written out, the transformer's invariants (phi = 1 and a negative equal to
the positive change nothing), the plain pipeline call at scale 1, the negative prompt moving the output away at one
network row per step, processors restored (also after an exception)."""

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import NAG
from steerdiff.models.nag import NAGJointProcessor, nag_attention, select_nag_layers

diffusers = pytest.importorskip("diffusers")

STEPS = 3


def _transformer(seed=0):
    """A 2-block SD 3.5-style transformer: q/k RMS norms, dual attention in block 0, block 1 ``context_pre_only``."""
    torch.manual_seed(seed)
    return diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=8, out_channels=4,
        qk_norm="rms_norm", dual_attention_layers=(0,)).eval()


def _processors(tr):
    return {n: m.processor for n, m in tr.named_modules() if hasattr(m, "processor")}


def _inputs(seed=1, n_txt=5):
    g = torch.Generator().manual_seed(seed)
    kw = dict(hidden_states=torch.randn(2, 4, 8, 8, generator=g), timestep=torch.tensor([300.0, 700.0]),
              encoder_hidden_states=torch.randn(2, n_txt, 16, generator=g),
              pooled_projections=torch.randn(2, 8, generator=g), return_dict=False)
    return kw, torch.randn(2, 4, 16, generator=g)  # a negative text of another length


def _attend(attn, q_in, kv_in):
    """softmax(q k^T / sqrt(d)) v in float64 over the rows ``kv_in``, heads merged; q/k normed as the module."""
    def proj(x, names):
        lin, norm = getattr(attn, names[0]), getattr(attn, names[1], None) if len(names) > 1 else None
        t = lin(x).double().unflatten(-1, (attn.heads, -1))
        return t if norm is None else norm.double()(t)

    q = torch.cat([proj(q_in[0], ("to_q", "norm_q")), proj(q_in[1], ("add_q_proj", "norm_added_q"))], 1)
    k = torch.cat([proj(kv_in[0], ("to_k", "norm_k")), proj(kv_in[1], ("add_k_proj", "norm_added_k"))], 1)
    v = torch.cat([proj(kv_in[0], ("to_v",)), proj(kv_in[1], ("add_v_proj",))], 1)
    w = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    return torch.einsum("bhqk,bkhd->bqhd", w.softmax(-1), v).flatten(2)


@torch.no_grad()
def test_one_joint_layer_closed_form():
    tr = _transformer()
    attn = tr.transformer_blocks[0].attn
    g = torch.Generator().manual_seed(0)
    img, pos, neg = torch.randn(2, 9, 16, generator=g), torch.randn(2, 3, 16, generator=g), torch.randn(
        2, 4, 16, generator=g)
    phi, tau, alpha = torch.tensor([4.0, 1.0]), 2.0, 0.6
    z_pos = _attend(attn, (img, pos), (img, pos))
    z_neg = _attend(attn, (img, neg), (img, neg))
    zp, zn = z_pos[:, :9], z_neg[:, :9]
    z = phi.double()[:, None, None] * zp - (phi.double()[:, None, None] - 1) * zn
    ratio = z.abs().sum(-1, keepdim=True) / zp.abs().sum(-1, keepdim=True)
    z = z * ratio.clamp(max=tau) / ratio
    z = alpha * z + (1 - alpha) * zp
    want_img = attn.to_out[0].double()(z)
    want_txt = attn.to_add_out.double()(torch.cat([z_pos[:, 9:], z_neg[:, 9:]], 1))
    attn.float()
    saved = attn.processor
    state = {"phi": phi, "tau": tau, "alpha": alpha, "t_pos": 3, "t_neg": 4}
    try:
        attn.processor = NAGJointProcessor(state, guide=True)
        got_img, got_txt = attn(img, encoder_hidden_states=torch.cat([pos, neg], 1))
        attn.processor = NAGJointProcessor(state, guide=False)
        off_img, off_txt = attn(img, encoder_hidden_states=torch.cat([pos, neg], 1))
    finally:
        attn.processor = saved
    err = max((got_img - want_img).abs().max(), (got_txt - want_txt).abs().max())
    print(f"SD3 joint layer vs float64 closed form: max |diff| {err:.2e}")
    torch.testing.assert_close(got_img.double(), want_img, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_txt.double(), want_txt, rtol=0, atol=1e-5)
    # a layer not chosen passes Z+ on (diffusers' own processor on [image, positive text]), the texts as before
    ref_img, ref_txt = attn(img, encoder_hidden_states=pos)
    torch.testing.assert_close(off_img, ref_img, rtol=0, atol=1e-6)
    torch.testing.assert_close(off_txt[:, :3], ref_txt, rtol=0, atol=1e-6)
    torch.testing.assert_close(off_txt[:, 3:], attn(img, encoder_hidden_states=neg)[1], rtol=0, atol=1e-6)
    assert (got_img - ref_img)[0].abs().max() > 1e-3 and (got_img - ref_img)[1].abs().max() < 1e-6  # phi 4 / 1


@torch.no_grad()
def test_transformer_invariants_and_restore():
    tr = _transformer()
    before = _processors(tr)
    kw, neg = _inputs()
    plain = tr(**kw)[0]
    modules, names = select_nag_layers(tr, None)
    assert names == ["transformer_blocks.0.attn", "transformer_blocks.1.attn"]  # attn2 (image only) untouched
    with nag_attention(tr, neg, 1.0, 2.5, 0.25):  # phi = 1: SD3's own output
        torch.testing.assert_close(tr(**kw)[0], plain, rtol=1e-5, atol=1e-6)
    with nag_attention(tr, kw["encoder_hidden_states"], 7.0, 2.5, 0.5):  # negative == positive: unchanged
        torch.testing.assert_close(tr(**kw)[0], plain, rtol=1e-5, atol=1e-6)
    with nag_attention(tr, neg, 5.0, 2.5, 0.25, layers=["transformer_blocks.1"]) as chosen:
        assert chosen == ["transformer_blocks.1.attn"]
        assert (tr(**kw)[0] - plain).abs().max() > 1e-4
    assert _processors(tr) == before and not tr._forward_pre_hooks
    with pytest.raises(ValueError, match="negative text"), nag_attention(tr, neg[..., :8], 5.0, 2.5, 0.25):
        tr(**kw)
    assert _processors(tr) == before and not tr._forward_pre_hooks


@pytest.fixture(scope="module")
def sd3(tiny):
    pipe = tiny.sd3()
    return pipe, sd.pipelines.from_diffusers(pipe)


def test_sd3_pipeline_scale_one_and_negative_moves_away(sd3):
    pipe, p = sd3
    before = _processors(pipe.transformer)
    lat = torch.randn((1, *p.latent_shape()), generator=torch.Generator().manual_seed(3))
    run = dict(num_inference_steps=STEPS, latents=lat, output_type="latent", guidance_scale=1.0)
    plain, plain_neg = p(["a cat"], **run).images, p(["dog"], **run).images
    same = p(["a cat"], negative_prompt=["dog"], guidance=NAG(1.0), **run)
    assert torch.equal(same.images, plain) and same.nfe == STEPS
    out = p(["a cat"], negative_prompt=["dog"], guidance=NAG(10.0, nag_tau=10.0, nag_alpha=1.0), **run)
    print(f"SD3 NAG: |out - plain(neg)| {(out.images - plain_neg).norm():.4f} vs |plain - plain(neg)| "
          f"{(plain - plain_neg).norm():.4f}")
    assert out.nfe == STEPS + 1  # one row per step and the stopped read of the negative text
    assert (out.images - plain_neg).norm() > (plain - plain_neg).norm()
    assert _processors(pipe.transformer) == before


@torch.no_grad()
def test_bf16_follows_the_model():
    tr = _transformer()
    kw, neg = _inputs()
    with nag_attention(tr, neg, 5.0, 2.5, 0.25):
        ref = tr(**kw)[0]
    tr = tr.to(torch.bfloat16)
    kw = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    with nag_attention(tr, neg.to(torch.bfloat16), torch.tensor([5.0, 5.0]), 2.5, 0.25):
        got = tr(**kw)[0]
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert float((got.float() - ref).norm() / ref.norm()) < 5e-2
