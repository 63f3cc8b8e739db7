"""Checkpoint I/O: safetensors + config.json round trips, refusal of pickles, clear errors, atomic writes."""

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from steerdiff.io import CheckpointError
from steerdiff.models import io
from steerdiff.models.dit import DiT
from steerdiff.models.io import build_model, load, model_spec, register_model, save
from steerdiff.models.mlp import MLP
from steerdiff.models.precond import EDMPrecond
from steerdiff.models.unet import UNet


def tiny_models():
    return [
        EDMPrecond(MLP(dim=2, hidden=[16], num_classes=[2, 3], cond_dim=4, fourier_dim=8, noise_dim=8), 0.5),
        EDMPrecond(
            UNet(
                img_size=8,
                in_channels=1,
                channels=[8, 16],
                num_res_blocks=1,
                num_classes=10,
                emb_dim=16,
                fourier_dim=8,
                norm_groups=4,
            ),
            0.6,
        ),
        EDMPrecond(
            DiT(
                img_size=6,
                in_channels=3,
                patch_size=3,
                width=16,
                depth=1,
                heads=2,
                num_classes=[4, 4],
                fourier_dim=8,
            )
        ),
    ]


def randomize(model: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


def example_inputs(model):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, *model.sample_shape, generator=g)
    sigma = torch.tensor([0.05, 1.0, 20.0])
    m = len(model.num_classes)
    cond = torch.tensor([[0] * m, [-1] * m, [1] * m]) if m > 1 else torch.tensor([0, -1, 1])
    return x, sigma, cond


@pytest.mark.parametrize("index", [0, 1, 2])
def test_round_trip_identical_outputs(tmp_path, index):
    model = randomize(tiny_models()[index]).eval()
    save(model, tmp_path / "m")
    loaded = load(tmp_path / "m")
    assert not loaded.training
    assert type(loaded.net) is type(model.net)
    x, sigma, cond = example_inputs(model)
    with torch.no_grad():
        assert torch.equal(loaded(x, sigma, cond), model(x, sigma, cond))
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["class"] == "EDMPrecond"
    assert config["config"]["net"]["class"] == type(model.net).__name__
    assert "steerdiff_version" in config
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    # The config file or the weights file name the same checkpoint.
    for path in (tmp_path / "m" / "config.json", tmp_path / "m" / "model.safetensors", str(tmp_path / "m")):
        assert torch.equal(
            load(path).net.state_dict()[next(iter(model.net.state_dict()))],
            model.net.state_dict()[next(iter(model.net.state_dict()))],
        )


def test_build_model_from_json_spec():
    model = tiny_models()[2]
    spec = json.loads(json.dumps(model_spec(model)))
    rebuilt = build_model(spec)
    assert rebuilt.config == model.config
    assert rebuilt.sample_shape == model.sample_shape and rebuilt.num_classes == (4, 4)


def test_unknown_class_and_bad_config(tmp_path):
    save(tiny_models()[0], tmp_path / "m")
    cfg_path = tmp_path / "m" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["config"]["net"]["class"] = "NoSuchNet"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown model class 'NoSuchNet'.*registered"):
        load(tmp_path / "m")
    cfg["config"]["net"] = {"class": "MLP", "config": {"dim": 2, "bogus_option": 3}}
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="invalid config for model class 'MLP'"):
        load(tmp_path / "m")
    cfg_path.write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        load(tmp_path / "m")
    assert issubclass(CheckpointError, ValueError)


def test_truncated_and_corrupt_safetensors(tmp_path):
    save(tiny_models()[1], tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        load(tmp_path / "m")
    weights.write_bytes(b"\x00" * 3)
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        load(tmp_path / "m")


def test_tensor_name_and_shape_mismatch(tmp_path):
    save(tiny_models()[0], tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    extra = dict(tensors, surprise=torch.zeros(1))
    del extra[name]
    save_file(extra, str(weights))
    with pytest.raises(CheckpointError, match=rf"missing \['{name}'\].*unexpected \['surprise'\]"):
        load(tmp_path / "m")
    wrong = dict(tensors)
    wrong[name] = torch.zeros(7, 7)
    save_file(wrong, str(weights))
    with pytest.raises(CheckpointError, match="shapes do not match"):
        load(tmp_path / "m")


class Evil:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickles_are_refused_without_unpickling(tmp_path):
    marker = tmp_path / "PWNED"
    d = tmp_path / "pickled"
    d.mkdir()
    torch.save(tiny_models()[0].state_dict(), d / "model.pt")
    (d / "model.pkl").write_bytes(pickle.dumps(Evil(marker)))
    (d / "weights.ckpt").write_bytes(pickle.dumps(Evil(marker)))
    for path in (d / "model.pt", d / "model.pkl", d / "weights.ckpt", str(d / "model.pkl")):
        with pytest.raises(CheckpointError, match="only safetensors"):
            load(path)
    with pytest.raises(CheckpointError, match="only safetensors.*pickle"):
        load(d)
    # A pickle disguised under the safetensors name is rejected by the header parser, never unpickled.
    save(tiny_models()[0], tmp_path / "disguised")
    (tmp_path / "disguised" / "model.safetensors").write_bytes(pickle.dumps(Evil(marker)))
    with pytest.raises(CheckpointError, match="not a valid safetensors"):
        load(tmp_path / "disguised")
    assert not marker.exists()
    # Control: the payload really does run when unpickled, so the assertion above is meaningful.
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Evil(control)))
    assert control.exists()


def test_shipped_names(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "ASSETS_DIR", tmp_path / "assets")
    with pytest.raises(CheckpointError, match="unknown model 'digits'.*shipped models: none"):
        load("digits")
    model = randomize(tiny_models()[1])
    save(model, tmp_path / "assets" / "tiny_unet")
    assert io.shipped_models() == ["tiny_unet"]
    loaded = load("tiny_unet")
    x, sigma, cond = example_inputs(model)
    with torch.no_grad():
        assert torch.equal(loaded(x, sigma, cond), model.eval()(x, sigma, cond))
    with pytest.raises(CheckpointError, match=r"shipped models: \['tiny_unet'\]"):
        load("tiny_dit")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load(tmp_path / "nowhere" / "m")


def test_atomic_save_leaves_nothing_on_failure(tmp_path, monkeypatch):
    model = tiny_models()[0]

    def exploding_save(tensors, path):
        Path(path).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(io, "save_tensors", exploding_save)
    with pytest.raises(OSError, match="disk full"):
        save(model, tmp_path / "new")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    save(model, tmp_path / "existing")
    before = (tmp_path / "existing" / "model.safetensors").read_bytes()
    monkeypatch.setattr(io, "save_tensors", exploding_save)
    with pytest.raises(OSError):
        save(randomize(tiny_models()[0]), tmp_path / "existing")
    assert [p.name for p in tmp_path.iterdir()] == ["existing"]
    assert (tmp_path / "existing" / "model.safetensors").read_bytes() == before
    monkeypatch.undo()

    save(randomize(tiny_models()[0]), tmp_path / "existing")  # overwrite works and cleans up
    assert [p.name for p in tmp_path.iterdir()] == ["existing"]
    assert (tmp_path / "existing" / "model.safetensors").read_bytes() != before


def test_registry_rules():
    with pytest.raises(TypeError, match="not a registered model"):
        model_spec(nn.Linear(2, 2))

    with pytest.raises(ValueError, match="already registered"):

        @register_model("MLP")
        class Other(nn.Module):
            pass
