"""Quantized checkpoints through ``steerdiff.models.save`` / ``load`` (the quantized format registers its saver),
bit-exact for every method and format, and clear errors for checkpoints and templates that do not fit
(docs/methods/svdquant.md, "Storage and bits per weight")."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import steerdiff as sd
import steerdiff.quant as sq
from steerdiff.io import CheckpointError

from .conftest import denoiser_inputs, tiny_dit, tiny_mlp, tiny_unet

BUILD = {"mlp": tiny_mlp, "unet": tiny_unet, "dit": tiny_dit}
OPTIONS = {"num_grids": 2, "num_iters": 2, "max_tokens": 256}


def _calls(model, n: int, seed: int):
    return denoiser_inputs(model, n, seed, cond=bool(getattr(model, "num_classes", ())))


def _quantized(kind: str, method: str, fmt: str = "int4"):
    model = BUILD[kind]()
    rank = None if kind == "mlp" else 4  # the MLP's 32->2 output layer allows rank 0 only (the default there)
    return sq.quantize(model, method, fmt=fmt, rank=rank, calib=[_calls(model, 32, 1)], **OPTIONS)


def _assert_same_model(a, b):
    assert type(a) is type(b) and not b.training
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    x, sigma, cond = _calls(a, 8, 2)
    with torch.no_grad():
        assert torch.equal(a(x, sigma, cond), b(x, sigma, cond))  # bit-exact outputs


@pytest.mark.parametrize("kind,method,fmt", [
    ("mlp", "svdquant", "int4"), ("mlp", "svdquant", "nvfp4"), ("mlp", "rtn", "int4"), ("mlp", "rtn", "nvfp4"),
    ("mlp", "smoothquant", "int4"), ("mlp", "smoothquant", "nvfp4"), ("mlp", "svd", "int4"), ("mlp", "svd", "nvfp4"),
    ("mlp", "w4a16", "int4"), ("mlp", "w8a8", "int4"),
    ("unet", "svdquant", "int4"), ("unet", "w4a16", "int4"), ("dit", "svdquant", "nvfp4"), ("dit", "w8a8", "int4"),
])
def test_models_save_then_load_returns_the_same_quantized_model(tmp_path, kind, method, fmt):
    q = _quantized(kind, method, fmt)
    path = sd.models.save(q, tmp_path / "q")
    assert json.loads((path / "config.json").read_text())["class"] == "QuantizedModel"
    back = sd.models.load(path)
    _assert_same_model(q, back)
    info, back_info = sq.quant_info(q), sq.quant_info(back)
    assert (back_info["method"], back_info["fmt"], back_info["layers"]) == (info["method"], info["fmt"], info["layers"])
    _assert_same_model(back, sq.load(path))  # the quantized format's own loader reads the same directory


def test_a_quantized_model_steerdiff_cannot_rebuild_points_to_quant_save_and_load(tmp_path):
    base = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 16)).eval()
    q = sq.quantize(base, "w8a8")
    with pytest.raises(TypeError, match=r"save it with steerdiff.quant.save\(model, directory\) and load it with "
                                        r"steerdiff.quant.load\(directory, template=<the unquantized model>\)"):
        sd.models.save(q, tmp_path / "m")
    assert not (tmp_path / "m").exists()
    path = sq.save(q, tmp_path / "q")  # the quantized format's own saver writes it (base: null)
    with pytest.raises(CheckpointError, match=r"load it with steerdiff.quant.load\(directory, template="):
        sd.models.load(path)
    back = sq.load(path, template=base)
    x = torch.randn(5, 64)
    with torch.no_grad():
        assert torch.equal(back(x), q(x))


def test_a_quantized_diffusers_denoiser_points_to_quant_save_and_load(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
                                 block_out_channels=(16, 32), norm_num_groups=8,
                                 down_block_types=("DownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "UpBlock2D")).eval()
    D = sd.models.from_diffusers(unet, diffusers.DDPMScheduler(num_train_timesteps=100))
    q = sq.quantize(D, "w8a8")
    with pytest.raises(TypeError, match="steerdiff.quant.save"):
        sd.models.save(q, tmp_path / "m")
    back = sq.load(sq.save(q, tmp_path / "q"), template=D)
    x, sigma = torch.randn(2, 1, 8, 8), torch.tensor([0.5, 3.0])
    with torch.no_grad():
        assert torch.equal(back(x, sigma), q(x, sigma))


def test_a_bare_quantized_layer_round_trips(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    x = torch.randn(16, 64)
    q = sq.quantize(lin, "svdquant", rank=4, calib=x, num_grids=2, num_iters=2)
    back = sq.load(sq.save(q, tmp_path / "layer"), template=lin)
    assert isinstance(back, sq.SVDQLayer)
    with torch.no_grad():
        assert torch.equal(back(x), q(x))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    q = _quantized("mlp", "svdquant")
    return sd.models.save(q, tmp_path_factory.mktemp("quant") / "q"), q


def _corrupt(src, tmp_path, edit) -> object:
    import shutil

    dst = tmp_path / "bad"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _first_layer(cfg) -> dict:
    return cfg["quantization"]["layers"][next(iter(cfg["quantization"]["layers"]))]


@pytest.mark.parametrize("key,value,match", [
    ("out_channels", -1, "'out_channels' must be an integer >= 1, got -1"),
    ("in_channels", 0, "'in_channels' must be an integer >= 1, got 0"),
    ("group", 0, "'group' must be an integer >= 2, got 0"),
    ("group", 3, "'group' must be even"),
    ("rank", -1, "'rank' must be an integer >= 0, got -1"),
    ("rank", 2.5, "'rank' must be an integer >= 0, got 2.5"),
    ("kernel", [3], r"'kernel' must be a list of two integers >= 1, got \[3\]"),
    ("kernel", [3, 3], r"a linear layer has kernel \[1, 1\]"),
    ("kind", "conv3d", "'kind' must be 'linear' or 'conv2d', got 'conv3d'"),
    ("wfmt", "int3", r"'wfmt' must be one of \['int4', 'nvfp4', 'none'\], got 'int3'"),
    ("afmt", None, r"'afmt' must be one of"),
    ("factor_dtype", "float8", "'factor_dtype' must be one of"),
    ("k_layout", "rows", "'k_layout' must be one of"),
    ("shift", "0.2", "'shift' must be a number"),
    ("type", "GPTQLayer", "has no valid 'type'"),
])
def test_a_corrupt_layer_description_is_a_checkpoint_error(tmp_path, saved, key, value, match):
    path = _corrupt(saved[0], tmp_path, lambda cfg: _first_layer(cfg).__setitem__(key, value))
    for loader in (sd.models.load, sq.load):
        with pytest.raises(CheckpointError, match=match):
            loader(path)


@pytest.mark.parametrize("edit,match", [
    (lambda cfg: cfg["quantization"].__setitem__("method", "gptq"), "'quantization.method' must be one of"),
    (lambda cfg: cfg["quantization"].__setitem__("fmt", "int3"), "'quantization.fmt' must be 'int4', 'nvfp4' or null"),
    (lambda cfg: cfg["quantization"]["layers"].__setitem__("", {}), "layer '' .* cannot come with other layers"),
    (lambda cfg: cfg["quantization"]["layers"].__setitem__("net.fourier", _first_layer(cfg)),
     "replaces a FourierFeatures in the base model, not an nn.Linear or nn.Conv2d"),
    (lambda cfg: _first_layer(cfg).__setitem__("out_channels", 16),
     r"is linear 10->16 but the base model's layer there is linear 10->32"),
])
def test_a_corrupt_quantization_record_is_a_checkpoint_error(tmp_path, saved, edit, match):
    path = _corrupt(saved[0], tmp_path, edit)
    with pytest.raises(CheckpointError, match=match):
        sd.models.load(path)


def test_missing_files_and_templates_that_do_not_fit(tmp_path, saved):
    import shutil

    src, q = saved
    for name, match in (("model.safetensors", "no model.safetensors"), ("config.json", "config.json: file not found")):
        dst = tmp_path / name
        shutil.copytree(src, dst)
        (dst / name).unlink()
        with pytest.raises(CheckpointError, match=match):
            sd.models.load(dst)
        with pytest.raises(CheckpointError, match="file not found"):
            sq.load(dst)
    other = tiny_mlp()
    other.net.body[2] = nn.Linear(32, 16)  # same layer names, another width
    with pytest.raises(CheckpointError, match="is linear 32->32 but the base model's layer there is linear 32->16"):
        sq.load(src, template=other)
    with pytest.raises(TypeError, match="template must be the unquantized model"):
        sq.load(src, template="digits")


def test_device_strings_are_checked_before_loading(saved):
    with pytest.raises(ValueError, match="device must be a device such as 'cpu', 'cuda' or 'cuda:0', got 'gpu'"):
        sq.load(saved[0], device="gpu")
    with pytest.raises(TypeError, match="device must be a torch.device or a string"):
        sq.load(saved[0], device=2.5)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda' is not available on this machine"):
            sq.load(saved[0], device="cuda")


def test_quant_save_never_destroys_what_is_not_a_checkpoint(tmp_path, saved):
    q = saved[1]
    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="is an existing file"):
        sq.save(q, tmp_path / "notes.txt")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "data.csv").write_text("keep")
    with pytest.raises(ValueError, match="non-empty directory that holds no checkpoint"):
        sq.save(q, tmp_path / "work")
    assert (tmp_path / "notes.txt").read_text() == "keep" and (tmp_path / "work" / "data.csv").read_text() == "keep"
