"""Beat-aligned generation by SMC steering (steerdiff/motion/apps.py ``beat_reward`` / ``align_to_beats``;
docs/methods/motiondreamer.md, "Beat-aligned generation"): the reward against closed forms and against the beat-hit
metric it stands in for, and steering on a shipped model against unguided draws of the same seeds."""

import math

import pytest
import torch

from steerdiff.app.recipes.motiondreamer import asset_name
from steerdiff.models.io import ASSETS_DIR
from steerdiff.motion.apps import align_to_beats, beat_alignment, beat_reward, decode_batch, kinematic_beats
from steerdiff.motion.dreamer import MotionDreamer


def test_beat_reward_closed_forms():
    # constant speed 1 but one held frame: the speed out of frame 10 is 0 -> a pause at 10, fully slow there
    steps = torch.ones(39, 1)
    steps[10] = 0.0
    x = torch.cat([torch.zeros(1, 1), steps.cumsum(0)])[None]  # [1, 40, 1]
    r = beat_reward([10], soft=0.5)
    torch.testing.assert_close(r(x), torch.tensor([1.5]))
    torch.testing.assert_close(beat_reward([12], soft=0.5)(x), torch.tensor([1.5]))  # within 2 frames
    torch.testing.assert_close(beat_reward([13], soft=0.5)(x), torch.tensor([0.0]))
    torch.testing.assert_close(beat_reward([10, 30], soft=0.0)(x), torch.tensor([0.5]))
    torch.testing.assert_close(beat_reward([10, 300], soft=0.0)(x), torch.tensor([1.0]))  # past the end: ignored
    # a sine pauses at its extrema t = 5, 15, ...: hit rate 1 there, 0 half a period away (as beat_alignment)
    t = torch.arange(100, dtype=torch.float64)
    s = torch.sin(2 * math.pi * t / 20)[None, :, None]
    on, off = torch.arange(5, 96, 10), torch.arange(10, 96, 10)
    assert float(beat_reward(on, soft=0.0)(s)) == 1.0 == beat_alignment(on, s[0])
    assert float(beat_reward(off, soft=0.0)(s)) == 0.0 == beat_alignment(off, s[0])
    with pytest.raises(ValueError, match="beats"):
        beat_reward([])


def test_hard_reward_is_the_unthinned_hit_rate_on_random_motions():
    # beat_alignment thins the pauses to >= 4 frames apart; the reward keeps every pause (kinematic_beats with
    # min_gap=1, computed here one row at a time), so it equals that hit rate and is never below the thinned one
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 80, 3, generator=g).cumsum(1)
    x = torch.nn.functional.avg_pool1d(x.transpose(1, 2), 5, 1, 2).transpose(1, 2)
    beats = torch.arange(3, 80, 9)
    r = beat_reward(beats, soft=0.0)(x)
    every = []
    for row in x:
        pauses = kinematic_beats(row, min_gap=1)
        every.append(float(((beats[:, None] - pauses[None]).abs().min(1).values <= 2).double().mean()))
    torch.testing.assert_close(r, torch.tensor(every, dtype=r.dtype))
    thinned = torch.tensor([beat_alignment(beats, row) for row in x], dtype=r.dtype)
    assert (r >= thinned).all() and (r > thinned).any()


@pytest.fixture(scope="module")
def quadruped():
    return MotionDreamer.load(ASSETS_DIR / asset_name("quadruped"))


def test_smc_steering_raises_the_beat_hit_rate_over_unguided_draws(quadruped):
    md, n, frames = quadruped, 8, 240
    beats = list(range(3, frames, 12))  # the reference's beat rate (about one per 12 frames)
    norm = md.tokenizer.normalize
    res = align_to_beats(md.generator, md.tokenizer, beats, 60, count=n, particles=32, alpha=0.02, seed=0)
    # the chosen particle of each group is one of its group's, and its reward is the reward of its decoding
    assert res.features.shape == (n, frames, norm(res.features[0]).shape[-1]) and res.steered.nfe == 32 * 12
    torch.testing.assert_close(res.features, decode_batch(md.tokenizer, res.tokens))
    torch.testing.assert_close(res.rewards.float(), beat_reward(beats, normalize=norm)(res.features).float())
    free = md.sample(n, frames, seed=0)
    # the metric is beat_alignment (kinematic beats, thinned), not the reward the sampler was steered by
    gain = torch.tensor([beat_alignment(beats, norm(a)) - beat_alignment(beats, norm(b))
                         for a, b in zip(res.features, free, strict=True)])
    assert float(gain.mean()) > 2 * float(gain.std()) / n**0.5, gain
    with pytest.raises(ValueError, match="particles"):
        md.sample(1, beats=beats, particles=0)
