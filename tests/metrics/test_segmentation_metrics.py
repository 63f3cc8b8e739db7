"""DIS5K metrics (docs/methods/diffdis.md, "Metrics"): closed forms, hand-computed cases, and the py-sod-metrics
reference where it is installed (requirements-test-reference.txt)."""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from steerdiff.data.dis import generate
from steerdiff.metrics.segmentation import (
    adaptive_e_measure,
    band_fmeasure_curve,
    boundary_band,
    dis_metrics,
    e_measure_curve,
    fmeasure_curve,
    hce,
    mae,
    morphological_skeleton,
    s_measure,
    weighted_fmeasure,
)


@pytest.fixture(scope="module")
def gt():
    return generate(8, size=64, seed=11).mask


def test_perfect_prediction(gt):
    row = dis_metrics(gt.clone(), gt)
    n = 64 * 64
    assert row["maxF"] == pytest.approx(1, abs=1e-12) and row["MAE"] == 0 and row["HCE"] == 0
    assert row["S"] == pytest.approx(1, abs=1e-9) and row["wF"] == pytest.approx(1, abs=1e-9)
    assert row["bandF"] == pytest.approx(1, abs=1e-12)
    # E's N - 1 normaliser and its t = 0 threshold (everything positive: enhanced value 1/4 everywhere).
    assert row["maxE"] == pytest.approx(n / (n - 1), abs=1e-12)
    assert row["meanE"] == pytest.approx(n / (n - 1) * (255 + 0.25) / 256, abs=1e-12)


def test_all_zero_prediction(gt):
    zero = torch.zeros_like(gt)
    mu = gt.flatten(1).mean(1).double()
    n = 64 * 64
    # Only t = 0 predicts anything (every pixel): P = mu, R = 1.
    assert torch.allclose(fmeasure_curve(zero, gt)[:, 0], 1.3 * mu / (0.3 * mu + 1))
    assert (fmeasure_curve(zero, gt)[:, 1:] == 0).all()
    assert torch.allclose(mae(zero, gt), mu)
    # Every pixel has a zero-demeaned prediction: the alignment is 0 and the enhanced value 1/4 everywhere.
    assert torch.allclose(e_measure_curve(zero, gt), torch.full((8, 256), n / 4 / (n - 1), dtype=torch.float64))
    # Empty-gt conventions: S = 1 - mean(pred), E = mean(1 - binarised pred) * N / (N - 1), wF = 0.
    empty = torch.zeros(2, 1, 8, 8)
    p = torch.full((2, 1, 8, 8), 0.25)
    assert torch.allclose(s_measure(p, empty), torch.full((2,), 0.75, dtype=torch.float64))
    assert torch.allclose(e_measure_curve(p, empty)[:, 100], torch.full((2,), 64 / 63, dtype=torch.float64))
    assert (weighted_fmeasure(p, empty) == 0).all()


def test_hand_cases():
    pred = torch.tensor([[[0.2, 0.9], [0.5, 0.0]]])
    g = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    assert mae(pred, g).item() == pytest.approx(0.2)
    # q = [255, 127, 0, 0] against gt [1, 1, 0, 0].
    curve = fmeasure_curve(torch.tensor([[[1.0, 0.5], [0.0, 0.0]]]), torch.tensor([[[1.0, 1.0], [0.0, 0.0]]]))[0]
    assert curve[0].item() == pytest.approx(1.3 * 0.5 / (0.3 * 0.5 + 1))
    assert curve[1].item() == pytest.approx(1.0) and curve[127].item() == pytest.approx(1.0)
    assert curve[128].item() == pytest.approx(1.3 * 0.5 / (0.3 + 0.5)) and curve[255].item() == pytest.approx(0.8125)
    # S-measure of an all-zero map on a 4x4 gt with a 2x2 top-left object: S_object = 0.75 * 1 + 0.25 * 0; the
    # centroid (0.5, 0.5) rounds (half to even) to 0, +1: only the 1-pixel top-left block has zero variances in
    # both maps and scores 1 (weight 1/16); the other blocks score 0.
    g4 = torch.zeros(1, 4, 4)
    g4[0, :2, :2] = 1
    assert s_measure(torch.zeros(1, 4, 4), g4).item() == pytest.approx(0.5 * 0.75 + 0.5 / 16)
    # wF of 0.5 * gt on an object >= 3 px from the border: every error is 0.5 (background pixels take their
    # nearest object pixel's), the 7x7 blur keeps 0.5 on the object: R = 0.5, no weighted FP: P = 1, Q = 2/3.
    g16 = torch.zeros(1, 16, 16)
    g16[0, 5:11, 4:12] = 1
    assert weighted_fmeasure(0.5 * g16, g16).item() == pytest.approx(2 / 3, abs=1e-12)


