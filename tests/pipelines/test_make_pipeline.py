"""scripts/make_pipeline.py: the shipped pipeline's builder, run on a tiny override of its recipe."""

from pathlib import Path

import pytest
import torch
from script_modules import load_script

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

import steerdiff as sd  # noqa: E402
from steerdiff.data import shapes  # noqa: E402

mp = load_script("scripts/make_pipeline.py", "make_pipeline")

# Tiny widths and a few steps; the recipe's structure (resolution 32, 4x8x8 latents, band split) is kept.
TINY = [
    "data.n=48",
    "text_encoder.hidden=16", "text_encoder.heads=2", "text_encoder.layers=1",
    "vae.block_out_channels=[8,8,8]", "vae.norm_num_groups=4", "vae.steps=4", "vae.batch_size=4",
    "vae.checkpoint_every=2", "vae.log_every=2",
    "unet.block_out_channels=[8,16]", "unet.norm_num_groups=4", "unet.attention_head_dim=4", "unet.steps=4",
    "unet.batch_size=4", "unet.checkpoint_every=2", "unet.log_every=2",
]


def _tiny():
    return mp.load_recipe(mp.DEFAULT_RECIPE, TINY)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("make_pipeline")
    out = mp.build(_tiny(), root / "pipe", root / "work", log=lambda *_: None)
    return out


def test_captions_cover_every_pair_and_the_recipe_trains_on_the_band_split():
    caps = mp.all_captions()
    assert len({text for _, _, text in caps}) == len(shapes.SHAPES) * len(shapes.COLOURS)
    assert mp.caption(1, 0) == "a red disk on a grey background"
    recipe = mp.load_recipe()
    assert recipe["data"]["split"] == "band"
    images, labels = mp.make_images({**recipe["data"], "n": 40}, recipe["resolution"])
    assert images.shape == (40, 3, 32, 32)
    train = set(shapes.split_combos("band", "train"))
    assert {tuple(p) for p in labels.tolist()} <= train  # the held-out band pairs never reach training
    # The 12x12 generator's images, enlarged 2x by pixel repetition, sit in the middle of the canvas.
    ref, ref_labels = shapes.generate(40, split="band", part="train", seed=recipe["data"]["seed"])
    assert torch.equal(labels, ref_labels)
    assert torch.equal(images[:, :, 4:28, 4:28], ref.repeat_interleave(2, 2).repeat_interleave(2, 3))
    border = images[:, :, :4]
    assert abs(border.mean().item()) < 0.01 and 0.02 < border.std().item() < 0.06  # grey 0.5 +- 0.02 -> 0 +- 0.04


def test_tokenizer_reads_each_caption_word_as_one_token(tmp_path):
    mp.write_tokenizer_files(tmp_path, mp.caption_words())
    tok = transformers.CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    for _, _, text in mp.all_captions():
        ids = tok(text, add_special_tokens=False).input_ids
        assert len(ids) == len(text.split())
        assert tok.decode(ids) == text
    assert tok.decode(tok("a purple dog", add_special_tokens=False).input_ids) == "a purple dog"  # unseen words too


def test_recipe_overrides_are_checked():
    with pytest.raises(ValueError, match="no key 'stepz'"):
        mp.load_recipe(mp.DEFAULT_RECIPE, ["vae.stepz=3"])
    with pytest.raises(ValueError, match="key.sub=value"):
        mp.load_recipe(mp.DEFAULT_RECIPE, ["vae.steps"])
    with pytest.raises(ValueError, match="resolution"):
        mp.make_images({"n": 1, "split": "band", "seed": 0}, 31)


def test_built_directory_loads_and_generates_with_diffusers_and_steerdiff(built):
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(built), use_safetensors=True, local_files_only=True)
    assert isinstance(pipe, diffusers.StableDiffusionPipeline)
    assert pipe.unet.config.cross_attention_dim == pipe.text_encoder.config.hidden_size
    pipe.set_progress_bar_config(disable=True)
    img = pipe("a red disk on a grey background", num_inference_steps=2, output_type="np",
               generator=torch.Generator().manual_seed(0)).images
    assert img.shape == (1, 32, 32, 3)
    ours = sd.pipelines.load(built)
    out = ours("a blue square on a grey background", num_inference_steps=7, output_type="pt",
               generator=torch.Generator().manual_seed(0))
    assert out.images.shape == (1, 3, 32, 32)
    assert out.latents.shape == (1, 4, 8, 8)
    # The same call through diffusers itself ("pt" images in [0, 1], as diffusers returns them).
    ref = pipe("a blue square on a grey background", num_inference_steps=7, output_type="pt",
               generator=torch.Generator().manual_seed(0)).images
    torch.testing.assert_close(out.images, ref, atol=1e-4, rtol=0)


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    found = {}
    for f in sorted(directory.rglob("*.safetensors")):
        for k, v in load_file(str(f)).items():
            found[f"{f.relative_to(directory)}:{k}"] = v
    return found


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(built, tmp_path):
    logs = [[], [], []]
    assert mp.build(_tiny(), tmp_path / "pipe", tmp_path / "work", halt_after={"vae": 2}, log=logs[0].append) is None
    assert not (tmp_path / "pipe").exists()
    assert mp.build(_tiny(), tmp_path / "pipe", tmp_path / "work", halt_after={"unet": 2}, log=logs[1].append) is None
    assert mp.build(_tiny(), tmp_path / "pipe", tmp_path / "work", log=logs[2].append) == tmp_path / "pipe"
    # Each rerun really resumed (a restart from scratch would also end at the same weights): it ran only the
    # steps after the checkpoint (log_every = 2, so a restart would log step 2 again).
    assert any("[vae] step 2/4" in m for m in logs[0]) and not any("[unet]" in m for m in logs[0])
    assert any("[vae] resumed" in m and "at step 2" in m for m in logs[1])
    assert not any("[vae] step 2/4" in m for m in logs[1]) and any("[unet] step 2/4" in m for m in logs[1])
    assert any("[vae] resumed" in m and "at step 4" in m for m in logs[2])
    assert any("[unet] resumed" in m and "at step 2" in m for m in logs[2])
    assert not any("step 2/4" in m for m in logs[2]) and any("[unet] step 4/4" in m for m in logs[2])
    a, b = _weights(built), _weights(tmp_path / "pipe")
    assert a.keys() == b.keys() and len(a) > 0
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="halt_after"):
        mp.build(_tiny(), tmp_path / "p2", tmp_path / "w2", halt_after={"text": 1})
