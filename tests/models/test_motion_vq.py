"""The MotionDreamer tokeniser (steerdiff.models.motion_vq, steerdiff.train.motion_vq)."""

import math

import pytest
import torch
import torch.nn.functional as F

import steerdiff.models as sdm
from steerdiff.data.motion import motion_features
from steerdiff.data.motion_synth import reference_motion
from steerdiff.models.motion_vq import MotionVQVAE, code_distribution_loss, codebook_stats, soft_assignment
from steerdiff.train.motion_vq import MotionVQConfig, reference_codebook_stats, train_motion_vq


def test_distribution_loss_is_kl_to_uniform():
    codes = 10.0 * torch.eye(4)  # far apart: at a small temperature the soft assignment is one-hot
    all_on_one = codes[[0, 0, 0, 0, 0, 0]]
    assert code_distribution_loss(all_on_one, codes, temperature=0.01) == pytest.approx(math.log(4), abs=1e-6)
    even = codes[[0, 1, 2, 3, 0, 1, 2, 3]]
    assert code_distribution_loss(even, codes, temperature=0.01) == pytest.approx(0.0, abs=1e-6)
    # general case against torch's KL: KL(p || U) with p the mean soft assignment
    z, c = torch.randn(50, 3), torch.randn(6, 3)
    p = soft_assignment(z, c, 0.7).mean(0)
    ref = F.kl_div(torch.full((6,), -math.log(6)), p, reduction="sum")  # sum p (log p - log u)
    assert code_distribution_loss(z, c, 0.7) == pytest.approx(float(ref), rel=1e-5)
    # its gradient moves latents away from the over-used code
    z = all_on_one.clone().requires_grad_(True)
    code_distribution_loss(z + 0.1 * torch.randn(6, 4), codes, temperature=20.0).backward()
    assert (z.grad[:, 0] > 0).all()  # descending the gradient lowers coordinate 0: away from code 0


def test_codebook_stats_closed_form():
    s = codebook_stats(torch.tensor([0, 1, 2, 0, 1, 2]), 8)
    assert s["used"] == 3 and s["usage"] == 3 / 8 and s["perplexity"] == pytest.approx(3.0)
    assert codebook_stats(torch.zeros(5, dtype=torch.long), 8)["perplexity"] == pytest.approx(1.0)


def test_ema_update_moves_codes_to_assigned_means():
    m = MotionVQVAE(5, codebook_size=3, code_dim=2, ema_decay=0.0)
    z = torch.tensor([[1.0, 1.0], [3.0, 1.0], [-2.0, 0.0]])
    tokens = torch.tensor([0, 0, 2])
    m.ema_update(z, tokens)
    torch.testing.assert_close(m.codes[0], torch.tensor([2.0, 1.0]), atol=1e-4, rtol=0)
    torch.testing.assert_close(m.codes[2], torch.tensor([-2.0, 0.0]), atol=1e-4, rtol=0)


def test_encode_decode_shapes_errors_and_save_load(tmp_path):
    torch.manual_seed(0)
    f = motion_features(reference_motion("snake", 50))
    m = MotionVQVAE(f.shape[1], codebook_size=16, code_dim=8, hidden=16, downsample=4).eval()
    tok = m.encode(f)
    assert tok.shape == (13,) and tok.dtype == torch.long  # ceil(50 / 4): the last frame repeated
    assert m.decode(tok).shape == (52, f.shape[1])
    assert m.encode(torch.stack([f, f])).shape == (2, 13)
    # the decoder sees exactly the codes: decoding tokens equals decoding their code vectors
    torch.testing.assert_close(m.decode(tok), m.denormalize(m.decode_latents(m.codebook()[tok][None]))[0])
    with pytest.raises(ValueError, match="tokens"):
        m.decode(torch.tensor([16]))
    with pytest.raises(ValueError, match="features"):
        m.encode(f[:, :5])
    loaded = sdm.load(sdm.save(m, tmp_path / "vq"))
    assert isinstance(loaded, MotionVQVAE) and torch.equal(loaded.encode(f), tok)


def test_straight_through_gradient_reaches_the_encoder():
    m = MotionVQVAE(7, codebook_size=8, code_dim=4, hidden=8, downsample=2, quantizer="st")
    out = m(torch.randn(2, 8, 7))
    (F.mse_loss(out["recon"], torch.zeros(2, 8, 7)) + out["codebook"]).backward()
    assert m.encoder[0].weight.grad.abs().sum() > 0 and m.codes.grad.abs().sum() > 0


def test_short_training_learns_and_logs():
    f = motion_features(reference_motion("snake", 96))
    cfg = MotionVQConfig(steps=40, batch=8, window=32, hidden=16, code_dim=8, codebook_size=16)
    res = train_motion_vq(f, cfg)
    curve = res.log["curve"]
    assert curve[-1]["recon"] < curve[0]["recon"]
    assert 0 < res.log["usage"] <= 1 and 1 <= res.log["perplexity"] <= 16
    assert reference_codebook_stats(res.model, f)["used"] == res.log["used"]
    with pytest.raises(ValueError, match="window"):
        train_motion_vq(f, MotionVQConfig(window=30))


@pytest.mark.slow
def test_regularisation_spreads_codes_on_one_sequence():
    f = motion_features(reference_motion("biped", 240))
    base = dict(steps=400, codebook_size=64)
    plain = train_motion_vq(f, MotionVQConfig(reg_weight=0.0, **base)).log
    reg = train_motion_vq(f, MotionVQConfig(reg_weight=0.1, **base)).log
    assert reg["perplexity"] > plain["perplexity"] and reg["usage"] > plain["usage"]


def test_bf16_model_encodes_and_decodes():
    torch.manual_seed(0)
    f = motion_features(reference_motion("snake", 40))
    m = MotionVQVAE(f.shape[1], codebook_size=16, code_dim=8, hidden=16).eval().to(torch.bfloat16)
    tok = m.encode(f)  # float32 features are cast to the model's dtype
    assert tok.dtype == torch.long and tok.shape == (10,)
    assert m.decode(tok).dtype == torch.bfloat16