def _e_direct(binary: np.ndarray, g: np.ndarray) -> float:
    """Fan et al. 2018 pixel by pixel: the enhanced alignment matrix of the demeaned maps."""
    fm, gm = binary - binary.mean(), g - g.mean()
    xi = 2 * fm * gm / (fm**2 + gm**2 + np.spacing(1))
    return float(((1 + xi) ** 2 / 4).sum() / (g.size - 1 + np.spacing(1)))


def test_e_measure_against_pixelwise_definition(gt):
    pred = F.avg_pool2d(gt, 5, 1, 2)[:3]
    curve = e_measure_curve(pred, gt[:3])
    q = np.floor(pred[:, 0].double().numpy() * 255)
    for i in range(3):
        for t in (0, 1, 64, 200, 255):
            assert curve[i, t].item() == pytest.approx(_e_direct((q[i] >= t).astype(float), gt[i, 0].double().numpy()))


def test_adaptive_e_and_binarized_protocol(gt):
    pred = F.avg_pool2d(gt, 5, 1, 2)[:3]
    for i in range(3):
        p = pred[i, 0].double().numpy()
        th = min(2 * p.mean(), 1.0)
        direct = _e_direct((p >= th).astype(float), gt[i, 0].double().numpy())
        assert adaptive_e_measure(pred, gt[:3])[i].item() == pytest.approx(direct)
    # Binarised first (DiffDIS's script): adaptive E is the binary map's E, maxF its F at any t >= 1.
    binary = (pred > 0.5).float()
    row = dis_metrics(pred, gt[:3], binarize=True, with_hce=False)
    assert row == dis_metrics(binary, gt[:3], with_hce=False)
    assert row["adpE"] == pytest.approx(e_measure_curve(binary, gt[:3])[:, 1].mean().item())
    assert row["maxF"] == pytest.approx(fmeasure_curve(binary, gt[:3])[:, 1:].mean(0).max().item())


def test_band_fmeasure_targets_thin_structures():
    g = torch.zeros(1, 32, 32)
    g[0, 8:24, 8:24] = 1
    g[0, 2, 2:30] = 1  # a 1-px wire
    band = boundary_band(g, 2)
    assert band[0, 2].all() and not band[0, 16, 16]  # the wire lies in the band, the deep interior does not
    no_wire = g.clone()
    no_wire[0, 2] = 0
    interior_miss = g.clone()
    interior_miss[0, 14:18, 14:18] = 0
    assert band_fmeasure_curve(interior_miss, g).max() == pytest.approx(1.0)  # invisible to the band
    # The missed wire: inside the band 28 of the 28 + |square band| positives are lost, none predicted wrongly.
    n_pos = int((g.bool() & band).sum())
    recall = (n_pos - 28) / n_pos
    assert band_fmeasure_curve(no_wire, g)[0, 255].item() == pytest.approx(1.3 * recall / (0.3 + recall))
    assert band_fmeasure_curve(no_wire, g)[0, 255] < fmeasure_curve(no_wire, g)[0, 255]


