"""The shipped text-to-image pipeline (``steerdiff/assets/shapes_pipeline``): a diffusers save_pretrained directory
that diffusers itself loads, small, agreeing with diffusers' own call, and drawing the prompted shape and colour.

Independent truths: diffusers' ``DiffusionPipeline.from_pretrained`` and its own ``__call__``; the shipped shapes
classifier (trained on the 12x12 data, never on pipeline output) as judge of the prompted attributes.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.app.protocols import shapes_pipeline as sp

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

ROOT = sp.shipped_dir()
pytestmark = pytest.mark.skipif(not (ROOT / "model_index.json").is_file(), reason="shipped pipeline not built")


@pytest.fixture(scope="module")
def pipe():
    return sd.pipelines.load("shapes_pipeline")


@pytest.fixture(scope="module")
def judge():
    return sp.load_judge()


def test_diffusers_loads_it_and_it_is_small():
    raw = diffusers.DiffusionPipeline.from_pretrained(str(ROOT), local_files_only=True)
    assert type(raw).__name__ == "StableDiffusionPipeline"
    assert type(raw.scheduler).__name__ == "EulerDiscreteScheduler"
    files = [p for p in ROOT.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 20 * 2**20
    assert not [p for p in files if p.suffix in (".bin", ".ckpt", ".pt", ".pth", ".pkl")]


def test_matches_the_diffusers_call(pipe):
    prompts = ["a red square on a grey background", "a blue disk on a grey background"]
    latents = torch.randn((2, *pipe.latent_shape()), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = pipe(prompts, num_inference_steps=12, latents=latents, output_type="latent").images
        theirs = pipe.pipe(prompts, num_inference_steps=12, latents=latents.clone(), output_type="latent").images
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_conformity_at_the_default_guidance(pipe, judge):
    """``pipe(prompt)`` with diffusers' defaults (CFG 7.5, 50 steps of the Euler scheduler) draws the prompted
    shape and colour for >= 90% of images over the 8 seen captions."""
    seen = sp.train_pairs()
    images, nfe = sp.prompt_samples(pipe, seen, 4, steps=50, scale=7.5, seed=1)
    assert nfe == 100
    score = sp.conformity(sp.classify(judge, images), sp.pair_labels(seen, 4))
    assert score >= 0.9, score


def test_by_name_and_unknown_names(pipe):
    assert "shapes_pipeline" in sd.pipelines.shipped_pipelines()
    with pytest.raises(FileNotFoundError, match="shapes_pipeline"):
        sd.pipelines.load("no_such_pipeline")
