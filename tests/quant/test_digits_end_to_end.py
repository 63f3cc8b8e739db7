"""T3 end to end on the shipped digits UNet (docs/methods/svdquant.md, "Validation"), slow: SVDQuant W4A4 (r = 8)
against naive W4A4
and searched SmoothQuant, same noise, labels and sampler (DDIM, 20 Karras steps, NFE 20); fp32 is the reference.

Independent truth: the fp32 model's own images and the held-out real digits (FD of classifier features).
"""

from __future__ import annotations

import pytest
import torch

import steerdiff as sd
import steerdiff.quant as sq

N = 500  # FD samples (the benchmark's number); image MSE on the first 256


@pytest.mark.slow
def test_t3_digits_svdquant_beats_naive_and_smoothquant(digits):
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
    res = {}
    for name, method, kw in [("naive", "rtn", {}), ("smoothquant", "smoothquant", {}),
                             ("svdquant", "svdquant", {"rank": 8})]:
        out = images(sq.quantize(digits, method, calib=calib, **kw))
        res[name] = (float(((out[:256] - ref[:256]) / 2).pow(2).mean()),
                     frechet_distance(real, classifier_features(clf, out)))
    assert res["svdquant"][0] <= 0.5 * res["naive"][0], res
    assert res["svdquant"][0] < res["smoothquant"][0], res
    assert res["svdquant"][1] <= res["naive"][1], res
