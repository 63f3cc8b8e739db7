"""A tiny UNet and a tiny DiT trained briefly on one digit class generate that class (shipped classifier)."""

import pytest
import torch

import steerdiff as sd
from steerdiff.data.digits import load_digits
from steerdiff.metrics.images import class_accuracy
from steerdiff.models import DiT, EDMPrecond, UNet, load, shipped_models
from steerdiff.train import train

pytestmark = pytest.mark.skipif("digits_classifier" not in shipped_models(), reason="shipped classifier missing")


def _tiny(kind: str) -> EDMPrecond:
    torch.manual_seed(0)
    if kind == "unet":
        return EDMPrecond(UNet(img_size=8, in_channels=1, channels=[16, 32], num_res_blocks=1, norm_groups=8))
    return EDMPrecond(DiT(img_size=8, in_channels=1, patch_size=2, width=48, depth=2, heads=4))


@pytest.mark.parametrize("kind", ["unet", "dit"])
def test_short_training_moves_samples_toward_the_class(kind, tmp_path):
    x, y = load_digits("train")
    threes = x[y == 3]
    cfg = dict(steps=300, batch_size=64, lr=2e-3, warmup_steps=20, ema_decay=0.95, p_uncond=0.0,
               checkpoint_every=1000, seed=0)
    model = train(_tiny(kind), threes, cfg, tmp_path, progress=False).model
    clf = load("digits_classifier")
    labels = torch.full((64,), 3)
    with torch.no_grad():
        samples = sd.sample(model, sd.randn((64, 1, 8, 8), seeds=0), sd.sigmas.karras(20, 0.002, 80.0))
        untrained = sd.sample(_tiny(kind), sd.randn((64, 1, 8, 8), seeds=0), sd.sigmas.karras(20, 0.002, 80.0))
    acc = class_accuracy(clf, samples.clamp(-1, 1), labels)
    # Chance is 0.1; the untrained network's samples are not threes.
    assert acc >= 0.5, acc
    assert class_accuracy(clf, untrained.clamp(-1, 1), labels) < 0.3
