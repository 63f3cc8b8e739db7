"""Smoothing search and low-rank split with refinement of SVDQuant (Li et al., ICLR 2025: outliers migrated into
the weights, then absorbed by a low-rank branch), per input-sharing group, as calibrated by the official
deepcompressor code (docs/methods/svdquant.md, "Smoothing search" and "Low-rank refinement").

Smoothing: lambda_j = a_j^alpha / w_j^beta with a_j = max |x_j| over calibration tokens (after the
shift), w_j = max |W_oj| over the group's stacked rows (and, for convs, kernel positions); lambda = 0 -> 1, any
NaN/Inf -> lambda = 1. Grid (``num_grids`` = 20): (0, 0), (k/20, 0), (k/20, 1 - k/20) for k = 1..19 -> 39
candidates. Each is scored by the summed squared error of the evaluation module's output with the candidate
layer in the loop (one-shot SVD, 4-bit quantizers active); the argmin wins, later candidates win ties.

Refinement: with lambda fixed, L_k = SVD_r(W^ - qW), qW = Q_w(W^ - L_k), k = 0..num_iters-1, keeping the best by
output error and stopping at the first non-improvement. The stored factors are rounded to the factor dtype (fp16)
*before* the residual is formed, so that rounding is absorbed by ``R``.

Fast search (``search``, docs/methods/svdquant.md "Fast search"): ``auto`` (the default) is ``hybrid`` for a group
at least ``AUTO_WIDTH`` = 320 wide with more than ``search_tokens`` calibration rows and ``exact`` for any other
(:func:`resolve_search`, from shapes alone); ``exact`` scores every candidate on every calibration row, as above;
``fast`` scores them on a fixed subsample of ``search_tokens`` = 512 rows
(:func:`scoring_rows`) and visits a coarse-to-fine grid (:func:`coarse_fine_grid`: every other alpha on each line,
then the best coarse candidate's two neighbours; 21 of 39 candidates), while the refinement and the reported error
use every row; ``fastest`` also scores the refinement's iterations on the subsample; ``rescore`` is ``fastest``
with a tie-break: the ``RESCORE_TOP`` = 3 best candidates on the subsample are scored once more on every row and the
best of them wins (3 full passes instead of the exact search's 39; the subsample's candidate scores are near ties,
so its own argmin is noisy); ``sampled`` scores every candidate of the exact search's grid, in its order, on the
subsample, re-scores the ``RESCORE_TOP`` best on every row (the best of those wins) and refines on every row: its
candidates' layers are those of the exact search (same grid, same order, so the same warm-started SVD chain and the
same random draws), so it keeps the exact search's lambda, and then builds bit-identical layers, whenever the exact
argmin is among the subsample's top ``RESCORE_TOP``. The statistics ``a_j`` always come from every row, so the
candidates' lambdas are those of the exact search.

SVD_r (``svd``): ``full`` is the float64 SVD of the whole matrix (the official code's choice, O(n K min(n, K)) per
candidate: hours for an SD-size UNet on a CPU); ``fast`` (the default) is a randomized subspace iteration of rank
r + 16 in float32 on the layer's device (Halko, Martinsson & Tropp, SIAM Review 2011, Alg. 4.4; O(n K r) per
candidate), warm-started from the previous candidate's right basis (rescaled by the change of lambda for the
search, unchanged between refinement iterations); ``lowrank`` is ``torch.svd_lowrank`` in float64, cold-started.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .layers import SVDQLayer, build_svdq_layer, folded_bias, layer_geometry, matrix, weight_of
from .mapping import Group

FP16_MAX = 65504.0
SVD_MODES = ("fast", "full", "lowrank")
SEARCH_MODES = ("auto", "exact", "fast", "fastest", "rescore", "sampled", "hybrid")
SEARCH_TOKENS = 512  # calibration rows (pixels of a conv, tokens of attention) that score a fast-search candidate
AUTO_WIDTH = 320  # search="auto": a group whose stacked weight is at least this wide on both sides (min(n, K)) and
# that has more calibration rows than search_tokens is calibrated with "hybrid", any other with "exact"; 320 is the
# narrowest group of the SD 1.5 / SDXL UNets, while the shipped models' groups with a real subsample are at most 128
# wide (docs/methods/svdquant.md, "Automatic search (the default)": the measured per-group times behind it)
RESCORE_TOP = 3  # subsample-best candidates that search="rescore" / "sampled" score again on every row
REFINE_TOP = 2  # subsample-best refinement iterates that search="hybrid" scores again on every row
CROP = 8  # side of the feature-map crops (interior) that subsample a conv's calibration maps
FAST_OVERSAMPLE = 16  # extra columns of the randomized range finder (Halko et al. 2011, sec. 4.2: p = 5-20)
FAST_NITER = 2  # power (subspace) iterations per SVD; warm starts make the later ones converge faster
SVD_SEED = 0  # seed of the randomized SVD's Gaussian columns, one generator per group (benchmarks vary it to measure
# how much a calibration's quality moves with these draws alone)


def _glibc() -> ctypes.CDLL | None:
    """The process's glibc (for ``mallopt`` / ``malloc_trim``), or None elsewhere (macOS, musl, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (raises AttributeError outside glibc)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def kept_heap(enabled: bool = True) -> Iterator[None]:
    """Within the block, glibc serves large CPU allocations from its heap and keeps freed memory for reuse.

    Why: glibc maps every allocation above its mmap threshold (at most 32 MiB) freshly from the kernel and unmaps
    it when freed, so each new tensor of an SD-size layer (a 1280-channel 3x3 conv's weight is 59 MB in float32)
    page-faults all its pages again; the calibration makes dozens of such tensors per candidate, and on a CPU the
    kernel time of those faults was a quarter of its CPU time. Values are unchanged (only where memory comes from).
    On exit the defaults are restored (``M_MMAP_MAX`` 65536, ``M_TRIM_THRESHOLD`` 128 KiB) and ``malloc_trim(0)``
    returns the free memory to the system. Process-wide (glibc has no per-thread setting); a no-op without glibc or
    when ``enabled`` is False.
    """
    libc = _glibc() if enabled else None
    if libc is None:
        yield
        return
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    libc.mallopt(m_mmap_max, 0)
    libc.mallopt(m_trim_threshold, 2**30)
    try:
        yield
    finally:
        libc.mallopt(m_mmap_max, 65536)
        libc.mallopt(m_trim_threshold, 128 * 1024)
        libc.malloc_trim(0)


