"""SVDQuant's fast smoothing search (docs/methods/svdquant.md, "Fast search"): candidates scored on a fixed
subsample of the calibration rows over a coarse-to-fine grid, against the exact search (every candidate of the
39-grid on every row) computed here, and the subsample's rows against the calibration data they come from."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steerdiff.quant import quant_info, quantize
from steerdiff.quant.calibrate import (
    GroupCalibrator,
    SearchConfig,
    alpha_beta_grid,
    coarse_fine_grid,
    scoring_rows,
    smooth_factor,
)
from steerdiff.quant.mapping import Group, attention_core

from .conftest import outlier_problem, rel_err


def _conv_problem(seed: int = 0):
    """A 3x3 conv with outlier input channels on 24x24 maps: 16 maps hold 9216 pixels, so the fast search scores
    8x8 windows (with a halo) of 8 of them."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(32, 48, 3, padding=1))
    xc, xt = torch.randn(16, 32, 24, 24), torch.randn(16, 32, 24, 24)
    xc[:, :3] *= 20
    xt[:, :3] *= 20
    return net, xc, xt


@pytest.mark.parametrize("search", ["fast", "fastest", "rescore", "sampled"])
@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_fast_search_error_within_tolerance_of_exact(kind, search):
    """Held-out output error of the fast searches within 5% of the exact search's (computed here), on data whose
    calibration rows exceed the scoring budget (1024 tokens / 9216 pixels against 512), and the chosen smoothing
    within one grid step of the exact choice on the same line."""
    if kind == "linear":
        net, xc, xt = outlier_problem(192, 160, 2048)
        kw = {"rank": 16}
    else:
        net, xc, xt = _conv_problem()
        kw = {"rank": 8, "groups": [Group("0", ["0"])]}
    kw["num_iters"] = 8
    qe = quantize(net, "svdquant", calib=xc, search="exact", **kw)
    qf = quantize(net, "svdquant", calib=xc, search=search, **kw)
    e_exact, e_fast = rel_err(qe, xt, net), rel_err(qf, xt, net)
    assert e_fast <= 1.05 * e_exact, (e_fast, e_exact)
    re, rf = quant_info(qe)["report"][0], quant_info(qf)["report"][0]
    assert (rf["n_candidates"] == 39 if search == "sampled" else rf["n_candidates"] < 39) and re["n_candidates"] == 39
    assert (re["beta"] == 0) == (rf["beta"] == 0) and abs(re["alpha"] - rf["alpha"]) <= 0.05 + 1e-9, (re, rf)
    # the reported calibration error is measured on every calibration row, not on the scoring subsample
    assert rf["rel_error"] <= 1.05 * re["rel_error"], (rf["rel_error"], re["rel_error"])


def test_fast_grid_scores_the_exact_candidates_it_visits():
    """With every row scored (512 rows: no subsample) and the order-independent exact SVD, each candidate the fast
    search scores has the exact search's error, and its choice is the best of the coarse grid plus the two
    neighbours of the coarse argmin, derived here from the exact trace."""
    lin, xc, _ = outlier_problem(128, 96, 1024)
    group = Group("0", ["0"])
    mk = lambda search: GroupCalibrator(group, [lin[0]], xc, SearchConfig(rank=8, svd="full", search=search))  # noqa: E731
    _, trace_e = mk("exact").search_lambda()
    _, trace_f = mk("fast").search_lambda()
    exact = {(t["alpha"], t["beta"]): t["error"] for t in trace_e}
    for t in trace_f:
        assert t["error"] == exact[(t["alpha"], t["beta"])]
    grid = alpha_beta_grid(20, "search")
    coarse, grid2 = coarse_fine_grid(20, "search")
    assert grid2 == grid and len(coarse) == 19 and coarse[0] == (0.0, 0.0) and set(coarse) <= set(grid)
    i = min((grid.index(ab) for ab in coarse), key=lambda j: (exact[grid[j]], -j))
    a, b = grid[i]
    visit = set(coarse)
    if (a, b) != (0.0, 0.0):
        line = [ab for ab in grid[1:] if (ab[1] == 0) == (b == 0)]
        k = line.index((a, b))
        visit |= {line[j] for j in (k - 1, k + 1) if 0 <= j < len(line)}
    assert {(t["alpha"], t["beta"]) for t in trace_f} == visit
    want = min((j for j in range(len(grid)) if grid[j] in visit), key=lambda j: (exact[grid[j]], -j))
    best_f = min(range(len(trace_f)), key=lambda j: (trace_f[j]["error"], -grid.index((trace_f[j]["alpha"],
                                                                                       trace_f[j]["beta"]))))
    assert (trace_f[best_f]["alpha"], trace_f[best_f]["beta"]) == grid[want]


