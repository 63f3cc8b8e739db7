"""FlowModel: a registered FlowDenoiser, its checkpoint format (save/load round trips), and the shipped digits_flow."""

import pytest
import torch

import steerdiff as sd
from steerdiff.core import FlowDenoiser
from steerdiff.io import CheckpointError, read_json, write_json
from steerdiff.models import FlowModel, UNet, load, save

SIGMAS = torch.tensor([float("inf"), 3.0, 0.2])


def tiny_unet(seed: int = 0) -> UNet:
    torch.manual_seed(seed)
    net = UNet(img_size=4, in_channels=1, channels=[8], num_res_blocks=1, num_classes=3, emb_dim=16, fourier_dim=8,
               norm_groups=4)
    with torch.no_grad():  # a non-zero output layer, so that the weights round trip is visible in D
        net.conv_out.weight.normal_(0, 0.3)
    return net


def outputs(model) -> torch.Tensor:
    x = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(x, SIGMAS, torch.tensor([0, 2, -1]))


def test_flow_model_is_the_wrapper_around_its_backbone():
    net = tiny_unet()
    model = FlowModel(net, t_scale=1.0)
    plain = FlowDenoiser(net, prediction="velocity", t_scale=1.0)
    assert isinstance(model, FlowDenoiser) and model.sigma_range == (0.0, float("inf"))
    assert model.sample_shape == (1, 4, 4) and model.num_classes == (3,)
    assert torch.equal(outputs(model), outputs(plain))
    # D = x_t - t v with t = sigma / (1 + sigma), x_t = x / (1 + sigma) (at inf: t = 1, x_t = x)
    x = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([1.0, 0.75, 0.2 / 1.2])
    x_t = x * torch.tensor([1.0, 0.25, 1 / 1.2])[:, None, None, None]
    with torch.no_grad():
        want = x_t - t[:, None, None, None] * net(x_t, t, torch.tensor([0, 2, -1]))
    assert torch.allclose(outputs(model), want, atol=1e-6)


def test_save_load_round_trip(tmp_path):
    model = FlowModel(tiny_unet(), t_scale=1.0)
    save(model, tmp_path / "m")
    spec = read_json(tmp_path / "m" / "config.json")
    assert spec["class"] == "FlowModel" and spec["config"]["net"]["class"] == "UNet"
    back = load(tmp_path / "m")
    assert type(back) is FlowModel and back.config == model.config and not back.training
    assert torch.equal(outputs(back), outputs(model))


def test_plain_flow_denoiser_saves_as_flow_model(tmp_path):
    plain = FlowDenoiser(tiny_unet(seed=1), t_scale=7.0)
    save(plain, tmp_path / "p")
    back = load(tmp_path / "p")
    assert isinstance(back, FlowModel) and back.t_scale == 7.0
    assert torch.equal(outputs(back), outputs(plain))


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(TypeError, match="not a registered steerdiff backbone"):
        save(FlowDenoiser(lambda x_t, t, cond: x_t, t_scale=1.0), tmp_path / "f")
    with pytest.raises(TypeError, match="net must be a backbone module"):
        FlowModel("UNet")
    with pytest.raises(ValueError, match="prediction must be one of"):
        FlowModel(tiny_unet(), prediction="score")
    save(FlowModel(tiny_unet(), t_scale=1.0), tmp_path / "m")
    spec = read_json(tmp_path / "m" / "config.json")
    spec["config"]["net"]["config"]["channels"] = [16]  # the weights no longer fit the config
    write_json(tmp_path / "m" / "config.json", spec)
    with pytest.raises(CheckpointError):
        load(tmp_path / "m")


def test_shipped_digits_flow_loads_as_a_flow_denoiser():
    model = load("digits_flow")
    assert isinstance(model, FlowModel) and isinstance(model, FlowDenoiser)
    assert model.sample_shape == (1, 8, 8) and model.num_classes == (10,) and model.prediction == "velocity"
    assert "digits_flow" in sd.models.shipped_models()
    # a quick look from pure noise: 40 digits, Euler, 8 steps of the uniform flow grid
    labels = torch.arange(40) % 10
    with torch.no_grad():
        x = sd.sample(model, sd.core.randn((40, 1, 8, 8), seeds=1), sd.sigmas.flow(8, grid="flux"), method="euler",
                      cond=labels)
    assert bool(torch.isfinite(x).all())
    assert float((load("digits_classifier").predict(x.clamp(-1, 1)) == labels).double().mean()) > 0.8


@pytest.mark.slow
def test_shipped_digits_flow_samples_the_right_classes_from_pure_noise():
    """Euler, 20 steps of the flow grid from sigma = inf: the shipped classifier reads > 90% of the asked classes."""
    model, clf = load("digits_flow"), load("digits_classifier")
    labels = torch.arange(300) % 10
    noise = sd.core.randn((300, 1, 8, 8), seeds=0)
    with torch.no_grad():
        x = sd.sample(model, noise, sd.sigmas.flow(20), method="euler", cond=labels)
    assert float((clf.predict(x.clamp(-1, 1)) == labels).double().mean()) > 0.9
