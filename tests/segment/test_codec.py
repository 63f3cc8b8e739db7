"""The DiffDIS codec's whole-VAE fine-tuning (docs/methods/diffdis.md, "Latent space and the mask decoder"):
reconstruction error against diffusers' own encode/decode, training lowers it, bad input is refused."""

from __future__ import annotations

import pytest
import torch

from steerdiff.data import dis
from steerdiff.segment import LatentCodec, finetune_codec, reconstruction_mse


def _vae():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4,
                         layers_per_block=1, sample_size=16, scaling_factor=0.7).eval()


def test_reconstruction_mse_matches_diffusers_round_trip():
    vae = _vae()
    codec = LatentCodec(vae).eval()
    images = dis.generate(3, 32, seed=1).image
    with torch.no_grad():  # diffusers' own path: the posterior mean, decoded, clamped (scaling cancels out)
        ref = (vae.decode(vae.encode(images).latent_dist.mean).sample.clamp(-1, 1) - images).pow(2).mean()
    assert reconstruction_mse(codec, images, chunk=2) == pytest.approx(float(ref), rel=1e-5)
    # decode_raw is the channel mean of decode_rgb
    z = codec.encode(images)
    torch.testing.assert_close(codec.decode_raw(z), codec.decode_rgb(z).mean(1, keepdim=True))


def test_finetune_codec_lowers_reconstruction_error_and_trains_the_encoder():
    vae = _vae()
    codec = LatentCodec(vae)
    batch = dis.generate(4, 32, seed=0)
    enc0 = [p.detach().clone() for p in codec.encoder.parameters()]
    before = reconstruction_mse(codec, batch.image)
    info = finetune_codec(codec, batch.image, torch.cat([batch.mask, batch.edge]), steps=40, batch_size=2, lr=3e-3)
    assert info["steps"] == 40 and info["cpu_s"] > 0
    after = reconstruction_mse(codec, batch.image)
    # Lower than before, and below the error of the best flat image (the images' variance): the latent now carries
    # the image (the shipped shapes VAE sits above that line on these images).
    assert after < 0.7 * before and after < float(batch.image.var())
    assert any(not torch.equal(a, b) for a, b in zip(enc0, codec.encoder.parameters(), strict=True))
    assert not codec.encoder.training and not codec.decoder.training


def test_finetune_codec_refuses_bad_shapes():
    codec = LatentCodec(_vae())
    images = torch.zeros(2, 3, 16, 16)
    with pytest.raises(ValueError, match="images"):
        finetune_codec(codec, images[:, :1], torch.zeros(2, 1, 16, 16), steps=1)
    with pytest.raises(ValueError, match="maps"):
        finetune_codec(codec, images, torch.zeros(2, 3, 16, 16), steps=1)
