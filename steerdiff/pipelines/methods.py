"""Every method on a pipeline: rewards and measurement operators on decoded images, text conditions as row labels
(docs/methods/pipelines.md, "Methods on a pipeline").

The alignment samplers (:mod:`steerdiff.align`) and the inverse solvers (:mod:`steerdiff.inverse`) take integer
conditions, which they repeat and reindex with their particles and chains. :func:`bind` turns a pipeline's
structured condition (a :class:`TextCond` of ``B`` prompts) into row labels ``0..B-1`` and a latent denoiser that
maps each label back to its prompt's row, so those methods run on a pipeline unchanged (this layer imports none of
them: the objects here are plain callables they accept). :func:`on_images` turns a
pixel-space reward ``r(images) -> [B]`` into the latent reward ``r(decode(z))``, differentiable through the VAE
decoder; :class:`DecodedOperator` does the same for a pixel-space measurement operator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.guided import StructuredRows
from .conditions import TextCond

NULL = -1


class RowDenoiser(StructuredRows):
    """The latent denoiser over integer row labels of a fixed :class:`TextCond` ``cond`` of ``B`` rows.

    Label ``i >= 0`` evaluates row ``i`` of ``cond``; ``-1`` (the null) at batch position ``j`` row ``j mod B`` of
    its null (the negative or empty prompt): core's row mapping (:class:`steerdiff.core.guided.StructuredRows`, the
    one guiders get), with the labels checked, since methods pass them directly. ``cond=None`` is the null of every
    row, or row ``default_row`` for every sample when given (for methods that call the denoiser without a
    condition, e.g. :func:`steerdiff.align.online_das`). Other attributes (``sigma_range``, ...) are the wrapped
    denoiser's; ``sample_shape`` is the latent shape.
    """

    def __init__(self, denoiser: Callable, cond: TextCond, sample_shape: tuple[int, ...],
                 default_row: int | None = None):
        if not isinstance(cond, TextCond):
            raise TypeError(f"cond must be a TextCond (Pipeline.encode), got {type(cond).__name__}")
        if default_row is not None and (isinstance(default_row, bool) or not isinstance(default_row, int)
                                        or not 0 <= default_row < cond.batch_size):
            raise ValueError(f"default_row must be None or a row index in [0, {cond.batch_size}), got "
                             f"{default_row!r}")
        super().__init__(denoiser, cond, default_row=default_row, whole_copies=False)
        self.sample_shape = tuple(sample_shape)
        self._both = TextCond.cat([cond, cond.null_like()])

    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        if cond is not None:
            b, n = self.cond.batch_size, x.shape[0]
            if not isinstance(cond, Tensor) or cond.shape != (n,) or cond.is_floating_point():
                got = tuple(cond.shape) if isinstance(cond, Tensor) else type(cond).__name__
                raise ValueError(f"cond must be integer row labels [{n}] (0..{b - 1}, -1 = null), got {got}")
            if ((cond < NULL) | (cond >= b)).any():
                raise ValueError(f"cond row labels must lie in -1..{b - 1} ({b} prompts), got "
                                 f"{cond.unique().tolist()}")
        return super().__call__(x, sigma, cond)

    def __getattr__(self, name: str) -> Any:
        if name == "sample_shape":
            raise AttributeError(name)
        return super().__getattr__(name)


def bind(pipeline, cond: TextCond, height: int | None = None, width: int | None = None,
         default_row: int | None = None) -> tuple[RowDenoiser, Tensor]:
    """``(denoiser, labels)``: a :class:`RowDenoiser` over ``cond``'s rows and the labels ``arange(B)``, to pass as
    ``cond=labels`` to :mod:`steerdiff.align` and :func:`steerdiff.inverse.solve` (row ``g`` of ``labels`` is group
    / measurement ``g``'s prompt; they repeat it over particles and chains). ``default_row``: the row evaluated
    when a method passes no condition (default the null)."""
    denoiser = RowDenoiser(pipeline.denoiser, cond, pipeline.latent_shape(height, width), default_row)
    return denoiser, torch.arange(cond.batch_size)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class DecodedReward:
    """A latent reward ``r(decode(z)) -> [B]`` from a pixel-space reward ``r(images [B, 3, H, W] in [-1, 1])``.

    Differentiable rewards are evaluated through the VAE decoder with autograd (the chain rule
    ``grad_z r = J_decode(z)^T grad_x r``), so DAS, TDS and reward guidance twist in latent space. A reward must
    then depend on its input through torch operations: one that returns a tensor without a gradient when one is
    required (it detaches, converts to numpy, returns a constant) raises a ValueError naming it. A black-box reward
    (``differentiable=False``) is called under ``torch.no_grad`` and serves best-of-N, SIR and DAS with
    ``gradient=False`` / online DAS; asking it for a gradient raises the same error.
    """

    def __init__(self, pipeline, reward: Callable[[Tensor], Tensor], differentiable: bool = True,
                 height: int | None = None, width: int | None = None):
        if not callable(reward):
            raise TypeError(f"reward must be a callable r(images [B, 3, H, W] in [-1, 1]) -> [B], got "
                            f"{type(reward).__name__}")
        self.pipeline, self.reward, self.differentiable = pipeline, reward, bool(differentiable)
        self.height, self.width = height, width
        self.__name__ = f"on_images({_name(reward)})"

    def __call__(self, z: Tensor) -> Tensor:
        needs_grad = torch.is_grad_enabled() and isinstance(z, Tensor) and z.requires_grad
        if needs_grad and not self.differentiable:
            raise ValueError(f"reward {_name(self.reward)} is a black box (differentiable=False) but a gradient was "
                             "requested: use best_of_n / sir, or das(..., gradient=False) / online_das")
        with torch.set_grad_enabled(needs_grad):
            images = self.pipeline.decode(z, self.height, self.width, grad=needs_grad)
            r = self.reward(images)
        if not isinstance(r, Tensor):
            raise TypeError(f"reward {_name(self.reward)} must return a tensor [B], got {type(r).__name__}")
        if r.shape != (z.shape[0],):
            raise ValueError(f"reward {_name(self.reward)} must return shape [B] = [{z.shape[0]}] for images "
                             f"{tuple(images.shape)}, got {tuple(r.shape)}")
        if needs_grad and not r.requires_grad:
            raise ValueError(f"reward {_name(self.reward)} returned a value without a gradient for images that "
                             "require one (it detaches, leaves torch, or ignores its input): make it differentiable, "
                             "or pass differentiable=False and use a gradient-free method")
        return r if needs_grad else r.detach()

    def __repr__(self) -> str:
        return f"DecodedReward({_name(self.reward)}, differentiable={self.differentiable})"


def on_images(pipeline, reward: Callable[[Tensor], Tensor], *, differentiable: bool = True,
              height: int | None = None, width: int | None = None) -> DecodedReward:
    """The latent reward ``z -> reward(pipeline.decode(z))`` (:class:`DecodedReward`), for :mod:`steerdiff.align`
    on ``pipeline.denoiser`` (with :func:`bind` for a text condition)."""
    return DecodedReward(pipeline, reward, differentiable, height, width)


class DecodedOperator:
    """A pixel-space measurement operator through the VAE decoder: ``z -> A(decode(z))``, a forward function on
    latents ``[B, *latent_shape]`` returning ``[B, m]``, differentiable through the decoder.

    Pass it to :func:`steerdiff.inverse.solve` as the operator (a single forward function is a nonlinear operator
    there, bound to the latent shape of the :class:`RowDenoiser` from :func:`bind`). Nonlinear (the decoder is), it
    has no adjoint and no pseudo-inverse: DPS takes its step rule (the Jacobian's norm at the latent origin) unless
    given ``scale``; DR / CR / HR need ``init="zeros"`` or an init tensor, e.g. :meth:`init` (the VAE encoder's
    latents of the pixel operator's pseudo-inverse), and refuse the default ``init="pinv"`` with a NoPinvError
    saying so.

    Args:
        pipeline: the :class:`~steerdiff.pipelines.Pipeline` whose VAE decodes.
        operator: the pixel-space operator on images ``[3, H, W]`` in [-1, 1] (a :mod:`steerdiff.inverse` operator,
            bound here to the image shape when it has none, or a function ``images -> [B, m]``).
        height, width: the image size (default the pipeline's).
    """

    def __init__(self, pipeline, operator, height: int | None = None, width: int | None = None):
        if not callable(operator):
            raise TypeError(f"operator must be a pixel-space operator or function images [B, 3, H, W] -> [B, m], got "
                            f"{type(operator).__name__}")
        h, w = pipeline._size(height, width)
        if getattr(operator, "shape", 0) is None and callable(getattr(operator, "bind", None)):
            operator = operator.bind((3, h, w))
        self.pipeline, self.pixel, self.height, self.width = pipeline, operator, h, w
        self.__name__ = f"decoded({_name(operator)})"

    def __call__(self, z: Tensor) -> Tensor:
        grad = torch.is_grad_enabled() and z.requires_grad
        images = self.pipeline.decode(z, self.height, self.width, grad=grad)
        return self.pixel(images).reshape(z.shape[0], -1)

    def init(self, y: Tensor) -> Tensor:
        """Latents ``encode_images(A^+ y)`` ``[M, *latent_shape]``: a DR / CR / HR starting point (``init=``) from
        measurements ``y [M, m]``, for a pixel operator with ``pinv``."""
        pinv = getattr(self.pixel, "pinv", None)
        if pinv is None:
            raise ValueError(f"the pixel operator {_name(self.pixel)} has no pinv: pass init='zeros' to DR/CR/HR")
        x = pinv(y).reshape(y.shape[0], 3, self.height, self.width).clamp(-1, 1)
        return self.pipeline.encode_images(x.to(torch.float32)).to(y.dtype)

    def __repr__(self) -> str:
        return f"DecodedOperator({self.pixel!r} on the {self.pipeline.family} VAE decoder)"


def through_decoder(pipeline, operator, height: int | None = None, width: int | None = None) -> DecodedOperator:
    """The latent forward ``z -> A(decode(z))`` (:class:`DecodedOperator`) for :func:`steerdiff.inverse.solve`."""
    return DecodedOperator(pipeline, operator, height, width)