@dataclass
class SearchConfig:
    """Knobs of the smoothing search and the refinement (defaults = deepcompressor's svdquant/__default__.yaml)."""

    wfmt: str = "int4"  # int4 | nvfp4 | none
    afmt: str = "int4"  # int4 | nvfp4 | none
    rank: int = 32  # low-rank branch rank r (0: none)
    smooth: str = "search"  # search (39-grid) | smoothquant (alpha + beta = 1 grid) | fixed | none
    alpha: float = 0.5  # migration strength for smooth="fixed" (SmoothQuant alpha, beta = 1 - alpha)
    num_grids: int = 20
    num_iters: int = 100  # low-rank refinement iterations (1 = one-shot SVD)
    early_stop: bool = True
    shift: bool = True  # UINT4 activations for shifted post-activation inputs (INT4 only)
    factor_dtype: str = "float16"
    svd: str = "fast"  # fast (randomized, float32, warm-started) | full (float64 torch.linalg.svd) | lowrank
    search: str = "auto"  # auto (per group: hybrid if min(n, K) >= AUTO_WIDTH and rows > search_tokens, else exact;
    # resolve_search) | exact | fast (candidates on search_tokens rows, coarse-to-fine grid) | fastest | rescore
    # | sampled (the whole grid on search_tokens rows, the top RESCORE_TOP on every row) | hybrid (sampled, with the
    # refinement's iterations scored on search_tokens rows and its REFINE_TOP best on every row)
    search_tokens: int = SEARCH_TOKENS
    refine_tol: float = 0.0  # an iteration that improves the best error by less than this fraction counts as none
    refine_patience: int = 1  # early stop after this many iterations without improvement (1: the official rule)


def calibration_rows(x: Tensor) -> int:
    """Calibration rows of a group's input: tokens of ``[N, C]`` / ``[B, L, C]``, pixels of ``[B, C, H, W]`` maps."""
    if x.ndim == 4:
        return x.shape[0] * x.shape[2] * x.shape[3]
    return x.numel() // max(x.shape[-1], 1)


