"""SVDQuant's fast calibration (docs/methods/svdquant.md, "Fast SVD"): the randomized, warm-started SVD against the
exact truncation (Eckart-Young), the fast search against the exact one, ``svd="full"`` against an independent
re-implementation of the documented exact algorithm, and device / dtype following the layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from steerdiff.quant import quant_info, quantize
from steerdiff.quant.calibrate import randomized_svd_r
from steerdiff.quant.mapping import Group
from steerdiff.quant.quantizers import fake_quant_act, fq_int

from .conftest import outlier_problem, rel_err


def _decaying(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A matrix with a slowly decaying spectrum (sigma_i = 1 / (1 + i)^0.5) plus a few large directions."""
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(n, min(n, k), generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(k, min(n, k), generator=g, dtype=torch.float64)).Q
    s = 1.0 / (1.0 + torch.arange(min(n, k), dtype=torch.float64)) ** 0.5
    s[:4] *= 20
    return (u * s) @ v.t()


def test_randomized_svd_near_eckart_young():
    m = _decaying(300, 200)
    r = 16
    s = torch.linalg.svdvals(m)
    best = float(s[r:].pow(2).sum().sqrt())  # ||M - M_r||_F of the exact truncation (Eckart-Young)
    ld, lu, basis = randomized_svd_r(m.float(), r, generator=torch.Generator().manual_seed(0))
    assert ld.shape == (r, 200) and lu.shape == (300, r) and basis.shape == (200, r + 16)
    assert ld.dtype == lu.dtype == torch.float32
    got = float((m - (lu @ ld).double()).norm())
    assert best <= got <= 1.02 * best, (got, best)
    # warm-started from the exact right basis, one pass is exact up to float32 rounding
    v = torch.linalg.svd(m, full_matrices=False).Vh[: r + 16].t().float()
    ld2, lu2, _ = randomized_svd_r(m.float(), r, start=v, niter=0, generator=torch.Generator().manual_seed(0))
    assert float((m - (lu2 @ ld2).double()).norm()) <= best * (1 + 1e-5)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_fast_calibration_error_within_factor_of_exact(kind):
    """Fast (randomized, float32, warm-started) vs exact (float64 full SVD) calibration: held-out output error within
    a factor 1.10 (the rank-r approximation is within ~1% of Eckart-Young; the search may pick a neighbouring
    candidate)."""
    if kind == "linear":
        lin, xc, xt = outlier_problem(192, 160, 2048)
        kw = {"rank": 16}
    else:
        torch.manual_seed(0)
        lin = nn.Sequential(nn.Conv2d(24, 48, 3, padding=1))
        xc, xt = torch.randn(16, 24, 8, 8), torch.randn(16, 24, 8, 8)
        xc[:, :3] *= 20
        xt[:, :3] *= 20
        kw = {"rank": 8, "groups": [Group("0", ["0"])]}
    kw["num_grids"] = 10
    e_full = rel_err(quantize(lin, "svdquant", calib=xc, svd="full", **kw), xt, lin)
    e_fast = rel_err(quantize(lin, "svdquant", calib=xc, svd="fast", **kw), xt, lin)
    e_rtn = rel_err(quantize(lin, "rtn", calib=xc, groups=kw.get("groups")), xt, lin)
    assert e_fast <= 1.10 * e_full, (e_fast, e_full)
    assert e_fast < 0.5 * e_rtn, (e_fast, e_rtn)


