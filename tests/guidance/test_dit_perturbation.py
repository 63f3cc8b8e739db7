"""PAG and SEG on the shipped in-context DiT (steerdiff.models.dit): its self-attention runs through a
parameter-free, hookable ``blocks.<i>.attn`` module. Checks: the plain forward is bit-for-bit the fused attention
written out (and the checkpoint keys unchanged); PAG's identity map equals a hand-computed forward (the layer adds
``proj(v)``); SEG at ``sigma = inf`` equals a hand-written attention on mean image queries; the guiders on an
``EDMPrecond(DiT)`` equal ``D_c + s (D_c - D_p)`` with the hand-computed ``D_p``; processors restored after an
exception; the shipped style-token DiT takes PAG / SEG without style tokens and refuses them with."""

import math

import pytest
import torch
import torch.nn.functional as F

import steerdiff as sd
from steerdiff.guidance import PAG, SEG
from steerdiff.models.dit import DiT, FusedSelfAttention
from steerdiff.models.perturb import blurred_queries, perturbed_attention, select_self_attention
from steerdiff.models.precond import EDMPrecond


def _net(seed=0):
    torch.manual_seed(seed)
    net = DiT(img_size=8, width=32, depth=3, heads=2, num_classes=10).eval()
    with torch.no_grad():
        for prm in net.parameters():  # the zero-initialised output layer would hide every block
            prm.copy_(0.2 * torch.randn_like(prm))
    return net


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 1, 8, 8, generator=g), torch.randn(2, generator=g), torch.tensor([1, 7])


def _old_block(block, x):
    """The block's forward as it was written before the hookable attention (fused qkv, SDPA, proj)."""
    b, n, w = x.shape
    q, k, v = block.qkv(block.norm1(x)).reshape(b, n, 3, block.heads, w // block.heads).permute(2, 0, 3, 1, 4)
    x = x + block.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, w))
    return x + block.mlp(block.norm2(x))


def _forward(net, x, c, y, layer_fn):
    """The DiT forward with block ``i`` replaced by ``layer_fn(block, h)`` where it returns a tensor."""
    h = net.embed_tokens(x, c, y)
    for i, block in enumerate(net.blocks):
        out = layer_fn(i, block, h)
        h = _old_block(block, h) if out is None else out
    return net.decode_tokens(h)


def _pag_block(block, h):
    w = h.shape[-1]
    x = h + block.proj(F.linear(block.norm1(h), block.qkv.weight[2 * w:], block.qkv.bias[2 * w:]))
    return x + block.mlp(block.norm2(x))


def _seg_inf_block(block, h, n_img):
    b, n, w = h.shape
    hn = block.norm1(h)
    q, k, v = (F.linear(hn, block.qkv.weight[i * w:(i + 1) * w], block.qkv.bias[i * w:(i + 1) * w]) for i in range(3))
    q = torch.cat([q[:, :n - n_img], q[:, n - n_img:].mean(1, keepdim=True).expand(b, n_img, w)], 1)
    d = w // block.heads
    qh, kh, vh = (t.reshape(b, n, block.heads, d) for t in (q, k, v))
    att = (torch.einsum("bqhd,bkhd->bhqk", qh, kh) / math.sqrt(d)).softmax(-1)
    x = h + block.proj(torch.einsum("bhqk,bkhd->bqhd", att, vh).reshape(b, n, w))
    return x + block.mlp(block.norm2(x))


@torch.no_grad()
def test_plain_forward_bit_for_bit_and_keys():
    net = _net()
    x, c, y = _inputs()
    assert torch.equal(net(x, c, y), _forward(net, x, c, y, lambda i, b, h: None))
    assert not any(".attn." in k for k in net.state_dict())
    assert [n for n, _ in select_self_attention(net, ["blocks"])] == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]


@torch.no_grad()
def test_pag_identity_equals_hand_forward():
    net = _net()
    x, c, y = _inputs()
    want = _forward(net, x, c, y, lambda i, b, h: _pag_block(b, h) if i == 1 else None)
    with perturbed_attention(net, ["blocks.1"]) as names:
        got = net(x, c, y)
    print(f"DiT PAG vs hand forward: max |diff| {(got - want).abs().max():.2e}")
    assert names == ["blocks.1.attn"]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (net(x, c, y) - want).abs().max() > 1e-3  # restored: the plain forward differs


