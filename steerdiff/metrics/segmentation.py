"""Dichotomous-segmentation metrics as DIS5K reports them (docs/methods/diffdis.md, "Metrics").

DIS (Qin et al., ECCV 2022, "Highly Accurate Dichotomous Image Segmentation", Sec. 4) and DiffDIS (Yu et al.,
ICLR 2025, Sec. 4.1) report max F-measure, weighted F-measure, S-measure, mean E-measure, MAE and the human
correction efforts (HCE). The conventions follow the standard SOD evaluation code (the MATLAB originals and the
``py-sod-metrics`` package, which the tests compare against):

* ``pred`` is a probability map in [0, 1] (not min-max normalised per image), ``gt`` is binarised at 0.5.
* **Threshold curves** (F, E, band F): the prediction is quantised as ``q = floor(255 pred)`` and binarised at
  every ``t in {0, ..., 255}`` by ``q >= t``: 256 thresholds, index ``t`` of the curve (``t = 0`` predicts every
  pixel positive). Dataset-level "max" scores take the max over ``t`` of the per-image curves averaged over
  images (not the mean of per-image maxima); "mean" scores average over ``t`` and images.
* **F-measure** (Achanta et al. 2009), ``beta^2 = 0.3``: ``F = (1 + b2) P R / (b2 P + R)``, 0 when ``P R = 0``;
  ``P = TP / max(TP + FP, 1)``, ``R = TP / max(|gt|, 1)``.
* **Weighted F-measure** (Margolin et al., CVPR 2014), ``beta^2 = 1``: errors ``E = |pred - gt|``; a background
  pixel takes the error of its nearest foreground pixel (Euclidean distance transform); a 7x7 Gaussian
  (sigma 5, zero padding) blurs it and foreground pixels keep ``min(E, blur)``; background errors are weighted
  by ``2 - exp(ln(0.5) d / 5)`` at distance ``d`` from the foreground. 0 for an empty ``gt``.
* **S-measure** (Fan et al., ICCV 2017), ``alpha = 0.5``: ``alpha S_object + (1 - alpha) S_region`` clipped at
  0, with ``S_object`` from the mean and sample std of the foreground and background scores
  (``2 m / (m^2 + 1 + s)``) and ``S_region`` the area-weighted SSIM of the four blocks cut at the foreground
  centroid (rounded, +1 as MATLAB's ``1:X``); ``1 - mean(pred)`` for an empty ``gt``, ``mean(pred)`` for a full one.
* **E-measure** (Fan et al., IJCAI 2018): per threshold, ``sum((1 + xi)^2 / 4) / (N - 1)`` with the alignment
  ``xi = 2 a b / (a^2 + b^2)`` of the demeaned binary prediction ``a`` and ``gt`` ``b``; for an empty ``gt`` the
  enhanced matrix is ``1 - pred``, for a full one ``pred``. DIS reports the **mean** over thresholds
  (``E_phi^m``); the max and the adaptive E (threshold ``min(2 mean(pred), 1)``) are returned too. Because of
  the ``N - 1`` and the ``t = 0`` threshold, a perfect binary prediction scores
  ``mean E = N / (N - 1) (255 + 1/4) / 256`` (0.9971 at 64x64), ``max E = N / (N - 1)``.
* **MAE**: mean ``|pred - gt|``.
* **HCE proxy** (:func:`hce`; DIS Sec. 4.2 counts the mouse clicks a human needs to fix a binarised prediction):
  see :func:`hce` for exactly what is counted. Not numerically comparable with published HCE values.
* **DiffDIS's own script** (``test_score.py`` of the official code) min-max normalises and then binarises the
  prediction at 0.5 before every metric, reports the adaptive E-measure (of that binary map), 255 threshold bins
  (the same max for a binary map) and a population (not sample) std in S-measure: ``dis_metrics(...,
  binarize=True)`` gives that protocol's numbers (without the min-max step, which is meant for 8-bit maps, and
  with the sample std of the standard code).
* **Band F-measure** (:func:`band_fmeasure_curve`): the F-measure counted only inside the band of pixels within
  ``width`` px (Chebyshev) of the true mask's boundary: what separates thin-structure accuracy from the bulk.

Every per-image function takes ``pred`` and ``gt`` of shape ``[B, 1, H, W]`` or ``[B, H, W]`` and returns a
float64 tensor ``[B]`` (or ``[B, 256]`` for curves); :func:`dis_metrics` gives the dataset-level table row.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.ndimage as ndi
import torch
import torch.nn.functional as F
from torch import Tensor

EPS = float(np.spacing(1))  # MATLAB's eps, as the reference codes use
THRESHOLDS = 256


def _check(pred: Tensor, gt: Tensor) -> tuple[Tensor, Tensor]:
    """``pred`` as float64 ``[B, H, W]`` in [0, 1] and ``gt`` as bool ``[B, H, W]``."""
    if not isinstance(pred, Tensor) or not isinstance(gt, Tensor):
        raise ValueError(f"pred and gt must be tensors, got {type(pred).__name__}, {type(gt).__name__}")
    if pred.shape != gt.shape:
        raise ValueError(f"pred and gt must have the same shape, got {tuple(pred.shape)} and {tuple(gt.shape)}")
    if pred.ndim == 4 and pred.shape[1] == 1:
        pred, gt = pred[:, 0], gt[:, 0]
    if pred.ndim != 3 or pred.shape[1] < 2 or pred.shape[2] < 2:
        raise ValueError(f"pred must be [B, 1, H, W] or [B, H, W] with H, W >= 2, got {tuple(pred.shape)}")
    pred = pred.detach().to(torch.float64)
    if not torch.isfinite(pred).all() or pred.min() < 0 or pred.max() > 1:
        raise ValueError("pred must be finite probabilities in [0, 1] (apply a sigmoid or clamp first)")
    return pred, gt.detach() > 0.5


def _counts(pred: Tensor, gt: Tensor, region: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per threshold ``t``: ``#(q >= t & gt)`` and ``#(q >= t & ~gt)`` over ``region``, each ``[B, 256]``."""
    q = (pred * 255).floor().long().clamp(0, 255).flatten(1)
    w = torch.ones_like(q, dtype=torch.float64) if region is None else region.flatten(1).to(torch.float64)
    g = gt.flatten(1).to(torch.float64)
    hist_fg = torch.zeros(q.shape[0], THRESHOLDS, dtype=torch.float64, device=q.device).scatter_add_(1, q, w * g)
    hist_bg = torch.zeros_like(hist_fg).scatter_add_(1, q, w * (1 - g))
    # Suffix sums: the count of q >= t for every t at once.
    return hist_fg.flip(1).cumsum(1).flip(1), hist_bg.flip(1).cumsum(1).flip(1)


