"""SVDQuant's ``search="sampled"`` (docs/methods/svdquant.md, "Fast search"): the exact search's whole grid, in its
order, scored on the 512-row subsample, the subsample's top ``RESCORE_TOP`` re-scored on every row, the refinement on
every row. Checked against the exact search computed here with the same (randomized, warm-started) SVD: without a
subsample it is the exact search bit for bit; with one, the candidates it re-scores carry the exact search's errors
and layers, and its pick is the exact pick whenever that one is among the subsample's top candidates."""

from __future__ import annotations

import pytest
import torch

from steerdiff.quant.calibrate import RESCORE_TOP, alpha_beta_grid, smooth_factor

from .conftest import calibrate_one, same_layers, search_problem


def _calibrate(module, x, search: str, num_iters: int = 6, **kw):
    return calibrate_one(module, x, search, num_iters, **kw)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_sampled_is_the_exact_search_when_the_sample_is_every_row(kind):
    """``search_tokens`` >= the calibration rows: the same pick and bit-identical layers as ``search="exact"``."""
    module, x = search_problem(kind)
    _, le, ie = _calibrate(module, x, "exact")
    cal, ls, is_ = _calibrate(module, x, "sampled", search_tokens=10**6)
    assert cal.xs is cal.x
    assert (is_["alpha"], is_["beta"]) == (ie["alpha"], ie["beta"])
    assert same_layers(le, ls)
    assert is_["rel_error"] == ie["rel_error"] and is_["refine_errors"] == ie["refine_errors"]


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_sampled_rescores_the_exact_candidates_and_keeps_the_exact_pick(kind):
    """With a real subsample: every candidate of the grid is scored, in the grid's order; the ``RESCORE_TOP`` best on
    the subsample are scored on every row with exactly the exact search's errors (same SVD chain, so the same
    layers); the lambda kept is the best of those full errors; and on these problems the exact argmin is among them,
    so the result is the exact search's, bit for bit."""
    module, x = search_problem(kind)
    _, le, ie = _calibrate(module, x, "exact")
    exact = {(t["alpha"], t["beta"]): t["error"] for t in ie["search"]}
    cal, ls, is_ = _calibrate(module, x, "sampled")
    assert cal.xs is not cal.x
    grid = alpha_beta_grid(20, "search")
    assert [(t["alpha"], t["beta"]) for t in is_["search"]] == grid == list(exact)
    by_sample = sorted(is_["search"], key=lambda t: (t["error"], -grid.index((t["alpha"], t["beta"]))))
    top = {(t["alpha"], t["beta"]) for t in by_sample[:RESCORE_TOP]}
    rescored = {(t["alpha"], t["beta"]): t["full_error"] for t in is_["search"] if "full_error" in t}
    assert set(rescored) == top
    for ab, e in rescored.items():
        assert e == exact[ab]  # the exact search's layers for that candidate: equal, not close
    want = min(top, key=lambda ab: (exact[ab], -grid.index(ab)))
    assert (is_["alpha"], is_["beta"]) == want
    lam, _ = cal.search_lambda()
    assert torch.equal(lam, smooth_factor(cal.a, cal.w, *want))
    best = min(grid, key=lambda ab: (exact[ab], -grid.index(ab)))
    assert (ie["alpha"], ie["beta"]) == best
    assert best in top and want == best
    assert same_layers(le, ls) and is_["rel_error"] == ie["rel_error"]

