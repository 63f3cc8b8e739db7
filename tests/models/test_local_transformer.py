"""The sliding-window masked transformer (steerdiff/models/local_transformer.py): its receptive field is exact, it
equals full attention when the window covers the sequence, and it saves and loads."""

import pytest
import torch

from steerdiff.models import build_model, load, save
from steerdiff.models.local_transformer import LocalMaskedTransformer, band_mask


def _model(**kw):
    torch.manual_seed(0)
    m = LocalMaskedTransformer(num_tokens=7, dim=16, depth=2, heads=2, window=2, rel_range=5, **kw).eval()
    with torch.no_grad():  # non-zero relative biases, so the position terms are exercised
        m.rel_bias.normal_()
    return m


def test_output_ignores_tokens_outside_the_receptive_field():
    m = _model()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 8, (3, 20), generator=g)
    i, r = 9, m.receptive_field
    assert r == 4
    far = [j for j in range(20) if abs(j - i) > r]
    near = [j for j in range(20) if 0 < abs(j - i) <= r]
    y = x.clone()
    y[:, far] = (x[:, far] + 3) % 8  # change everything outside the field
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.equal(a[:, i], b[:, i])  # bit-identical: masked keys get exactly zero weight
    z = x.clone()
    z[:, near[0]] = (x[:, near[0]] + 3) % 8  # a token inside the field (at the edge: distance r) does matter
    with torch.no_grad():
        assert not torch.allclose(m(z)[:, i], a[:, i])


def _manual_full(m, x):
    """Full attention written out with an explicit softmax (independent of the banded code path)."""
    h = m.embed(x)
    n = x.shape[1]
    pos = torch.arange(n)
    rel = (pos[None, :] - pos[:, None]).clamp(-m.rel_range, m.rel_range) + m.rel_range
    for i, blk in enumerate(m.blocks):
        b, _, d = h.shape
        q, k, v = blk.qkv(blk.norm1(h)).view(b, n, 3, m.heads, d // m.heads).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / (d // m.heads) ** 0.5 + m.rel_bias[i][:, rel]
        a = torch.softmax(s, -1) @ v
        h = h + blk.proj(a.transpose(1, 2).reshape(b, n, d))
        h = h + blk.mlp(blk.norm2(h))
    return m.head(m.norm(h))


def test_window_covering_the_sequence_is_full_attention():
    m = _model()
    x = torch.randint(0, 8, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = _manual_full(m, x)
        torch.testing.assert_close(m(x, window=None), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m(x, window=8), ref, rtol=1e-5, atol=1e-5)  # w >= L - 1: the band is everything
        torch.testing.assert_close(m(x, window=50), ref, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(m(x, window=1), ref, atol=1e-3)
    assert band_mask(9, 2).sum() == 9 + 2 * 8 + 2 * 7


def test_save_load_and_conditions(tmp_path):
    m = _model(cond_kind="frames", cond_values=2)
    x = torch.randint(0, 8, (2, 10))
    beats = torch.randint(-1, 2, (2, 10))
    save(m, tmp_path / "m")
    m2 = load(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.equal(m(x, beats), m2(x, beats))
    assert isinstance(build_model({"class": "LocalMaskedTransformer", "config": m.config}), LocalMaskedTransformer)
    with pytest.raises(ValueError, match="cond must be an integer tensor"):
        m(x, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="window"):
        LocalMaskedTransformer(num_tokens=4, window=-1)


def test_bfloat16_forward_and_sampling():
    from steerdiff.motion.generator import generate

    m = _model()
    x = torch.randint(0, 8, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = torch.softmax(m(x), -1)
        m16 = _model().to(torch.bfloat16)
        p16 = m16.denoiser()(x, torch.zeros(2), None)
    assert p16.dtype == torch.bfloat16
    torch.testing.assert_close(p16.float(), ref, atol=0.03, rtol=0)
    out = generate(m16, 12, 3, steps=4, seed=0)
    assert out.dtype == torch.long and int(out.max()) < 7 and int(out.min()) >= 0
