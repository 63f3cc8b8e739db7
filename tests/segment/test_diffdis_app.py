"""The shipped DiffDIS segmenter through the application: ``steerdiff segment`` (files and ``--procedural``), the demo
section in quick mode, and the shipped model's recorded recipe (docs/methods/diffdis.md, "Inference and the shipped
model")."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from steerdiff.app.cli import main
from steerdiff.app.recipes.diffdis import load_shipped, shipped_dir
from steerdiff.data import dis
from steerdiff.metrics.segmentation import dis_metrics, fmeasure_curve

pytestmark = pytest.mark.skipif(not (shipped_dir() / "config.json").is_file(),
                                reason="the shipped diffdis segmenter is not there (scripts/make_assets.py)")


@pytest.fixture(scope="module")
def seg():
    return load_shipped()


def _png(path) -> np.ndarray:
    return np.asarray(Image.open(path), dtype=np.float64) / 255


def test_cli_procedural_and_files_match_the_library(tmp_path, seg):
    out = tmp_path / "proc"
    res = CliRunner().invoke(main, ["segment", "--procedural", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    batch = dis.generate(2, 64, seed=0, part="test")
    metrics = json.loads((out / "metrics.json").read_text())
    for i in range(2):
        mask, edge = seg.segment(batch.image[i:i + 1], seed=i)
        for kind, want in (("mask", mask), ("edge", edge)):
            np.testing.assert_allclose(_png(out / f"procedural_{i:04d}_{kind}.png"), want[0, 0].numpy(),
                                       atol=0.5 / 255 + 1e-6)
    assert metrics["steps"] == 1 and metrics["scores"]["n"] == 2
    # A file given on the command line: the image written above, read back as RGB (8-bit rounding of the input).
    src = out / "procedural_0000_image.png"
    res = CliRunner().invoke(main, ["segment", str(src), "--out", str(tmp_path / "files")])
    assert res.exit_code == 0, res.output
    img = torch.from_numpy(_png(src)).float().permute(2, 0, 1)[None] * 2 - 1
    mask, _ = seg.segment(img, seed=0)
    np.testing.assert_allclose(_png(tmp_path / "files" / "procedural_0000_image_mask.png"), mask[0, 0].numpy(),
                               atol=0.5 / 255 + 1e-6)
    # --no-edges: the same mask file, and no edge file
    res = CliRunner().invoke(main, ["segment", str(src), "--no-edges", "--out", str(tmp_path / "masks_only")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "masks_only" / "procedural_0000_image_mask.png").read_bytes() == (
        tmp_path / "files" / "procedural_0000_image_mask.png").read_bytes()
    assert not (tmp_path / "masks_only" / "procedural_0000_image_edge.png").exists()
    assert (tmp_path / "files" / "procedural_0000_image_edge.png").exists()
    assert json.loads((tmp_path / "masks_only" / "metrics.json").read_text())["edges_written"] is False


def test_cli_refuses_bad_input(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["segment", "--out", str(tmp_path / "a")])
    assert res.exit_code != 0 and "--procedural" in res.output
    res = runner.invoke(main, ["segment", "--procedural", "1", "--size", "66", "--out", str(tmp_path / "b")])
    assert res.exit_code != 0 and "--size" in res.output
    res = runner.invoke(main, ["segment", str(tmp_path / "missing.png"), "--out", str(tmp_path / "c")])
    assert res.exit_code != 0 and "no such file" in res.output


def test_shipped_model_segments_and_records_its_recipe(seg):
    test = dis.generate(16, 64, seed=0, part="test")
    mask, edge = seg.segment(test.image)
    assert mask.shape == edge.shape == (16, 1, 64, 64)
    row = dis_metrics(mask.double(), test.mask, with_hce=False)
    # Better than the uninformative map (every pixel foreground: its F is the t = 0 point of the curve).
    constant = float(fmeasure_curve(torch.ones_like(test.mask).double(), test.mask)[:, 0].mean())
    assert row["maxF"] > constant + 0.1
    # Better than the best image-blind latent: the test masks' own mean latent, decoded (an oracle constant; the
    # models shipped before the diagnosis in docs/methods/diffdis.md scored below the training set's mean latent).
    blind = seg.codec.decode_map(seg.codec.encode_map(test.mask).mean(0, keepdim=True).expand(16, -1, -1, -1))
    row_blind = dis_metrics(blind.double(), test.mask, with_hce=False)
    assert row["maxF"] > row_blind["maxF"] and row["MAE"] < row_blind["MAE"] and row["bandF"] > row_blind["bandF"]
    meta = json.loads((shipped_dir() / "config.json").read_text())["metadata"]
    # One thread's CPU seconds bound the wall time on an idle core (this machine's wall clock counts other jobs).
    assert 0 < meta["train_cpu_s"] < 30 * 60 and meta["threads"] == 1
    assert meta["ceiling_after"]["mask"]["max_f"] > meta["ceiling_before"]["mask"]["max_f"]
    # The VAE fine-tuned on the images reconstructs them better than the best flat image (their variance).
    assert meta["recon_mse_after"] < meta["image_variance"]


def test_cli_light_decoder_matches_the_library_and_unknown_names_are_refused(tmp_path):
    """``--decoder light``: the masks of the shipped segmenter with its light decoder (``load_shipped("light")``),
    decoded by it and not by the VAE; an unregistered name is a click error listing the registered ones."""
    light = load_shipped("light")
    out = tmp_path / "light"
    res = CliRunner().invoke(main, ["segment", "--procedural", "2", "--decoder", "light", "--out", str(out)])
    assert res.exit_code == 0, res.output
    batch = dis.generate(2, 64, seed=0, part="test")
    for i in range(2):
        mask, edge = light.segment(batch.image[i:i + 1], seed=i)
        np.testing.assert_allclose(_png(out / f"procedural_{i:04d}_mask.png"), mask[0, 0].numpy(),
                                   atol=0.5 / 255 + 1e-6)
        np.testing.assert_allclose(_png(out / f"procedural_{i:04d}_edge.png"), edge[0, 0].numpy(),
                                   atol=0.5 / 255 + 1e-6)
    assert json.loads((out / "metrics.json").read_text())["decoder"] == "light"
    res = CliRunner().invoke(main, ["segment", "--procedural", "1", "--decoder", "tiny", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "light" in res.output and "vae" in res.output


def test_shipped_light_decoder_reads_the_shipped_codec_and_records_its_recipe(seg):
    """The shipped light decoder: a tenth or less of the VAE decoder's parameters, better than the best image-blind
    map it can decode (the test masks' own mean latent) on one-step predictions, and trained in the recorded time."""
    from steerdiff.segment import load_light_decoder

    light = load_light_decoder(shipped_dir() / "light_decoder", seg.codec)
    vae_params = sum(p.numel() for p in (*seg.codec.decoder.parameters(), *seg.codec.post_quant_conv.parameters()))
    assert sum(p.numel() for p in light.parameters()) * 10 < vae_params
    test = dis.generate(16, 64, seed=0, part="test")
    with torch.no_grad():
        from steerdiff.segment import predict_latents

        m, _ = predict_latents(seg.model, seg.codec.encode(test.image), steps=1, edge=True)
        row = dis_metrics(light.decode_map(m).double(), test.mask, with_hce=False)
        blind = light.decode_map(seg.codec.encode_map(test.mask).mean(0, keepdim=True).expand(16, -1, -1, -1))
    row_blind = dis_metrics(blind.double(), test.mask, with_hce=False)
    assert row["maxF"] > row_blind["maxF"] and row["MAE"] < row_blind["MAE"] and row["bandF"] > row_blind["bandF"]
    meta = json.loads((shipped_dir() / "light_decoder" / "config.json").read_text())["metadata"]
    assert 0 < meta["train_cpu_s"] < 30 * 60 and meta["threads"] == 1 and "--light-decoder" in meta["command"]


def test_cli_light_encoder_matches_the_library_and_unknown_names_are_refused(tmp_path):
    """``--encoder light --decoder light``: the masks of the shipped segmenter with its light image encoder and light
    decoder (``load_shipped("light", "light")``); an unregistered encoder name is a click error listing the
    registered ones."""
    light = load_shipped("light", "light")
    assert light.encoder is not None and light.decoder is not None
    out = tmp_path / "light"
    res = CliRunner().invoke(main, ["segment", "--procedural", "2", "--encoder", "light", "--decoder", "light",
                                    "--no-edges", "--out", str(out)])
    assert res.exit_code == 0, res.output
    batch = dis.generate(2, 64, seed=0, part="test")
    for i in range(2):
        mask, _ = light.segment(batch.image[i:i + 1], seed=i, edges=False)
        np.testing.assert_allclose(_png(out / f"procedural_{i:04d}_mask.png"), mask[0, 0].numpy(),
                                   atol=0.5 / 255 + 1e-6)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["encoder"] == "light" and metrics["decoder"] == "light"
    res = CliRunner().invoke(main, ["segment", "--procedural", "1", "--encoder", "tiny", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "light" in res.output and "vae" in res.output


def test_shipped_light_encoder_reads_the_shipped_codec_and_records_its_recipe(seg):
    """The shipped light image encoder: under a fifth of the VAE encoder's parameters, its latents of unseen test
    images closer to the VAE encoder's than the best constant latent (error over variance < 1) and than the test
    latents' own spatial means per image and channel, and distilled in the recorded time."""
    from steerdiff.segment import load_light_encoder

    light = load_light_encoder(shipped_dir() / "light_encoder", seg.codec)
    vae_params = sum(p.numel() for p in (*seg.codec.encoder.parameters(), *seg.codec.quant_conv.parameters()))
    assert sum(p.numel() for p in light.parameters()) * 5 < vae_params
    test = dis.generate(16, 64, seed=0, part="test")
    with torch.no_grad():
        want = seg.codec.encode(test.image)
        err = (light.encode(test.image) - want).pow(2).mean()
    per_image_mean = (want - want.mean((-2, -1), keepdim=True)).pow(2).mean()
    assert err < per_image_mean < want.var()
    meta = json.loads((shipped_dir() / "light_encoder" / "config.json").read_text())["metadata"]
    assert 0 < meta["train_cpu_s"] < 30 * 60 and meta["threads"] == 1 and "--light-encoder" in meta["command"]


def test_demo_section_quick(tmp_path):
    from steerdiff.app.demo import run_demo

    results = run_demo(tmp_path / "rep", quick=True, only=["segment"], progress=False)
    (s,) = [x for x in results["sections"] if x["key"] == "segment"]
    assert s["status"] == "ok", s.get("note")
    assert [v["values"]["nfe"] for v in s["variants"]] == [1, 10]
    for v in s["variants"]:
        assert (tmp_path / "rep" / v["image"]).is_file()
        assert 0 <= v["values"]["maxF"] <= 1 and 0 <= v["values"]["MAE"] <= 1
    assert s["cpu_seconds"] < 10


def test_the_cli_recognises_a_segmenter_folder_by_the_format_the_library_writes():
    """The CLI's model-kind detector (kept import-light) reads the same format tag the segmenter saves."""
    from steerdiff.app.cli._models import classify
    from steerdiff.app.cli.segment import SEGMENTER_FORMAT
    from steerdiff.models.io import ASSETS_DIR
    from steerdiff.segment.segmenter import FORMAT

    assert SEGMENTER_FORMAT == FORMAT
    assert classify(ASSETS_DIR / "diffdis").kind == "segmenter"
    assert classify(ASSETS_DIR / "motiondreamer_biped").kind == "motion"


@pytest.mark.slow  # three tiny recipe runs: the ceilings over 128 test images dominate (about a CPU minute)
def test_recipe_codec_from_keeps_the_codec_refits_the_prior_and_counts_both(tmp_path):
    """``--codec-from``: the codec (stages 1-3) is the given folder's, weight for weight; the prior is pre-trained
    again with this recipe's steps; the recorded training time adds the codec stages' recorded CPU seconds to this
    run's; a codec made with other data or stage settings is refused."""
    from steerdiff.app.recipes.diffdis import make
    from steerdiff.segment import load_light_decoder, load_light_encoder, read_metadata
    from steerdiff.segment import load_segmenter as load

    quick = {"n_train": 16, "vae_steps": 1, "vae_batch_size": 2, "decoder_steps": 1, "prior_steps": 1,
             "finetune_steps": 1, "batch_size": 2, "light": {"steps": 1, "n_distill": 8, "batch_size": 2},
             "light_encoder": {"steps": 1, "batch_size": 2}}
    first = make(tmp_path / "a", quick)
    assert first["light_decoder"]["recipe"]["steps"] == 1  # stage 6 ran and wrote a decoder that reads back
    load_light_decoder(tmp_path / "a" / "light_decoder", load(tmp_path / "a").codec)
    assert first["light_encoder"]["recipe"]["steps"] == 1  # stage 7 likewise, an encoder
    load_light_encoder(tmp_path / "a" / "light_encoder", load(tmp_path / "a").codec)
    second = make(tmp_path / "b", {**quick, "prior_steps": 3}, codec_from=tmp_path / "a")
    a, b = load(tmp_path / "a"), load(tmp_path / "b")
    for (name, pa), (_, pb) in zip(a.codec.state_dict().items(), b.codec.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name  # the values the folder stores (float16), carried over exactly
    assert second["prior"]["steps"] == 3 and first["prior"]["steps"] == 1
    codec_cpu = first["vae_finetune"]["cpu_s"] + first["encode_cpu_s"] + first["mask_decoder"]["cpu_s"]
    assert second["codec_cpu_s"] == pytest.approx(codec_cpu)
    assert second["train_cpu_s"] > codec_cpu + second["prior"]["cpu_s"] + second["finetune"]["cpu_s"]
    assert read_metadata(tmp_path / "b_base")["recipe"]["prior_steps"] == 3
    with pytest.raises(ValueError, match="n_train"):
        make(tmp_path / "c", {**quick, "n_train": 8}, codec_from=tmp_path / "a")