def resolve_search(search: str, modules: list[nn.Module], x: Tensor, search_tokens: int = SEARCH_TOKENS) -> str:
    """The search mode a group is calibrated with: ``search`` itself, or for ``"auto"`` (the default) ``"hybrid"``
    when the group is wide, ``min(n, K) >= AUTO_WIDTH`` for its stacked weight ``[n, K]`` (``n`` the output rows of
    all its layers, ``K`` the input channels times the kernel positions), and has more calibration rows than
    ``search_tokens`` (with fewer, ``hybrid`` has nothing to subsample and computes what ``exact`` computes), and
    ``"exact"`` otherwise (docs/methods/svdquant.md, "Automatic search (the default)").

    Only shapes are read (weights and ``x`` may live on the ``meta`` device): the decision never calibrates.

    Raises:
        ValueError: ``search`` is not one of :data:`SEARCH_MODES`.
    """
    if search not in SEARCH_MODES:
        raise ValueError(f"search must be one of {', '.join(map(repr, SEARCH_MODES))}, got {search!r}")
    if search != "auto":
        return search
    n = sum(m.weight.shape[0] for m in modules)
    k = modules[0].weight[0].numel()
    wide = min(n, k) >= AUTO_WIDTH
    return "hybrid" if wide and calibration_rows(x) > search_tokens else "exact"


def alpha_beta_grid(num_grids: int, kind: str) -> list[tuple[float, float]]:
    """Smoothing candidates: ``search`` -> (0,0), (k/N, 0), (k/N, 1-k/N); ``smoothquant`` -> (0,0), (k/N, 1-k/N)."""
    ks = [k / num_grids for k in range(1, num_grids)]
    if kind == "search":
        return [(0.0, 0.0)] + [(a, 0.0) for a in ks] + [(a, 1.0 - a) for a in ks]
    if kind == "smoothquant":
        return [(0.0, 0.0)] + [(a, 1.0 - a) for a in ks]
    raise ValueError(f"unknown grid kind {kind!r}")


def smooth_factor(a: Tensor, w: Tensor, alpha: float, beta: float) -> Tensor:
    """``lambda = a^alpha / w^beta`` (0 -> 1; any non-finite, or beyond fp16 -> all ones), rounded to fp16."""
    if alpha == 0 and beta == 0:
        return torch.ones_like(a)
    lam = a.double().pow(alpha) / w.double().pow(beta)
    lam = torch.where(lam == 0, torch.ones_like(lam), lam)
    if not torch.isfinite(lam).all() or lam.max() > FP16_MAX or lam.min() < 2**-14:
        return torch.ones_like(a)
    return lam.to(torch.float16).float()


def svd_r(m: Tensor, r: int, method: str = "full") -> tuple[Tensor, Tensor]:
    """Top-``r`` SVD of ``m [n, K]`` in float64: ``(L_down = Vh[:r] [r, K], L_up = U[:, :r] S[:r] [n, r])``."""
    m = m.double()
    if method == "lowrank" and r < min(m.shape) // 2:
        u, s, v = torch.svd_lowrank(m, q=min(r + 10, min(m.shape)), niter=4)
        return v[:, :r].t(), u[:, :r] * s[:r]
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    return vh[:r], u[:, :r] * s[:r]


