"""The W4A4 methods: SVDQuant (Li et al., ICLR 2025, "SVDQuant: Absorbing Outliers by Low-Rank Components for
4-Bit Diffusion Models") and its calibrated baselines RTN, SmoothQuant (Xiao et al., ICML 2023) and the SVD-only
ablation, each a registered quantizer (docs/methods/svdquant.md, "Calibration" and "Baselines").

All four run :class:`~steerdiff.quant.calibrate.GroupCalibrator` per input-sharing group on the floating-point
model's own layer inputs; they differ only in its configuration:

============== ================================ ========================= ==============================
method         smoothing                        low-rank branch           shifted (UINT4) inputs default
============== ================================ ========================= ==============================
``svdquant``   searched (39-grid, output error) rank r, refined           on
``rtn``        none                             none                      off
``smoothquant````alpha`` fixed, or searched on   none                      on
               k/20 with ``alpha=None``
``svd``        none                             rank r, refined           on
============== ================================ ========================= ==============================
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .calibrate import GroupCalibrator, SearchConfig
from .collect import subsample
from .layers import layer_geometry, matrix, weight_of
from .registry import QuantJob, register_quantizer

DEFAULT_RANK = 32  # deepcompressor low_rank.rank (the official calibration default)
W4A4_OPTIONS = ("fmt", "num_grids", "early_stop", "shift", "max_tokens", "svd", "search", "factor_dtype")


def default_rank(group_modules: list[nn.Module]) -> int:
    """32 (deepcompressor's default) capped at a quarter of the group's smaller side (a steerdiff cap)."""
    n = sum(m.weight.shape[0] for m in group_modules)
    k = matrix(weight_of(group_modules[0])).shape[1]
    return min(DEFAULT_RANK, min(n, k) // 4)


def calibrate_w4a4(job: QuantJob, smooth: Callable[[dict], str], with_rank: bool, shift_default: bool) -> None:
    """Run :class:`GroupCalibrator` on every group of ``job``: ``smooth(options)`` is the smoothing rule
    (``"search"``, ``"none"``, ``"smoothquant"``, ``"fixed"``), ``with_rank`` adds the low-rank branch with its
    refinement, ``shift_default`` is the UINT4 shift of post-activation inputs when ``shift=None``."""
    opt = job.options
    rank, shift, alpha = opt["rank"], opt["shift"], opt["alpha"]
    for g in job.groups:
        modules = [job.fp_root.get_submodule(p) for p in g.paths]
        conv = layer_geometry(modules[0])["kind"] == "conv2d"
        x = subsample(job.inputs[g.paths[0]], opt["max_tokens"], g.tokens, conv=conv)
        r = (rank if rank is not None else default_rank(modules)) if with_rank else 0
        cfg = SearchConfig(
            wfmt=opt["fmt"], afmt=opt["fmt"], rank=r, num_grids=opt["num_grids"],
            num_iters=opt["num_iters"] if with_rank else 1, early_stop=opt["early_stop"],
            shift=shift_default if shift is None else shift, factor_dtype=opt["factor_dtype"], svd=opt["svd"],
            search=opt.get("search", "auto"),
            smooth=smooth(opt), alpha=0.5 if alpha is None else alpha)
        new_layers, info = GroupCalibrator(g, modules, x, cfg).run()
        for p, layer in zip(g.paths, new_layers, strict=True):
            job.replace(p, layer, {"type": "SVDQLayer", **layer.spec})
        job.report.append({k: v for k, v in info.items() if k != "search"} | {"n_candidates": len(info["search"])})
        if job.progress:
            print(f"[quant] {g.name}: rank {r}, search {info['search_mode']}, rel. output error "
                  f"{info['rel_error']:.3e}", flush=True)


@register_quantizer("svdquant", options=("rank", "num_iters", *W4A4_OPTIONS))
def svdquant(job: QuantJob) -> None:
    """SVDQuant W4A4: smoothing search, a rank-r 16-bit branch with refinement, 4-bit residual (Li et al. 2025)."""
    calibrate_w4a4(job, lambda opt: "search", with_rank=True, shift_default=True)


@register_quantizer("rtn", options=W4A4_OPTIONS)
def rtn(job: QuantJob) -> None:
    """Naive W4A4: Q_x(x) Q_w(W)^T + b, no smoothing, no branch, no shift."""
    calibrate_w4a4(job, lambda opt: "none", with_rank=False, shift_default=False)


@register_quantizer("smoothquant", options=("alpha", *W4A4_OPTIONS))
def smoothquant(job: QuantJob) -> None:
    """SmoothQuant W4A4 (Xiao et al., ICML 2023): lambda = a^alpha / w^(1 - alpha), alpha fixed or searched."""
    calibrate_w4a4(job, lambda opt: "smoothquant" if opt["alpha"] is None else "fixed", with_rank=False,
                   shift_default=True)


@register_quantizer("svd", options=("rank", "num_iters", *W4A4_OPTIONS))
def svd(job: QuantJob) -> None:
    """SVD-only ablation: lambda = 1, a rank-r branch with refinement, W4A4."""
    calibrate_w4a4(job, lambda opt: "none", with_rank=True, shift_default=True)
