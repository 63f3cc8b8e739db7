"""Named inverse tasks: a registry of functions ``shape -> Operator`` (``steerdiff restore --task``, the protocols).

A task names a measurement operator built for a sample shape; the shipped ones are the 8x8 tasks of
docs/methods/inverse.md ("Operators", the paragraph on named tasks): a centred hole and a random 50 % mask
(inpainting as in the experiments of Dou et al., "Hybrid Regularization Improves Diffusion-based Inverse Problem
Solving", ICLR 2025, code ``Inpainting2``), 2x average-pool super-resolution (their ``SuperResolution``), a Gaussian
blur k = 5, std 1, and the nonlinear HDR map ``clip(2x, -1, 1)`` of RED-diff (Mardani et al., "A Variational
Perspective on Solving Inverse Problems with Diffusion Models", ICLR 2024). A new task is one decorated function,
offered by ``steerdiff restore --task`` at once::

    from steerdiff.inverse import Downsample, register_task

    @register_task("sr4")
    def sr4(shape):
        return Downsample(4, shape)

    task_operator("sr4", (1, 8, 8))   # == Downsample(4, (1, 8, 8))
"""

from __future__ import annotations

from collections.abc import Callable

from ..io.plugins import Registry
from .base import Operator, as_shape
from .operators import HDR, Downsample, GaussBlur, Inpaint

__all__ = ["TASKS", "register_task", "task_operator"]

TASKS: Registry[Callable[[tuple[int, ...]], Operator]] = Registry("inverse task", argument="task")


def register_task(name: str, aliases: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(shape) -> Operator`` as the inverse task ``name`` (and ``aliases``)."""
    return TASKS.register(name, aliases)


def task_operator(task: str, shape=(1, 8, 8)) -> Operator:
    """The operator of the named task, bound to the sample shape ``shape`` (default the 8x8 digits' ``(1, 8, 8)``).

    Raises:
        ValueError: an unknown task (the message lists the registered ones), or a bad shape.
        TypeError: a task function that does not return an :class:`~steerdiff.inverse.Operator`.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS.names())}")
    op = TASKS.get(task)(as_shape(shape))
    if not isinstance(op, Operator):
        raise TypeError(f"inverse task {task!r} returned {type(op).__name__}, not a steerdiff.inverse Operator")
    return op


@register_task("inpaint-center")
def inpaint_center(shape: tuple[int, ...]) -> Operator:
    """A centred square hole of half the image's width (4x4 on 8x8 images)."""
    return Inpaint.center(shape, hole=max(1, shape[-1] // 2))


@register_task("inpaint-random")
def inpaint_random(shape: tuple[int, ...]) -> Operator:
    """A random mask keeping 50 % of the pixels (seed 0, so the same mask every run)."""
    return Inpaint.random(shape, keep=0.5, seed=0)


@register_task("sr2")
def sr2(shape: tuple[int, ...]) -> Operator:
    """2x super-resolution: means over non-overlapping 2x2 blocks."""
    return Downsample(2, shape)


@register_task("deblur")
def deblur(shape: tuple[int, ...]) -> Operator:
    """Gaussian deblurring: the normalised 5x5 kernel of std 1, zero "same" padding."""
    return GaussBlur(5, 1.0, shape)


@register_task("hdr")
def hdr(shape: tuple[int, ...]) -> Operator:
    """High dynamic range: ``clip(2x, -1, 1)`` (nonlinear)."""
    return HDR(shape)
