"""Local descriptors of a generator's learned manifold: scaling psi, rank nu, complexity delta ("What Secrets Do Your
Manifolds Hold? Understanding the Local Geometry of Generative Models", Humayun et al., ICLR 2025;
docs/methods/geometry.md "Definitions").

For a map ``G: R^k -> R^D`` (:mod:`steerdiff.geometry.maps`) at a latent ``z``, with ``J = dG/dz`` (``D x k``) and
singular values ``s_1 >= ... >= s_p`` (``p = min(D, k)``):

* rank ``nu = #{s_i > tau}``, ``tau = s_1 max(D, k) eps(dtype)`` (numpy/torch ``matrix_rank``'s default) or
  ``tau = rank_tol s_1``; also ``nu_rel = #{s_i > 1e-2 s_1}``, ``nu_abs = #{s_i > 1e-2}`` and the effective rank
  ``exp(H(p))``, ``p_i = s_i / sum s``. The three counts answer different questions: never compare nu across them.
* scaling ``psi = sum_{i <= nu} log s_i = 1/2 log pdet(J^T J)`` (over the ``nu`` counted values only, so an
  underflowing value never makes it ``-inf``); for a CPWL generator ``log p_G(G(z)) = log p(z) - psi``.
* complexity ``delta``: ``n/2`` random orthonormal directions ``u_j`` give the vertices ``z +- r u_j`` (plus ``z``);
  ``G`` runs on all of them and every hidden unit's pre-activation sign is recorded (each network call of a sampler
  counts as separate units); a unit intersects the neighbourhood when its sign is not the same at every vertex;
  ``delta`` is the number of intersecting units, also per layer (estimator of AhmedImtiazPrio/grok-adversarial
  ``local_complexity.py``). For SiLU/GELU the sign of the pre-activation is a zero-crossing proxy.

Large outputs: ``sketch_dim = m`` measures ``J V`` for a random orthonormal ``V`` (``k x m``); ``psi_m``, ``nu_m``
depend on ``m`` and are comparable only at equal ``m``. Jacobians come from reverse mode (one backward pass per
output coordinate, all latents of a chunk at once) when ``D <= m``, else from forward products ``J v`` (one double
backward each). Everything runs in ``dtype`` (float64 by default; the map's networks are copied to it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .maps import GeometryMap, as_map

REL_TOL = 1e-2  # nu_rel: s_i > 1e-2 s_1 (docs/methods/geometry.md "Definitions")
ABS_TOL = 1e-2  # nu_abs: s_i > 1e-2
MAX_VERTICES = 128  # n = 2k capped at 128 (our default)
DEFAULT_RADIUS = 0.05  # r in z units (our default)

# Modules whose input is a pre-activation: delta records its sign. Piecewise-linear ones make delta exact.
ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.LeakyReLU, nn.PReLU, nn.ReLU6, nn.Hardtanh, nn.SiLU, nn.GELU,
                                            nn.ELU, nn.SELU, nn.CELU, nn.Softplus, nn.Mish, nn.Hardswish, nn.Tanh,
                                            nn.Sigmoid)
PIECEWISE_LINEAR: tuple[type[nn.Module], ...] = (nn.ReLU, nn.LeakyReLU, nn.PReLU)


@dataclass
class Descriptors:
    """Descriptors of ``N`` latents (one row each).

    Attributes:
        psi: ``[N]`` log volume change over the ``nu`` counted singular values.
        nu: ``[N]`` rank at ``tau`` (``rank_tol``; default the ``matrix_rank`` rule).
        nu_rel: ``[N]`` ``#{s > 1e-2 s_1}``.
        nu_abs: ``[N]`` ``#{s > 1e-2}``.
        effective_rank: ``[N]`` ``exp(entropy of s / sum s)``.
        singular_values: ``[N, p]`` descending (of ``J``, or of ``J V`` when sketched).
        delta: ``[N]`` intersecting units in all layers (None when ``delta_radius`` is None).
        delta_per_layer: layer name -> ``[N]`` intersecting units of that layer (summed over the map's calls).
        units_per_layer: layer name -> units of that layer (width x calls).
        outputs: ``[N, *out_shape]`` the map at each latent.
        info: the map (:meth:`describe`), dims, thresholds, radius, vertices, sketch size, seconds.
    """

    psi: Tensor
    nu: Tensor
    nu_rel: Tensor
    nu_abs: Tensor
    effective_rank: Tensor
    singular_values: Tensor
    delta: Tensor | None
    delta_per_layer: dict[str, Tensor] = field(default_factory=dict)
    units_per_layer: dict[str, int] = field(default_factory=dict)
    outputs: Tensor | None = None
    info: dict = field(default_factory=dict)

    @property
    def delta_fraction(self) -> dict[str, Tensor]:
        """Layer name -> ``[N]`` share of that layer's units that intersect the neighbourhood."""
        return {k: v.double() / max(self.units_per_layer[k], 1) for k, v in self.delta_per_layer.items()}

    def summary(self) -> dict:
        """Means, standard deviations and ranges of every descriptor, plus :attr:`info` (JSON values)."""
        out: dict = {"n": int(self.psi.shape[0]), **self.info}
        for name in ("psi", "nu", "nu_rel", "nu_abs", "effective_rank", "delta"):
            v = getattr(self, name)
            if v is None:
                continue
            v = v.double()
            out[name] = {"mean": float(v.mean()), "std": float(v.std()) if v.numel() > 1 else 0.0,
                         "min": float(v.min()), "max": float(v.max())}
        out["delta_fraction_per_layer"] = {k: float(v.mean()) for k, v in self.delta_fraction.items()}
        return out

    def rows(self) -> list[dict]:
        """One JSON dict per latent: psi, the three ranks, effective rank, delta and s_1."""
        out = []
        for i in range(self.psi.shape[0]):
            row = {"psi": float(self.psi[i]), "nu": int(self.nu[i]), "nu_rel": int(self.nu_rel[i]),
                   "nu_abs": int(self.nu_abs[i]), "effective_rank": float(self.effective_rank[i]),
                   "s1": float(self.singular_values[i, 0])}
            if self.delta is not None:
                row["delta"] = int(self.delta[i])
            out.append(row)
        return out


# ------------------------------------------------------------------------------------------------ spectra
def rank_threshold(s: Tensor, rows: int, cols: int, rank_tol: float | None) -> Tensor:
    """``tau`` per latent ``[N]`` for singular values ``s [N, p]`` of ``rows x cols`` matrices."""
    s1 = s[:, 0]
    if rank_tol is None:
        return s1 * max(rows, cols) * torch.finfo(s.dtype).eps
    return s1 * rank_tol


def spectral_descriptors(s: Tensor, rows: int, cols: int, rank_tol: float | None = None) -> dict[str, Tensor]:
    """psi, nu (three conventions) and the effective rank from descending singular values ``s [N, p]``."""
    tau = rank_threshold(s, rows, cols, rank_tol)
    counted = s > tau[:, None]
    nu = counted.sum(1)
    psi = torch.where(counted, s.clamp_min(torch.finfo(s.dtype).tiny).log(), torch.zeros_like(s)).sum(1)
    nu_rel = (s > REL_TOL * s[:, :1]).sum(1)
    nu_abs = (s > ABS_TOL).sum(1)
    total = s.sum(1, keepdim=True)
    p = torch.where(total > 0, s / total.clamp_min(torch.finfo(s.dtype).tiny), torch.zeros_like(s))
    entropy = -torch.where(p > 0, p * p.clamp_min(torch.finfo(s.dtype).tiny).log(), torch.zeros_like(p)).sum(1)
    return {"psi": psi, "nu": nu, "nu_rel": nu_rel, "nu_abs": nu_abs, "effective_rank": entropy.exp(), "tau": tau}


# ------------------------------------------------------------------------------------------------ Jacobians
def _not_differentiable(why: str) -> ValueError:
    return ValueError(f"G: the map's output is not differentiable in z ({why}); local descriptors need a map built "
                      "from differentiable torch operations (no detach / no_grad / numpy inside)")


def _forward(fmap: Callable, z: Tensor) -> tuple[Tensor, Tensor]:
    """``(z_leaf, out [n, D])`` with the graph from ``z_leaf`` kept."""
    zc = z.detach().requires_grad_(True)
    with torch.enable_grad():
        out = fmap(zc)
    if not isinstance(out, Tensor) or out.shape[0] != z.shape[0]:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"G must map a batch [n, ...] to a batch [n, ...], got {got} for {tuple(z.shape)}")
    if not out.is_floating_point():
        raise _not_differentiable(f"its output has dtype {out.dtype}")
    if out.grad_fn is None:
        raise _not_differentiable("its output carries no autograd graph back to z")
    flat = out.reshape(out.shape[0], -1)
    if not bool(torch.isfinite(flat.detach()).all()):
        raise ValueError("G returned non-finite values at some latent (NaN or inf)")
    return zc, flat


