"""Linear-algebra pieces the SVD-based solvers share (DDNM+, PiGDM, DDRM, DiffPIR): the thin SVD of a linear
operator's explicit matrix, ``A = U diag(s) V^T``, and the operator norm ``||A||_2`` for step-size rules;
docs/methods/inverse.md, "DDNM", "PiGDM", "DDRM", "DiffPIR", "DAPS".

The SVD is taken once per operator, dtype and device from ``operator.matrix()`` (float64) and cached on the
operator. It needs an explicit matrix, so it is refused beyond :data:`~steerdiff.inverse.base.EXPLICIT_PINV_MAX_D`
unknowns (64 x 64) and for nonlinear operators, with an error naming the method; ``Inpaint`` has a matrix-free SVD
(:class:`MaskSpectral`: a permutation) and runs at any size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import EXPLICIT_PINV_MAX_D, NoAdjointError, NoPinvError

RANK_RTOL = 1e-10  # singular values below this fraction of the largest count as zero (null space)


class Spectral:
    """``A = U diag(s) V^T`` of a bound linear operator: ``V`` ``[d, d]`` (full, so its last ``d - r`` columns span
    the null space), ``U`` ``[m, r]``, ``s`` ``[d]`` (the ``r`` nonzero singular values, then zeros)."""

    def __init__(self, operator, dtype: torch.dtype, device: torch.device, method: str):
        if not operator.is_linear:
            raise NoAdjointError(f"method={method!r} needs a linear operator (it works in the SVD basis of A); "
                                 f"{operator!r} is nonlinear: use method='dps', 'daps' or 'hr'")
        if operator.d > EXPLICIT_PINV_MAX_D:
            raise NoPinvError(f"method={method!r} takes the SVD of the explicit matrix of {operator!r}, which has "
                              f"{operator.d} unknowns, more than {EXPLICIT_PINV_MAX_D}; use method='dps', 'daps' or "
                              "'hr' for such operators")
        a = operator.matrix(torch.float64)
        u, s, vh = torch.linalg.svd(a, full_matrices=True)
        r = int((s > s.max() * RANK_RTOL).sum()) if s.numel() else 0
        d = a.shape[1]
        sv = torch.zeros(d, dtype=torch.float64)
        sv[:r] = s[:r]
        self.shape = operator.shape
        self.rank = r
        self.U = u[:, :r].to(dtype=dtype, device=device)
        self.V = vh.T.to(dtype=dtype, device=device)
        self.s = sv.to(dtype=dtype, device=device)
        self.observed = self.s > 0

    def to_spec(self, x: Tensor) -> Tensor:
        """``V^T x``: ``[B, *shape] -> [B, d]``."""
        return x.flatten(1) @ self.V

    def from_spec(self, c: Tensor) -> Tensor:
        """``V c``: ``[B, d] -> [B, *shape]``."""
        return (c @ self.V.T).reshape(c.shape[0], *self.shape)

    def y_spec(self, y: Tensor) -> Tensor:
        """``U^T y`` padded with zeros to ``[B, d]`` (entry ``i`` pairs with ``s_i``)."""
        out = torch.zeros(y.shape[0], self.s.shape[0], dtype=y.dtype, device=y.device)
        out[:, : self.rank] = y @ self.U
        return out

    def y_bar(self, y: Tensor) -> Tensor:
        """``ybar_i = (U^T y)_i / s_i`` on the observed directions, 0 on the null space: ``V^T A^+ y``."""
        return torch.where(self.observed, self.y_spec(y) / torch.where(self.observed, self.s, 1), 0)


class MaskSpectral(Spectral):
    """The SVD of :class:`~steerdiff.inverse.operators.Inpaint` without a matrix: ``A`` selects entries, so ``U = I``,
    ``s = 1`` on the kept entries and ``V`` is the permutation putting the kept entries first (any size)."""

    def __init__(self, operator, dtype: torch.dtype, device: torch.device):
        index = operator._index.to(device)
        keep = torch.zeros(operator.d, dtype=torch.bool, device=device)
        keep[index] = True
        self.perm = torch.cat([index, (~keep).nonzero().flatten()])
        self.inv = torch.argsort(self.perm)
        self.shape = operator.shape
        self.rank = index.numel()
        self.U = None  # identity
        self.V = None  # the permutation self.perm
        self.s = keep[self.perm].to(dtype)
        self.observed = self.s > 0

    def to_spec(self, x: Tensor) -> Tensor:
        return x.flatten(1)[:, self.perm]

    def from_spec(self, c: Tensor) -> Tensor:
        return c[:, self.inv].reshape(c.shape[0], *self.shape)

    def y_spec(self, y: Tensor) -> Tensor:
        out = torch.zeros(y.shape[0], self.s.shape[0], dtype=y.dtype, device=y.device)
        out[:, : self.rank] = y
        return out


def spectral(operator, dtype: torch.dtype, device: torch.device, method: str) -> Spectral:
    """The cached SVD of ``operator`` for ``dtype`` / ``device``: matrix-free for ``Inpaint`` (any size), else
    :class:`Spectral` of the explicit matrix."""
    from .operators import Inpaint  # operators imports base only; this keeps linear importable from it

    cache = operator.__dict__.setdefault("_spectral_cache", {})
    key = (operator.shape, dtype, torch.device(device))
    if key not in cache:
        if isinstance(operator, Inpaint):
            cache[key] = MaskSpectral(operator, dtype, torch.device(device))
        else:
            cache[key] = Spectral(operator, dtype, device, method)
    return cache[key]


def operator_norm_sq(operator, dtype: torch.dtype, device: torch.device, iters: int = 50, seed: int = 0) -> float:
    """``||A||_2^2``, the largest eigenvalue of ``A^T A``: exact from the SVD for small operators, else by ``iters``
    power iterations with ``forward`` / ``adjoint`` (once per run, before the loop)."""
    from .operators import Inpaint

    if operator.d <= EXPLICIT_PINV_MAX_D or isinstance(operator, Inpaint):
        return float(spectral(operator, torch.float64, torch.device("cpu"), "operator norm").s.max() ** 2)
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(1, *operator.shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    lam = 0.0
    with torch.no_grad():
        for _ in range(iters):
            v = v / v.norm()
            w = operator.adjoint(operator.forward(v))
            lam = float((v * w).sum())
            v = w
    return lam


def jacobian_norm_sq(operator, at: Tensor, iters: int = 20, seed: int = 0) -> float:
    """``||J||_2^2`` of a (nonlinear) operator's Jacobian ``J = dA/dx`` at the point ``at`` ``[1, *shape]``, by
    ``iters`` power iterations on ``J^T J`` (:func:`jacobian_norm_sq_rows`). The local operator norm a step-size rule
    uses where there is no adjoint (DPS, docs/methods/inverse.md "Step sizes"). Once per run, before the loop."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(at.shape, generator=g, dtype=torch.float64).to(device=at.device, dtype=at.dtype)
    lam, _ = jacobian_norm_sq_rows(operator, at, v, iters)
    return float(lam[0])


