"""Attention feature aggregation on the in-context DiT (steerdiff.control.afa; spec C.3, C.7 AFA tests (a)-(c)).

Independent truths: the DiT's own forward (with ``style=None`` AFA must reproduce it bit for bit), attention written
out by hand (softmax(Q K^T / sqrt(d)) V per head, from the block's weights) for the three terms, and a permutation of
the style tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from steerdiff.control.afa import AFADiT, afa_block
from steerdiff.models.dit import DiT
from steerdiff.models.embed import check_cond


@pytest.fixture(scope="module")
def dit():
    torch.manual_seed(0)
    net = DiT(img_size=8, patch_size=2, width=32, depth=2, heads=4, num_classes=10).double().eval()
    with torch.no_grad():  # the output layer is zero-initialised: give it weights so outputs depend on the blocks
        net.patch_out.weight.normal_(0, 0.2)
    return net


def _inputs(b=3):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, 1, 8, 8, generator=g, dtype=torch.float64)
    return x, torch.randn(b, generator=g, dtype=torch.float64), torch.tensor([1, 4, -1][:b]), \
        torch.randn(b, 4, 32, generator=g, dtype=torch.float64)


def _attention_by_hand(block, q_tokens, kv_tokens):
    w, heads = q_tokens.shape[-1], block.heads
    d = w // heads
    wq, wk, wv = block.qkv.weight.split(w)
    bq, bk, bv = block.qkv.bias.split(w)
    out = []
    for h in range(heads):
        sl = slice(h * d, (h + 1) * d)
        q = q_tokens @ wq[sl].T + bq[sl]
        k = kv_tokens @ wk[sl].T + bk[sl]
        v = kv_tokens @ wv[sl].T + bv[sl]
        out.append(torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1) @ v)
    return torch.cat(out, dim=-1)


def test_a_no_style_is_the_plain_dit(dit):
    x, c, cond, _ = _inputs()
    with torch.no_grad():
        assert torch.equal(AFADiT(dit)(x, c, cond, style=None), dit(x, c, cond))
        assert torch.equal(AFADiT(dit, pooled_cond=True)(x, c, cond, style=None), dit(x, c, cond))


@pytest.mark.parametrize("pooled", [None, slice(1, 2)], ids=["class-as-text", "class-as-pooled"])
def test_b_afa_is_the_mean_of_three_attentions(dit, pooled):
    """One block, against the three attentions of C.3 computed by hand: A([X;T;P]), A([X;T;P;Ybar]), A([X;T;Ybar])."""
    x, c, cond, style = _inputs()
    block = dit.blocks[0]
    with torch.no_grad():
        slots = dit.slots(check_cond(cond, dit.num_classes, 3, x.device)) + dit.slot_type
        h = torch.cat([dit.noise_mlp(dit.fourier(c))[:, None], slots,
                       dit.patch_in(dit.patchify(x)) + dit.pos], dim=1)
        hn, yn = block.norm1(h), block.norm1(style)
        ybar = yn.mean(1, keepdim=True).expand(-1, 4, -1)
        keep = [j for j in range(h.shape[1]) if pooled is None or j != 1]  # token 1: the class (condition) slot
        terms = [_attention_by_hand(block, hn, hn), _attention_by_hand(block, hn, torch.cat([hn, ybar], 1)),
                 _attention_by_hand(block, hn, torch.cat([hn[:, keep], ybar], 1))]
        h1 = h + block.proj(sum(terms) / 3)
        want = h1 + block.mlp(block.norm2(h1))
        got = afa_block(block, h, style, pooled)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got, block(h), atol=1e-4)  # style does change the block


@pytest.mark.parametrize("pooled_cond", [False, True])
def test_c_style_token_permutation_invariance(dit, pooled_cond):
    x, c, cond, style = _inputs()
    net = AFADiT(dit, pooled_cond=pooled_cond)
    with torch.no_grad():
        a = net(x, c, cond, style=style)
        for perm in ([3, 2, 1, 0], [1, 3, 0, 2]):
            torch.testing.assert_close(net(x, c, cond, style=style[:, perm]), a, rtol=1e-6, atol=1e-6)


def test_bad_style_tokens(dit):
    x, c, cond, style = _inputs()
    with pytest.raises(ValueError, match=r"style tokens must have shape \[B=3, k, 32\]"):
        AFADiT(dit)(x, c, cond, style=style[:, :, :16])
    with pytest.raises(TypeError, match="AFADiT wraps a steerdiff.models.dit.DiT"):
        AFADiT(torch.nn.Linear(2, 2))