def test_rescore_picks_the_best_full_error_of_the_subsample_top3():
    """``rescore``: the three best candidates on the subsample (2048 rows, 512 scored) are scored again on every
    row, with the exact search's full errors (same candidates, exact SVD), and the lambda kept is that of the best
    full error among them; the other candidates keep only their subsample error."""
    lin, xc, _ = outlier_problem(128, 96, 2048)
    group = Group("0", ["0"])
    mk = lambda search: GroupCalibrator(group, [lin[0]], xc, SearchConfig(rank=8, svd="full", search=search))  # noqa: E731
    _, trace_e = mk("exact").search_lambda()
    exact = {(t["alpha"], t["beta"]): t["error"] for t in trace_e}
    cal = mk("rescore")
    lam, trace_r = cal.search_lambda()
    _, trace_f = mk("fastest").search_lambda()
    assert [(t["alpha"], t["beta"], t["error"]) for t in trace_r] == [(t["alpha"], t["beta"], t["error"])
                                                                      for t in trace_f]
    grid = alpha_beta_grid(20, "search")
    by_sample = sorted(trace_f, key=lambda t: (t["error"], -grid.index((t["alpha"], t["beta"]))))[:3]
    top = {(t["alpha"], t["beta"]) for t in by_sample}
    rescored = {(t["alpha"], t["beta"]): t["full_error"] for t in trace_r if "full_error" in t}
    assert set(rescored) == top
    for ab, e in rescored.items():
        assert e == pytest.approx(exact[ab], rel=1e-9)
    want = min(top, key=lambda ab: (exact[ab], -grid.index(ab)))
    assert torch.equal(lam, smooth_factor(cal.a, cal.w, *want))


def test_scoring_rows_are_rows_of_the_data():
    g = torch.Generator().manual_seed(3)
    x2 = torch.randn(2000, 8, generator=g)
    s2 = scoring_rows(x2, 512)
    assert s2.shape == (512, 8)
    assert torch.equal(s2, scoring_rows(x2, 512))  # fixed (seeded)
    assert len({tuple(r.tolist()) for r in s2}) == 512
    rows = {tuple(r.tolist()) for r in x2}
    assert all(tuple(r.tolist()) in rows for r in s2)
    small = torch.randn(300, 8, generator=g)
    assert scoring_rows(small, 512) is small
    # sequences: whole samples, the same token positions in each, in order
    x3 = torch.arange(6 * 400 * 2, dtype=torch.float32).reshape(6, 400, 2)
    s3 = scoring_rows(x3, 512)
    assert s3.shape == (1, 400, 2) and any(torch.equal(s3[0], x3[i]) for i in range(6))
    x3l = torch.arange(2 * 1000 * 2, dtype=torch.float32).reshape(2, 1000, 2)
    s3l = scoring_rows(x3l, 512)
    assert s3l.shape == (1, 512, 2)
    pos = (s3l[0, :, 0] % 2000) / 2
    assert torch.all(pos[1:] > pos[:-1])  # increasing token positions of one sample
    # feature maps: 8x8 windows of distinct maps with a halo, exact for a "same" conv on the interior
    x4 = torch.randn(12, 4, 20, 20, generator=g)
    s4 = scoring_rows(x4, 512, halo=(1, 1))
    assert s4.shape == (8, 4, 10, 10)
    conv = nn.Conv2d(4, 5, 3, padding=1)
    with torch.no_grad():
        full = conv(x4)
        inner = conv(s4)[..., 1:-1, 1:-1]
    xp = nn.functional.pad(x4, (1, 1, 1, 1))
    used = []
    for c, y in zip(s4, inner, strict=True):
        hits = [(m, i, j) for m in range(12) for i in range(13) for j in range(13)
                if torch.equal(c, xp[m, :, i:i + 10, j:j + 10])]
        assert len(hits) == 1
        m, i, j = hits[0]
        used.append(m)
        torch.testing.assert_close(y, full[m, :, i:i + 8, j:j + 8], rtol=1e-5, atol=1e-5)
    assert len(set(used)) == 8  # distinct maps
    x8 = torch.randn(64, 4, 8, 8, generator=g)
    s8 = scoring_rows(x8, 512)
    assert s8.shape == (8, 4, 8, 8) and all(any(torch.equal(c, m) for m in x8) for c in s8)


