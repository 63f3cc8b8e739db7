"""The measurement-operator interface (docs/methods/inverse.md, "Operators"): ``forward`` (batched, differentiable),
``adjoint`` (linear only), ``pinv`` (initialiser), ``matrix()`` (linear only), ``m``, ``is_linear``, and the binding
of an operator to a sample shape. Concrete operators are in :mod:`steerdiff.inverse.operators`.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor


class NoAdjointError(ValueError):
    """A linear-only facility (adjoint, matrix, exact posterior) was asked of a nonlinear operator."""


def as_shape(shape, name: str = "shape") -> tuple[int, ...]:
    try:
        s = tuple(int(v) for v in shape)
    except TypeError as err:
        raise ValueError(f"{name} must be a tuple of positive ints, got {shape!r}") from err
    if not s or any(v < 1 for v in s):
        raise ValueError(f"{name} must be a non-empty tuple of positive ints, got {shape!r}")
    return s


class Operator:
    """Base class: subclasses define ``_forward``, and for linear operators ``_adjoint`` (and optionally ``_pinv``).

    Attributes:
        shape: the sample shape ``x.shape[1:]`` the operator acts on (None until bound).
        is_linear: whether ``forward`` is linear (then ``adjoint`` and ``matrix`` exist).
        dps_scale: DPS step size ``s`` of the DPS configs for this task (None: no published default).
    """

    is_linear: bool = True
    dps_scale: float | None = None

    def __init__(self, shape=None):
        self.shape = None if shape is None else as_shape(shape)
        if self.shape is not None:
            self._validate_shape(self.shape)

    # --- shape handling ----------------------------------------------------------------------------------------
    def _validate_shape(self, shape: tuple[int, ...]) -> None:
        """Raise ValueError if the operator cannot act on samples of ``shape``."""

    def _measurement_size(self, shape: tuple[int, ...]) -> int:
        return math.prod(shape)

    def _need_shape(self) -> tuple[int, ...]:
        if self.shape is None:
            raise ValueError(f"{self!r} has no sample shape yet; pass shape=(...) or call .bind(shape)")
        return self.shape

    def bind(self, shape) -> Operator:
        """This operator acting on samples of ``shape`` (itself if already bound to it; a copy otherwise)."""
        shape = as_shape(shape)
        if self.shape == shape:
            return self
        if self.shape is not None:
            raise ValueError(f"{self!r} acts on samples of shape {self.shape}, not {shape}")
        self._validate_shape(shape)
        new = copy.copy(self)
        new.shape = shape
        return new

    @property
    def d(self) -> int:
        """Unknowns per sample."""
        return math.prod(self._need_shape())

    @property
    def m(self) -> int:
        """Measurements per sample."""
        return self._measurement_size(self._need_shape())

    # --- the interface -----------------------------------------------------------------------------------------
    def _check_x(self, x: Tensor) -> None:
        if not isinstance(x, Tensor) or x.ndim < 2:
            raise ValueError(f"x must be a batch tensor [B, *shape], got {getattr(x, 'shape', type(x).__name__)}")
        if self.shape is not None and tuple(x.shape[1:]) != self.shape:
            raise ValueError(f"{self!r} expects x of shape [B, {', '.join(map(str, self.shape))}], got "
                             f"{tuple(x.shape)}")
        if self.shape is None:
            self._validate_shape(tuple(x.shape[1:]))

    def check_y(self, y: Tensor, name: str = "y") -> Tensor:
        """``y`` as ``[M, m]`` (a single ``[m]`` measurement gets a batch axis); ValueError for a wrong shape or NaN."""
        if not isinstance(y, Tensor):
            raise ValueError(f"{name} must be a tensor [M, m], got {type(y).__name__}")
        m = self.m
        if y.ndim == 1:
            y = y[None]
        if y.ndim != 2 or y.shape[1] != m:
            raise ValueError(f"{name} must have shape [M, {m}] (m = {m} measurements of {self!r}), got "
                             f"{tuple(y.shape)}")
        if not y.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {y.dtype}")
        if not torch.isfinite(y).all():
            bad = int((~torch.isfinite(y)).any(1).sum())
            raise ValueError(f"{name} contains NaN or infinite values (in {bad} of {y.shape[0]} measurements)")
        return y

    def forward(self, x: Tensor) -> Tensor:
        """``A(x)``: ``[B, *shape] -> [B, m]``, differentiable."""
        self._check_x(x)
        return self._forward(x).reshape(x.shape[0], -1)

    __call__ = forward

    def _require_linear(self, what: str) -> None:
        if not self.is_linear:
            raise NoAdjointError(f"{self!r} is nonlinear: it has no {what}; use a linear operator or a method that "
                                 "only needs forward()")

    def adjoint(self, v: Tensor) -> Tensor:
        """``A^T v``: ``[B, m] -> [B, *shape]`` (linear operators only)."""
        self._require_linear("adjoint")
        v = self.check_y(v, "v")
        return self._adjoint(v).reshape(v.shape[0], *self.shape)

    def pinv(self, y: Tensor) -> Tensor:
        """The initialiser ``A^+(y)``: ``[M, m] -> [M, *shape]``."""
        y = self.check_y(y)
        return self._pinv(y).reshape(y.shape[0], *self.shape)

    def matrix(self, dtype: torch.dtype = torch.float64) -> Tensor:
        """The explicit ``[m, d]`` matrix of a linear operator (row ``j`` is ``A^T e_j``)."""
        self._require_linear("matrix")
        return self.adjoint(torch.eye(self.m, dtype=dtype)).reshape(self.m, self.d)

    # --- defaults for subclasses ---------------------------------------------------------------------------------
    def _forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _adjoint(self, v: Tensor) -> Tensor:
        raise NotImplementedError

    def _pinv(self, y: Tensor) -> Tensor:
        return self._adjoint(y)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape})"
