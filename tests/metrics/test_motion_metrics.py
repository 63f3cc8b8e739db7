"""Single-instance motion metrics (steerdiff.metrics.motion): coverage, local / global diversity, SIFID and the
self-supervised window feature extractor."""

import itertools
import math

import pytest
import torch

from steerdiff.data.motion import FeatureStats, motion_features
from steerdiff.data.motion_synth import generate_motion
from steerdiff.metrics.motion import (
    MotionFeatureEncoder,
    coverage,
    global_diversity,
    inter_diversity,
    intra_diversity,
    local_diversity,
    sifid,
    train_feature_encoder,
)


@pytest.fixture(scope="module")
def ref():
    return motion_features(generate_motion("biped_walk", 150, seed=0)).double()


def _brute_global(g, r, min_len):
    """Minimum over all segmentations of g into pieces >= min_len, each matched to its best same-length piece of r."""
    tg = g.shape[0]
    d = torch.cdist(g, r).pow(2) / g.shape[1]
    best = math.inf
    for k in range(1, tg // min_len + 1):
        for cuts in itertools.combinations(range(1, tg), k - 1):
            bounds = [0, *cuts, tg]
            if any(b - a < min_len for a, b in itertools.pairwise(bounds)):
                continue
            total = 0.0
            for a, b in itertools.pairwise(bounds):
                n = b - a
                costs = [float(sum(d[a + i, s + i] for i in range(n))) for s in range(r.shape[0] - n + 1)]
                total += min(costs, default=math.inf)
            best = min(best, total)
    return math.sqrt(best / tg)


def test_global_diversity_dp_equals_brute_force():
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        g, r = torch.randn(7, 2, generator=gen, dtype=torch.float64), torch.randn(6, 2, generator=gen,
                                                                                  dtype=torch.float64)
        assert global_diversity(r, g, min_fragment=2) == pytest.approx(_brute_global(g, r, 2), rel=1e-9)


def test_coverage_matches_a_loop():
    gen = torch.Generator().manual_seed(1)
    r, g = torch.randn(12, 3, generator=gen, dtype=torch.float64), torch.randn(10, 3, generator=gen,
                                                                               dtype=torch.float64)
    w, thr = 3, 1.0
    hits = 0
    for i in range(12 - w + 1):
        dmin = min(float((r[i:i + w] - g[j:j + w]).pow(2).mean().sqrt()) for j in range(10 - w + 1))
        hits += dmin <= thr
    assert coverage(r, g, window=w, threshold=thr) == pytest.approx(hits / (12 - w + 1))


def test_identical_motion_is_covered_and_not_diverse(ref):
    stats = FeatureStats.fit(ref)
    assert coverage(ref, ref, stats=stats) == 1.0
    assert local_diversity(ref, ref, stats=stats) == pytest.approx(0.0, abs=1e-6)
    assert global_diversity(ref, ref, stats=stats) == pytest.approx(0.0, abs=1e-6)
    # two long reference pieces swapped: still nothing new globally, all windows but those across the seam covered
    swapped = torch.cat([ref[75:], ref[:75]])
    assert global_diversity(ref, swapped, stats=stats) == pytest.approx(0.0, abs=1e-6)
    enc = MotionFeatureEncoder(ref.shape[1])  # any encoder: the Frechet distance of a set to itself is 0
    assert sifid(enc, ref, ref) == pytest.approx(0.0, abs=1e-6)


def test_frozen_motion_has_low_coverage_and_diversity(ref):
    stats = FeatureStats.fit(ref)
    frozen = ref[:1].expand(150, -1).clone()
    assert coverage(ref, frozen, stats=stats) < 0.1
    assert local_diversity(ref, frozen, stats=stats) > local_diversity(ref, ref[10:], stats=stats)
    torch.manual_seed(0)
    enc = MotionFeatureEncoder(ref.shape[1])
    assert intra_diversity(enc, frozen) == pytest.approx(0.0, abs=1e-6)
    assert intra_diversity(enc, ref) > 0.01
    assert inter_diversity(enc, [frozen, frozen.clone()]) == pytest.approx(0.0, abs=1e-6)


def test_feature_encoder_trains_saves_and_loads(tmp_path, ref):
    enc, log = train_feature_encoder([ref, ref.flip(0)], steps=15, batch=16, window=20)
    assert log["curve"][-1]["loss"] < log["curve"][0]["loss"]
    f = enc.window_features(ref, window=20, stride=10)
    assert f.shape == (14, 32) and torch.allclose(f.norm(dim=1), torch.ones(14), atol=1e-5)
    back = MotionFeatureEncoder.load(enc.save(tmp_path / "enc"))
    assert (tmp_path / "enc.safetensors").is_file()
    torch.testing.assert_close(back.window_features(ref, 20, 10), f)


@pytest.mark.slow
def test_trained_features_separate_styles():
    walk = [motion_features(generate_motion("biped_walk", 240, seed=s)) for s in range(3)]
    wave = [motion_features(generate_motion("biped_wave", 240, seed=s)) for s in range(3)]
    enc, _ = train_feature_encoder(walk[:2] + wave[:2], steps=200)
    same, other = sifid(enc, walk[0], walk[2]), sifid(enc, walk[0], wave[2])
    frozen = sifid(enc, walk[0], walk[0][:1].expand(240, -1).clone())
    assert same < other < frozen  # another seed of the style is closer than another style, a frozen pose farthest


@pytest.mark.parametrize("skeleton", ["biped", "quadruped", "snake"])
def test_shipped_extractors_rank_same_style_other_style_frozen(skeleton):
    from steerdiff.app.recipes.motion_features import load_motion_feature_encoder
    from steerdiff.data.motion_synth import REFERENCE_STYLE, STYLES

    enc = load_motion_feature_encoder(skeleton)
    style = REFERENCE_STYLE[skeleton]
    other = next(s for s in STYLES.names() if STYLES.get(s).skeleton == skeleton and s != style)
    ref = motion_features(generate_motion(style, 240, seed=0))
    same = sifid(enc, ref, motion_features(generate_motion(style, 240, seed=7)))  # seeds unseen in training
    diff = sifid(enc, ref, motion_features(generate_motion(other, 240, seed=7)))
    frozen = sifid(enc, ref, ref[:1].expand(240, -1).clone())
    assert same < diff < frozen
