"""The measurement-operator interface (docs/methods/inverse.md, "Operators"): ``forward`` (batched, differentiable),
``adjoint`` (linear only), ``pinv`` (initialiser), ``matrix()`` (linear only), ``m``, ``is_linear``, and the binding
of an operator to a sample shape. Concrete operators are in :mod:`steerdiff.inverse.operators`.

A user-defined operator subclasses :class:`Operator` and defines ``_forward`` (and ``_adjoint`` when linear); the
number of measurements ``m`` is then inferred from one forward pass on zeros, and a linear operator's ``pinv`` is the
Moore-Penrose inverse of its explicit matrix (up to :data:`EXPLICIT_PINV_MAX_D` unknowns).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor

EXPLICIT_PINV_MAX_D = 4096  # explicit pseudo-inverse up to this many unknowns (64x64); refused beyond


class NoAdjointError(ValueError):
    """A linear-only facility (adjoint, matrix, exact posterior) was asked of a nonlinear operator."""


class NoPinvError(ValueError):
    """The operator has no pseudo-inverse initialiser (a nonlinear one without ``_pinv``, or too many unknowns)."""


def probe(run):
    """``run(dtype)`` without gradient, in float32 and, if that fails (a function with float64 weights), float64."""
    with torch.no_grad():
        try:
            return run(torch.float32)
        except RuntimeError:
            return run(torch.float64)


def as_shape(shape, name: str = "shape") -> tuple[int, ...]:
    try:
        s = tuple(int(v) for v in shape)
    except TypeError as err:
        raise ValueError(f"{name} must be a tuple of positive ints, got {shape!r}") from err
    if not s or any(v < 1 for v in s):
        raise ValueError(f"{name} must be a non-empty tuple of positive ints, got {shape!r}")
    return s


class Operator:
    """Base class of measurement operators.

    A subclass defines:

    * ``_forward(x)``: ``[B, *shape] ->`` ``B * m`` values in any shape (reshaped to ``[B, m]``), differentiable;
    * ``_adjoint(v)``: ``[B, m] -> [B, *shape]``, for a linear operator (``is_linear = True``, the default);
    * optionally ``_pinv(y)`` (default: the Moore-Penrose inverse of the explicit matrix for linear operators with at
      most ``EXPLICIT_PINV_MAX_D`` unknowns; none for nonlinear ones), ``_measurement_size(shape)`` (default: the
      size of one ``_forward`` of zeros) and ``_validate_shape(shape)`` (raise ValueError for a shape it cannot act
      on).

    Attributes:
        shape: the sample shape ``x.shape[1:]`` the operator acts on (None until bound).
        is_linear: whether ``forward`` is linear (then ``adjoint`` and ``matrix`` exist).
        dps_scale: DPS step size ``s`` of the DPS configs for this task (None: no published value; DPS then takes
            its step rule, :func:`steerdiff.inverse.dps.dps_auto_scales`).
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
        """``m`` for samples of ``shape``: the size of one forward pass on zeros (cached per shape)."""
        cache = self.__dict__.setdefault("_m_cache", {})
        if shape not in cache:
            try:
                out = probe(lambda dtype: self._forward(torch.zeros(1, *shape, dtype=dtype)))
            except NotImplementedError:
                raise
            except Exception as err:
                raise TypeError(f"{type(self).__name__}: could not infer the number of measurements from _forward on "
                                f"zeros of shape [1, {', '.join(map(str, shape))}] ({type(err).__name__}: {err}); "
                                "define _measurement_size(self, shape) -> int") from err
            if not isinstance(out, Tensor) or out.numel() == 0:
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise ValueError(f"{type(self).__name__}._forward must map [B, *shape] to B * m values (m >= 1); on "
                                 f"[1, {', '.join(map(str, shape))}] it returned {got}")
            cache[shape] = out.numel()
        return cache[shape]

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
        if y.ndim != 2 or y.shape[1] != m or y.shape[0] == 0:
            raise ValueError(f"{name} must have shape [M, {m}] with M >= 1 (m = {m} measurements of {self!r}), got "
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
        out = self._forward(x)
        b = x.shape[0]
        if not isinstance(out, Tensor) or out.numel() != b * (self.m if self.shape is not None else out.numel() // b):
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            m = self.m if self.shape is not None else "m"
            raise ValueError(f"{self!r}: forward of x {tuple(x.shape)} returned {got}, expected {b} x {m} values "
                             f"([{b}, {m}] or any shape of that size)")
        if x.requires_grad and torch.is_grad_enabled() and not out.requires_grad:
            raise ValueError(f"{self!r}: forward is not differentiable (its output does not depend on x through torch "
                             "operations); DPS and the data term of DR/CR/HR need gradients through it")
        return out.reshape(b, -1)

    __call__ = forward

    def _require_linear(self, what: str) -> None:
        if not self.is_linear:
            raise NoAdjointError(f"{self!r} is nonlinear: it has no {what}; use a linear operator or a method that "
                                 "only needs forward()")

    def adjoint(self, v: Tensor) -> Tensor:
        """``A^T v``: ``[B, m] -> [B, *shape]`` (linear operators only)."""
        self._require_linear("adjoint")
        v = self.check_y(v, "v")
        return self._shaped(self._adjoint(v), v.shape[0], "adjoint")

    def pinv(self, y: Tensor) -> Tensor:
        """The initialiser ``A^+(y)``: ``[M, m] -> [M, *shape]``."""
        y = self.check_y(y)
        return self._shaped(self._pinv(y), y.shape[0], "pinv")

    def _shaped(self, out, b: int, what: str) -> Tensor:
        if not isinstance(out, Tensor) or out.numel() != b * self.d:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"{self!r}: {what} returned {got}, expected [{b}, {', '.join(map(str, self.shape))}]")
        return out.reshape(b, *self.shape)

    def matrix(self, dtype: torch.dtype = torch.float64) -> Tensor:
        """The explicit ``[m, d]`` matrix of a linear operator (row ``j`` is ``A^T e_j``)."""
        self._require_linear("matrix")
        return self.adjoint(torch.eye(self.m, dtype=dtype)).reshape(self.m, self.d)

    # --- defaults for subclasses ---------------------------------------------------------------------------------
    def _forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define _forward(self, x) -> [B, m]")

    def _adjoint(self, v: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} is linear (is_linear = True) but defines no "
                                  "_adjoint(self, v) -> [B, *shape]; define it, or set is_linear = False")

    def _pinv(self, y: Tensor) -> Tensor:
        """Moore-Penrose ``A^+ y`` from the explicit matrix (linear operators with at most ``EXPLICIT_PINV_MAX_D``
        unknowns; the matrix's pseudo-inverse is computed once per dtype)."""
        if not self.is_linear:
            raise NoPinvError(f"{self!r} is nonlinear and defines no _pinv: it has no pseudo-inverse initialiser; pass "
                              "init='zeros' or an init tensor, or use method='dps'")
        if self.d > EXPLICIT_PINV_MAX_D:
            raise NoPinvError(f"{self!r} has {self.d} unknowns, more than the {EXPLICIT_PINV_MAX_D} of an explicit "
                              "pseudo-inverse; define _pinv, or pass init='adjoint' or init='zeros'")
        cache = self.__dict__.setdefault("_mp_cache", {})
        key = (self.shape, y.dtype, y.device)
        if key not in cache:
            cache[key] = torch.linalg.pinv(self.matrix(torch.float64)).to(y)
        return y @ cache[key].T

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape})"
