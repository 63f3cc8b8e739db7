"""Measurement operators ``y = A(x)`` for inverse problems (docs/methods/inverse.md, "Operators").

Every operator maps a batch ``x: [B, *shape]`` (model units; images in [-1, 1]) to flat measurements ``[B, m]``
and offers ``forward`` (batched, differentiable), ``adjoint`` (linear only), ``pinv`` (the initialiser of DR/CR/HR),
``matrix()`` (linear only: the explicit ``[m, d]`` matrix, for tests and exact posteriors), ``m`` and ``is_linear``.

* :class:`Matrix` ``(A)``: any explicit linear map (small problems, tests);
* :class:`Inpaint` ``(mask)``: the kept entries ``x[mask == 1]`` (HRDIS ``Inpainting2.H``); pinv = zero fill;
* :class:`Downsample` ``(r)`` (alias ``AvgPoolSR``): means over non-overlapping ``r x r`` blocks (HRDIS
  ``SuperResolution``); pinv = nearest replicate ``= r^2 A^T``;
* :class:`Blur` ``(kernel)``: 2-D convolution with zero "same" padding; :func:`GaussBlur` builds the separable
  normalised Gaussian kernel here (HRDIS' blur matrix drops a tap); pinv = explicit ``pinv(matrix)`` when
  ``d <= 4096`` (truncated at ``pinv_rtol``, a steerdiff decision explained in :class:`Blur`), else the adjoint;
* :class:`HDR` (nonlinear): ``clip(2x, -1, 1)`` (RED-diff/HRDIS ``HDR``), pinv ``y / 2``; zero gradient where
  ``|2x| > 1``;
* :class:`FunctionOperator` ``(forward, adjoint=None)``: plain functions as an operator (linear when the adjoint is
  given: checked against the forward, pinv = Moore-Penrose of the explicit matrix; nonlinear otherwise, no pinv).

:func:`as_operator` turns what a user would pass as ``operator=`` into an operator: an :class:`Operator` as it is,
a ``[m, d]`` matrix (tensor or array) into :class:`Matrix`, a pair ``(forward, adjoint)`` or a single ``forward``
function into :class:`FunctionOperator`.

Operators built without a sample shape (``Downsample(2)``) are bound to the denoiser's ``sample_shape`` by
:func:`steerdiff.inverse.solve`, or explicitly with ``op.bind(shape)``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .base import EXPLICIT_PINV_MAX_D, NoAdjointError, NoPinvError, Operator, as_shape, probe

__all__ = ["HDR", "AvgPoolSR", "Blur", "Downsample", "FunctionOperator", "GaussBlur", "Inpaint", "Matrix",
           "NoAdjointError", "NoPinvError", "Operator", "as_operator", "gaussian_kernel"]


class Matrix(Operator):
    """An explicit linear map ``y = A x.flatten()``, ``A: [m, d]``; pinv is ``torch.linalg.pinv(A)``.

    Args:
        A: ``[m, d]`` finite matrix.
        shape: the sample shape (default ``(d,)``); its size must be ``d``.
    """

    def __init__(self, A, shape=None):
        A = torch.as_tensor(A)
        if A.ndim != 2 or A.numel() == 0 or not A.is_floating_point() or not torch.isfinite(A).all():
            raise ValueError(f"A must be a finite floating-point [m, d] matrix, got shape {tuple(A.shape)}")
        self.A = A
        self._pinv_cache: dict = {}
        super().__init__((A.shape[1],) if shape is None else shape)

    def bind(self, shape) -> Operator:
        shape = as_shape(shape)
        if math.prod(shape) != self.A.shape[1]:
            raise ValueError(f"Matrix with d={self.A.shape[1]} columns cannot act on samples of shape {shape}")
        new = copy.copy(self)
        new.shape = shape
        return new

    def _validate_shape(self, shape):
        if math.prod(shape) != self.A.shape[1]:
            raise ValueError(f"shape {shape} has {math.prod(shape)} entries but A has d={self.A.shape[1]} columns")

    def _measurement_size(self, shape):
        return self.A.shape[0]

    def _forward(self, x):
        return x.flatten(1) @ self.A.to(x).T

    def _adjoint(self, v):
        return v @ self.A.to(v)

    def _pinv(self, y):
        key = (y.dtype, y.device)
        if key not in self._pinv_cache:
            self._pinv_cache[key] = torch.linalg.pinv(self.A.double()).to(y)
        return y @ self._pinv_cache[key].T

    def matrix(self, dtype=torch.float64):
        return self.A.to(dtype)

    def __repr__(self):
        return f"Matrix({self.A.shape[0]}x{self.A.shape[1]}, shape={self.shape})"


class Inpaint(Operator):
    """Keep the entries where ``mask == 1``: ``A x = x[mask == 1]``, ``m = mask.sum()``; pinv = zero fill.

    Args:
        mask: 0/1 (or bool) tensor of the sample shape, or broadcastable to it (``[H, W]`` for ``[C, H, W]``).
        shape: the sample shape (default: the mask's shape).
    """

    dps_scale = 0.5  # DPS configs/inpainting_config.yaml

    def __init__(self, mask, shape=None):
        mask = torch.as_tensor(mask)
        if mask.ndim < 1 or not ((mask == 0) | (mask == 1)).all():
            raise ValueError("mask must be a non-empty tensor of 0/1 (or bool) values")
        if not mask.any():
            raise ValueError("mask keeps no entry: at least one value must be 1")
        self.raw_mask = mask.bool()
        super().__init__(tuple(mask.shape) if shape is None else shape)

    def bind(self, shape) -> Operator:
        shape = as_shape(shape)
        return self if shape == self.shape else Inpaint(self.raw_mask, shape)

    def _validate_shape(self, shape):
        try:
            mask = torch.broadcast_to(self.raw_mask, shape)
        except RuntimeError as err:
            got = tuple(self.raw_mask.shape)
            raise ValueError(f"mask of shape {got} does not fit samples of shape {shape}") from err
        self.mask = mask
        self._index = mask.flatten().nonzero().flatten()

    def _measurement_size(self, shape):
        return self._index.numel()

    def _forward(self, x):
        return x.flatten(1)[:, self._index.to(x.device)]

    def _adjoint(self, v):
        out = v.new_zeros(v.shape[0], self.d)
        return out.index_copy(1, self._index.to(v.device), v)

    def _pinv(self, y):
        return self._adjoint(y)  # A A^T = I: zero fill is the Moore-Penrose inverse

    @classmethod
    def center(cls, shape=(1, 8, 8), hole: int = 4) -> Inpaint:
        """A centred ``hole x hole`` square removed from every channel (the digits protocol: 4x4 on 8x8)."""
        shape = as_shape(shape)
        h, w = shape[-2:]
        if not 0 < hole < min(h, w):
            raise ValueError(f"hole must be in [1, {min(h, w) - 1}] for {h}x{w} images, got {hole}")
        mask = torch.ones(shape, dtype=torch.bool)
        top, left = (h - hole) // 2, (w - hole) // 2
        mask[..., top:top + hole, left:left + hole] = False
        return cls(mask)

    @classmethod
    def random(cls, shape=(1, 8, 8), keep: float = 0.5, seed: int = 0) -> Inpaint:
        """A random pixel mask keeping ``round(keep * H * W)`` pixels (shared by all channels), seeded."""
        shape = as_shape(shape)
        if not 0 < keep <= 1:
            raise ValueError(f"keep must be in (0, 1], got {keep}")
        h, w = shape[-2:] if len(shape) >= 2 else (1, shape[0])
        n_keep = max(1, round(keep * h * w))
        perm = torch.randperm(h * w, generator=torch.Generator().manual_seed(seed))
        pix = torch.zeros(h * w, dtype=torch.bool)
        pix[perm[:n_keep]] = True
        return cls(pix.reshape(h, w) if len(shape) >= 2 else pix, shape)

    def __repr__(self):
        return f"Inpaint(keeps {int(self.raw_mask.sum())} of {self.raw_mask.numel()}, shape={self.shape})"


def _check_image_shape(shape, what: str) -> tuple[int, int]:
    if len(shape) < 2:
        raise ValueError(f"{what} acts on images [..., H, W]; got sample shape {shape}")
    return shape[-2], shape[-1]


class Downsample(Operator):
    """Average pooling over non-overlapping ``factor x factor`` blocks (alias ``AvgPoolSR``); pinv = nearest
    replicate, which is the Moore-Penrose inverse ``r^2 A^T`` (``A A^T = I / r^2``).
    """

    dps_scale = 0.3  # DPS configs/super_resolution_config.yaml

    def __init__(self, factor: int, shape=None):
        if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
            raise ValueError(f"factor must be a positive integer, got {factor!r}")
        self.factor = factor
        super().__init__(shape)

    def _validate_shape(self, shape):
        h, w = _check_image_shape(shape, "Downsample")
        if h % self.factor or w % self.factor:
            raise ValueError(f"image size {h}x{w} is not divisible by the factor {self.factor}")

    def _measurement_size(self, shape):
        return math.prod(shape) // self.factor**2

    def _forward(self, x):
        h, w = x.shape[-2:]
        return F.avg_pool2d(x.reshape(-1, 1, h, w), self.factor)

    def _low_res(self, v):
        *lead, h, w = self.shape
        return v.reshape(v.shape[0], *lead, h // self.factor, w // self.factor)

    def _adjoint(self, v):
        r = self.factor
        return self._low_res(v).repeat_interleave(r, -2).repeat_interleave(r, -1) / r**2

    def _pinv(self, y):
        r = self.factor
        return self._low_res(y).repeat_interleave(r, -2).repeat_interleave(r, -1)

    def __repr__(self):
        return f"Downsample({self.factor}, shape={self.shape})"


AvgPoolSR = Downsample


def gaussian_kernel(size: int = 5, std: float = 1.0) -> Tensor:
    """The ``size x size`` separable Gaussian ``g g^T`` with ``g_i ∝ exp(-(i - c)^2 / (2 std^2))``, summing to 1."""
    if not isinstance(size, int) or size < 1 or size % 2 == 0:
        raise ValueError(f"size must be a positive odd integer, got {size!r}")
    if not (isinstance(std, (int, float)) and std > 0 and math.isfinite(std)):
        raise ValueError(f"std must be positive and finite, got {std!r}")
    i = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(i**2) / (2 * std**2))
    g = g / g.sum()
    return g[:, None] * g[None, :]


class Blur(Operator):
    """2-D convolution ``y = k * x`` per channel with zero "same" padding (``m = d``).

    The pseudo-inverse initialiser truncates singular values below ``pinv_rtol`` times the largest: a plain
    ``pinv(matrix)`` (``pinv_rtol=None``) inverts a 5x5, std-1 blur of 8x8 images whose smallest singular value is
    8.6e-4, so it amplifies ``sigma_y = 0.05`` noise a thousandfold (initial PSNR -12.8 dB on digits, and HR started
    there ends at -4.9 dB, against 19.0 dB from the truncated inverse; see docs/methods/inverse.md, "Operators").

    Args:
        kernel: ``[kh, kw]`` with odd sizes (see :func:`gaussian_kernel`).
        shape: the sample shape ``[..., H, W]`` (optional until bound).
        pinv_rtol: relative singular-value cutoff of the explicit pseudo-inverse (None: torch's default, ~1e-15).
    """

    dps_scale = 0.3  # DPS configs/gaussian_deblur_config.yaml

    def __init__(self, kernel, shape=None, pinv_rtol: float | None = 0.1):
        k = torch.as_tensor(kernel, dtype=torch.float64)
        if k.ndim != 2 or k.shape[0] % 2 == 0 or k.shape[1] % 2 == 0 or not torch.isfinite(k).all():
            raise ValueError(f"kernel must be a finite 2-D tensor with odd sizes, got shape {tuple(k.shape)}")
        if pinv_rtol is not None and not 0 <= pinv_rtol < 1:
            raise ValueError(f"pinv_rtol must be in [0, 1) or None, got {pinv_rtol!r}")
        self.kernel = k
        self.pinv_rtol = pinv_rtol
        self._pinv_cache: dict = {}
        super().__init__(shape)

    def _validate_shape(self, shape):
        _check_image_shape(shape, "Blur")

    def _weight(self, x):
        return self.kernel.flip(0, 1).to(x)[None, None]  # conv2d correlates: flip for a true convolution

    def _padding(self):
        return self.kernel.shape[0] // 2, self.kernel.shape[1] // 2

    def _forward(self, x):
        h, w = x.shape[-2:]
        return F.conv2d(x.reshape(-1, 1, h, w), self._weight(x), padding=self._padding())

    def _adjoint(self, v):
        h, w = self.shape[-2:]
        return F.conv_transpose2d(v.reshape(-1, 1, h, w), self._weight(v), padding=self._padding())

    def _pinv(self, y):
        if self.d > EXPLICIT_PINV_MAX_D:
            return self._adjoint(y)
        key = (y.dtype, y.device)
        if key not in self._pinv_cache:
            self._pinv_cache[key] = torch.linalg.pinv(self.matrix(torch.float64), rtol=self.pinv_rtol).to(y)
        return y @ self._pinv_cache[key].T

    def __repr__(self):
        return f"Blur({self.kernel.shape[0]}x{self.kernel.shape[1]}, shape={self.shape})"


def GaussBlur(size: int = 5, std: float = 1.0, shape=None, pinv_rtol: float | None = 0.1) -> Blur:  # noqa: N802
    """Gaussian blur with a ``size x size`` normalised separable kernel (8x8 default k=5, s=1.0; DPS on FFHQ: k=61,
    s=3.0)."""
    return Blur(gaussian_kernel(size, std), shape, pinv_rtol)


class HDR(Operator):
    """Nonlinear high-dynamic-range clipping ``A x = clip(2 x, -1, 1)`` (RED-diff/HRDIS ``HDR``); pinv ``y / 2``."""

    is_linear = False

    def _forward(self, x):
        return (2 * x).clamp(-1, 1)

    def _pinv(self, y):
        return y / 2

    def __repr__(self):
        return f"HDR(shape={self.shape})"


class FunctionOperator(Operator):
    """An operator made of plain functions: ``forward(x)`` maps ``[B, *shape]`` to ``[B, ...]`` (torch-differentiable);
    with ``adjoint(v)`` (``[B, m] -> [B, *shape]``) it is linear.

    A linear one is checked when bound to a shape, on random inputs: ``forward`` must be linear and ``<A x, v> =
    <x, A^T v>`` must hold (relative error 1e-4, float32 inputs), so a wrong adjoint fails here rather than as a bad
    solution. Its ``pinv`` is the Moore-Penrose inverse of the explicit matrix (``d <= 4096`` unknowns; beyond that
    DR/CR/HR need ``init="adjoint"`` or ``"zeros"``). A nonlinear one has no ``pinv`` (DR/CR/HR need
    ``init="zeros"`` or a tensor) and no published DPS step (DPS takes its step rule, with the Jacobian's norm at 0).

    Args:
        forward: ``A(x)``.
        adjoint: ``A^T v`` (None: the operator is nonlinear).
        shape: the sample shape (optional until bound to the denoiser's).
    """

    def __init__(self, forward: Callable, adjoint: Callable | None = None, shape=None):
        if not callable(forward):
            raise TypeError(f"forward must be a function x -> A(x), got {type(forward).__name__}")
        if adjoint is not None and not callable(adjoint):
            raise TypeError(f"adjoint must be a function v -> A^T v or None, got {type(adjoint).__name__}")
        self.fn, self.adjoint_fn = forward, adjoint
        self.is_linear = adjoint is not None
        super().__init__(shape)

    def _validate_shape(self, shape):
        if self.is_linear:
            self._check_linear(shape)

    def _check_linear(self, shape):
        def run(dtype):
            g = torch.Generator().manual_seed(0)
            x1, x2 = (torch.randn(2, *shape, generator=g, dtype=dtype) for _ in range(2))
            a1, a2, a12 = (self.fn(x).reshape(2, -1) for x in (x1, x2, x1 + 2 * x2))
            v = torch.randn(a1.shape, generator=g, dtype=dtype)
            return x1, v, a1, a2, a12, self.adjoint_fn(v)

        try:
            x1, v, a1, a2, a12, atv = probe(run)
        except RuntimeError as err:
            raise TypeError(f"could not run forward and adjoint on random inputs of shape {(2, *shape)} "
                            f"({type(err).__name__}: {err})") from err
        if not isinstance(atv, Tensor) or atv.numel() != 2 * math.prod(shape):
            got = tuple(atv.shape) if isinstance(atv, Tensor) else type(atv).__name__
            raise ValueError(f"adjoint must map [B, m] = {tuple(v.shape)} to [B, *shape] = {(2, *shape)}, got {got}")

        def off(a, b):
            return float((a - b).norm() / (a.norm() + b.norm()).clamp_min(1e-30))

        if off(a12, a1 + 2 * a2) > 1e-4:
            raise ValueError(f"forward is not linear (A(x1 + 2 x2) differs from A(x1) + 2 A(x2) by "
                             f"{off(a12, a1 + 2 * a2):.2g} relative); give forward alone for a nonlinear operator")
        lhs, rhs = (a1 * v).sum(1), (x1.reshape(2, -1) * atv.reshape(2, -1)).sum(1)
        scale = (a1.norm(dim=1) * v.norm(dim=1)).clamp_min(1e-30)
        err = float(((lhs - rhs).abs() / scale).max())
        if err > 1e-4:
            raise ValueError(f"adjoint does not match forward: <A x, v> = {lhs.tolist()} but <x, A^T v> = "
                             f"{rhs.tolist()} (relative error {err:.2g})")

    def _forward(self, x):
        return self.fn(x)

    def _adjoint(self, v):
        return self.adjoint_fn(v)

    def _pinv(self, y):
        if not self.is_linear:
            raise NoPinvError(f"{self!r} was given as a forward function only (nonlinear): it has no pseudo-inverse; "
                              "pass init='zeros' or an init tensor to DR/CR/HR, or use method='dps'")
        return super()._pinv(y)

    def __repr__(self):
        kind = "linear" if self.is_linear else "nonlinear"
        return f"FunctionOperator({getattr(self.fn, '__name__', type(self.fn).__name__)}, {kind}, shape={self.shape})"


def as_operator(operator, shape=None) -> Operator:
    """What a user passes as ``operator=``, as an :class:`Operator`.

    Accepted: an :class:`Operator` (returned as it is); a ``[m, d]`` matrix (tensor or numpy array; becomes
    :class:`Matrix`); a pair ``(forward, adjoint)`` of functions (a linear :class:`FunctionOperator`); a single
    function ``forward`` (a nonlinear :class:`FunctionOperator`, e.g. for DPS).

    Raises:
        TypeError: anything else (the message lists the accepted forms).
    """
    if isinstance(operator, Operator):
        return operator if shape is None else operator.bind(shape)
    if isinstance(operator, (Tensor, np.ndarray)):
        A = torch.as_tensor(operator)
        if A.ndim != 2:
            raise ValueError(f"operator given as a matrix must be [m, d], got shape {tuple(A.shape)}")
        return Matrix(A if A.is_floating_point() else A.double(), shape)
    if isinstance(operator, (tuple, list)):
        if len(operator) == 2 and all(callable(f) for f in operator):
            return FunctionOperator(operator[0], operator[1], shape)
        raise TypeError(f"operator given as a sequence must be a pair (forward, adjoint) of functions, got "
                        f"{len(operator)} item(s) of types {[type(f).__name__ for f in operator]}")
    if callable(operator):
        return FunctionOperator(operator, None, shape)
    raise TypeError("operator must be a steerdiff.inverse Operator, a [m, d] matrix (tensor), a pair (forward, "
                    f"adjoint) of functions or a forward function, got {type(operator).__name__}")


def __getattr__(name: str):
    # TASKS and task_operator moved to steerdiff.inverse.tasks (the task registry); the old path works for one
    # release. Imported lazily: tasks.py builds on the operators defined here.
    if name in ("TASKS", "task_operator"):
        import warnings

        from . import tasks

        warnings.warn(f"steerdiff.inverse.operators.{name} moved to steerdiff.inverse.tasks.{name} (the inverse-task "
                      f"registry; also steerdiff.inverse.{name}); the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return getattr(tasks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