def test_hce_proxy_counts():
    yy, xx = torch.meshgrid(torch.arange(48), torch.arange(48), indexing="ij")
    disk = (((yy - 24) ** 2 + (xx - 24) ** 2) < 12**2).float()[None]
    assert hce(disk, disk).item() == 0
    # A 1-px slip of the whole boundary (dilation / erosion) is within DIS's tolerance: no correction needed.
    grown = F.max_pool2d(disk[None], 3, 1, 1)[0]
    shrunk = -F.max_pool2d(-disk[None], 3, 1, 1)[0]
    assert hce(grown, disk).item() == 0 and hce(shrunk, disk).item() == 0
    assert mae(grown, disk).item() > 0
    # A separate false blob too big to be forgiven: one region-selection click.
    blob = disk.clone()
    blob[0, 2:14, 2:14] = 1
    blob[0, :, :] = torch.maximum(blob[0], disk[0])
    assert hce(blob, disk).item() == 1
    # A missed 1-px wire attached to the object is always counted (skeleton rule), and longer costs more.
    costs = []
    for length in (10, 30):
        g = disk.clone()
        g[0, 24, 36 : 36 + length] = 1
        costs.append(hce(disk, g).item())
    assert 0 < costs[0] < costs[1]
    square = torch.zeros(9, 9, dtype=torch.bool)
    square[2:7, 2:7] = True
    diagonals = np.zeros((9, 9), dtype=bool)
    for i in range(5):
        diagonals[2 + i, 2 + i] = diagonals[2 + i, 6 - i] = True
    assert (morphological_skeleton(square.numpy()) == diagonals).all()  # a square's skeleton: its two diagonals
    assert morphological_skeleton(np.eye(6, dtype=bool)).sum() == 6  # a 1-px line is its own skeleton


def test_bad_inputs():
    with pytest.raises(ValueError, match="same shape"):
        mae(torch.zeros(1, 4, 4), torch.zeros(1, 4, 5))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fmeasure_curve(torch.full((1, 4, 4), 1.5), torch.zeros(1, 4, 4))
    with pytest.raises(ValueError, match="width"):
        band_fmeasure_curve(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4), width=0)
    with pytest.raises(ValueError, match="relax"):
        hce(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4), relax=-1)


def _reference():
    """py-sod-metrics' sod_metrics module, with a stand-in cv2 (only its HCE class calls OpenCV), or None."""
    try:
        stub = "cv2" not in sys.modules
        if stub:
            sys.modules["cv2"] = types.ModuleType("cv2")
        try:
            return importlib.import_module("py_sod_metrics.sod_metrics")
        finally:
            if stub:
                del sys.modules["cv2"]
    except ImportError:
        return None


def test_against_py_sod_metrics(gt):
    ref = _reference()
    if ref is None:
        pytest.skip("py-sod-metrics not installed (requirements-test-reference.txt)")
    torch.manual_seed(0)
    g = gt.clone()
    g[0] = 0  # the empty- and full-gt conventions too
    g[1] = 1
    preds = [F.avg_pool2d(gt, 5, 1, 2), torch.rand_like(gt), (0.6 * gt + 0.4 * torch.rand_like(gt)), gt.clone()]
    for pred in preds:
        for truth in (gt, g):
            fm, em, sm, wfm = ref.Fmeasure(), ref.Emeasure(), ref.Smeasure(), ref.WeightedFmeasure()
            for p, t in zip(pred[:, 0].double().numpy(), truth[:, 0].numpy() > 0.5, strict=True):
                for m in (fm, em, sm, wfm):
                    m.step(p, t, normalize=False)
            ours = dis_metrics(pred, truth, with_hce=False)
            assert ours["maxF"] == pytest.approx(fm.get_results()["fm"]["curve"].max(), abs=1e-12)
            assert ours["meanE"] == pytest.approx(em.get_results()["em"]["curve"].mean(), abs=1e-12)
            assert ours["maxE"] == pytest.approx(em.get_results()["em"]["curve"].max(), abs=1e-12)
            assert ours["adpE"] == pytest.approx(em.get_results()["em"]["adp"], abs=1e-12)
            assert ours["S"] == pytest.approx(sm.get_results()["sm"], abs=1e-12)
            assert ours["wF"] == pytest.approx(wfm.get_results()["wfm"], abs=1e-12)
            assert ours["MAE"] == pytest.approx(float(np.mean([np.abs(p - t).mean() for p, t in zip(
                pred[:, 0].double().numpy(), truth[:, 0].double().numpy(), strict=True)])), abs=1e-12)
