"""The light mask decoder (docs/methods/diffdis.md, "The light mask decoder"): shapes, dtypes and upsampling of
:class:`LightMaskDecoder`, the segmenter decoding every map through the decoder it is given (one step and
multi-step alike, the VAE decoder untouched), the registry and the CLI option, and loading that refuses bad files."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import steerdiff as sd
from steerdiff.data import dis
from steerdiff.segment import (
    MASK_DECODERS,
    FinetuneConfig,
    LatentCodec,
    LightMaskDecoder,
    Segmenter,
    build,
    load_light_decoder,
    load_segmenter,
    predict_latents,
    save_light_decoder,
    save_segmenter,
    train_light_decoder,
)
from steerdiff.segment.decoders import LIGHT_DIR

from .test_diffdis import _prior, _randomise, _tiny_codec


def _decoder(seed: int = 0, codec: LatentCodec | None = None) -> LightMaskDecoder:
    torch.manual_seed(seed)
    scale = codec.scaling_factor if codec is not None else 1.0
    return LightMaskDecoder(4, (8, 6), scaling_factor=scale).eval()  # factor 2, as the tiny codec


def test_shapes_dtypes_and_probabilities():
    dec = LightMaskDecoder(4, (8, 6, 4))
    assert dec.factor == 4
    z = torch.randn(3, 4, 5, 7)
    logits = dec(z)
    assert logits.shape == (3, 1, 20, 28) and logits.dtype == torch.float32
    maps = dec.decode_map(z)
    torch.testing.assert_close(maps, torch.sigmoid(logits), rtol=0, atol=0)
    assert maps.min() >= 0 and maps.max() <= 1
    # A bfloat16 decoder runs in bfloat16 and hands back the latents' dtype; a bfloat16 latent into a float32
    # decoder comes back bfloat16. Both close to the float32 result (bfloat16's 8-bit mantissa).
    low = LightMaskDecoder(4, (8, 6, 4))
    low.load_state_dict(dec.state_dict())
    low = low.to(torch.bfloat16)
    out = low.decode_map(z)
    assert out.dtype == torch.float32 and out.device == z.device
    torch.testing.assert_close(out, maps, rtol=0, atol=0.05)
    assert dec.decode_map(z.bfloat16()).dtype == torch.bfloat16
    for bad in (torch.randn(3, 3, 5, 7), torch.randn(4, 5, 7), "z"):
        with pytest.raises(ValueError, match="latents"):
            dec(bad)
    with pytest.raises(ValueError, match="channels"):
        LightMaskDecoder(4, ())


def test_output_shifts_by_the_factor_when_the_latent_shifts_by_one():
    """Convolutions and nearest-neighbour upsampling commute with shifts: a latent moved one pixel gives the map
    moved ``factor`` pixels (compared away from the zero-padded borders, which the shift brings in)."""
    torch.manual_seed(1)
    dec = LightMaskDecoder(4, (8, 6, 4)).eval()
    z = torch.randn(1, 4, 12, 12)
    with torch.no_grad():
        a, b = dec(z), dec(torch.roll(z, shifts=1, dims=-1))
    f, m = dec.factor, 16  # m: the receptive field's reach from the border, in output pixels (generous)
    torch.testing.assert_close(b[..., m + f:-m], a[..., m:-m - f], rtol=1e-5, atol=1e-6)
    assert (b[..., m:-m] - a[..., m:-m]).abs().max() > 1e-3  # not trivially constant


def _segmenter(decoder=None) -> tuple[Segmenter, LatentCodec]:
    codec = _tiny_codec()
    model = build(_prior(size=16), 1.0, FinetuneConfig())
    _randomise(model)
    return Segmenter(codec, model, decoder=decoder), codec


@pytest.mark.parametrize("steps,ensemble", [(1, 1), (3, 2)])
def test_one_and_multi_step_decode_through_the_given_decoder_only(steps, ensemble):
    """With a light decoder, every map (masks and edges, one step and multi-step) is its decode of the latents
    ``predict_latents`` gives, averaged over members; the VAE decoder is never called."""
    seg, codec = _segmenter()
    dec = _decoder(codec=codec)
    seg.decoder = dec
    batch = dis.generate(2, 32, seed=0)
    calls = []
    hook = codec.post_quant_conv.register_forward_hook(lambda *_: calls.append(1))
    try:
        mask, edges = seg.segment(batch.image, steps=steps, ensemble=ensemble, seed=5)
    finally:
        hook.remove()
    assert calls == [] and mask.shape == edges.shape == (2, 1, 32, 32)
    with torch.no_grad():
        z = codec.encode(batch.image)
        members = [predict_latents(seg.model, z, steps=steps, edge=True, seed=5 + 2 * k) for k in range(ensemble)]
        want_mask = torch.stack([dec.decode_map(m) for m, _ in members]).mean(0)
        want_edge = torch.stack([dec.decode_map(e) for _, e in members]).mean(0)
        vae_mask = torch.stack([codec.decode_map(m) for m, _ in members]).mean(0)
    torch.testing.assert_close(mask, want_mask, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(edges, want_edge, rtol=1e-5, atol=1e-6)
    assert (mask - vae_mask).abs().max() > 1e-3  # the decoder made a difference
    seg.decoder = None  # back to the VAE: its maps
    torch.testing.assert_close(seg.segment(batch.image, steps=steps, ensemble=ensemble, seed=5)[0], vae_mask,
                               rtol=1e-5, atol=1e-6)


def test_round_trip_and_the_registry(tmp_path):
    seg, codec = _segmenter()
    dec = _decoder(codec=codec)
    batch = dis.generate(2, 32, seed=0)
    vae_mask = seg.segment(batch.image)[0]
    seg.decoder = dec
    light_mask = seg.segment(batch.image)[0]
    save_segmenter(seg, tmp_path / "seg", dtype=torch.float32)  # the light decoder goes to its own folder
    assert (tmp_path / "seg" / LIGHT_DIR / "model.safetensors").is_file()
    assert MASK_DECODERS.names() == ["light", "vae"]
    back_light = load_segmenter(tmp_path / "seg", decoder="light")
    back_vae = load_segmenter(tmp_path / "seg")
    assert back_vae.decoder is None and isinstance(back_light.decoder, LightMaskDecoder)
    torch.testing.assert_close(back_light.segment(batch.image)[0], light_mask, rtol=0, atol=1e-6)
    torch.testing.assert_close(back_vae.segment(batch.image)[0], vae_mask, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="decoder must be one of"):
        load_segmenter(tmp_path / "seg", decoder="tiny")
    seg.decoder = None
    save_segmenter(seg, tmp_path / "plain", dtype=torch.float32)
    with pytest.raises(sd.io.CheckpointError, match="no config.json"):  # no light decoder was saved with it
        load_segmenter(tmp_path / "plain", decoder="light")


def test_loading_refuses_bad_files(tmp_path):
    codec = _tiny_codec()
    dec = _decoder(codec=codec)
    good = save_light_decoder(dec, tmp_path / "good")
    load_light_decoder(good, codec)
    cfg = json.loads((good / "config.json").read_text())

    def variant(name: str, config: dict | None = None, tensors: dict | None = None):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg if config is None else config))
        save_file(tensors if tensors is not None else {k: v.contiguous() for k, v in dec.state_dict().items()},
                  str(d / "model.safetensors"))
        return d

    cases = {
        "format": (variant("fmt", {**cfg, "format": "steerdiff.segment.diffdis/1"}), "format"),
        "corrupt": (variant("corrupt", {k: v for k, v in cfg.items() if k != "channels"}), "corrupt config"),
        "shapes": (variant("shapes", {**cfg, "channels": [8, 5]}), "shapes"),
        "missing": (variant("missing", tensors={"conv_in.weight": dec.conv_in.weight.detach().contiguous()}),
                    "missing"),
        "nan": (variant("nan", tensors={k: torch.full_like(v, float("nan")) for k, v in dec.state_dict().items()}),
                "non-finite"),
        "codec": (variant("codec", {**cfg, "scaling_factor": codec.scaling_factor * 2}), "codec"),
        "factor": (variant("factor", {**cfg, "channels": [8, 6, 4]}), "codec"),
    }
    for d, match in cases.values():
        with pytest.raises(sd.io.CheckpointError, match=match):
            load_light_decoder(d, codec)
    (tmp_path / "empty").mkdir()
    with pytest.raises(sd.io.CheckpointError, match="no config.json"):
        load_light_decoder(tmp_path / "empty")
    trunc = variant("trunc")
    (trunc / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(sd.io.CheckpointError, match="safetensors"):
        load_light_decoder(trunc, codec)


def test_training_beats_the_closed_form_upsampling_and_records_its_time():
    """On an ideal codec whose latent is the mask average-pooled by 2 (in [-1, 1], on every channel), the trained
    decoder reconstructs the masks better than the closed-form decoder of that codec (nearest-neighbour upsampling
    of the pooled mask) and than the best constant map."""
    codec = _tiny_codec()  # only its scaling factor and factor (2) are read with distill=0
    batch = dis.generate(16, 32, seed=0)
    lat = F.avg_pool2d(batch.mask, 2).expand(-1, 4, -1, -1) * 2 - 1
    dec, info = train_light_decoder(codec, lat, batch.mask, channels=(8, 6), steps=100, batch_size=8, lr=1e-2,
                                    distill=0.0)
    with torch.no_grad():
        err = (dec.decode_map(lat) - batch.mask).abs().mean()
    nearest = (F.interpolate((lat[:, :1] + 1) / 2, scale_factor=2, mode="nearest") - batch.mask).abs().mean()
    const = torch.minimum(batch.mask.mean(), 1 - batch.mask.mean())
    assert err < nearest < const
    assert info["cpu_s"] > 0 and info["steps"] == 100 and info["distill_targets_cpu_s"] < info["cpu_s"]
    with torch.no_grad():
        real = codec.encode_map(batch.mask)
    _, info = train_light_decoder(codec, real, batch.mask, channels=(8, 6), steps=2, n_distill=16)
    assert 0 < info["distill_targets_cpu_s"] <= info["cpu_s"]
    with pytest.raises(ValueError, match="upsample"):
        train_light_decoder(codec, real, batch.mask, channels=(8, 6, 4), steps=1)
    with pytest.raises(ValueError, match="distill"):
        train_light_decoder(codec, real, batch.mask, channels=(8, 6), steps=1, distill=-1.0)
    with pytest.raises(ValueError, match="same N"):
        train_light_decoder(codec, real[:3], batch.mask, steps=1)
