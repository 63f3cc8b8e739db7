"""The quantizer registry: every method :func:`steerdiff.quant.quantize` runs is one registered entry
(docs/methods/svdquant.md, "Baselines" and "Adding a quantizer"): SVDQuant (Li et al., ICLR 2025, "SVDQuant:
Absorbing Outliers by Low-Rank Components for 4-Bit Diffusion Models", its method section) and its baselines, and
any method a user registers.

A quantizer is a function ``run(job: QuantJob) -> None`` that replaces the layers of ``job.groups`` in
``job.root`` (with :meth:`QuantJob.replace`), registered where it is defined::

    @register_quantizer("w8a8", options=())
    def w8a8(job):
        for path in job.paths():
            job.replace(path, W8A8Layer.from_float(job.layer(path)))

``quantize`` does everything around it: the option checks, the copy, the layer mapping (:func:`select_groups`),
the calibration inputs (for ``calibrated`` quantizers: the floating-point model's own inputs at every group's
layers, :attr:`QuantJob.inputs`) and the record that :func:`steerdiff.quant.save` writes. ``options`` names the
options of ``quantize`` the method reads (``rank``, ``fmt``, ``alpha``, ``num_grids``, ...): ``rank`` is checked
against every layer before calibration, and ``fmt`` is recorded, only for methods that take them. The CLI's
``steerdiff quantize --method`` lists the registered names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ..io.plugins import Registry
from .mapping import Group, set_module

OPTIONS = ("rank", "fmt", "alpha", "num_grids", "num_iters", "early_stop", "shift", "max_tokens", "svd",
           "search", "factor_dtype")
"""The method options of :func:`steerdiff.quant.quantize` a quantizer may read from :attr:`QuantJob.options`."""


@dataclass(frozen=True)
class Quantizer:
    """A registered quantization method.

    Attributes:
        name: its name (``quantize(model, method=name)``).
        fn: ``fn(job: QuantJob) -> None``, replacing the layers of ``job.groups``.
        calibrated: whether it needs calibration inputs (then ``quantize`` gathers them into ``job.inputs``).
        options: the options of ``quantize`` it reads (a subset of :data:`OPTIONS`).
        summary: one line for listings (the function's first docstring line by default).
    """

    name: str
    fn: Callable[[QuantJob], None]
    calibrated: bool = True
    options: tuple[str, ...] = ()
    summary: str = ""


QUANTIZERS: Registry[Quantizer] = Registry("quantizer", argument="method")
"""The registered quantizers, name -> :class:`Quantizer` (:func:`register_quantizer`)."""


def register_quantizer(name: str, *, calibrated: bool = True, options: tuple[str, ...] = (),
                       aliases: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(job: QuantJob) -> None`` as the quantizer ``name`` (returns ``fn`` unchanged).

    Args:
        name: the method name ``quantize(model, method=name)`` and ``steerdiff quantize --method`` take.
        calibrated: ``True`` when the method needs calibration inputs (``job.inputs``); ``False`` for
            weight-only or data-free methods (``calib`` is then ignored).
        options: the options of ``quantize`` it reads from ``job.options`` (see :data:`OPTIONS`).
        aliases: other names for it.

    Raises:
        ValueError: an unknown option name, or a different quantizer already registered as ``name``.
    """
    unknown = [o for o in options if o not in OPTIONS]
    if unknown:
        raise ValueError(f"register_quantizer({name!r}): unknown options {unknown}; a quantizer reads some of "
                         f"{list(OPTIONS)}")

    def decorate(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"register_quantizer({name!r}) decorates a function run(job), got {type(fn).__name__}")
        doc = (fn.__doc__ or "").strip().splitlines()
        QUANTIZERS.add(name, Quantizer(name, fn, bool(calibrated), tuple(options), doc[0] if doc else ""), aliases)
        return fn

    return decorate


@dataclass
class QuantJob:
    """What a quantizer works on, prepared by :func:`steerdiff.quant.quantize`.

    Attributes:
        method: the quantizer's name.
        root: the module being quantized (a copy of the model's root unless ``inplace``); replace its layers.
        fp_root: the original floating-point root (read weights and calibration from it, never write).
        groups: the layer groups to quantize (:class:`~steerdiff.quant.Group`: layers sharing one input).
        options: the method options of ``quantize`` (every name of :data:`OPTIONS`, with its value).
        inputs: for calibrated quantizers, the floating-point model's inputs at each group's first layer
            (``{path: tensor}``); None otherwise.
        progress: print one line per group.
        layers: the record of replaced layers, ``{path: spec}`` (filled by :meth:`replace`).
        report: per-group calibration results (dicts), for ``quant_info(model)["report"]``.
    """

    method: str
    root: nn.Module
    fp_root: nn.Module
    groups: list[Group]
    options: dict[str, Any]
    inputs: dict[str, Tensor] | None = None
    progress: bool = False
    layers: dict[str, dict] = field(default_factory=dict)
    report: list[dict] = field(default_factory=list)

    def paths(self) -> list[str]:
        """Every layer path of every group, in order."""
        return [p for g in self.groups for p in g.paths]

    def layer(self, path: str) -> nn.Module:
        """The floating-point layer at ``path`` (of :attr:`fp_root`)."""
        return self.fp_root.get_submodule(path)

    def replace(self, path: str, layer: nn.Module, spec: dict | None = None) -> None:
        """Put ``layer`` at ``path`` of :attr:`root` and record ``spec`` (default ``{"type": class name,
        **layer.spec}``; :func:`steerdiff.quant.save` rebuilds the layer from it)."""
        set_module(self.root, path, layer)
        self.layers[path] = spec if spec is not None else {"type": type(layer).__name__, **getattr(layer, "spec", {})}
