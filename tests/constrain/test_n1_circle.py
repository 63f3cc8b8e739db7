"""N1 of docs/methods/namm.md (unit circle, non-convex): the full NAMM pipeline from scratch against its pass criteria.

Takes about 11 CPU-minutes (maps 3000 steps, two EDM MLPs 3000 steps each, 2 x 4000 Heun-32 samples): slow.
"""

import pytest
import torch

from steerdiff.app.protocols.namm import compare
from steerdiff.app.recipes.namm import run


@pytest.mark.slow
def test_n1_unit_circle(tmp_path):
    torch.set_num_threads(1)
    run("circle_namm", ("maps", "mirror", "plain"), out_dir=tmp_path)
    res = compare("circle_namm", n=4000, out_dir=tmp_path)
    plain, namm = res["rows"]["plain"], res["rows"]["namm"]
    print(res)
    assert res["heldout"]["cycle_error"] <= 0.01
    assert namm["constraint_mean"] <= plain["constraint_mean"] / 3
    assert namm["sliced_w2"] <= 1.5 * plain["sliced_w2"] + 0.01
