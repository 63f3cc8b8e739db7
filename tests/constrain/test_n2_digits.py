"""N2 of docs/methods/namm.md on the shipped digits NAMM: constraint violation >= 3x lower than the
like-for-like plain model's (same UNet, budget and seed, trained on x), FID-digits within 1.5x, and inpainting in
mirror space keeps the constraint where data-space HR does not. Samples 2 x 2000 UNet draws: slow.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.app.protocols.namm import _fid, draw
from steerdiff.constrain import TotalBrightness, brightness_digits
from steerdiff.constrain.io import load_namm
from steerdiff.constrain.mirror import MirrorDenoiser
from steerdiff.inverse.operators import Inpaint
from steerdiff.models.io import ASSETS_DIR, load


@pytest.fixture(scope="module")
def shipped():
    namm, mirror = load_namm("digits_namm")
    return namm, MirrorDenoiser(mirror, namm), load(ASSETS_DIR / "digits_namm" / "plain")


@pytest.mark.slow
def test_n2_constraint_and_fid(shipped):
    torch.set_num_threads(1)
    namm, md, plain = shipped
    n, labels = 2000, torch.arange(2000) % 10
    sig = sd.sigmas.karras(30, 0.002, 80.0)
    xp, _ = draw(plain, n, (1, 8, 8), sig, 0, labels)
    xm, _ = draw(md, n, (1, 8, 8), sig, 0, labels)
    with torch.no_grad():
        xn = namm.decode(xm)
    d = TotalBrightness(20.0)
    ref, _ = brightness_digits("test")
    assert d(xn).mean() <= d(xp).mean() / 3
    assert _fid(xn, ref)["fid_digits"] <= 1.5 * _fid(xp, ref)["fid_digits"]


@pytest.mark.slow
def test_n2_inpainting_in_mirror_space_keeps_the_constraint(shipped):
    torch.set_num_threads(1)
    namm, md, plain = shipped
    x, labels = brightness_digits("test")
    x, labels = x[:20], labels[:20]
    op = Inpaint.center((1, 8, 8))
    y = op.forward(x) + 0.05 * torch.randn(20, op.m, generator=torch.Generator().manual_seed(0))
    data = sd.inverse.solve(plain, op, y, "hr", noise_std=0.05, chains=2, cond=labels)
    mirror = md.solve(op, y, "hr", noise_std=0.05, chains=2, cond=labels)
    d = TotalBrightness(20.0)
    l_data = d(data.samples.reshape(-1, 1, 8, 8)).mean()
    l_mirror = d(mirror.samples.reshape(-1, 1, 8, 8)).mean()
    assert l_mirror <= l_data / 3
    assert data.nfe == mirror.nfe == 100  # equal cost