def _reference_exact(lin: nn.Linear, x: torch.Tensor, r: int, num_grids: int, num_iters: int):
    """The documented exact algorithm ("Smoothing search", "Low-rank refinement") written out for an unshifted INT4
    Linear with fp16 factors, independently of steerdiff's calibrator and layer."""
    W, b = lin.weight.detach().double(), lin.bias.detach().float()
    y = lin(x).detach().double()
    a = x.float().abs().amax(0)
    wmax = lin.weight.detach().abs().amax(0).float()

    def lam_of(alpha, beta):
        if alpha == 0 and beta == 0:
            return torch.ones_like(a)
        lam = a.double() ** alpha / wmax.double() ** beta
        lam = torch.where(lam == 0, torch.ones_like(lam), lam)
        if not torch.isfinite(lam).all() or lam.max() > 65504 or lam.min() < 2**-14:
            return torch.ones_like(a)
        return lam.half().float()

    def factors(m):
        u, s, vh = torch.linalg.svd(m, full_matrices=False)
        return vh[:r].half().double(), (u[:, :r] * s[:r]).half().double()

    def out(lam, ld, lu):
        rq = fq_int((W * lam.double() - lu @ ld).float(), 64)
        xh = x.float() / lam
        yq = F.linear(fake_quant_act(xh, "int4"), rq) + F.linear(F.linear(xh, ld.float()), lu.float())
        return yq + b, rq

    def err(lam, ld, lu):
        yq, rq = out(lam, ld, lu)
        return float(((yq.double() - y) ** 2).sum()), rq

    ks = [k / num_grids for k in range(1, num_grids)]
    grid = [(0.0, 0.0)] + [(k, 0.0) for k in ks] + [(k, 1.0 - k) for k in ks]
    best, lam_best = float("inf"), None
    for alpha, beta in grid:
        lam = lam_of(alpha, beta)
        e, _ = err(lam, *factors(W * lam.double()))
        if e <= best:
            best, lam_best = e, lam
    wh, qw, kept = W * lam_best.double(), torch.zeros_like(W), None
    for _ in range(num_iters):
        ld, lu = factors(wh - qw)
        e, rq = err(lam_best, ld, lu)
        qw = rq.double()
        if kept is None or e <= kept[0]:
            kept = (e, lam_best, ld, lu, rq)
        else:
            break
    return kept


def test_full_svd_equals_documented_exact_algorithm_bitwise():
    lin, xc, _ = outlier_problem(128, 96, 1024)
    q = quantize(lin, "svdquant", calib=xc, rank=8, svd="full", search="exact", num_grids=6, num_iters=10)
    layer = q[0]
    _, lam, ld, lu, rq = _reference_exact(lin[0], xc, 8, 6, 10)
    assert torch.equal(layer.smooth_factor, lam.half())
    assert torch.equal(layer.lora_down, ld.half())
    assert torch.equal(layer.lora_up, lu.half())
    assert torch.equal(layer.dequantized_residual(), rq)


def test_fast_calibration_bf16_layer():
    """A bfloat16 layer: the fast SVD runs in float32 on the layer's device, the quantized layer takes and returns
    bfloat16, and its error matches the float32 layer's within bfloat16 rounding."""
    lin, xc, xt = outlier_problem(128, 128, 1024)
    e32 = rel_err(quantize(lin, "svdquant", calib=xc, rank=8), xt, lin)
    lb = lin.to(torch.bfloat16)
    qb = quantize(lb, "svdquant", calib=xc.bfloat16(), rank=8)
    assert quant_info(qb)["layers"]["0"]["type"] == "SVDQLayer"
    with torch.no_grad():
        yb = qb(xt.bfloat16())
        ref = lb(xt.bfloat16()).float()
    assert yb.dtype == torch.bfloat16 and torch.isfinite(yb).all()
    eb = float((yb.float() - ref).pow(2).sum() / ref.pow(2).sum())
    assert eb <= 1.5 * e32 + 1e-4, (eb, e32)


def test_fast_svd_follows_device_and_dtype():
    m = _decaying(64, 48).float()
    g = torch.Generator(device=m.device).manual_seed(0)
    ld, lu, basis = randomized_svd_r(m, 4, generator=g)
    assert {t.device for t in (ld, lu, basis)} == {m.device}
    assert {t.dtype for t in (ld, lu, basis)} == {torch.float32}
    m64 = m.double()
    ld, lu, basis = randomized_svd_r(m64, 4, generator=torch.Generator().manual_seed(0))
    assert {t.dtype for t in (ld, lu, basis)} == {torch.float64}


@pytest.mark.gpu
def test_fast_calibration_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    lin, xc, xt = outlier_problem(256, 256, 2048)
    e_cpu = rel_err(quantize(lin, "svdquant", calib=xc, rank=16), xt, lin)
    lc = lin.cuda()
    qc = quantize(lc, "svdquant", calib=xc.cuda(), rank=16)
    assert all(b.device.type == "cuda" for b in qc.buffers())
    with torch.no_grad():
        y, ref = qc(xt.cuda()), lc(xt.cuda())
    e = float((y - ref).pow(2).sum() / ref.pow(2).sum())
    assert e <= 1.1 * e_cpu, (e, e_cpu)