def jacobian(fmap: Callable, z: Tensor, directions: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(J V [n, D, m], G(z) [n, D])`` for latents ``z [n, *in_shape]``; ``V = I`` when ``directions`` is None,
    else ``directions [n, k, m]`` (one matrix per latent).

    Raises:
        ValueError: the output does not depend differentiably on ``z``.
    """
    n = z.shape[0]
    k = z[0].numel()
    zc, out = _forward(fmap, z)
    d = out.shape[1]
    m = k if directions is None else directions.shape[2]
    with torch.enable_grad():
        if d <= m:  # reverse mode: row i of J for all latents at once
            rows = []
            for i in range(d):
                (g,) = torch.autograd.grad(out[:, i].sum(), zc, retain_graph=i < d - 1, allow_unused=True)
                if g is None:
                    raise _not_differentiable(f"output coordinate {i} does not depend on z")
                rows.append(g.reshape(n, k))
            jac = torch.stack(rows, 1)  # [n, D, k]
            jv = jac if directions is None else jac @ directions
        else:  # forward products J v through the double-backward trick: d/du <J^T u, v> = J v
            u = torch.zeros_like(out, requires_grad=True)
            (jtu,) = torch.autograd.grad(out, zc, grad_outputs=u, create_graph=True, allow_unused=True)
            if jtu is None or not jtu.requires_grad:
                raise _not_differentiable("J^T u does not depend on u")
            cols = []
            for j in range(m):
                v = (torch.eye(k, dtype=z.dtype, device=z.device)[:, j].expand(n, k) if directions is None
                     else directions[:, :, j])
                (jv_j,) = torch.autograd.grad(jtu, u, grad_outputs=v.reshape(zc.shape), retain_graph=j < m - 1)
                cols.append(jv_j)
            jv = torch.stack(cols, 2)  # [n, D, m]
    return jv.detach(), out.detach()


def orthonormal_directions(n: int, k: int, m: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """``[n, k, m]`` matrices with orthonormal columns (QR of a Gaussian matrix, signs fixed), one per latent."""
    g = torch.randn(n, k, m, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r, dim1=1, dim2=2)).unsqueeze(1)
    return q.to(dtype)


# ------------------------------------------------------------------------------------------------ complexity
def neighbourhood(z: Tensor, radius: float, n_vertices: int, generator: torch.Generator,
                  include_center: bool = True) -> Tensor:
    """The vertices ``[n, V, *in_shape]`` around each latent: ``z +- r u_j`` for ``n_vertices / 2`` orthonormal
    directions (plus ``z`` first, with ``include_center``), ``V = n_vertices (+ 1)``.

    The directions come from ``generator``: the same seed gives the same directions at any radius.
    """
    n, shape = z.shape[0], z.shape[1:]
    k = z[0].numel()
    u = orthonormal_directions(n, k, n_vertices // 2, generator, z.dtype).transpose(1, 2)  # [n, n/2, k]
    flat = z.reshape(n, 1, k)
    parts = ([flat] if include_center else []) + [flat + radius * u, flat - radius * u]
    return torch.cat(parts, 1).reshape(n, -1, *shape)


class _SignRecorder:
    """Forward pre-hooks recording the pre-activation sign ``input > 0`` of every activation module, per call."""

    def __init__(self, modules: Sequence[tuple[str, nn.Module]]):
        self.records: dict[str, list[Tensor]] = {name: [] for name, _ in modules}
        self.handles = [m.register_forward_pre_hook(self._hook(name)) for name, m in modules]

    def _hook(self, name: str):
        def hook(_module, inputs):
            x = inputs[0]
            self.records[name].append((x.detach() > 0).reshape(x.shape[0], -1))

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def activation_units(fmap: GeometryMap, units: Sequence[nn.Module] | None = None) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of the activation modules delta counts: ``units`` if given, else every module of
    :data:`ACTIVATIONS` inside the map's networks (by qualified name)."""
    if units is not None:
        return [(f"unit{i}", m) for i, m in enumerate(units)]
    found = []
    for j, root in enumerate(fmap.modules()):
        for name, m in root.named_modules():
            if isinstance(m, ACTIVATIONS):
                found.append((f"{j}.{name}" if j else name, m))
    return found


def complexity(fmap: GeometryMap, vertices: Tensor, modules: Sequence[tuple[str, nn.Module]]
               ) -> tuple[Tensor, dict[str, Tensor], dict[str, int]]:
    """``(delta [n], per layer [n], units per layer)`` from vertices ``[n, V, *in_shape]``.

    A unit is one coordinate of one activation module's input in one call of the map; it intersects the
    neighbourhood of latent ``i`` when its sign differs between two of latent ``i``'s vertices.
    """
    n, v = vertices.shape[:2]
    recorder = _SignRecorder(modules)
    try:
        with torch.no_grad():
            fmap(vertices.reshape(n * v, *vertices.shape[2:]))
    finally:
        recorder.close()
    per_layer, units = {}, {}
    for name, calls in recorder.records.items():
        count = torch.zeros(n, dtype=torch.long)
        width = 0
        for signs in calls:
            if signs.shape[0] != n * v:  # a call on another batch (e.g. a guider's doubled batch) is split per copy
                if signs.shape[0] % (n * v):
                    raise ValueError(f"layer {name}: a call on {signs.shape[0]} rows cannot be split into the "
                                     f"{n * v} vertices")
                signs = signs.reshape(-1, n * v, signs.shape[1]).transpose(0, 1).reshape(n * v, -1)
            s = signs.reshape(n, v, -1)
            count += (s != s[:, :1]).any(1).sum(1).cpu()
            width += s.shape[2]
        per_layer[name] = count
        units[name] = width
    total = sum(per_layer.values()) if per_layer else torch.zeros(n, dtype=torch.long)
    return total, per_layer, units


# ------------------------------------------------------------------------------------------------ the entry point
def _check_args(rank_tol, delta_radius, n_vertices, sketch_dim, batch_size):
    if rank_tol is not None and (isinstance(rank_tol, bool) or not isinstance(rank_tol, (int, float))
                                 or not math.isfinite(rank_tol) or rank_tol <= 0):
        raise ValueError(f"rank_tol must be a positive finite number (tau = rank_tol * s_1) or None (the "
                         f"matrix_rank default s_1 * max(D, k) * eps), got {rank_tol!r}")
    if delta_radius is not None and (isinstance(delta_radius, bool) or not isinstance(delta_radius, (int, float))
                                     or not math.isfinite(delta_radius) or delta_radius <= 0):
        raise ValueError(f"delta_radius must be a positive finite number (r in z units) or None (no delta), "
                         f"got {delta_radius!r}")
    if n_vertices is not None and (isinstance(n_vertices, bool) or not isinstance(n_vertices, int)
                                   or n_vertices < 2 or n_vertices % 2):
        raise ValueError(f"n_vertices must be an even integer >= 2 (z +- r u_j for n/2 directions), got "
                         f"{n_vertices!r}")
    if sketch_dim is not None and (isinstance(sketch_dim, bool) or not isinstance(sketch_dim, int)
                                   or sketch_dim < 1):
        raise ValueError(f"sketch_dim must be a positive integer or None (exact Jacobian), got {sketch_dim!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def local_descriptors(
    G,
    z: Tensor,
    map_kind: str = "generator",
    rank_tol: float | None = None,
    delta_radius: float | None = DEFAULT_RADIUS,
    n_vertices: int | None = None,
    sketch_dim: int | None = None,
    *,
    sigmas: Tensor | None = None,
    method: str = "ddim",
    cond=None,
    guidance=None,
    sigma: float | None = None,
    units: Sequence[nn.Module] | None = None,
    include_center: bool = True,
    dtype: torch.dtype | None = torch.float64,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = False,
) -> Descriptors:
    """psi, nu (three conventions), delta (total and per layer) and the singular values of ``G`` at latents ``z``.

    Args:
        G: a denoiser (``map_kind="generator"`` or ``"denoiser"``), a callable ``z -> x`` (``"decoder"``), or a map
            from :mod:`steerdiff.geometry.maps`.
        z: latents ``[N, *in_shape]``: unit-variance noise for the generator map (``x_T = sigma_max z``), noisy
            states for the denoiser map, decoder inputs otherwise.
        map_kind: ``"generator"`` (default), ``"denoiser"`` or ``"decoder"`` (docs/methods/geometry.md "Which map").
        rank_tol: relative rank tolerance, ``tau = rank_tol s_1``; None: ``s_1 max(D, k) eps(dtype)``.
        delta_radius: the neighbourhood radius ``r`` of delta (in z units); None skips delta.
        n_vertices: vertices ``z +- r u_j``: default ``2k`` capped at 128 (at most ``2k``).
        sketch_dim: measure ``J V`` with ``m = sketch_dim`` random orthonormal directions (``m <= min(k, D)``);
            None: the exact Jacobian.
        sigmas, method, cond, guidance: the generator map's grid (default ``karras(20, 0.002, 40, 7)``), its
            deterministic sampler, fixed condition and guider.
        sigma: the denoiser map's noise level.
        units: the modules whose inputs count as pre-activations (default: every activation module of the map).
        include_center: also run ``z`` itself among the vertices.
        dtype: compute dtype (the map's networks are copied to it); None keeps the map and ``z`` as they are.
        batch_size: latents per chunk (the vertex batch is ``batch_size * (n_vertices + 1)`` rows).
        seed: seeds the directions of delta and of the sketch (the same seed, the same directions).
        progress: a progress bar over the chunks.

    Raises:
        ValueError: a map whose output is not differentiable in ``z`` (names ``G``), ``rank_tol <= 0``,
            ``sketch_dim`` larger than the latent or output dimension, an odd or too large ``n_vertices``, a
            non-positive ``delta_radius``, an unknown ``map_kind``.
    """
    _check_args(rank_tol, delta_radius, n_vertices, sketch_dim, batch_size)
    if not isinstance(z, Tensor) or z.ndim < 2 or not z.is_floating_point():
        got = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
        raise ValueError(f"z must be a floating-point tensor of latents [N, *shape], got {got}")
    fmap = as_map(G, map_kind, sigmas=sigmas, method=method, cond=cond, guidance=guidance, sigma=sigma)
    if dtype is not None:
        fmap, z = fmap.to(dtype), z.to(dtype)
    n, k = z.shape[0], z[0].numel()
    if n_vertices is None:
        n_vertices = min(2 * k, MAX_VERTICES)
    if n_vertices > 2 * k:
        raise ValueError(f"n_vertices={n_vertices} needs {n_vertices // 2} orthonormal directions but the latent has "
                         f"k={k} dimensions: use n_vertices <= {2 * k}")
    if sketch_dim is not None and sketch_dim > k:
        raise ValueError(f"sketch_dim={sketch_dim} is larger than the latent dimension k={k} (V is k x m with "
                         "orthonormal columns): use sketch_dim <= min(k, D) or None for the exact Jacobian")
    modules = activation_units(fmap, units) if delta_radius is not None else []
    gen = torch.Generator().manual_seed(seed)
    gen_sketch = torch.Generator().manual_seed(seed + 1)
    svals, outs, deltas, layers, unit_count = [], [], [], {}, {}
    chunks = range(0, n, batch_size)
    import time

    start = time.perf_counter()
    d_out = None
    for lo in tqdm(chunks, desc="geometry", disable=not progress):
        zc = z[lo:lo + batch_size]
        directions = None
        if sketch_dim is not None:
            directions = orthonormal_directions(zc.shape[0], k, sketch_dim, gen_sketch, z.dtype)
        jv, out = jacobian(fmap, zc, directions)
        d_out = out.shape[1]
        if sketch_dim is not None and sketch_dim > d_out:
            raise ValueError(f"sketch_dim={sketch_dim} is larger than the output dimension D={d_out}: use "
                             f"sketch_dim <= min(k, D) = {min(k, d_out)}")
        svals.append(torch.linalg.svdvals(jv.double() if jv.dtype != torch.float64 else jv))
        outs.append(out.reshape(zc.shape[0], *_out_shape(fmap, zc, out)))
        if delta_radius is not None:
            verts = neighbourhood(zc, float(delta_radius), n_vertices, gen, include_center)
            total, per_layer, units_per = complexity(fmap, verts, modules)
            deltas.append(total)
            for name, v in per_layer.items():
                layers.setdefault(name, []).append(v)
            unit_count = units_per
    s = torch.cat(svals)
    m = k if sketch_dim is None else sketch_dim
    spec = spectral_descriptors(s, d_out, m, rank_tol)
    info = {**fmap.describe(), "k": k, "D": d_out, "sketch_dim": sketch_dim, "dtype": str(z.dtype),
            "rank_rule": ("tau = s1 * max(D, k) * eps" if rank_tol is None else f"tau = {rank_tol} * s1"),
            "nu_rel_rule": f"s > {REL_TOL} * s1", "nu_abs_rule": f"s > {ABS_TOL}",
            "delta_radius": delta_radius, "n_vertices": n_vertices if delta_radius is not None else None,
            "include_center": include_center, "units": sum(unit_count.values()) if unit_count else 0,
            "piecewise_linear": all(isinstance(mod, PIECEWISE_LINEAR) for _, mod in modules) if modules else True,
            "seed": seed, "seconds": time.perf_counter() - start}
    return Descriptors(psi=spec["psi"], nu=spec["nu"], nu_rel=spec["nu_rel"], nu_abs=spec["nu_abs"],
                       effective_rank=spec["effective_rank"], singular_values=s,
                       delta=torch.cat(deltas) if delta_radius is not None else None,
                       delta_per_layer={k_: torch.cat(v) for k_, v in layers.items()},
                       units_per_layer=unit_count, outputs=torch.cat(outs), info=info)


def _out_shape(fmap, zc: Tensor, out: Tensor) -> tuple[int, ...]:
    shape = getattr(getattr(fmap, "denoiser", None), "sample_shape", None)
    if shape is not None and math.prod(shape) == out.shape[1]:
        return tuple(shape)
    if zc[0].numel() == out.shape[1]:
        return tuple(zc.shape[1:])
    return (out.shape[1],)
