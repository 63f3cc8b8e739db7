"""MotionDreamer's applications (steerdiff/motion/apps.py): editing keeps the kept frames bit for bit with smooth
seams, beats, SMC steering on the decoded motion; the SinMDM-style baseline's receptive field."""

import math

import torch
from motion_toy import LookupTokenizer

from steerdiff.models.local_transformer import LocalMaskedTransformer
from steerdiff.motion.apps import (
    beat_alignment,
    beat_flags,
    decode_batch,
    edit_motion,
    kinematic_beats,
    root_path_reward,
    seam_statistics,
    steer,
)
from steerdiff.motion.generator import generate
from steerdiff.motion.sinmdm import TemporalConvNet


def _model(k=6, **kw):
    torch.manual_seed(0)
    return LocalMaskedTransformer(k, dim=16, depth=1, heads=2, window=2, **kw).eval()


def test_edit_keeps_frames_bit_identical_and_widens_to_tokens():
    tok = LookupTokenizer(num_tokens=6, downsample=4, features=3)
    ref_tokens = torch.randint(0, 6, (12,), generator=torch.Generator().manual_seed(1))
    ref = tok.decode(ref_tokens) + 0.01 * torch.randn(48, 3, generator=torch.Generator().manual_seed(2))
    res = edit_motion(_model(), tok, ref, 10, 21, count=3, seed=3, seam_step=None)  # the fixed 4-frame ramp
    assert res.span == (8, 24)  # frames 10..20 widened to tokens 2..5
    a, b = res.span
    assert torch.equal(res.features[:, :a], ref[:a].expand(3, -1, -1))
    assert torch.equal(res.features[:, b:], ref[b:].expand(3, -1, -1))
    assert torch.equal(res.tokens[:, :2], ref_tokens[:2].expand(3, -1))
    # inside the span, far from the seams, the frames are the decoded tokens (no residual carried there)
    torch.testing.assert_close(res.features[:, a + 5: b - 5], tok.decode(res.tokens)[:, a + 5: b - 5])
    # the offset carried at the seam: the first edited frame is the decoded frame plus 4/5 of the offset between
    # the last kept frame and the edit's decoding of it
    dec = tok.decode(res.tokens)
    torch.testing.assert_close(res.features[:, a], dec[:, a] + 0.8 * (ref[a - 1] - dec[:, a - 1]))


def test_seam_ramp_is_the_shortest_that_bounds_the_added_step():
    # a reference whose kept head sits far (offset ~5) from any decoding: a 4-frame ramp would add ~1 per frame
    tok = LookupTokenizer(num_tokens=6, downsample=4, features=3)
    ref_tokens = torch.randint(0, 6, (30,), generator=torch.Generator().manual_seed(1))
    ref = tok.decode(ref_tokens).clone()
    ref[:40] += torch.tensor([3.0, -4.0, 0.0])
    res = edit_motion(_model(), tok, ref, 40, 100, count=2, seed=3, seam_step=0.1)
    a, b = res.span
    assert (a, b) == (40, 100)
    assert torch.equal(res.features[:, :a], ref[:a].expand(2, -1, -1))
    assert torch.equal(res.features[:, b:], ref[b:].expand(2, -1, -1))
    dec = tok.decode(res.tokens)
    tol = 0.1 * (ref[1:] - ref[:-1]).norm(dim=-1).median()
    off = ref[a - 1] - dec[:, a - 1]  # the lookup decoder is local: dec[:, b] == ref[b], no ramp at the end
    torch.testing.assert_close(dec[:, b], ref[b].expand(2, -1))
    n = torch.ceil(off.norm(dim=-1) / tol) - 1  # closed form: the least n with ||off|| / (n + 1) <= tol
    assert bool((n > 4).all()) and bool((n < b - a).all())
    k = torch.arange(b - a, dtype=ref.dtype)
    ramp = (1 - (k[None] + 1) / (n[:, None] + 1)).clamp_min(0)[..., None] * off[:, None]
    torch.testing.assert_close(res.features[:, a:b], dec[:, a:b] + ramp)
    added = (res.features - dec)[:, a - 1:b + 1]
    added[:, 0] = off  # the step into the span, relative to the decoding, starts from the offset
    assert float((added[:, 1:] - added[:, :-1]).norm(dim=-1).max()) <= float(tol) * (1 + 1e-5)
    # the fixed ramp breaks that bound, so the check above can fail
    fixed = edit_motion(_model(), tok, ref, 40, 100, count=2, seed=3, seam_step=None)
    fixed_added = (fixed.features - tok.decode(fixed.tokens))[:, a - 1:b + 1]
    fixed_added[:, 0] = ref[a - 1] - tok.decode(fixed.tokens)[:, a - 1]
    assert float((fixed_added[:, 1:] - fixed_added[:, :-1]).norm(dim=-1).max()) > 2 * float(tol)


