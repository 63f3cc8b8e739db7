"""Align-Your-Steps presets against the published numbers and ComfyUI's AlignYourStepsScheduler formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from steerdiff.core.ays import ays
from steerdiff.core.sigmas import SCHEDULES, check_sigmas

# The NVIDIA how-to's lists (https://research.nvidia.com/labs/toronto-ai/AlignYourSteps/howto.html), retyped.
PUBLISHED = {
    "sd15": [14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177, 1.3943805092, 0.9642583904,
             0.6523686016, 0.3977456272, 0.1515232662, 0.0291671582],
    "sdxl": [14.6146412293, 6.3184485287, 3.7681790315, 2.1811480769, 1.3405244945, 0.8620721141, 0.5550693289,
             0.3798540708, 0.2332364134, 0.1114188177, 0.0291671582],
    "svd": [700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002],
}


def _node(levels, steps):
    """ComfyUI's ``AlignYourStepsScheduler.get_sigmas`` at denoise 1 (its ``loglinear_interp``, numpy)."""
    sig = np.array(levels, dtype=np.float64)
    if steps + 1 != len(sig):
        xs = np.linspace(0, 1, len(sig))
        ys = np.log(sig[::-1])
        sig = np.exp(np.interp(np.linspace(0, 1, steps + 1), xs, ys))[::-1].copy()
    sig[-1] = 0
    return torch.from_numpy(sig)


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_ten_steps_are_the_published_list(model):
    got = SCHEDULES.get(f"ays_{model}")(10)
    assert got.dtype == torch.float64
    assert torch.equal(got[:-1], torch.tensor(PUBLISHED[model][:-1], dtype=torch.float64)) and got[-1] == 0


@pytest.mark.parametrize("model", sorted(PUBLISHED))
@pytest.mark.parametrize("steps", [1, 2, 5, 7, 20, 33, 100])
def test_other_step_counts_are_the_nodes_loglinear_interpolation(model, steps):
    got = ays(steps, model)
    want = _node(PUBLISHED[model], steps)
    assert got.shape == (steps + 1,)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-13
    check_sigmas(got)  # strictly decreasing, ending at 0
    assert abs(float(got[0]) / PUBLISHED[model][0] - 1) < 1e-14  # the top level kept


def test_interpolation_keeps_the_published_levels_where_the_grids_meet():
    # 20 steps: every second level of the 21-point grid lies on the 11 knots, so equals a published level
    got = ays(20, "sdxl")
    assert torch.allclose(got[:-1:2], torch.tensor(PUBLISHED["sdxl"][:-1], dtype=torch.float64), rtol=1e-14)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="model must be one of"):
        ays(10, "sd3")
    with pytest.raises(ValueError, match="steps"):
        ays(0)


# ------------------------------------------------------------------------------------------------------------ GITS
def _sd15_table():
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    abar = torch.cumprod(1 - betas, 0)
    return ((1 - abar) / abar).sqrt()


def test_gits_lists_are_consistent_sd15_levels():
    """A check of the transcribed tables: GITS searches a grid of SD 1.5's noise levels, so every level lies within
    0.5% of one of SD 1.5's 1000 training sigmas (its grid is a continuous fit of that table: 0.05-0.2% off), two
    equal levels are written alike in every list (one value per nearest training sigma: a mistyped digit would
    give two), each list has steps + 1 strictly decreasing levels from 14.6146 to 0.0292."""
    from steerdiff.core.ays import GITS_LEVELS_120

    table = _sd15_table()
    seen: dict[int, float] = {}
    for k, levels in enumerate(GITS_LEVELS_120):
        lv = torch.tensor(levels, dtype=torch.float64)
        assert len(levels) == k + 3 and torch.all(lv[1:] < lv[:-1])
        assert levels[0] == 14.61464119 and levels[-1] == 0.02916753
        dist = (table[None, :] - lv[:, None]).abs()
        nearest = dist.argmin(1)
        assert float((dist.min(1).values / lv).max()) < 5e-3, k
        for i, v in zip(nearest.tolist(), levels, strict=True):
            assert seen.setdefault(i, v) == v, (k, i, v, seen[i])
    for steps in range(2, 21):
        got = SCHEDULES.get("gits_sd15")(steps)
        assert got.shape == (steps + 1,) and got[-1] == 0
        assert torch.equal(got[:-1], torch.tensor(GITS_LEVELS_120[steps - 2][:-1], dtype=torch.float64))


@pytest.mark.parametrize("steps", [21, 30, 50])
def test_gits_above_20_steps_is_the_nodes_interpolation_of_the_20_step_list(steps):
    from steerdiff.core.ays import GITS_LEVELS_120

    want = _node(GITS_LEVELS_120[-1], steps)
    got = SCHEDULES.get("gits_sd15")(steps)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-13
    with pytest.raises(ValueError, match="steps"):
        SCHEDULES.get("gits_sd15")(1)
