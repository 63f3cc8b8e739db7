"""The light image encoder (docs/methods/diffdis.md, "The light image encoder"): shapes, dtypes and downsampling of
:class:`LightImageEncoder`, the segmenter conditioning every path on the encoder it is given (one step and
multi-step alike, the VAE encoder never called), the registry, loading that refuses bad files, and distillation
fitting a target it can represent better than the best constant and than its untrained self."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import steerdiff as sd
from steerdiff.data import dis
from steerdiff.segment import (
    IMAGE_ENCODERS,
    FinetuneConfig,
    LatentCodec,
    LightImageEncoder,
    Segmenter,
    build,
    load_light_encoder,
    load_segmenter,
    predict_latents,
    save_light_encoder,
    save_segmenter,
    train_light_encoder,
)
from steerdiff.segment.encoders import LIGHT_ENCODER_DIR, distillation_error

from .test_diffdis import _prior, _randomise, _tiny_codec


def _encoder(seed: int = 0, codec: LatentCodec | None = None) -> LightImageEncoder:
    torch.manual_seed(seed)
    scale = codec.scaling_factor if codec is not None else 1.0
    return LightImageEncoder(4, (6, 8), scaling_factor=scale).eval()  # factor 2, as the tiny codec


def test_shapes_dtypes_and_errors():
    enc = LightImageEncoder(4, (6, 8, 8))
    assert enc.factor == 4
    x = torch.rand(3, 3, 20, 28) * 2 - 1
    with torch.no_grad():
        z = enc(x)
    assert z.shape == (3, 4, 5, 7) and z.dtype == torch.float32
    torch.testing.assert_close(enc.encode(x), z, rtol=0, atol=0)
    # A bfloat16 encoder runs in bfloat16 and hands back the images' dtype; bfloat16 images into a float32
    # encoder come back bfloat16. Both close to the float32 result (bfloat16's 8-bit mantissa).
    low = LightImageEncoder(4, (6, 8, 8))
    low.load_state_dict(enc.state_dict())
    low = low.to(torch.bfloat16)
    out = low.encode(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, z, rtol=0, atol=0.05 * float(z.abs().max()))
    assert enc.encode(x.bfloat16()).dtype == torch.bfloat16
    for bad in (torch.randn(3, 1, 20, 28), torch.randn(3, 20, 28), "x"):
        with pytest.raises(ValueError, match="images"):
            enc(bad)
    with pytest.raises(ValueError, match="multiples of 4"):
        enc(torch.zeros(1, 3, 22, 28))
    with pytest.raises(ValueError, match="channels"):
        LightImageEncoder(4, ())


def test_context_term_is_global_and_the_rest_is_local():
    """Without the context term the encoder is local: an image changed in one corner changes the latent only
    within the receptive field. With it, the change reaches every latent position (the spatial mean's term)."""
    torch.manual_seed(2)
    x = torch.rand(1, 3, 64, 64) * 2 - 1
    y = x.clone()
    y[..., :4, :4] = -x[..., :4, :4]
    for context in (False, True):
        enc = LightImageEncoder(4, (6, 8, 8), context=context).eval()
        with torch.no_grad():
            diff = (enc(x) - enc(y)).abs()[0].amax(0)  # [16, 16]
        far = diff[8:, 8:].max()
        assert diff[0, 0] > 1e-4
        assert (far > 1e-6) == context


def _segmenter(encoder=None) -> tuple[Segmenter, LatentCodec]:
    codec = _tiny_codec()
    model = build(_prior(size=16), 1.0, FinetuneConfig())
    _randomise(model)
    return Segmenter(codec, model, encoder=encoder), codec


@pytest.mark.parametrize("steps,ensemble", [(1, 1), (3, 2)])
def test_one_and_multi_step_condition_on_the_given_encoder_only(steps, ensemble):
    """With a light encoder, every path's maps are the decodes of ``predict_latents`` on its latents; the VAE
    encoder is never called (a forward hook on it)."""
    seg, codec = _segmenter()
    enc = _encoder(codec=codec)
    seg.encoder = enc
    batch = dis.generate(2, 32, seed=0)
    calls = []
    hooks = [m.register_forward_hook(lambda *_: calls.append(1)) for m in (codec.encoder, codec.quant_conv)]
    try:
        mask, edges = seg.segment(batch.image, steps=steps, ensemble=ensemble, seed=5)
    finally:
        for h in hooks:
            h.remove()
    assert calls == [] and mask.shape == edges.shape == (2, 1, 32, 32)
    with torch.no_grad():
        z = enc(batch.image)
        members = [predict_latents(seg.model, z, steps=steps, edge=True, seed=5 + 2 * k) for k in range(ensemble)]
        want_mask = torch.stack([codec.decode_map(m) for m, _ in members]).mean(0)
        want_edge = torch.stack([codec.decode_map(e) for _, e in members]).mean(0)
        vae_z = codec.encode(batch.image)
    torch.testing.assert_close(mask, want_mask, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(edges, want_edge, rtol=1e-5, atol=1e-6)
    assert (z - vae_z).abs().max() > 1e-3  # the encoder made a difference
    seg.encoder = None  # back to the VAE encoder: its latents
    with torch.no_grad():
        vae_members = [predict_latents(seg.model, vae_z, steps=steps, edge=True, seed=5 + 2 * k)
                       for k in range(ensemble)]
    torch.testing.assert_close(seg.segment(batch.image, steps=steps, ensemble=ensemble, seed=5)[0],
                               torch.stack([codec.decode_map(m) for m, _ in vae_members]).mean(0),
                               rtol=1e-5, atol=1e-6)


def test_round_trip_and_the_registry(tmp_path):
    seg, codec = _segmenter()
    enc = _encoder(codec=codec)
    batch = dis.generate(2, 32, seed=0)
    vae_mask = seg.segment(batch.image)[0]
    seg.encoder = enc
    light_mask = seg.segment(batch.image)[0]
    save_segmenter(seg, tmp_path / "seg", dtype=torch.float32)  # the light encoder goes to its own folder
    assert (tmp_path / "seg" / LIGHT_ENCODER_DIR / "model.safetensors").is_file()
    assert IMAGE_ENCODERS.names() == ["light", "vae"]
    back_light = load_segmenter(tmp_path / "seg", encoder="light")
    back_vae = load_segmenter(tmp_path / "seg")
    assert back_vae.encoder is None and isinstance(back_light.encoder, LightImageEncoder)
    torch.testing.assert_close(back_light.segment(batch.image)[0], light_mask, rtol=0, atol=1e-6)
    torch.testing.assert_close(back_vae.segment(batch.image)[0], vae_mask, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="encoder must be one of"):
        load_segmenter(tmp_path / "seg", encoder="tiny")
    seg.encoder = None
    save_segmenter(seg, tmp_path / "plain", dtype=torch.float32)
    with pytest.raises(sd.io.CheckpointError, match="no config.json"):  # no light encoder was saved with it
        load_segmenter(tmp_path / "plain", encoder="light")
    seg.encoder = torch.nn.Identity()
    with pytest.raises(ValueError, match="LightImageEncoder"):
        save_segmenter(seg, tmp_path / "other", dtype=torch.float32)


def test_loading_refuses_bad_files(tmp_path):
    codec = _tiny_codec()
    enc = _encoder(codec=codec)
    good = save_light_encoder(enc, tmp_path / "good")
    load_light_encoder(good, codec)
    cfg = json.loads((good / "config.json").read_text())

    def variant(name: str, config: dict | None = None, tensors: dict | None = None):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg if config is None else config))
        save_file(tensors if tensors is not None else {k: v.contiguous() for k, v in enc.state_dict().items()},
                  str(d / "model.safetensors"))
        return d

    cases = {
        "format": (variant("fmt", {**cfg, "format": "steerdiff.segment.light_decoder/1"}), "format"),
        "corrupt": (variant("corrupt", {k: v for k, v in cfg.items() if k != "channels"}), "corrupt config"),
        "shapes": (variant("shapes", {**cfg, "channels": [6, 5]}), "shapes"),
        "missing": (variant("missing", tensors={"conv_in.weight": enc.conv_in.weight.detach().contiguous()}),
                    "missing"),
        "nan": (variant("nan", tensors={k: torch.full_like(v, float("nan")) for k, v in enc.state_dict().items()}),
                "non-finite"),
        "codec": (variant("codec", {**cfg, "scaling_factor": codec.scaling_factor * 2}), "codec"),
        "factor": (variant("factor", {**cfg, "channels": [6, 8, 8]}), "codec"),
    }
    for d, match in cases.values():
        with pytest.raises(sd.io.CheckpointError, match=match):
            load_light_encoder(d, codec)
    (tmp_path / "empty").mkdir()
    with pytest.raises(sd.io.CheckpointError, match="no config.json"):
        load_light_encoder(tmp_path / "empty")
    trunc = variant("trunc")
    (trunc / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(sd.io.CheckpointError, match="safetensors"):
        load_light_encoder(trunc, codec)


def test_distillation_fits_a_representable_target_and_the_vae_better_than_untrained():
    """On an ideal target the encoder can represent (each latent channel a fixed mix of the images' channels,
    average-pooled by 2, computed here without the encoder), training brings the error (over the target's
    variance) far below the best constant's (1) and the untrained encoder's; distilled from the tiny VAE encoder
    itself, the error on the training rows falls below the untrained encoder's."""
    codec = _tiny_codec()  # its scaling factor and factor (2); encode is read only without given targets
    batch = dis.generate(16, 32, seed=0)
    mix = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.5, -0.5, 0.25]])
    target = torch.einsum("ck,bkhw->bchw", mix, F.avg_pool2d(batch.image, 2))
    untrained = distillation_error(_encoder(codec=codec), batch.image, target)
    enc, info = train_light_encoder(codec, batch.image, channels=(8, 16), steps=300, batch_size=16, lr=1e-2,
                                    targets=target, context=False)
    assert info["train_error"] < 0.1 < untrained and info["rows"] == 16 and info["targets_cpu_s"] < 0.01
    assert info["train_error"] == pytest.approx(distillation_error(enc, batch.image, target))
    test = dis.generate(8, 32, seed=0, part="test")
    test_target = torch.einsum("ck,bkhw->bchw", mix, F.avg_pool2d(test.image, 2))
    assert distillation_error(enc, test.image, test_target) < 0.2  # it generalises: the map is the same
    vae, info = train_light_encoder(codec, batch.image, channels=(8, 16), steps=60, batch_size=16, lr=1e-2)
    with torch.no_grad():
        flipped = torch.cat([batch.image, batch.image.flip(-1)])
        z = codec.encode(flipped)
    torch.manual_seed(0)
    fresh = LightImageEncoder(4, (8, 16), codec.scaling_factor).eval()
    assert info["rows"] == 32 and info["targets_cpu_s"] > 0  # the flipped rows are added
    assert info["train_error"] == pytest.approx(distillation_error(vae, flipped, z))
    assert info["train_error"] < distillation_error(fresh, flipped, z)
    with pytest.raises(ValueError, match="downsample"):
        train_light_encoder(codec, batch.image, channels=(8, 16, 16), steps=1)
    with pytest.raises(ValueError, match="targets"):
        train_light_encoder(codec, batch.image, targets=target[:3], steps=1)
    with pytest.raises(ValueError, match="steps"):
        train_light_encoder(codec, batch.image, steps=-1)