def test_fast_search_attention_group_and_bf16():
    """A q/k/v group scored on the attention core of a shorter sequence, in bfloat16: runs in the layer's dtype and
    stays within 10% of the exact search's output error."""
    torch.manual_seed(0)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.to_q, self.to_k, self.to_v = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, x):
            return attention_core(4, split=True)([self.to_q(x), self.to_k(x), self.to_v(x)])

    net = Attn().to(torch.bfloat16)
    xc = torch.randn(2, 600, 64)
    xc[..., :4] *= 20
    xc = xc.bfloat16()
    grp = [Group("qkv", ["to_q", "to_k", "to_v"], eval_fn=attention_core(4, split=True), tokens=False)]
    errs = {}
    for search in ("exact", "fast"):
        q = quantize(net, "svdquant", calib=xc, rank=8, num_iters=4, search=search, groups=grp)
        with torch.no_grad():
            y, ref = q(xc), net(xc)
        assert y.dtype == torch.bfloat16
        errs[search] = float((y.float() - ref.float()).pow(2).sum() / ref.float().pow(2).sum())
    assert errs["fast"] <= 1.10 * errs["exact"], errs


def test_search_option_is_checked():
    lin, xc, _ = outlier_problem(64, 64, 256)
    with pytest.raises(ValueError, match="search must be one of"):
        quantize(lin, "svdquant", calib=xc, search="coarse")


@pytest.mark.gpu
def test_fast_search_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    lin, xc, xt = outlier_problem(256, 256, 4096)
    e_cpu = rel_err(quantize(lin, "svdquant", calib=xc, rank=16, search="fast"), xt, lin)
    lc = lin.cuda()
    qc = quantize(lc, "svdquant", calib=xc.cuda(), rank=16, search="fast")
    assert all(b.device.type == "cuda" for b in qc.buffers())
    assert rel_err(qc, xt.cuda(), lc) <= 1.1 * e_cpu


@pytest.mark.parametrize("shape", [(2000, 8), (3, 1000, 8), (12, 4, 20, 20)])
def test_scoring_rows_follow_device_and_dtype(shape):
    """The subsample stays on the data's device in its dtype (a meta tensor stands in for an accelerator), with the
    same shape as on the CPU."""
    x = torch.empty(shape, device="meta", dtype=torch.bfloat16)
    y = scoring_rows(x, 512, halo=(1, 1))
    ref = scoring_rows(torch.zeros(shape, dtype=torch.bfloat16), 512, halo=(1, 1))
    assert y.device.type == "meta" and y.dtype == torch.bfloat16 and y.shape == ref.shape
