"""DAS drops particles whose reward is NaN when only some are: the result counts them and the run warns (issue 35,
"Silent garbage"); a run without a non-finite reward does neither."""

import math
import warnings

import pytest
import torch

import steerdiff as sd

G = sd.models.builtin_mixture("gmm2d")
SIG = sd.sigmas.karras(5)


class NaNEveryThird:
    """A reward that is NaN on every third row it is given, and counts the NaNs it returned (the independent truth)."""

    def __init__(self):
        self.returned_nan = 0

    def __call__(self, x):
        r = x.sum(1).clone()
        r[::3] = math.nan
        self.returned_nan += int(torch.isnan(r).sum())
        return r


@pytest.mark.parametrize("method", ["das", "tds"])
def test_nan_rewards_are_counted_and_warned(method):
    reward = NaNEveryThird()
    run = getattr(sd.align, method)
    with pytest.warns(RuntimeWarning, match=rf"{method}: particles were dropped \d+ times .* for a reward of NaN"):
        res = run(G, reward, sd.randn((16, 2), seeds=0, dtype=torch.float64), SIG, alpha=1.0, particles=8)
    assert reward.returned_nan > 0
    assert res.n_nonfinite_reward == reward.returned_nan
    assert res.nonfinite_reward.shape == (len(SIG), 2)
    assert res.n_nonfinite >= res.n_nonfinite_reward
    assert res.summary()["n_nonfinite_reward"] == reward.returned_nan
    assert torch.isfinite(res.samples).all()


def test_finite_rewards_count_zero_and_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = sd.align.das(G, lambda x: x.sum(1), sd.randn((16, 2), seeds=0, dtype=torch.float64), SIG, alpha=1.0,
                           particles=8)
    assert res.n_nonfinite_reward == 0 and res.n_nonfinite == 0
