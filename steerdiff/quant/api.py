"""``sd.quant.quantize``: SVDQuant W4A4 and its baselines on any steerdiff denoiser or ``nn.Module``.

Methods (SVDQuant, Li et al., ICLR 2025, and its baselines; docs/methods/svdquant.md): the registered quantizers
(:data:`~steerdiff.quant.QUANTIZERS`, :func:`~steerdiff.quant.register_quantizer`); built in, each registered where
it is defined (``w4a4.py``, ``kernels.py``):

============== ============================================================================================
``svdquant``   smoothing search (39-grid, output-error objective) + rank-r branch with refinement
               + W4A4 (INT4 g64, UINT4 for shifted post-activation inputs; or NVFP4 g16)
``rtn``        naive W4A4: ``Q_x(x) Q_w(W)^T + b``, no lambda, no branch, no shift
``smoothquant``SmoothQuant W4A4 (Xiao et al. 2023): lambda = a^alpha / w^(1 - alpha), ``alpha=0.5`` fixed or,
               with ``alpha=None``, searched on the grid k/20 with the same output-error objective; no branch
``svd``        SVD-only ablation: lambda = 1, rank-r branch with refinement, W4A4
``w4a16``      INT4 asymmetric g64 weight-only, real CPU int4 kernel
``w8a8``       INT8 per-channel weights, per-token dynamic INT8 activations, ``torch._int_mm``
============== ============================================================================================

A new method is one file with a ``@register_quantizer("name")`` function (docs/methods/svdquant.md, "Adding a
quantizer"). The pipeline is in docs/methods/svdquant.md ("Calibration", "Baselines"). W4A4 runs **simulated** on
CPU (no CPU kernel multiplies 4-bit activations by 4-bit weights; "CPU kernels" there); W4A16 and W8A8 use
PyTorch's real low-bit CPU kernels. The returned model is the same kind of object as the input (an ``EDMPrecond``
stays an ``EDMPrecond``, a ``from_diffusers`` denoiser stays one), so it runs under every sampler and guider.
"""

from __future__ import annotations

import copy
import time
from numbers import Real

import torch
from torch import nn

from .calibrate import SEARCH_MODES, SVD_MODES
from .collect import capture_inputs, iter_calib, trajectory_calibration
from .kernels import W4A16Layer, W8A8Layer
from .layers import FACTOR_DTYPES, SVDQLayer, layer_geometry, matrix, weight_of
from .mapping import Group, denoiser_root, input_shape_check, select_groups
from .registry import QUANTIZERS, QuantJob
from .w4a4 import DEFAULT_RANK, default_rank  # noqa: F401  (DEFAULT_RANK: re-exported)

METHODS = tuple(QUANTIZERS.names())
"""The built-in quantizers (a snapshot at import: :data:`~steerdiff.quant.QUANTIZERS` holds every registered one)."""
W4A4_METHODS = tuple(name for name, q in QUANTIZERS.items() if "fmt" in q.options)
"""The built-in W4A4 quantizers (those taking ``fmt``; a snapshot at import)."""
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
"""Model dtypes every method quantizes: calibration runs the fp layers in the model's own dtype, and the quantized
layers take and return it (their simulated W4A4 product, like the real W4A16/W8A8 kernels, computes in float32)."""
QUANT_LAYERS = (SVDQLayer, W4A16Layer, W8A8Layer)