def jacobian_norm_sq_rows(operator, at: Tensor, v: Tensor, iters: int) -> tuple[Tensor, Tensor]:
    """Per row of ``at`` ``[B, *shape]``, ``||J_b||_2^2`` of the operator's Jacobian at ``at[b]`` by ``iters`` power
    iterations on ``J^T J`` started from ``v`` (same shape; pass the previous call's vector to warm-start). ``J v`` by
    central differences (step ``eps^(1/3)`` of the dtype along the unit ``v``: a double backward is not available
    through every layer, e.g. CPU flash attention in a VAE decoder), ``J^T u`` by one VJP of the whole batch (rows
    are independent measurements). Returns ``(norms [B], v)`` on ``at``'s device; no host read."""
    x = at.detach()
    h = float(torch.finfo(x.dtype).eps) ** (1 / 3)
    tiny = torch.finfo(x.dtype).tiny
    lam = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    per_row = (-1,) + (1,) * (x.dim() - 1)
    for _ in range(iters):
        v = v / v.flatten(1).norm(dim=1).clamp_min(tiny).reshape(per_row)
        with torch.no_grad():
            jv = (operator.forward(x + h * v) - operator.forward(x - h * v)) / (2 * h)
        with torch.enable_grad():
            xg = x.clone().requires_grad_(True)
            (jtjv,) = torch.autograd.grad(operator.forward(xg), xg, jv)
        lam, v = (v * jtjv).flatten(1).sum(1), jtjv.detach()
    return lam, v


def cg(apply, b: Tensor, x0: Tensor | None = None, iters: int = 50) -> Tensor:
    """Batched conjugate gradients for ``apply(x) = b`` with ``apply`` symmetric positive (semi-)definite per row:
    ``iters`` fixed iterations (no host reads; a row whose residual has reached rounding level stops moving). Rows
    are flattened; ``x0`` is the start (default 0). Started in ``x0 + range(A^T)`` on a singular system it converges
    to the solution nearest ``x0``."""
    shape = b.shape
    b = b.flatten(1)
    x = torch.zeros_like(b) if x0 is None else x0.flatten(1).clone()
    r = b - apply(x.reshape(shape)).flatten(1)
    p = r.clone()
    rs = (r * r).sum(1, keepdim=True)
    tiny = torch.finfo(b.dtype).tiny
    # a row whose residual is at rounding level stops (alpha = 0): past convergence rs / p^T A p is 0 / 0
    tol2 = (10 * torch.finfo(b.dtype).eps) ** 2 * ((b * b).sum(1, keepdim=True) + (r * r).sum(1, keepdim=True)) + tiny
    for _ in range(iters):
        ap = apply(p.reshape(shape)).flatten(1)
        pap = (p * ap).sum(1, keepdim=True)
        active = (rs > tol2) & (pap > tiny)
        alpha = torch.where(active, rs / torch.where(active, pap, 1.0), 0.0)
        x = x + alpha * p
        r = r - alpha * ap
        rs_new = (r * r).sum(1, keepdim=True)
        p = r + torch.where(active, rs_new / torch.where(active, rs, 1.0), 0.0) * p
        rs = rs_new
    return x.reshape(shape)
