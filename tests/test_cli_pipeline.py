"""``steerdiff sample --pipeline`` / ``steerdiff align --pipeline`` on tiny random-weight SD and SD3 pipeline
directories.

The pipelines are built from configs by tests/tiny_pipelines.py (tokenizer files written here) and saved with
``save_pretrained``; the CLI's images are checked against the diffusers pipeline's own call from the same latents.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from steerdiff.align.rewards import redness as red  # noqa: E402
from steerdiff.app.cli import main  # noqa: E402
from steerdiff.core.sampling import nfe_of  # noqa: E402
from steerdiff.io import load_tensors  # noqa: E402

STEPS = 3


def _saved(tmp_path_factory, family: str) -> Path:
    """A tiny random-weight pipeline of ``family`` (tests/tiny_pipelines.py) written with save_pretrained."""
    import tiny_pipelines

    root = tmp_path_factory.mktemp(f"cli_pipeline_{family}")
    tok = root / "tok"
    write_clip_tokenizer(tok)
    {"sd": tiny_pipelines.make_sd, "sd3": tiny_pipelines.make_sd3}[family](tok).save_pretrained(root / family)
    return root / family


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory):
    return _saved(tmp_path_factory, "sd")


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    return _saved(tmp_path_factory, "sd3")


def _run(args, out=None):
    res = CliRunner().invoke(main, [*args, *([] if out is None else ["--out", str(out)])])
    return res


def _ok(args, out):
    res = _run([*args, "--no-progress"], out)
    assert res.exit_code == 0, res.output + repr(res.exception)
    return json.loads((Path(out) / "metrics.json").read_text()), load_tensors(Path(out) / "samples.safetensors")


def test_sample_pipeline_matches_diffusers(sd_dir, tmp_path):
    """Outputs, NFE = the registry's count x 2 under CFG, images in [-1, 1], one PNG per image, and the images equal
    the diffusers pipeline's own ``output_type="pt"`` call from the same initial latents."""
    prompts = ["a red disk", "a square"]
    m, t = _ok(["sample", "--pipeline", str(sd_dir), "--prompt", prompts[0], "--prompt", prompts[1], "--n", "2",
                "--steps", str(STEPS), "--scale", "5", "--seed", "7"], tmp_path / "o")
    images = t["samples"]
    assert images.shape == (4, 3, 16, 16)
    assert float(images.min()) >= -1 and float(images.max()) <= 1
    assert m["method"] == "ddim" and m["nfe"] == 2 * nfe_of("ddim", STEPS)
    assert m["rows"] == [prompts[0]] * 2 + [prompts[1]] * 2
    pngs = sorted(p.name for p in (tmp_path / "o").glob("image_*.png"))
    assert len(pngs) == images.shape[0] == len(m["images"])
    assert (tmp_path / "o" / "samples.png").is_file()

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(sd_dir), use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    latents = torch.cat([torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(7 + j))
                         for j in range(4)])
    ref = pipe(m["rows"], num_inference_steps=STEPS, guidance_scale=5.0, latents=latents, output_type="pt").images
    torch.testing.assert_close(images, ref * 2 - 1, rtol=1e-4, atol=1e-4)


