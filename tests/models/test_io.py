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
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [".steerdiff-checkpoint", "config.json",
                                                                   "model.safetensors"]
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


# ---------------------------------------------------------------------------------------------- every kind of model


def test_classifier_round_trip(tmp_path):
    from steerdiff.models import ImageClassifier

    model = randomize(ImageClassifier(in_channels=1, classes=[10], channels=[4, 8], feature_dim=8)).eval()
    loaded = load(save(model, tmp_path / "clf"))
    assert type(loaded) is ImageClassifier and not loaded.training
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


@pytest.mark.parametrize("spec", [
    {"class": "DiT", "config": {"width": -8}},
    {"class": "MLP", "config": {"dim": 2, "hidden": [4], "noise_dim": -2}},
    {"class": "ImageClassifier", "config": {"channels": [-1]}},
])
def test_configs_torch_cannot_build_are_checkpoint_errors(tmp_path, spec):
    with pytest.raises(CheckpointError, match=f"invalid config for model class '{spec['class']}'"):
        build_model(spec)
    save(tiny_models()[0], tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match="invalid config"):
        load(tmp_path / "m")


def test_device_strings_are_checked_before_any_file_is_read():
    with pytest.raises(ValueError, match="device must be a device such as 'cpu', 'cuda' or 'cuda:0', got 'gpu'"):
        load("no_such_model", device="gpu")  # the device is named, not the (also unknown) model
    with pytest.raises(TypeError, match="device must be a torch.device or a string"):
        load("digits", device=2.5)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda' is not available on this machine"):
            load("digits", device="cuda")
        with pytest.raises(ValueError, match="device"):
            load("digits", device=7)
    for device in (torch.device("cpu"), "cpu:0", None):  # None: the default, the CPU
        assert next(load("digits", device=device).parameters()).device.type == "cpu"


def test_save_never_destroys_what_is_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="is an existing file"):
        save(tiny_models()[0], tmp_path / "notes.txt")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "thesis.tex").write_text("keep")
    with pytest.raises(ValueError, match="non-empty directory that holds no checkpoint"):
        save(tiny_models()[0], tmp_path / "work")
    assert (tmp_path / "notes.txt").read_text() == "keep"
    assert (tmp_path / "work" / "thesis.tex").read_text() == "keep"


def test_unregistered_and_analytic_models_are_refused_with_what_to_do(tmp_path):
    from steerdiff.models import builtin_mixture

    with pytest.raises(TypeError, match=r"Sequential, which is not a registered steerdiff model: decorate its class "
                                        r"with @steerdiff.models.register_model\(\)"):
        save(nn.Sequential(nn.Linear(2, 2)), tmp_path / "a")
    with pytest.raises(TypeError, match="analytic GaussianMixture.*builtin_mixture"):
        save(builtin_mixture("gmm2d"), tmp_path / "b")
    with pytest.raises(TypeError, match="must be a registered steerdiff model .* got function"):
        save(lambda x, sigma: x, tmp_path / "c")
    assert list(tmp_path.iterdir()) == []


def test_a_diffusers_denoiser_is_refused_pointing_to_save_pretrained(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    from steerdiff.models import from_diffusers

    unet = diffusers.UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
                                 block_out_channels=(8, 16), norm_num_groups=4,
                                 down_block_types=("DownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "UpBlock2D"))
    D = from_diffusers(unet, diffusers.DDPMScheduler(num_train_timesteps=100))
    with pytest.raises(TypeError, match=r"from_diffusers: save the UNet and its scheduler with "
                                        r"unet.save_pretrained\(dir\) and scheduler.save_pretrained\(dir\)"):
        save(D, tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_ocm_heads_need_their_denoiser_so_models_save_and_load_point_to_the_head_functions(tmp_path):
    from steerdiff.covariance import InputHead, load_head, save_head

    head, den = InputHead(2, hidden=8), randomize(tiny_models()[0]).eval()
    with pytest.raises(TypeError, match=r"save it with steerdiff.covariance.save_head\(head, directory, denoiser\)"):
        save(head, tmp_path / "m")
    save_head(head, tmp_path / "h", denoiser=den, denoiser_name="tiny")
    with pytest.raises(CheckpointError, match=r"OCM covariance head \(trained for denoiser tiny\).*"
                                              r"steerdiff.covariance.load_head\(directory, denoiser\)"):
        load(tmp_path / "h")
    assert isinstance(load_head(tmp_path / "h", den), InputHead)  # its own loader still reads it
    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="is an existing file"):
        save_head(head, tmp_path / "notes.txt", denoiser=den)  # nor does it destroy what is not a checkpoint
    assert (tmp_path / "notes.txt").read_text() == "keep"
    with pytest.raises(CheckpointError, match="load_head"):
        load("digits_ocm")  # the shipped head
    assert "digits_ocm" not in io.shipped_models() and "digits" in io.shipped_models()


def test_namm_bundles_are_refused_pointing_to_save_and_load_namm(tmp_path):
    from steerdiff.constrain import NAMM, ICNNMap, ResidualMLP, unit_circle_distance
    from steerdiff.constrain.io import load_namm, save_namm

    namm = NAMM(ICNNMap(dim=2, hidden=8), ResidualMLP(dim=2, hidden=8), unit_circle_distance)
    with pytest.raises(TypeError, match=r"save it with steerdiff.constrain.io.save_namm\(namm, directory"):
        save(namm, tmp_path / "m")
    save_namm(namm, tmp_path / "bundle")
    with pytest.raises(CheckpointError, match=r"NAMM bundle \(namm.json\).*steerdiff.constrain.io.load_namm"):
        load(tmp_path / "bundle")
    assert isinstance(load_namm(tmp_path / "bundle")[0], NAMM)
    save_namm(namm, tmp_path / "bundle")  # a bundle directory (namm.json) is replaced as a checkpoint
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("keep")
    with pytest.raises(ValueError, match="non-empty directory that holds no checkpoint"):
        save_namm(namm, tmp_path / "data")
    assert (tmp_path / "data" / "x.csv").read_text() == "keep"
    with pytest.raises(CheckpointError, match="load_namm"):
        load("digits_namm")  # the shipped bundle, by name
