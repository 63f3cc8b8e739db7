"""DiffDIS's baselines (docs/methods/diffdis.md, "Baselines"): the UNet regressor and multi-step diffusion
segmentation, on tiny networks."""

from __future__ import annotations

import math

import pytest
import torch

from steerdiff.data.dis import generate
from steerdiff.io import CheckpointError
from steerdiff.metrics.segmentation import fmeasure_curve
from steerdiff.models.precond import edm_scalings
from steerdiff.segment.baselines import (
    BaselineConfig,
    DiffusionSegmenter,
    RegressorSegmenter,
    load_baseline,
    save_baseline,
    seg_unet,
    segmentation_loss,
    time_per_image,
    train_diffusion_segmenter,
    train_regressor,
)

TINY = {"size": 32, "channels": (8, 16), "num_res_blocks": 1}


@pytest.fixture(scope="module")
def data():
    return generate(8, size=32, seed=5)


def test_same_network_for_both_and_bad_inputs(data):
    torch.manual_seed(0)
    reg = RegressorSegmenter(seg_unet(**TINY))
    dif = DiffusionSegmenter(seg_unet(**TINY))
    assert reg.num_parameters() == dif.num_parameters()
    logits = reg(data.image)
    assert logits.shape == (8, 1, 32, 32)
    probs, edges = reg.segment(data.image)
    assert edges is None and probs.min() >= 0 and probs.max() <= 1
    with pytest.raises(ValueError, match="in_channels=4"):
        RegressorSegmenter(seg_unet(**TINY).__class__(img_size=32, in_channels=3, channels=(8, 16)))
    with pytest.raises(ValueError, match=r"images must be a tensor \[B, 3, 32, 32\]"):
        reg.segment(torch.zeros(2, 3, 16, 16))
    with pytest.raises(ValueError, match="method"):
        dif.segment(data.image, method="dpm")
    with pytest.raises(ValueError, match="ensemble"):
        dif.segment(data.image, ensemble=0)
    with pytest.raises(ValueError, match="steps"):
        BaselineConfig(steps=0)


def test_low_precision_models_take_float32_images(data):
    torch.manual_seed(2)
    reg = RegressorSegmenter(seg_unet(**TINY)).to(torch.bfloat16)
    probs, _ = reg.segment(data.image[:2])
    assert probs.dtype == torch.float32 and torch.isfinite(probs).all()
    dif = DiffusionSegmenter(seg_unet(**TINY)).to(torch.bfloat16)
    torch.nn.init.normal_(dif.unet.conv_out.weight, std=0.05)
    probs, _ = dif.segment(data.image[:2], steps=2, ensemble=1)
    assert probs.dtype == torch.float32 and torch.isfinite(probs).all()


def test_segmentation_loss_closed_forms():
    m = torch.zeros(2, 1, 4, 4)
    m[:, :, :2, :3] = 1  # G = 6 of N = 16
    zero = segmentation_loss(torch.zeros_like(m), m)
    iou = (0.5 * 6 + 1) / (0.5 * 16 + 0.5 * 6 + 1)
    assert zero.item() == pytest.approx(math.log(2) + 1 - iou, rel=1e-6)
    assert segmentation_loss(40 * (2 * m - 1), m).item() == pytest.approx(0, abs=1e-6)


def test_diffusion_preconditioning_starts_at_c_skip(data):
    # The UNet's output convolution starts at zero, so the untrained denoiser is exactly c_skip(sigma) x.
    dif = DiffusionSegmenter(seg_unet(**TINY), sigma_data=0.6)
    x = torch.randn(8, 1, 32, 32)
    sigma = torch.tensor([0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 20.0, 80.0])
    c_skip = edm_scalings(sigma, 0.6)[0].reshape(-1, 1, 1, 1)
    assert torch.allclose(dif(x, sigma, data.image), c_skip * x)


def test_ensemble_is_the_mean_of_its_members_and_nfe(data):
    torch.manual_seed(1)
    dif = DiffusionSegmenter(seg_unet(**TINY), sigma_data=0.7)
    torch.nn.init.normal_(dif.unet.conv_out.weight, std=0.05)  # a non-trivial network
    img = data.image[:3]
    calls = []
    hook = dif.unet.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].shape[0]))
    both, _ = dif.segment(img, steps=3, ensemble=2, seed=7)
    assert calls == [6, 6, 6]  # Euler: one batched call per step for the whole ensemble
    calls.clear()
    dif.segment(img, steps=3, ensemble=1, method="heun")
    assert len(calls) == 2 * 3 - 1
    hook.remove()
    first, _ = dif.segment(img, steps=3, ensemble=1, seed=7)
    second, _ = dif.segment(img, steps=3, ensemble=1, seed=7 + 3)
    assert torch.allclose(both, (first + second) / 2, atol=1e-6)
    assert not torch.allclose(first, second)
    assert torch.equal(first, dif.segment(img, steps=3, ensemble=1, seed=7)[0])


def test_training_fits_and_checkpoints_round_trip(data, tmp_path):
    cfg = BaselineConfig(steps=40, batch=8, lr=5e-3, log_every=10, **TINY)
    reg, info = train_regressor(cfg, data=data)
    assert info["losses"][-1] < 0.7 * info["losses"][0] and info["cpu_seconds"] > 0
    untrained = RegressorSegmenter(seg_unet(**TINY))
    fit = fmeasure_curve(reg.segment(data.image)[0], data.mask).mean(0).max()
    assert fit > fmeasure_curve(untrained.segment(data.image)[0], data.mask).mean(0).max() + 0.1
    dif, dinfo = train_diffusion_segmenter(BaselineConfig(steps=4, batch=4, log_every=2, **TINY), data=data)
    p = data.mask.mean().item()
    assert dif.sigma_data == pytest.approx(2 * math.sqrt(p * (1 - p))) and math.isfinite(dinfo["losses"][-1])
    for model, opts in ((reg, {}), (dif, {"steps": 2, "ensemble": 1})):
        path = save_baseline(model, tmp_path / model.kind, {"cpu_seconds": 1.0})
        again = load_baseline(path)
        assert type(again) is type(model)
        assert torch.equal(again.segment(data.image[:2], **opts)[0], model.segment(data.image[:2], **opts)[0])
    assert time_per_image(lambda x: reg.segment(x), data.image[:2]) > 0
    with pytest.raises(CheckpointError, match="no config.json"):
        load_baseline(tmp_path / "nothing")
    cfg_file = tmp_path / "regressor" / "config.json"
    cfg_file.write_text(cfg_file.read_text().replace("segment.regressor/1", "segment.other/9"))
    with pytest.raises(CheckpointError, match="format"):
        load_baseline(tmp_path / "regressor")