def test_seam_statistics_against_a_hand_count():
    ref = torch.tensor([[0.0], [1.0], [3.0], [6.0]])  # steps 1, 2, 3
    edited = torch.tensor([[[0.0], [2.5], [3.0], [6.0]]])  # seams: into frame 1 (2.5), out of frame 1 (0.5)
    s = seam_statistics(ref, edited, 1, 2)
    torch.testing.assert_close(s["seam_steps"], torch.tensor([[2.5, 0.5]]))
    assert s["reference_max"] == 3.0 and s["within"]
    torch.testing.assert_close(s["seam_percentile"], torch.tensor([[2 / 3, 0.0]]))


def test_kinematic_beats_find_the_pauses_of_a_sine():
    t = torch.arange(100, dtype=torch.float64)
    x = torch.sin(2 * math.pi * t / 20)[:, None]  # speed is least at the extrema: t = 5, 15, 25, ...
    beats = kinematic_beats(x)
    expected = torch.arange(5, 96, 10)
    assert len(beats) == len(expected) and (beats - expected).abs().max() <= 1
    assert beat_alignment(expected, x) == 1.0 and beat_alignment(expected + 5, x) == 0.0
    assert beat_flags([0, 5, 9, 30, 40], 8, 4).tolist() == [1, 1, 1, 0, 0, 0, 0, 1]  # frame 40 is past the end


def test_smc_steering_raises_a_reward_on_the_decoded_motion():
    tok = LookupTokenizer(num_tokens=6, downsample=2, features=2)
    target = torch.zeros(16, 2) + tok.codebook[0].mean(0)  # a "path" the code 0 follows

    def path(features):
        return features

    reward = root_path_reward(path, target)
    model = _model()
    free = reward(decode_batch(tok, generate(model, 8, 32, seed=0)))
    res, decoded = steer(model, tok, reward, 8, count=4, particles=8, alpha=0.05, seed=0)
    assert decoded.shape == (32, 16, 2) and res.nfe == 8 * min(12, 8)
    w = res.weights()
    assert float((w * res.rewards).sum()) > float(free.mean()) + 0.1


def test_temporal_conv_receptive_field_is_exact():
    torch.manual_seed(0)
    net = TemporalConvNet(3, 40, hidden=8, layers=3, kernel=3).eval()
    torch.nn.init.normal_(net.out.weight)
    assert net.receptive_field == 7
    x = torch.randn(1, 3, 40)
    y = x.clone()
    y[..., :16] += 1.0
    y[..., 25:] += 1.0  # frames 16..24 kept; output frame 20 sees 17..23
    c = torch.zeros(1)
    with torch.no_grad():
        assert torch.equal(net(x, c)[..., 20], net(y, c)[..., 20])
        z = x.clone()
        z[..., 23] += 1.0
        assert not torch.allclose(net(z, c)[..., 20], net(x, c)[..., 20])