def _f_from_counts(tp: Tensor, fp: Tensor, n_pos: Tensor, beta2: float) -> Tensor:
    precision = tp / (tp + fp).clamp(min=1)
    recall = tp / n_pos.clamp(min=1)[:, None]
    num = (1 + beta2) * precision * recall
    return torch.where(num == 0, torch.zeros_like(num), num / (beta2 * precision + recall).clamp(min=EPS))


def fmeasure_curve(pred: Tensor, gt: Tensor, beta2: float = 0.3) -> Tensor:
    """F-measure at the 256 thresholds ``q >= t`` (module docstring), ``[B, 256]``; DIS's maxF is
    ``curve.mean(0).max()``."""
    pred, gt = _check(pred, gt)
    tp, fp = _counts(pred, gt)
    return _f_from_counts(tp, fp, gt.flatten(1).sum(1).to(torch.float64), beta2)


def boundary_band(gt: Tensor, width: int) -> Tensor:
    """Pixels within ``width`` px (Chebyshev) of the boundary of a binary ``[B, H, W]`` mask: dilation minus erosion
    by a ``(2 width + 1)`` square, image border replicated (the canvas edge is no boundary)."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be an int >= 1, got {width!r}")
    m = F.pad(gt[:, None].to(torch.float32), (width,) * 4, mode="replicate")
    k = 2 * width + 1
    return (F.max_pool2d(m, k, stride=1) + F.max_pool2d(-m, k, stride=1))[:, 0] > 0.5


def band_fmeasure_curve(pred: Tensor, gt: Tensor, width: int = 2, beta2: float = 0.3) -> Tensor:
    """F-measure over the 256 thresholds counted only inside :func:`boundary_band` ``(gt, width)``, ``[B, 256]``.

    Thin structures (wires, hair, lattice bars) lie wholly inside this band, so it measures them rather than the
    easy interior and far background.
    """
    pred, gt = _check(pred, gt)
    band = boundary_band(gt, width)
    tp, fp = _counts(pred, gt, band)
    return _f_from_counts(tp, fp, (gt & band).flatten(1).sum(1).to(torch.float64), beta2)


def mae(pred: Tensor, gt: Tensor) -> Tensor:
    """Mean absolute error per image, ``[B]``."""
    pred, gt = _check(pred, gt)
    return (pred - gt.to(torch.float64)).abs().flatten(1).mean(1)


def _e_from_counts(tp: Tensor, fp: Tensor, g: Tensor, n: float) -> Tensor:
    """E-measure of binary maps from their cell counts (any common shape): a binary map takes two values, so the
    enhanced matrix takes one value on each (pred, gt) cell and its sum is counts times those values."""
    pred_fg = tp + fp
    mu_p, mu_g = pred_fg / n, g / n
    total = torch.zeros_like(tp)
    cells = (
        (tp, 1 - mu_p, 1 - mu_g),  # pred fg, gt fg
        (fp, 1 - mu_p, -mu_g),  # pred fg, gt bg
        (g - tp, -mu_p, 1 - mu_g),  # pred bg, gt fg
        (n - pred_fg - (g - tp), -mu_p, -mu_g),  # pred bg, gt bg
    )
    for count, a, b in cells:
        xi = 2 * a * b / (a * a + b * b + EPS)
        total = total + count * (1 + xi) ** 2 / 4
    total = torch.where(g == 0, n - pred_fg, torch.where(g == n, pred_fg, total))
    return total / (n - 1 + EPS)


def e_measure_curve(pred: Tensor, gt: Tensor) -> Tensor:
    """Enhanced-alignment measure (Fan et al. 2018) at the 256 thresholds, ``[B, 256]``."""
    pred, gt = _check(pred, gt)
    tp, fp = _counts(pred, gt)
    g = gt.flatten(1).sum(1).to(torch.float64)[:, None].expand_as(tp)
    return _e_from_counts(tp, fp, g, float(gt.shape[1] * gt.shape[2]))


def adaptive_e_measure(pred: Tensor, gt: Tensor) -> Tensor:
    """E-measure at the adaptive threshold ``min(2 mean(pred), 1)`` (Fan et al. 2018), ``[B]``; for a binary map
    this is the E-measure of the map itself (what DiffDIS's evaluation script reports as E)."""
    pred, gt = _check(pred, gt)
    th = (2 * pred.flatten(1).mean(1)).clamp(max=1)
    binary = pred >= th[:, None, None]
    tp = (binary & gt).flatten(1).sum(1).to(torch.float64)
    fp = (binary & ~gt).flatten(1).sum(1).to(torch.float64)
    return _e_from_counts(tp, fp, gt.flatten(1).sum(1).to(torch.float64), float(gt.shape[1] * gt.shape[2]))


def s_measure(pred: Tensor, gt: Tensor, alpha: float = 0.5) -> Tensor:
    """Structure measure (Fan et al. 2017), ``[B]``: object- and region-aware similarity (module docstring)."""
    pred, gt = _check(pred, gt)
    b, h, w = pred.shape
    g = gt.to(torch.float64)
    y = g.flatten(1).mean(1)

    def s_object(x: Tensor, sel: Tensor) -> Tensor:
        k = sel.flatten(1).sum(1)
        m = (x * sel).flatten(1).sum(1) / k.clamp(min=1)
        var = (((x - m[:, None, None]) ** 2) * sel).flatten(1).sum(1) / (k - 1).clamp(min=1)
        return 2 * m / (m * m + 1 + var.sqrt() + EPS)

    s_obj = y * s_object(pred, gt) + (1 - y) * s_object(1 - pred, ~gt)

    rows = torch.arange(h, device=pred.device, dtype=torch.float64)
    cols = torch.arange(w, device=pred.device, dtype=torch.float64)
    k = g.flatten(1).sum(1).clamp(min=1)
    # Centroid (0-based mean index, rounded half to even as numpy) + 1: block "top-left" is rows < cy, cols < cx.
    cy = torch.where(y > 0, torch.round((g.sum(2) * rows).sum(1) / k), torch.tensor(round(h / 2.0))) + 1
    cx = torch.where(y > 0, torch.round((g.sum(1) * cols).sum(1) / k), torch.tensor(round(w / 2.0))) + 1
    top = rows[None, :, None] < cy[:, None, None]
    left = cols[None, None, :] < cx[:, None, None]
    s_reg = torch.zeros(b, dtype=torch.float64, device=pred.device)
    for sel in (top & left, top & ~left, ~top & left, ~top & ~left):
        sel = sel.expand(b, h, w).to(torch.float64)
        num = sel.flatten(1).sum(1)
        mx = (pred * sel).flatten(1).sum(1) / num.clamp(min=1)
        my = (g * sel).flatten(1).sum(1) / num.clamp(min=1)
        dx, dy = (pred - mx[:, None, None]) * sel, (g - my[:, None, None]) * sel
        sx = (dx * dx).flatten(1).sum(1) / (num - 1 + EPS)
        sy = (dy * dy).flatten(1).sum(1) / (num - 1 + EPS)
        sxy = (dx * dy).flatten(1).sum(1) / (num - 1 + EPS)
        a = 4 * mx * my * sxy
        bb = (mx * mx + my * my) * (sx + sy)
        ssim = torch.where(a != 0, a / (bb + EPS), torch.where(bb == 0, torch.ones_like(a), torch.zeros_like(a)))
        s_reg = s_reg + ssim * num / (h * w)
    s = (alpha * s_obj + (1 - alpha) * s_reg).clamp(min=0)
    return torch.where(y == 0, 1 - pred.flatten(1).mean(1), torch.where(y == 1, pred.flatten(1).mean(1), s))


def _gauss7() -> np.ndarray:
    r = np.arange(-3, 4, dtype=np.float64)
    k = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * 5.0**2))
    return k / k.sum()


