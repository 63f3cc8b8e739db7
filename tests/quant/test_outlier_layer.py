"""T2 synthetic outlier layer (docs/methods/svdquant.md, "Validation"): the mechanism, on held-out tokens.

The fast test uses T2's construction at m = n = 256 (T2's full size, 1024, runs in the slow test and in
``benchmarks/svdquant.py``); the thresholds are T2's.
"""

from __future__ import annotations

import pytest

from steerdiff.quant import quantize

from .conftest import outlier_problem, rel_err


def _t2(m: int, svd: str = "full"):
    # the official (exact) search: the default "auto" would pick hybrid at m = 1024 (docs/methods/svdquant.md,
    # "Automatic search (the default)"), and T2 validates the paper's method
    lin, xc, xt = outlier_problem(m, m, 4096)
    e = {meth: rel_err(quantize(lin, meth, rank=32, calib=xc, svd=svd, search="exact"), xt, lin)
         for meth in ("rtn", "smoothquant", "svd", "svdquant")}
    e_r = [rel_err(quantize(lin, "svdquant", rank=r, calib=xc, svd=svd, search="exact"), xt, lin)
           for r in (0, 4, 8, 16)]
    e_r.append(e["svdquant"])  # r = 32
    return e, e_r


def _check(e, e_r):
    assert e["svdquant"] <= 0.5 * e["rtn"], e
    assert e["svdquant"] < e["smoothquant"], e
    assert e["svdquant"] <= e["svd"], e
    for lo, hi in zip(e_r[1:], e_r[:-1], strict=True):  # non-increasing in r within 5%
        assert lo <= 1.05 * hi, e_r


def test_t2_outlier_layer_256():
    _check(*_t2(256))


def test_t2_outlier_layer_256_fast_svd():
    """T2's thresholds with the default fast calibration (randomized, warm-started SVDs)."""
    _check(*_t2(256, svd="fast"))


def test_t2_nvfp4_svdquant_beats_naive():
    lin, xc, xt = outlier_problem(256, 256, 4096)
    e_svdq = rel_err(quantize(lin, "svdquant", rank=32, calib=xc, fmt="nvfp4"), xt, lin)
    e_rtn = rel_err(quantize(lin, "rtn", calib=xc, fmt="nvfp4"), xt, lin)
    assert e_svdq < e_rtn


@pytest.mark.slow
def test_t2_outlier_layer_spec_size():
    _check(*_t2(1024))