@torch.no_grad()
def test_seg_mean_queries_equal_hand_forward():
    net = _net()
    x, c, y = _inputs()
    want = _forward(net, x, c, y, lambda i, b, h: _seg_inf_block(b, h, 16) if i in (0, 2) else None)
    with blurred_queries(net, ["blocks.0", "blocks.2"], math.inf):
        got = net(x, c, y)
    print(f"DiT SEG (sigma inf) vs hand forward: max |diff| {(got - want).abs().max():.2e}")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # a finite blur moves the output too, and the processors are restored afterwards
    with blurred_queries(net, ["blocks.0"], 0.8):
        finite = net(x, c, y)
    plain = net(x, c, y)
    assert (finite - plain).abs().max() > 1e-5
    assert all(isinstance(b.attn.processor, FusedSelfAttention) for b in net.blocks)


def test_processors_restored_after_an_exception():
    net = _net()
    before = [b.attn.processor for b in net.blocks]
    for ctx in (lambda: perturbed_attention(net, ["blocks.1"]), lambda: blurred_queries(net, ["blocks"], 1.0)):
        with pytest.raises(RuntimeError, match="boom"), ctx():
            assert not isinstance(net.blocks[1].attn.processor, FusedSelfAttention)
            raise RuntimeError("boom")
        assert [b.attn.processor for b in net.blocks] == before


@torch.no_grad()
def test_guiders_on_edm_dit_equal_the_hand_perturbed_pass():
    net = _net()
    model = EDMPrecond(net, sigma_data=0.5).eval()
    x, _, y = _inputs()
    sigma = torch.tensor([0.7, 2.0])
    d_c = model(x, sigma, y)

    def perturbed(layer_fn):
        from steerdiff.models.precond import edm_scalings

        c_skip, c_out, c_in, c_noise = (t.reshape(-1, 1, 1, 1) if t.ndim else t for t in edm_scalings(sigma, 0.5))
        f = _forward(net, c_in * x, c_noise.reshape(-1), y, layer_fn)
        return c_skip * x + c_out * f

    d_pag = perturbed(lambda i, b, h: _pag_block(b, h) if i == 1 else None)
    got = PAG(1.0, pag_scale=2.5, layers=["blocks.1"]).guide(model, x, sigma, y)
    torch.testing.assert_close(got, d_c + 2.5 * (d_c - d_pag), rtol=0, atol=1e-5)
    d_seg = perturbed(lambda i, b, h: _seg_inf_block(b, h, 16) if i == 2 else None)
    got = SEG(1.0, seg_scale=1.5, layers="blocks.2").guide(model, x, sigma, y)
    torch.testing.assert_close(got, d_c + 1.5 * (d_c - d_seg), rtol=0, atol=1e-5)
    # through the sampler: the perturbed pass costs one more row per sample and step
    noise = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    sigmas = sd.sigmas.karras(3, 0.1, 10.0)
    out = sd.sample(model, noise, sigmas, method="euler", cond=y, guidance=PAG(2.0, layers=["blocks.1"]),
                    progress=False)
    plain = sd.sample(model, noise, sigmas, method="euler", cond=y, guidance=sd.guidance.CFG(2.0), progress=False)
    assert (out - plain).abs().max() > 1e-4


@torch.no_grad()
def test_shipped_style_dit():
    from steerdiff.models.style_dit import no_style

    model = sd.models.load("digits_styles_dit").eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma, y = torch.tensor([1.0, 1.0]), torch.tensor([3, 8])
    den = no_style(model)
    plain = den(x, sigma, y)
    g = PAG(1.0, pag_scale=2.0, layers=["dit.blocks.2"], network=model.net)
    out = g.guide(den, x, sigma, y)
    assert (out - plain).abs().max() > 1e-3 and torch.equal(den(x, sigma, y), plain)
    # with style tokens the block runs its own attention: a perturbation there is refused, not ignored
    full = torch.tensor([[3, 0], [8, 1]])
    with perturbed_attention(model.net, ["dit.blocks.2"]), pytest.raises(ValueError, match="style tokens"):
        model(x, sigma, full)


@torch.no_grad()
def test_bf16_follows_the_model():
    net = _net()
    x, c, y = _inputs()
    with perturbed_attention(net, ["blocks.1"]):
        ref_pag = net(x, c, y)
    with blurred_queries(net, ["blocks.1"], 1.0):
        ref_seg = net(x, c, y)
    half = net.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    with perturbed_attention(half, ["blocks.1"]):
        pag = half(xb, c, y)
    with blurred_queries(half, ["blocks.1"], 1.0):
        seg = half(xb, c, y)
    for got, ref in ((pag, ref_pag), (seg, ref_seg)):
        assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
        assert float((got.float() - ref).norm() / ref.norm()) < 5e-2
