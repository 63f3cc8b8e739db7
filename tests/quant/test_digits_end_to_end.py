"""T3 end to end on the shipped digits UNet (docs/methods/svdquant.md, "Validation"), slow: SVDQuant W4A4 (r = 8)
against naive W4A4 and searched SmoothQuant, same noise, labels and sampler (DDIM, 20 Karras steps, NFE 20); fp32
is the reference.

Independent truth: the fp32 model's own images and the held-out real digits (FD of classifier features).

The spec's ``FD(SVDQuant) <= FD(RTN)`` is a strict xfail: RTN's FD falls below the fp32 model's own (the criterion
compares sampling noise around fp32's FD; docs/methods/svdquant.md, "Errata and measured deviations"); an XPASS
fails the run, so a change that makes it hold shows up.
"""

from __future__ import annotations

import pytest
import torch

import steerdiff as sd
import steerdiff.quant as sq

N = 500  # FD samples; image MSE on the first 256


@pytest.fixture(scope="module")
def t3(digits):
    """``{variant: (image MSE against fp32 on [0, 1], FD against the held-out digits)}`` for fp32, naive W4A4 (RTN),
    searched SmoothQuant and SVDQuant r = 8."""
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import classifier_features, frechet_distance
    from steerdiff.models.io import load

    clf = load("digits_classifier")
    real = classifier_features(clf, load_digits("test")[0])
    calib = sq.trajectory_calibration(digits)
    noise = sd.randn((N, 1, 8, 8), seeds=0)
    cond = torch.arange(N) % 10
    sigmas = sd.sigmas.karras(20, 0.002, 80.0)

    def images(model):
        with torch.no_grad():
            return sd.sample(model, noise, sigmas, method="ddim", cond=cond).clamp(-1, 1)

    ref = images(digits)
    res = {"fp32": (0.0, frechet_distance(real, classifier_features(clf, ref)))}
    for name, method, kw in [("naive", "rtn", {}), ("smoothquant", "smoothquant", {}),
                             ("svdquant", "svdquant", {"rank": 8})]:
        out = images(sq.quantize(digits, method, calib=calib, **kw))
        res[name] = (float(((out[:256] - ref[:256]) / 2).pow(2).mean()),
                     frechet_distance(real, classifier_features(clf, out)))
    return res


@pytest.mark.slow
def test_t3_digits_svdquant_images_beat_naive_and_smoothquant(t3):
    assert t3["svdquant"][0] <= 0.5 * t3["naive"][0], t3
    assert t3["svdquant"][0] < t3["smoothquant"][0], t3


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="FD(RTN) falls below FD(fp32) itself (0.260 vs 0.269 here; 0.225 vs 0.230 on "
                                       "other noise) and SVDQuant's sits at fp32's: the criterion compares noise "
                                       "(docs/methods/svdquant.md, 'Errata and measured deviations')")
def test_t3_digits_svdquant_fd_at_most_naive(t3):
    assert t3["svdquant"][1] <= t3["naive"][1], t3