def test_sample_pipeline_seed_and_batch_independence(sd_dir, tmp_path):
    """With a stochastic sampler (fresh noise each step), the same seed reproduces the images; an image does not
    depend on the rest of its batch (row 0 alone equals row 0 of a larger batch); another seed changes them."""
    base = ["sample", "--pipeline", str(sd_dir), "--prompt", "a disk", "--steps", "2", "--method", "euler_ancestral"]
    _, a = _ok([*base, "--n", "2", "--seed", "3"], tmp_path / "a")
    _, b = _ok([*base, "--n", "2", "--seed", "3"], tmp_path / "b")
    _, c = _ok([*base, "--n", "1", "--seed", "3"], tmp_path / "c")
    _, d = _ok([*base, "--n", "1", "--seed", "4"], tmp_path / "d")
    assert torch.equal(a["samples"], b["samples"])
    torch.testing.assert_close(c["samples"][0], a["samples"][0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(d["samples"][0], a["samples"][0])


def test_sample_pipeline_apg_and_negative(sd_dir, tmp_path):
    """APG with the model path's options (eta, momentum) and a negative prompt: recorded, NFE x 2, progress bar."""
    m, t = _ok(["sample", "--pipeline", str(sd_dir), "--prompt", "a disk", "--negative", "a square", "--guidance",
                "apg", "--scale", "10", "--eta", "0.5", "--momentum", "-0.5", "--method", "dpmpp_2m", "--steps",
                str(STEPS)], tmp_path / "o")
    assert m["guidance"]["name"] == "apg" and m["guidance"]["eta"] == 0.5 and m["guidance"]["momentum"] == -0.5
    assert m["negative_prompts"] == ["a square"]
    assert m["nfe"] == 2 * nfe_of("dpmpp_2m", STEPS)
    assert t["samples"].shape == (1, 3, 16, 16)


def _error(args, tmp_path, *words):
    res = _run([*args, "--no-progress"], tmp_path / "err")
    assert res.exit_code == 2, res.output + repr(res.exception)
    for w in words:
        assert w in res.output, res.output
    assert not (tmp_path / "err").exists()  # refused before any output


def test_sample_pipeline_bad_input(sd_dir, tmp_path):
    p = ["sample", "--pipeline", str(sd_dir)]
    _error([*p, "--model", "gmm2d", "--prompt", "x"], tmp_path, "--pipeline and --model")
    _error(p, tmp_path, "--prompt")
    _error([*p, "--prompt", "a", "--prompt", "b", "--prompt", "c", "--negative", "x", "--negative", "y"], tmp_path,
           "--negative", "2 --negative for 3 --prompt")
    _error([*p, "--prompt", "a", "--height", "15"], tmp_path, "--height", "multiple of 2")
    _error([*p, "--prompt", "a", "--guidance", "apg", "--momentum", "1.5"], tmp_path, "--guidance options")
    _error([*p, "--prompt", "a", "--class", "2"], tmp_path, "--class")
    _error([*p, "--prompt", "a", "--compose", "joint"], tmp_path, "--compose:")
    _error(["sample", "--pipeline", str(tmp_path / "nowhere"), "--prompt", "a"], tmp_path, "--pipeline",
           "not a directory")
    _error(["sample", "--model", "gmm2d", "--prompt", "a"], tmp_path, "--prompt", "--pipeline only")


def test_pickle_only_pipeline_refused(sd_dir, tmp_path):
    """A component with only a .bin (not even a valid pickle: loading it would fail loudly) is refused by name."""
    bad = tmp_path / "bad"
    shutil.copytree(sd_dir, bad)
    (bad / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    (bad / "unet" / "diffusion_pytorch_model.bin").write_bytes(b"\x80\x04 this must never be unpickled")
    _error(["sample", "--pipeline", str(bad), "--prompt", "a"], tmp_path, "--pipeline", "pickle")
    _error(["align", "--pipeline", str(bad), "--prompt", "a", "--reward", "red"], tmp_path, "--pipeline", "pickle")


def test_unsupported_pipeline_family_refused(sd_dir, tmp_path):
    """A diffusers pipeline class outside the supported families is named in a --pipeline error."""
    other = tmp_path / "img2img"
    shutil.copytree(sd_dir, other)
    index = json.loads((other / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionImg2ImgPipeline"
    (other / "model_index.json").write_text(json.dumps(index))
    _error(["sample", "--pipeline", str(other), "--prompt", "a"], tmp_path, "--pipeline",
           "StableDiffusionImg2ImgPipeline", "StableDiffusionXLPipeline")


def test_align_pipeline_decoded_reward(sd_dir, tmp_path):
    """DAS, best-of-N and FK steering with a decoded-image reward: outputs, one PNG per image, images in [-1, 1],
    and the reported per-image rewards are the red reward recomputed from the saved images."""
    for method in ("das", "bon", "fk"):
        out = tmp_path / method
        m, t = _ok(["align", "--pipeline", str(sd_dir), "--prompt", "a red disk", "--reward", "red", "--method",
                    method, "--n", "2", "--particles", "2", "--steps", str(STEPS)], out)
        images = t["samples"]
        assert images.shape == (2, 3, 16, 16)
        assert float(images.min()) >= -1 and float(images.max()) <= 1
        assert len(list(out.glob("image_*.png"))) == 2
        torch.testing.assert_close(torch.tensor(m["decoded_reward_per_image"]), red(images), rtol=1e-4, atol=1e-5)


def test_align_pipeline_bad_input(sd_dir, tmp_path):
    p = ["align", "--pipeline", str(sd_dir), "--prompt", "a"]
    _error([*p, "--reward", "class:3"], tmp_path, "--reward", "red")
    _error([*p, "--reward", "red", "--model", "digits"], tmp_path, "--pipeline and --model")
    _error(["align", "--model", "gmm2d", "--reward", "linear:1,0", "--prompt", "a"], tmp_path, "--pipeline only")


def test_red_reward_on_known_images():
    """Pure red scores 2, pure green -1, grey 0; non-RGB input is refused."""
    x = -torch.ones(3, 3, 4, 4)
    x[0, 0] = 1
    x[1, 1] = 1
    x[2] = 0
    torch.testing.assert_close(red(x), torch.tensor([2.0, -1.0, 0.0]))
    with pytest.raises(ValueError, match="RGB"):
        red(torch.zeros(1, 1, 4, 4))


def test_align_pipeline_reward_gradient_through_decoder(sd_dir, tmp_path):
    """Reward-gradient guidance on the decoded red reward raises every image's redness over the unguided sample
    from the same noise (best-of-1), so the gradient reaches the latents through the VAE decoder; with --scale 3
    (CFG on the prompt) each call costs two network evaluations."""
    base = ["align", "--pipeline", str(sd_dir), "--prompt", "a red disk", "--reward", "red", "--n", "3", "--steps",
            "4"]
    plain, _ = _ok([*base, "--method", "bon", "--particles", "1"], tmp_path / "plain")
    guided, _ = _ok([*base, "--method", "guidance", "--alpha", "0.001"], tmp_path / "guided")
    cfg, _ = _ok([*base, "--method", "bon", "--particles", "1", "--scale", "3"], tmp_path / "cfg")
    assert all(g > p for g, p in zip(guided["decoded_reward_per_image"], plain["decoded_reward_per_image"],
                                     strict=True))
    assert cfg["nfe"] == 2 * plain["nfe"] and cfg["evaluations_per_denoiser_call"] == 2


def test_align_pipeline_on_a_flow_pipeline_starts_at_inf(sd3_dir, tmp_path):
    """A flow (SD3) pipeline's schedule starts at sigma = inf: DAS and best-of-N run from there, the reported
    rewards are those of the saved images, and DAS at a strong tilt raises the mean decoded reward over best-of-1
    (the plain chain) from the same seeds."""
    base = ["align", "--pipeline", str(sd3_dir), "--prompt", "a red disk", "--reward", "red", "--n", "4",
            "--steps", "4"]
    plain, _ = _ok([*base, "--method", "bon", "--particles", "1"], tmp_path / "plain")
    tilted, t = _ok([*base, "--method", "das", "--particles", "4", "--alpha", "0.001"], tmp_path / "das")
    assert torch.isfinite(t["samples"]).all()
    torch.testing.assert_close(torch.tensor(tilted["decoded_reward_per_image"]), red(t["samples"]), rtol=1e-4,
                               atol=1e-5)
    assert tilted["decoded_reward_mean"] > plain["decoded_reward_mean"]