def weighted_fmeasure(pred: Tensor, gt: Tensor, beta2: float = 1.0) -> Tensor:
    """Weighted F-measure (Margolin et al. 2014), ``[B]`` (module docstring; per image on the CPU with scipy)."""
    pred, gt = _check(pred, gt)
    out = []
    kernel = _gauss7()
    for p, g in zip(pred.cpu().numpy(), gt.cpu().numpy(), strict=True):
        if not g.any():
            out.append(0.0)
            continue
        dist, (iy, ix) = ndi.distance_transform_edt(~g, return_indices=True)
        err = np.abs(p - g)
        err_t = err[iy, ix]  # background pixels take the error of their nearest foreground pixel
        blurred = ndi.convolve(err_t, kernel, mode="constant", cval=0.0)
        e_min = np.where(g & (blurred < err), blurred, err)
        weight = np.where(g, 1.0, 2.0 - np.exp(math.log(0.5) / 5.0 * dist))
        ew = e_min * weight
        tpw = g.sum() - ew[g].sum()
        fpw = ew[~g].sum()
        recall = 1 - ew[g].mean()
        precision = tpw / (tpw + fpw + EPS)
        out.append((1 + beta2) * recall * precision / (recall + beta2 * precision + EPS))
    return torch.tensor(out, dtype=torch.float64)