def randomized_svd_r(m: Tensor, r: int, start: Tensor | None = None, oversample: int = FAST_OVERSAMPLE,
                     niter: int = FAST_NITER, generator: torch.Generator | None = None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``r`` SVD of ``m [n, K]`` by randomized subspace iteration (Halko, Martinsson & Tropp, SIAM Review 2011,
    Alg. 4.4 with the final small SVD of Alg. 5.1), in ``m``'s dtype and device.

    The start block ``[K, r + oversample]`` is ``start`` (a previous right basis, e.g. of a nearby matrix: a warm
    start) topped up with Gaussian columns; every product is re-orthonormalised (QR), so any start is valid and a
    good one only makes the ``niter`` power iterations converge faster. Cost O(n K (r + p) (2 niter + 2)).

    Returns:
        ``(L_down = Vh[:r] [r, K], L_up = U[:, :r] S[:r] [n, r], V [K, r + p])``; ``V`` warm-starts the next call.
    """
    n, k = m.shape
    cols = min(r + oversample, n, k)
    omega = torch.randn(k, cols, device=m.device, dtype=m.dtype, generator=generator)
    if start is not None:
        keep = min(start.shape[1], cols)
        omega[:, :keep] = start[:, :keep]
    q = torch.linalg.qr(m @ omega).Q  # [n, cols]: an orthonormal basis of the sketched range
    for _ in range(niter):
        z = torch.linalg.qr(m.t() @ q).Q  # [K, cols]
        q = torch.linalg.qr(m @ z).Q
    ub, sv, vh = torch.linalg.svd(q.t() @ m, full_matrices=False)  # [cols, K]: small
    u = q @ ub
    return vh[:r], u[:, :r] * sv[:r], vh.t()


def channel_absmax(x: Tensor, kind: str, shift: float) -> Tensor:
    """a_j of the smoothing factor: max |x_j + c| over all calibration tokens (pixels for convs)."""
    x = x.float() + shift
    if kind == "conv2d":
        return x.abs().amax(dim=(0, 2, 3))
    return x.reshape(-1, x.shape[-1]).abs().amax(0)


def weight_absmax(modules: list[nn.Module]) -> Tensor:
    """w_j of the smoothing factor: max |W_oj| over the group's stacked rows (and kernel positions)."""
    cols = [weight_of(m).abs().reshape(m.weight.shape[0], m.weight.shape[1], -1).amax(dim=(0, 2)) for m in modules]
    return torch.stack(cols).amax(0).float()


def scoring_rows(x: Tensor, budget: int, seed: int = 0, halo: tuple[int, int] = (0, 0)) -> Tensor:
    """A fixed subsample of about ``budget`` calibration rows of ``x`` on which a fast search scores its candidates.

    ``[N, C]`` token rows: ``budget`` random rows. ``[B, L, C]`` sequences (attention inputs, scored on the attention
    core): ``min(L, budget)`` random token positions (the same for every kept sample, in order) of
    ``max(1, budget // L)`` random samples, i.e. the attention of a shorter sequence. ``[B, C, H, W]`` feature maps:
    ``max(1, budget // (h w))`` random ``h x w`` windows (``h = min(H, 8)``, ``w = min(W, 8)``), each from a
    different map while there are maps left, cut out of the maps zero-padded by ``halo`` with that halo around them:
    ``[n, C, h + 2 halo_h, w + 2 halo_w]``. For a stride-1 conv with kernel ``2 halo + 1`` and padding ``halo``, the
    interior ``h x w`` of its output on such a crop is exactly its output on the window (the halo carries the
    neighbours, or the zero padding at the map's border), so the caller scores only that interior. The indices are
    drawn on the CPU (seed ``seed``: the same rows on every device) and the rows gathered on ``x``'s device. ``x``
    itself when it holds no more than ``budget`` rows (pixels).
    """
    g = torch.Generator().manual_seed(seed)
    if x.ndim == 2:
        if x.shape[0] <= budget:
            return x
        return x[torch.randperm(x.shape[0], generator=g)[:budget].sort().values.to(x.device)]
    if x.ndim == 3:
        b, n = x.shape[:2]
        if b * n <= budget:
            return x
        keep = max(1, min(b, budget // n))
        rows = torch.randperm(b, generator=g)[:keep].sort().values.to(x.device)
        toks = torch.randperm(n, generator=g)[: min(n, budget)].sort().values.to(x.device)
        return x[rows][:, toks]
    if x.ndim == 4:
        b, _, hh, ww = x.shape
        if b * hh * ww <= budget:
            return x
        h, w = min(hh, CROP), min(ww, CROP)
        n = max(1, budget // (h * w))
        maps = torch.randperm(b, generator=g)
        if n > b:
            maps = torch.cat([maps, torch.randint(b, (n - b,), generator=g)])
        i0 = torch.randint(hh - h + 1, (n,), generator=g).tolist()
        j0 = torch.randint(ww - w + 1, (n,), generator=g).tolist()
        ph, pw = halo
        xp = torch.nn.functional.pad(x, (pw, pw, ph, ph)) if ph or pw else x
        return torch.stack([xp[m, :, i:i + h + 2 * ph, j:j + w + 2 * pw]
                            for m, i, j in zip(maps[:n].tolist(), i0, j0, strict=True)])
    raise ValueError(f"calibration rows must be 2-D, 3-D or 4-D, got shape {tuple(x.shape)}")


def coarse_fine_grid(num_grids: int, kind: str) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The fast search's grid: ``(coarse, grid)`` with ``grid`` the exact search's candidates
    (:func:`alpha_beta_grid`) and ``coarse`` those of ``grid`` with an even ``k`` (every other ``alpha`` on each
    line, plus ``(0, 0)``); :meth:`GroupCalibrator.search_lambda` then scores the best coarse candidate's two
    neighbours on its line. It finds the exact search's argmin whenever the error is unimodal along each line."""
    grid = alpha_beta_grid(num_grids, kind)
    coarse = [ab for ab in grid if ab == (0.0, 0.0) or round(ab[0] * num_grids) % 2 == 0]
    return coarse, grid


class GroupCalibrator:
    """Builds the quantized layers of one :class:`~steerdiff.quant.mapping.Group` from its cached fp input ``x``."""

    def __init__(self, group: Group, modules: list[nn.Module], x: Tensor, cfg: SearchConfig):
        w = modules[0].weight
        # The fp layers run in their own dtype and device (float64, float16, ... models, or a GPU); the quantized
        # candidates take any dtype, and errors are summed in float64.
        x = x.to(device=w.device, dtype=w.dtype)
        self.group, self.modules, self.x, self.cfg = group, modules, x, cfg
        self.kind = layer_geometry(modules[0])["kind"]
        for m in modules[1:]:
            if layer_geometry(m)["in_channels"] != layer_geometry(modules[0])["in_channels"]:
                raise ValueError(f"group {group.name}: layers sharing an input must have equal in_channels")
        self.shift = group.shift if (cfg.shift and cfg.afmt == "int4") else 0.0
        self.rows = [m.weight.shape[0] for m in modules]
        kmax = min(sum(self.rows), matrix(weight_of(modules[0])).shape[1])
        if cfg.rank < 0 or cfg.rank > kmax:
            raise ValueError(
                f"rank={cfg.rank} is larger than group {group.name!r} allows: its stacked weight is "
                f"{sum(self.rows)}x{matrix(weight_of(modules[0])).shape[1]}, so rank must be in [0, {kmax}]"
            )
        if cfg.search_tokens < 1:
            raise ValueError(f"search_tokens must be >= 1, got {cfg.search_tokens}")
        # "auto" becomes this group's mode here, from shapes alone; the report names both
        self.requested = cfg.search
        cfg = dataclasses.replace(cfg, search=resolve_search(cfg.search, modules, x, cfg.search_tokens))
        self.cfg = cfg
        if cfg.refine_patience < 1:
            raise ValueError(f"refine_patience must be >= 1, got {cfg.refine_patience}")
        if not 0.0 <= cfg.refine_tol < 1.0:
            raise ValueError(f"refine_tol must be in [0, 1), got {cfg.refine_tol}")
        # the fast search scores candidates (and refinement iterations) on a fixed subsample of the rows; the
        # smoothing statistics a_j and the reported error use all of them
        # a "same" stride-1 conv is scored on crops with a halo, on the interior of its output only (exact there)
        geo = layer_geometry(modules[0])
        same = geo["kind"] == "conv2d" and geo["stride"] == [1, 1] and all(
            k == 2 * p + 1 for k, p in zip(geo["kernel"], geo["padding"], strict=True))
        halo = tuple(geo["padding"]) if same else (0, 0)
        self.xs = scoring_rows(x, cfg.search_tokens, halo=halo) if cfg.search != "exact" else x
        self.ring = halo if self.xs is not x and x.ndim == 4 else (0, 0)
        # "sampled" runs the quantized candidates on the crops without their own zero padding: the crop's halo is
        # that padding (or the neighbours), so the output is exactly the interior, and the ring's outputs, which
        # the other modes compute and drop (56% more work on 8x8 windows of a 3x3 conv), are never computed
        self.unpadded = cfg.search in ("sampled", "hybrid") and self.ring != (0, 0)
        # "fastest" and "rescore" also score the refinement's iterations on them
        self.refine_full = cfg.search not in ("fastest", "rescore", "hybrid")
        try:
            with torch.no_grad():
                self.ref = self._eval(modules)
                self.ref_s = self.ref if self.xs is x else self._interior(self._eval(modules, self.xs))
        except RuntimeError as e:  # an op without a kernel for this dtype on this device
            raise ValueError(f"model: group {group.name!r} cannot run in {w.dtype} on {w.device} here ({e}); "
                             "convert the model to float32 (model.float()) before quantizing") from e
        self.a = channel_absmax(x, self.kind, self.shift)
        self.w = weight_absmax(modules)
        if cfg.svd not in SVD_MODES:
            raise ValueError(f"svd must be one of {SVD_MODES}, got {cfg.svd!r}")
        # fast: float32 on the layer's device, one folded bias per layer, warm-started randomized SVDs
        self.fast = cfg.svd == "fast"
        self.work = torch.float32 if self.fast else torch.float64
        self.bias = [folded_bias(m, self.shift) for m in modules] if self.fast else None
        self.kk = 1 if self.kind == "linear" else modules[0].weight[0, 0].numel()  # kernel positions
        self._basis: Tensor | None = None  # right basis of the last fast SVD [K, r + p]
        self._basis_lam: Tensor | None = None  # the lambda it was computed under
        self._gen: torch.Generator | None = None
        self.refine_full_errors: dict[int, float] | None = None  # hybrid: full errors of the re-scored iterates

    def _eval(self, layers: list[nn.Module], x: Tensor | None = None) -> Tensor:
        x = self.x if x is None else x
        outs = [layer(x) for layer in layers]
        return outs[0] if self.group.eval_fn is None else self.group.eval_fn(outs)

    def _interior(self, y: Tensor) -> Tensor:
        """A conv's output on halo crops without the halo ring (:func:`scoring_rows`)."""
        ph, pw = self.ring
        return y[..., ph:y.shape[-2] - ph, pw:y.shape[-1] - pw] if ph or pw else y

    def error(self, layers: list[nn.Module], full: bool = False) -> float:
        """Summed squared output error of ``layers`` on the scoring rows (all rows if ``full`` or an exact search)."""
        with torch.no_grad():
            if full or self.xs is self.x:
                out, ref = self._eval(layers), self.ref
            elif self.unpadded and all(isinstance(la, SVDQLayer) for la in layers):
                pads = [la.spec["padding"] for la in layers]
                try:
                    for la in layers:
                        la.spec["padding"] = [0, 0]
                    out, ref = self._eval(layers, self.xs), self.ref_s
                finally:
                    for la, p in zip(layers, pads, strict=True):
                        la.spec["padding"] = p
            else:
                out, ref = self._interior(self._eval(layers, self.xs)), self.ref_s
            return float(((out.double() - ref.double()) ** 2).sum())

    def _stack(self, lam: Tensor | None) -> Tensor:
        ws = []
        for m in self.modules:
            w = weight_of(m).to(self.work)
            if lam is not None:
                w = w * (lam.to(self.work) if self.kind == "linear" else lam.to(self.work)[:, None, None])
            ws.append(matrix(w))
        return ws[0] if len(ws) == 1 else torch.cat(ws, 0)

    def _residuals(self, wh: Tensor, ld: Tensor, lu: Tensor) -> list[Tensor]:
        """``R_i = W_i diag(lambda) - L_up,i L_down`` per layer, in each layer's weight shape, from the stacked
        ``wh = W diag(lambda)`` of :meth:`_stack`: the values :func:`build_svdq_layer` would compute itself (the same
        float operations on the same operands), without scaling the weights by ``lambda`` a second time."""
        out, start = [], 0
        r = ld.shape[0]
        for m, n in zip(self.modules, self.rows, strict=True):
            shape = m.weight.shape
            lr = (lu[start:start + n] @ ld.reshape(r, -1)).reshape(shape)
            out.append(wh[start:start + n].reshape(shape) - lr)
            start += n
        return out

    def _warm_start(self, lam: Tensor | None) -> Tensor | None:
        """The last right basis, mapped to smoothing ``lam``: ``W diag(lam') = W diag(lam) diag(lam'/lam)``, so the
        row space moves by ``diag(lam'/lam)`` (each input channel repeated over the kernel positions)."""
        if self._basis is None:
            return None
        old = self._basis_lam
        if (lam is None and old is None) or (lam is not None and old is not None and torch.equal(lam, old)):
            return self._basis
        new_l = torch.ones_like(self.a) if lam is None else lam
        old_l = torch.ones_like(self.a) if old is None else old
        ratio = (new_l.to(self.work) / old_l.to(self.work)).repeat_interleave(self.kk)
        return self._basis * ratio[:, None].to(self._basis.device)

    def _factors(self, m: Tensor, lam: Tensor | None = None) -> tuple[Tensor, Tensor]:
        fdt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[self.cfg.factor_dtype]
        if self.fast and self.cfg.rank + FAST_OVERSAMPLE < min(m.shape):
            if self._gen is None:
                self._gen = torch.Generator(device=m.device).manual_seed(SVD_SEED)
            ld, lu, self._basis = randomized_svd_r(m, self.cfg.rank, self._warm_start(lam), generator=self._gen)
            self._basis_lam = lam
        elif self.fast:  # the sketch would be (nearly) the whole matrix: the exact SVD in float32 is as cheap
            u, sv, vh = torch.linalg.svd(m, full_matrices=False)
            ld, lu = vh[: self.cfg.rank], u[:, : self.cfg.rank] * sv[: self.cfg.rank]
        else:
            ld, lu = svd_r(m, self.cfg.rank, self.cfg.svd)
        return ld.to(fdt).to(self.work), lu.to(fdt).to(self.work)

    def build(self, lam: Tensor | None, ld: Tensor | None, lu: Tensor | None,
              residuals: list[Tensor] | None = None, pack: bool = True) -> list[SVDQLayer]:
        """The group's layers for smoothing ``lam`` and shared ``L_down``, stacked ``L_up`` (split by rows);
        ``pack=False``: scoring-only layers (same outputs, codes not packed: :meth:`SVDQLayer.set_weights`)."""
        layers, start = [], 0
        for i, (m, n) in enumerate(zip(self.modules, self.rows, strict=True)):
            layers.append(build_svdq_layer(
                m, wfmt=self.cfg.wfmt, afmt=self.cfg.afmt, rank=self.cfg.rank if ld is not None else 0,
                smooth=lam, lora_down=ld, lora_up=None if lu is None else lu[start:start + n],
                shift=self.shift, unsigned=self.shift > 0, factor_dtype=self.cfg.factor_dtype,
                residual=None if residuals is None else residuals[i], work_dtype=self.work,
                bias=None if self.bias is None else self.bias[i], pack=pack))
            start += n
        return layers

    def _dequant_stack(self, layers: list[SVDQLayer]) -> Tensor:
        return torch.cat([matrix(layer.dequantized_residual()).to(self.work) for layer in layers], 0)

    def search_lambda(self) -> tuple[Tensor | None, list[dict]]:
        """The smoothing grid search; returns the best lambda (None for no smoothing) and the per-candidate errors."""
        cfg = self.cfg
        if cfg.smooth == "none":
            return None, []
        if cfg.smooth == "fixed":
            return smooth_factor(self.a, self.w, cfg.alpha, 1.0 - cfg.alpha), []
        kind = "search" if cfg.smooth == "search" else "smoothquant"
        # every candidate, in the grid's order (the SVD chain's order)
        whole = cfg.search in ("exact", "sampled", "hybrid")
        if whole:
            grid = todo = alpha_beta_grid(cfg.num_grids, kind)
        else:
            todo, grid = coarse_fine_grid(cfg.num_grids, kind)
        scored: dict[tuple[float, float], tuple[float, Tensor]] = {}
        top = RESCORE_TOP if cfg.search in ("rescore", "sampled", "hybrid") else 0
        kept: dict[tuple[float, float], list[SVDQLayer]] = {}  # the built layers of the current top candidates

        def score(ab: tuple[float, float]) -> None:
            lam = smooth_factor(self.a, self.w, *ab)
            ld = lu = res = None
            if cfg.rank:
                wh = self._stack(lam)
                ld, lu = self._factors(wh, lam)
                res = self._residuals(wh, ld, lu)
            # scored, then dropped: the refinement builds the kept ones
            layers = self.build(lam, ld, lu, residuals=res, pack=False)
            scored[ab] = (self.error(layers), lam)
            if top:  # keep only the top-k candidates' layers (memory: k copies of the group, not the grid's 21)
                kept[ab] = layers
                order = sorted(kept, key=lambda c: (scored[c][0], -grid.index(c)))
                for c in order[top:]:
                    del kept[c]

        for ab in todo:
            score(ab)
        if not whole:  # refine around the best coarse candidate: its two neighbours on its line
            i = min((j for j in range(len(grid)) if grid[j] in scored), key=lambda j: (scored[grid[j]][0], -j))
            a, b = grid[i]
            if (a, b) != (0.0, 0.0):
                step = 1.0 / cfg.num_grids
                for nb in ((a - step, b + step if b else 0.0), (a + step, b - step if b else 0.0)):
                    near = [ab for ab in grid if abs(ab[0] - nb[0]) < 1e-9 and abs(ab[1] - nb[1]) < 1e-9
                            and ab != (0.0, 0.0)]
                    if near and near[0] not in scored:
                        score(near[0])
        trace = [{"alpha": ab[0], "beta": ab[1], "error": scored[ab][0]} for ab in grid if ab in scored]
        if top:  # tie-break: the subsample's top candidates scored again on every row; only those full errors compete
            # (no subsample: the scores are already the full errors; scoring again would give the same numbers)
            full = {ab: scored[ab][0] if self.xs is self.x else self.error(layers, full=True)
                    for ab, layers in kept.items()}
            for t in trace:
                if (t["alpha"], t["beta"]) in full:
                    t["full_error"] = full[(t["alpha"], t["beta"])]
            scored = {ab: (e, scored[ab][1]) for ab, e in full.items()}
        best, best_lam = float("inf"), None
        for ab in grid:  # in grid order: later candidates win ties (as deepcompressor's search)
            if ab in scored and scored[ab][0] <= best:
                best, best_lam = scored[ab][0], scored[ab][1]
        return best_lam, trace

    def refine(self, lam: Tensor | None) -> tuple[list[SVDQLayer], list[float]]:
        """Alternating low-rank refinement (iteration 0 = the paper's one-shot SVD); without a rank, plain
        quantization."""
        if not self.cfg.rank:
            layers = self.build(lam, None, None)
            return layers, [self.error(layers, full=self.refine_full)]
        wh = self._stack(lam)
        qw = torch.zeros_like(wh)
        errs = []
        top = REFINE_TOP if self.cfg.search == "hybrid" and self.xs is not self.x else 1
        kept: list[tuple[float, int, list[SVDQLayer]]] = []  # the best ``top`` iterates so far (error, index)
        tol = self.cfg.refine_tol
        patience = self.cfg.refine_patience
        since = 0  # iterations since the best error last improved (by at least the tolerance)
        for k in range(max(1, self.cfg.num_iters)):
            ld, lu = self._factors(wh - qw, lam)
            layers = self.build(lam, ld, lu, residuals=self._residuals(wh, ld, lu))
            qw = self._dequant_stack(layers)
            err = self.error(layers, full=self.refine_full)
            errs.append(err)
            best = kept[0][0] if kept else float("inf")
            # later iterates win ties (as before: ``err <= best`` keeps the new one)
            kept = sorted([*kept, (err, k, layers)], key=lambda t: (t[0], -t[1]))[:top]
            since = 0 if err <= best * (1.0 - tol) else since + 1
            if self.cfg.early_stop and since >= patience:
                break
        self.refine_full_errors = None
        if top > 1:  # hybrid: the subsample's best iterates scored once more on every row; the best of those wins
            full = [(self.error(la, full=True), i, la) for _, i, la in kept]
            self.refine_full_errors = {i: e for e, i, _ in full}
            kept = sorted(full, key=lambda t: (t[0], -t[1]))
        return kept[0][2], errs

    def run(self) -> tuple[list[SVDQLayer], dict]:
        with kept_heap(self.x.device.type == "cpu"):
            lam, trace = self.search_lambda()
            layers, errs = self.refine(lam)
        ref = float((self.ref.double() ** 2).sum())
        # the kept layers' error on every calibration row (the fast search selected them on a subsample)
        if self.refine_full_errors:  # hybrid: the winner's full error is already known
            err = min(self.refine_full_errors.values())
        elif self.xs is self.x or self.refine_full:
            err = min(errs)
        else:
            err = self.error(layers, full=True)
        info = {"group": self.group.name, "paths": self.group.paths, "shift": self.shift,
                "rel_error": err / max(ref, 1e-30), "search_mode": self.cfg.search,
                "search_requested": self.requested,
                "refine_errors": errs, "search": trace}
        if self.refine_full_errors:
            info["refine_full_errors"] = self.refine_full_errors
        if trace:
            key = "full_error" if any("full_error" in t for t in trace) else "error"  # rescore: the full errors
            best = min((i for i in range(len(trace)) if key in trace[i]), key=lambda i: (trace[i][key], -i))
            info["alpha"], info["beta"] = trace[best]["alpha"], trace[best]["beta"]
        return layers, info
