"""The shipped OCM head of the digits UNet (docs/methods/ocm.md, "Digits gate"), and that it refuses other
denoisers (bad input gets a clear error; docs/methods/conventions.md, "Errors")."""

import json
import math
import warnings

import pytest
import torch

import steerdiff as sd
from steerdiff.core.sigmas import vp_linear
from steerdiff.covariance import TrunkHead, load_head_for
from steerdiff.covariance.store import denoiser_fingerprint
from steerdiff.models.io import ASSETS_DIR, load


@pytest.fixture(scope="module")
def digits():
    return load("digits")


def test_shipped_head_belongs_to_the_shipped_unet(digits):
    head = load_head_for("digits", digits)
    # softplus: positive by construction (issue 40: the former direct head predicted c < 0 for 41.6% of a run)
    assert isinstance(head, TrunkHead) and head.param == "softplus" and head.c_max == 1.0
    cfg = json.loads((ASSETS_DIR / "digits_ocm" / "config.json").read_text())
    assert cfg["denoiser_fingerprint"] == denoiser_fingerprint(digits) == head.denoiser_fingerprint
    metrics = json.loads((ASSETS_DIR / "digits_ocm" / "metrics.json").read_text())
    assert metrics["train_steps"] == metrics["recipe"]["train"]["steps"]
    # The stored sampling default is the recipe's last-step clip, (clip_pixel * bin * sqrt(pi/2))^2, bin = 2/16.
    clip = metrics["recipe"]["sampling"]["clip_pixel"]
    assert head.last_step_var_max == pytest.approx((clip * 2 / 16 * math.sqrt(math.pi / 2)) ** 2)


def test_shipped_head_samples_through_sd_sample(digits):
    head = load_head_for("digits", digits)
    noise = sd.randn((4, 1, 8, 8), seeds=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, stats = sd.sample(digits, noise, vp_linear(3), method="ocm-ddim", covariance=head,
                             cond=torch.arange(4), generator=0, return_stats=True)
    # The shipped head's variances are positive by construction: nothing is clamped, nothing is reported (a head
    # that predicts negative variances gets them clamped, counted and reported in one warning: test_heads.py).
    assert stats.clamped == 0 and not caught
    assert x.shape == noise.shape and torch.isfinite(x).all() and stats.nfe == 3
    assert x.abs().max() <= 1.0


def test_shipped_head_tracks_monte_carlo_covariance(digits):
    """At mid noise the head's mean c agrees with a 64-probe Monte Carlo diagonal of the same UNet (the protocol's
    first run, on a tiny MLP denoiser, found 3.5% for sigma <= 2.6; we require 15% on 16 test images, the Monte Carlo
    reference is noisy too)."""
    from steerdiff.app.recipes.ocm_digits import head_vs_monte_carlo
    from steerdiff.data.digits import load_digits

    head = load_head_for("digits", digits)
    x, y = load_digits("test")
    rows = head_vs_monte_carlo(digits, head, x[:16], y[:16], [1.0], n_probes=32, seed=1)
    for r in rows:
        assert abs(r["ratio_of_means"] - 1) < 0.15, rows


def _gate_k5(digits, clip_pixel):
    from steerdiff.app.recipes.ocm_digits import digits_samples
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import classifier_features, frechet_distance

    head = load_head_for("digits", digits)
    clf = load("digits_classifier")
    f_all = classifier_features(clf, load_digits("all")[0])
    fid = {}
    for m in ("ddpm-beta-tilde", "ddim", "ocm-ddpm", "ocm-ddim"):
        images, nfe, _ = digits_samples(digits, m, 5, covariance=head, n=2000, clip_pixel=clip_pixel)
        assert nfe == 5
        fid[m] = frechet_distance(f_all, classifier_features(clf, images))
    assert fid["ocm-ddpm"] <= 0.9 * fid["ddpm-beta-tilde"], fid
    assert fid["ocm-ddim"] <= 1.05 * fid["ddim"], fid


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "the digits gate's protocol (no last-step clip) misses with the shipped UNet: measured feature FID at K = 5, n = "
    "2000 (this test, first run): OCM-DDPM 0.612 vs 0.9 x beta-tilde 0.287 (0.319), OCM-DDIM 0.631 vs 1.05 x DDIM "
    "0.210 (0.200); n = 1000 (benchmarks/ocm.py --part digits): 0.685 vs 0.299, 0.631 vs 0.229. The step landing on "
    "sigma_1 = 0.01 injects the posterior variance c(sigma_2 = 0.82) ~ 0.06 as pixel noise that D(., 0.01) cannot "
    "remove; the official code bounds exactly this step (clip_sigma_idx; docs/methods/ocm.md, 'Clamps and clips'): see"
    " the test below"))
def test_digits_gate_k5_spec_protocol(digits):
    """Digits gate at K = 5: OCM-DDPM <= 0.9 x DDPM-beta-tilde and OCM-DDIM <= 1.05 x DDIM (feature FID, 2000
    samples against all digits), with the gate's original sampling protocol (D clipped, c clamped, no last-step
    clip)."""
    _gate_k5(digits, None)


@pytest.mark.slow
def test_digits_gate_k5_with_official_last_step_clip(digits):
    """The same gate with the official code's last-step variance clip (``clip_sigma_idx = 1``, one grey level) for
    every method, the shipped head's sampling default. The clip cannot change DDIM or beta-tilde
    (tests/covariance/test_kernel.py), so the baselines are the same as above."""
    _gate_k5(digits, 1)


def test_shipped_head_predicts_valid_variances_on_every_level(digits):
    """Issue 40: along a 20-step OCM-DDPM run (every level of the VP-linear grid from 157.4 down) the shipped head
    predicts no negative or non-finite variance, and almost none above c_max = 1 (the bound of data in [-1, 1])."""
    from steerdiff.core import SampleNoise, make_generators
    from steerdiff.covariance.kernel import clamp_covariance, gaussian_step

    head = load_head_for("digits", digits)
    sig = vp_linear(20).tolist()
    x = sd.randn((64, 1, 8, 8), seeds=0) * sig[0]
    cond, rng = torch.arange(64) % 10, SampleNoise(make_generators(0, 64, "cpu"))
    with torch.no_grad(), head.capture(digits) as store:
        for t, s in zip(sig[:-2], sig[1:-1], strict=True):
            sigma = torch.full((64,), t)
            d = digits(x, sigma, cond).clamp(-1, 1)
            c = head.covariance(x, sigma, store["features"])
            assert torch.isfinite(c).all() and (c >= 0).all(), t
            assert (c > head.c_max).float().mean() < 0.01, t
            x = gaussian_step(x, d, t, s, clamp_covariance(c, head.c_max)[0], kind="ddpm", eta=0.0, noise=rng)