_default_rank = default_rank  # the former private name


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _check_options(method, fmt, rank, alpha, num_grids, num_iters, early_stop, shift, num_samples, max_tokens, svd,
                   factor_dtype, groups, search="auto") -> None:
    """Every option of :func:`quantize`, checked before any copy or calibration."""
    QUANTIZERS.get(method)  # an unknown name: a ValueError listing the registered ones
    if fmt not in ("int4", "nvfp4"):
        raise ValueError(f"fmt must be 'int4' or 'nvfp4', got {fmt!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    if svd not in SVD_MODES:
        raise ValueError(f"svd must be one of {', '.join(map(repr, SVD_MODES))}, got {svd!r}")
    if search not in SEARCH_MODES:
        raise ValueError(f"search must be one of {', '.join(map(repr, SEARCH_MODES))}, got {search!r}")
    if factor_dtype not in FACTOR_DTYPES:
        raise ValueError(f"factor_dtype must be one of {sorted(FACTOR_DTYPES)}, got {factor_dtype!r}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0 <= alpha <= 1):
        raise ValueError(f"alpha must be None (searched) or a number in [0, 1] (SmoothQuant's migration strength), "
                         f"got {alpha!r}")
    _check_int("num_grids", num_grids, 1)
    _check_int("num_iters", num_iters, 1)
    _check_int("num_samples", num_samples, 1)
    _check_int("max_tokens", max_tokens, 1)
    if not isinstance(early_stop, bool):
        raise ValueError(f"early_stop must be a bool, got {early_stop!r}")
    if shift is not None and not isinstance(shift, bool):
        raise ValueError(f"shift must be None (the method's default) or a bool, got {shift!r}")
    if groups is not None and (not isinstance(groups, (list, tuple)) or not groups
                               or not all(isinstance(g, Group) for g in groups)):
        raise ValueError(f"groups must be a non-empty list of steerdiff.quant.Group, got {groups!r}")


def _already_quantized(root: nn.Module) -> str | None:
    """What shows that ``root`` is already quantized (its record, or a quantized layer), or None."""
    info = getattr(root, "steerdiff_quant", None)
    if isinstance(info, dict):
        return f"method {info.get('method')!r}, format {info.get('fmt')!r}"
    for path, m in root.named_modules():
        if isinstance(m, QUANT_LAYERS):
            return f"it holds a quantized {type(m).__name__} at {path or 'the top level'!r}"
    return None


def _check_groups(root: nn.Module, groups: list[Group], method: str) -> None:
    """Every group's layers exist, are plain Linear/Conv2d layers of a supported dtype, and share in_channels."""
    for g in groups:
        geos = []
        for p in g.paths:
            try:
                mod = root.get_submodule(p)
            except AttributeError as e:
                raise ValueError(f"groups: group {g.name!r} names layer {p!r}, which the model does not have") from e
            try:
                geos.append(layer_geometry(mod))
            except (TypeError, ValueError) as e:
                raise ValueError(f"groups: layer {p!r} of group {g.name!r} cannot be quantized: {e}") from e
            if mod.weight.dtype not in DTYPES:
                raise ValueError(f"model: layer {p!r} has dtype {mod.weight.dtype}; {method} quantizes float32, "
                                 "float64, float16 and bfloat16 layers")
        if len({geo["in_channels"] for geo in geos}) > 1:
            raise ValueError(f"groups: group {g.name!r}: layers sharing an input must have equal in_channels, got "
                             f"{[geo['in_channels'] for geo in geos]}")


def quantize(model, method: str = "svdquant", *, rank: int | None = None, calib=None, fmt: str = "int4",
             alpha: float | None = None, num_grids: int = 20, num_iters: int = 100, early_stop: bool = True,
             shift: bool | None = None, num_samples: int = 128, max_tokens: int = 4096, svd: str = "fast",
             search: str = "auto",
             factor_dtype: str = "float16", groups: list[Group] | None = None, inplace: bool = False,
             progress: bool = False):
    """Quantize ``model`` post-training; returns a model of the same kind (a copy unless ``inplace``).

    Args:
        model: a denoiser that is an ``nn.Module`` (``EDMPrecond`` around a UNet/DiT/MLP), a ``from_diffusers``
            denoiser (its ``.net.unet`` is quantized), or any ``nn.Module`` built of Linear layers.
        method: a registered quantizer (:data:`~steerdiff.quant.QUANTIZERS`); built in ``svdquant``, ``rtn``,
            ``smoothquant``, ``svd``, ``w4a16``, ``w8a8`` (module docstring).
        rank: low-rank branch rank r (``svdquant``, ``svd``); default 32 (deepcompressor) capped at a quarter of
            each layer's smaller side (a steerdiff cap). Rank 32 on a 128-wide layer would overstate the method, so
            the benchmarks and the demo pass ``rank=8`` (docs/methods/svdquant.md, "Defaults and their sources").
            Must not exceed the layer's ``min(n, m)``.
        calib: calibration inputs: a tensor (``model(calib)``), a list of inputs (tuples are unpacked as
            positional arguments, dicts as keyword arguments), or a callable returning such a list. Default for
            denoisers with ``sample_shape``: :func:`trajectory_calibration` (the model's own sampling runs,
            ``num_samples`` calls; docs/methods/svdquant.md, "Calibration data"). Ignored by ``w4a16``/``w8a8``
            (no calibration).
        fmt: ``int4`` (g 64) or ``nvfp4`` (g 16) for the W4A4 methods.
        alpha: SmoothQuant migration strength; ``None`` = searched (``smoothquant``), ignored otherwise.
        num_grids: smoothing grid resolution (20 -> 39 candidates; the fast preset uses 10).
        num_iters: low-rank refinement iterations (early stop on output error; "Low-rank refinement").
        shift: UINT4 activations for post-GELU/SiLU inputs ("Quantizers"); default on for svdquant/smoothquant/svd.
        num_samples: calibration denoiser calls drawn from the trajectories (128, as deepcompressor).
        max_tokens: cap on calibration tokens per layer (calibration cost grows with tokens, and the search
            repeats the forward pass for every candidate).
        svd: ``fast`` (default: randomized rank-(r + 16) SVD in float32 on the layer's device, warm-started across
            the candidates; cost grows with the rank, not with the layer's full SVD), ``full`` (float64 SVD of the
            whole matrix per candidate, the official code's choice; hours on an SD-size UNet on a CPU) or
            ``lowrank`` (``torch.svd_lowrank`` in float64, cold-started); docs/methods/svdquant.md, "Fast SVD".
        search: the smoothing search. ``auto`` (default): per group, ``hybrid`` when its stacked weight ``[n, K]``
            has ``min(n, K) >= 320`` (every group of SD 1.5 / SDXL's UNets) and it has more than 512 calibration
            rows, ``exact`` otherwise (every group of the shipped models); decided from shapes alone and recorded
            per group in ``quant_info(model)["report"]`` (``search_mode``, with ``search_requested``).
            ``exact``: every candidate of the grid scored on every calibration row, the official search.
            ``fast``: each candidate scored on a fixed subsample of 512 calibration rows (random tokens,
            attention over 512 tokens, 8x8 windows of conv maps) over a coarse-to-fine grid (every
            other ``alpha`` on each line, then the best one's two neighbours: 21 of 39 candidates at
            ``num_grids = 20``); the refinement and the reported error use every row. ``fastest``: as ``fast``,
            with the refinement's iterations also scored on the subsample. ``rescore``: as ``fastest``, with the
            3 best candidates on the subsample scored again on every row and the best of those kept (a tie-break:
            the subsample's scores are near ties). ``sampled``: every candidate of the exact grid, in its order,
            scored on the 512-row subsample, the 3 best re-scored on every row (the best of those kept), the
            refinement on every row: the exact search's result whenever the exact argmin is among the subsample's
            top 3, at about half its cost on an SD-size UNet. ``hybrid``: ``sampled`` with the refinement's
            iterations scored on the subsample (the same early stop) and its 2 best re-scored on
            every row. docs/methods/svdquant.md, "Fast search" and "Automatic search (the default)".
        factor_dtype: storage dtype of lambda and the low-rank factors (``float16``, the paper's 16-bit branch;
            ``float32`` for exactness checks).
        groups: override the layer mapping (:func:`steerdiff.quant.mapping.select_groups`).

    The model's dtype is kept: float32, float64, float16 and bfloat16 models are calibrated in their own dtype,
    and the quantized layers take and return it.

    Raises:
        ValueError: unknown method/format or a bad option value, rank too large for a layer, calibration of the
            wrong shape or dtype (or giving non-finite layer inputs), a model that is already quantized, layers of
            an unsupported dtype.
        TypeError: ``model`` is not an ``nn.Module`` or a ``from_diffusers`` denoiser; ``calib`` of a wrong type.
    """
    _check_options(method, fmt, rank, alpha, num_grids, num_iters, early_stop, shift, num_samples, max_tokens, svd,
                   factor_dtype, groups, search)
    done = _already_quantized(denoiser_root(model))
    if done is not None:
        raise ValueError(f"model is already quantized ({done}); quantize the original floating-point model")
    if isinstance(model, (nn.Linear, nn.Conv2d)):  # a bare layer: quantize it inside a container
        wrapped = quantize(nn.Sequential(model), method, rank=rank, calib=calib, fmt=fmt, alpha=alpha,
                           num_grids=num_grids, num_iters=num_iters, early_stop=early_stop, shift=shift,
                           num_samples=num_samples, max_tokens=max_tokens, svd=svd, search=search,
                           factor_dtype=factor_dtype, inplace=False, progress=progress)
        layer = wrapped[0]
        layer.steerdiff_quant = {**wrapped.steerdiff_quant,
                                 "layers": {"": next(iter(wrapped.steerdiff_quant["layers"].values()))}}
        return layer
    t0 = time.perf_counter()
    qmodel = model if inplace else copy.deepcopy(model)
    root = denoiser_root(qmodel)
    groups = list(groups) if groups is not None else select_groups(root)
    _check_groups(root, groups, method)
    if rank is not None and "rank" in QUANTIZERS.get(method).options:  # fail before any (slow) calibration
        for g in groups:
            mods = [root.get_submodule(p) for p in g.paths]
            n, k = sum(m.weight.shape[0] for m in mods), matrix(weight_of(mods[0])).shape[1]
            if rank > min(n, k):
                raise ValueError(f"rank={rank} is larger than group {g.name!r} allows: its stacked weight is "
                                 f"{n}x{k}, so rank must be in [0, {min(n, k)}]")
    generic = not any(g.eval_fn is not None or g.shift for g in groups) and all(
        isinstance(root.get_submodule(p), nn.Linear) for g in groups for p in g.paths)
    entry = QUANTIZERS.get(method)
    options = {"rank": rank, "fmt": fmt, "alpha": alpha, "num_grids": num_grids, "num_iters": num_iters,
               "early_stop": early_stop, "shift": shift, "max_tokens": max_tokens, "svd": svd, "search": search,
               "factor_dtype": factor_dtype}
    job = QuantJob(method, root, denoiser_root(model), groups, options, progress=progress)
    if entry.calibrated:
        if calib is None:
            if getattr(model, "sample_shape", None) is None:
                raise ValueError("calib is required for a model without sample_shape (a plain nn.Module): pass a "
                                 "tensor of inputs or a callable yielding them")
            calib = trajectory_calibration(model, num_samples=num_samples)
        items = iter_calib(calib)
        if generic:
            for item in items:
                if hasattr(item, "shape"):
                    input_shape_check(root, item)
        fp_model = model  # the unquantized original: layer inputs come from the fp model ("Calibration data")
        job.fp_root = denoiser_root(fp_model)
        job.inputs = capture_inputs(job.fp_root, [g.paths[0] for g in groups], fp_model, items)
    entry.fn(job)
    root.steerdiff_quant = {"method": method, "fmt": fmt if "fmt" in entry.options else None,
                            "layers": job.layers, "report": job.report, "seconds": time.perf_counter() - t0}
    return qmodel


def quant_info(model) -> dict:
    """The quantization record of a model returned by :func:`quantize` or :func:`steerdiff.quant.load`."""
    root = denoiser_root(model)
    info = getattr(root, "steerdiff_quant", None)
    if info is None:
        held = _already_quantized(root)
        if held is not None:
            raise ValueError(f"model has no steerdiff_quant record although {held}: only models returned by "
                             "steerdiff.quant.quantize or steerdiff.quant.load carry one")
        raise ValueError("model is not quantized (no steerdiff_quant record)")
    return info
