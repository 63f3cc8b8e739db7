"""SVDQuant's ``search="hybrid"`` and the refinement's early stop (docs/methods/svdquant.md, "Low-rank refinement"
and "Fast search"): hybrid is ``sampled`` with the refinement's iterations scored on the subsample and its
``REFINE_TOP`` best re-scored on every row. The refinement's iterates do not depend on how they are scored, so
hybrid's re-scored iterates must carry exactly the full-row errors that ``sampled`` computes for the same iterates;
``refine_patience`` / ``refine_tol`` stop after that many iterations that each improve the best error by less than
that fraction, returning the best iterate so far. Also: the stacked-weight residual the search now passes to the
layer builder equals the one the builder computes itself, bit for bit."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from steerdiff.quant import calibrate
from steerdiff.quant.calibrate import REFINE_TOP, GroupCalibrator, SearchConfig, smooth_factor
from steerdiff.quant.mapping import Group

from .conftest import calibrate_one, same_layers, search_problem


def _calibrate(module, x, search: str, num_iters: int = 8, **kw):
    return calibrate_one(module, x, search, num_iters, **kw)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_residuals_from_the_stack_equal_the_builders_own(kind):
    """``W diag(lambda) - L_up L_down`` from the stacked weight equals what ``build_svdq_layer`` computes from the
    module: the same layer, bit for bit (two layers sharing an input, so the row split is exercised)."""
    module, x = search_problem(kind)
    torch.manual_seed(1)
    other = nn.Linear(module.in_features, 64) if kind == "linear" else nn.Conv2d(module.in_channels, 16, 3, padding=1)
    cal = GroupCalibrator(Group("0", ["0", "1"]), [module, other], x, SearchConfig(rank=8))
    lam = smooth_factor(cal.a, cal.w, 0.5, 0.0)
    wh = cal._stack(lam)
    ld, lu = cal._factors(wh, lam)
    a = cal.build(lam, ld, lu)
    b = cal.build(lam, ld, lu, residuals=cal._residuals(wh, ld, lu))
    for la, lb in zip(a, b, strict=True):
        assert same_layers([la], [lb])


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_hybrid_is_sampled_when_the_sample_is_every_row(kind):
    module, x = search_problem(kind)
    _, ls, is_ = _calibrate(module, x, "sampled", search_tokens=10**6)
    cal, lh, ih = _calibrate(module, x, "hybrid", search_tokens=10**6)
    assert cal.xs is cal.x
    assert same_layers(ls, lh)
    assert ih["refine_errors"] == is_["refine_errors"] and ih["rel_error"] == is_["rel_error"]
    assert "refine_full_errors" not in ih


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_hybrid_rescores_its_best_iterates_with_sampleds_full_errors(kind):
    """Same search as ``sampled`` (same lambda, same SVD chain), so refinement iterate k is sampled's iterate k: the
    iterates hybrid re-scores are its ``REFINE_TOP`` best by subsample error among those it visited, their full
    errors equal sampled's (equal, not close), and it returns the best of them (later iterates win ties)."""
    module, x = search_problem(kind)
    n = 12
    _, _, is_ = _calibrate(module, x, "sampled", num_iters=n, early_stop=False)
    cal, lh, ih = _calibrate(module, x, "hybrid", num_iters=n)
    assert cal.xs is not cal.x
    assert (ih["alpha"], ih["beta"]) == (is_["alpha"], is_["beta"])
    sub = ih["refine_errors"]
    assert all(sub[k] <= min(sub[:k]) for k in range(1, len(sub) - 1))  # stopped at the first non-improvement
    assert len(sub) == n or sub[-1] > min(sub[:-1])
    top = sorted(range(len(sub)), key=lambda k: (sub[k], -k))[:REFINE_TOP]
    full = ih["refine_full_errors"]
    assert sorted(full) == sorted(top)
    for k, e in full.items():
        assert e == is_["refine_errors"][k]
    best = min(full, key=lambda k: (full[k], -k))
    ref = float((cal.ref.double() ** 2).sum())
    assert ih["rel_error"] == full[best] / ref
    assert cal.error(lh, full=True) == full[best]


def _stop_index(errs: list[float], patience: int, tol: float) -> int:
    """Where the rule stops on a given error sequence: after ``patience`` iterations in a row none of which lowered
    the best error by at least ``tol`` of it."""
    best, since = float("inf"), 0
    for k, e in enumerate(errs):
        since = 0 if e <= best * (1 - tol) else since + 1
        best = min(best, e)
        if since >= patience:
            return k
    return len(errs) - 1


@pytest.mark.parametrize(("patience", "tol"), [(1, 0.0), (1, 0.02), (3, 0.0), (2, 0.01)])
def test_refine_patience_and_tol_stop_early_and_return_the_best_iterate(patience, tol):
    """Against the run without early stop (the same iterates): the run stops where the rule says and returns the
    layers of the best iterate up to there (its error recomputed from the returned layers)."""
    module, x = search_problem("linear")
    n = 40
    _, _, i0 = _calibrate(module, x, "exact", num_iters=n, early_stop=False)
    e0 = i0["refine_errors"]
    stop = _stop_index(e0, patience, tol)
    assert stop < n - 1  # the rule matters on this problem
    cal, lt, it = _calibrate(module, x, "exact", num_iters=n, refine_patience=patience, refine_tol=tol)
    assert it["refine_errors"] == e0[: stop + 1]
    assert cal.error(lt, full=True) == min(e0[: stop + 1])
    if (patience, tol) == (1, 0.0):  # the official rule: the first iteration that does not improve
        assert all(e0[k] <= min(e0[:k]) for k in range(1, stop)) and e0[stop] > min(e0[:stop])


@pytest.mark.parametrize(("key", "value"), [("refine_tol", -0.1), ("refine_tol", 1.0), ("refine_patience", 0)])
def test_bad_refine_options_are_refused(key, value):
    module, x = search_problem("linear")
    with pytest.raises(ValueError, match=key):
        GroupCalibrator(Group("0", ["0"]), [module], x, SearchConfig(rank=8, **{key: value}))


def _faults(run) -> int:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    run()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(calibrate._glibc() is None, reason="glibc only")
def test_kept_heap_reuses_freed_memory_instead_of_faulting_it_in_again():
    """64 MB tensors made and dropped 8 times: outside the block each one is mapped fresh (about 16k page faults
    each with 4 KiB pages; fewer where the kernel backs them with huge pages); inside, the freed memory is reused.
    After the block the defaults are back: the faults return. Compared with the block's own count, since the
    absolute count depends on the kernel's page sizes (a parallel CI run once saw a quarter of it)."""
    def churn():
        for _ in range(8):
            torch.ones(16 * 2**20)  # 64 MB, written, freed at once

    outside = _faults(churn)
    with calibrate.kept_heap():
        churn()  # the first one grows the heap
        inside = _faults(churn)
    after = _faults(churn)
    assert outside > 8 * 1_000 and after > 8 * 1_000  # at least a thousand faults per 64 MB tensor
    assert inside < outside / 10 and inside < after / 10


def test_kept_heap_changes_no_value(monkeypatch):
    """The calibration with the heap kept (the default on CPU) and without: the same layers, bit for bit."""
    module, x = search_problem("linear")
    _, la, ia = _calibrate(module, x, "hybrid")
    monkeypatch.setattr(calibrate, "kept_heap", lambda enabled=True: contextlib.nullcontext())
    _, lb, ib = _calibrate(module, x, "hybrid")
    assert same_layers(la, lb) and ia["refine_errors"] == ib["refine_errors"]