_CROSS = ndi.generate_binary_structure(2, 1)
_SQUARE = ndi.generate_binary_structure(2, 2)


def morphological_skeleton(mask: np.ndarray) -> np.ndarray:
    """Lantuejoul's skeleton ``U_k (E^k(X) - open(E^k(X)))`` with the 3x3 cross: every structure at most 2 px
    thick lies on it wholly (not necessarily connected, unlike a thinning skeleton)."""
    skel = np.zeros_like(mask, dtype=bool)
    er = mask.astype(bool)
    while er.any():
        opened = ndi.binary_dilation(ndi.binary_erosion(er, _CROSS, border_value=1), _CROSS)
        skel |= er & ~opened
        er = ndi.binary_erosion(er, _CROSS, border_value=1)
    return skel


def _fix_cost(region: np.ndarray, condition: np.ndarray, epsilon: float) -> tuple[int, int]:
    """(boundary control points, independent regions) to fix the error pixels ``region`` (see :func:`hce`)."""
    labels, n = ndi.label(region, _SQUARE)
    if n == 0:
        return 0, 0
    near = ndi.binary_dilation(condition, _CROSS)
    contour = region & ~ndi.binary_erosion(region, _CROSS, border_value=1)
    contact = contour & near
    touching = np.zeros(n + 1, dtype=bool)
    touching[labels[contact]] = True
    independent = int(n - touching[1:].sum())
    runs, n_runs = ndi.label(contact, _SQUARE)
    sizes = np.bincount(runs.ravel(), minlength=n_runs + 1)[1:]
    seg = 5.0 * epsilon  # one polygon vertex per ~5 epsilon px of boundary to redraw, plus both ends
    points = int((2 + np.floor((sizes - 1) / seg)).sum())
    return points, independent


def hce(pred: Tensor, gt: Tensor, relax: int = 5, epsilon: float = 2.0) -> Tensor:
    """Human correction efforts proxy (DIS, Qin et al. 2022, Sec. 4.2), ``[B]`` float64 counts of operations.

    Exactly what is computed, per image (``P = pred > 0.5``, ``G = gt > 0.5``, 3x3 cross element, border = 1):

    1. ``FP = P & ~G``, ``FN = G & ~P``, ``U`` = ``P | G`` eroded ``relax`` times.
    2. Tolerance as in DIS's code: ``FP'`` = ``FP & U`` grown ``relax`` times by dilation inside ``~G``, then
       ``& FP`` (false-positive slivers along the object's border within ``relax`` px of nothing deeper are
       forgiven); ``FN'`` likewise inside ``~P``. Missed thin structure always counts:
       ``FN' |= skeleton(G) & ~P`` with :func:`morphological_skeleton` (DIS uses a thinning skeleton).
    3. Each 8-connected region of ``FP'`` (``FN'``) either touches its condition (``TP | FN'`` for FP,
       ``~(TP | FP' | FN')`` for FN, dilated by the cross) along its inner 4-contour, and is fixed by redrawing
       those contact runs, or is independent and costs 1 (one click to select and delete/fill it).
    4. A contact run (8-connected set of contact contour pixels) of ``n`` px costs ``2 + floor((n - 1) /
       (5 epsilon))`` polygon control points. DIS counts the vertices of a Douglas-Peucker approximation
       (tolerance ``epsilon``) of the run instead; this proxy charges a straight run the same 2 points for
       ``n <= 5 epsilon + 1`` px and grows linearly with length, so it over-counts long straight runs.

    ``HCE = points(FP') + independent(FP') + points(FN') + independent(FN')``; 0 for a perfect prediction.
    """
    if isinstance(relax, bool) or not isinstance(relax, int) or relax < 0:
        raise ValueError(f"relax must be an int >= 0, got {relax!r}")
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    pred, gt = _check(pred, gt)
    out = []
    for p, g in zip((pred > 0.5).cpu().numpy(), gt.cpu().numpy(), strict=True):
        tp, fp, fn = p & g, p & ~g, g & ~p
        u = ndi.binary_erosion(p | g, _CROSS, iterations=relax, border_value=1) if relax else p | g
        fp_, fn_ = fp & u, fn & u
        for _ in range(relax):
            fp_ = ndi.binary_dilation(fp_, _CROSS) & ~g
            fn_ = ndi.binary_dilation(fn_, _CROSS) & ~p
        fp_, fn_ = fp & fp_, fn & fn_
        fn_ |= morphological_skeleton(g) & ~p
        pts_fp, ind_fp = _fix_cost(fp_, tp | fn_, epsilon)
        pts_fn, ind_fn = _fix_cost(fn_, ~(tp | fp_ | fn_), epsilon)
        out.append(float(pts_fp + ind_fp + pts_fn + ind_fn))
    return torch.tensor(out, dtype=torch.float64)


def dis_metrics(pred: Tensor, gt: Tensor, band_width: int = 2, with_hce: bool = True,
                binarize: bool = False) -> dict[str, float]:
    """The DIS5K table row over a set of images (module docstring for each definition).

    Args:
        pred, gt: ``[B, 1, H, W]`` or ``[B, H, W]``; ``pred`` probabilities in [0, 1].
        band_width: ``width`` of the band F-measure.
        with_hce: compute the HCE proxy (the slowest metric).
        binarize: first binarise ``pred`` at 0.5, as DiffDIS's evaluation script does before every metric (then
            maxF is the F-measure of the binary map and ``adpE`` its E-measure: the numbers DiffDIS tabulates).

    Returns:
        ``{"maxF", "wF", "S", "meanE", "maxE", "adpE", "MAE", "bandF", "HCE", "n"}``: maxF / maxE / bandF are the max
        over thresholds of the image-averaged curves (bandF = max band F-measure, ``band_width`` px), the others
        means over images; ``HCE`` is the proxy of :func:`hce` (omitted when ``with_hce`` is False).
    """
    if binarize:
        pred, gt = _check(pred, gt)
        pred = (pred > 0.5).to(torch.float64)
    e = e_measure_curve(pred, gt)
    row = {
        "maxF": float(fmeasure_curve(pred, gt).mean(0).max()),
        "wF": float(weighted_fmeasure(pred, gt).mean()),
        "S": float(s_measure(pred, gt).mean()),
        "meanE": float(e.mean()),
        "maxE": float(e.mean(0).max()),
        "adpE": float(adaptive_e_measure(pred, gt).mean()),
        "MAE": float(mae(pred, gt).mean()),
        "bandF": float(band_fmeasure_curve(pred, gt, band_width).mean(0).max()),
    }
    if with_hce:
        row["HCE"] = float(hce(pred, gt).mean())
    row["n"] = int(pred.shape[0])
    return row
