"""The guidance hook: conditional and null predictions from one doubled batch (docs/methods/conventions.md,
"Guidance hook"; the guiders' shared conventions are in docs/methods/guidance.md, "Conventions shared by every
guider").

Two kinds of guidance object plug into :func:`steerdiff.sample`:

* a *combiner*, any callable ``combine(d_cond, d_uncond, x, sigma) -> D`` - the sampler evaluates the
  conditional and the all-null condition as one doubled batch and hands both predictions over;
* a *guider*, an object with a method ``guide(denoiser, x, sigma, cond) -> D`` that builds its own stacked batch
  (for rules needing more than two predictions, or skipping the null branch).

Either may have a ``reset()`` method; samplers call it at the start of every trajectory (stateful guiders such as
APG's momentum rely on it). A guider with ``set_schedule(sigmas)`` is handed the trajectory's schedule first (for
``start``/``stop`` windows given as fractions of the schedule). A guider whose ``guide`` takes a ``step`` keyword is
told which sampler step each evaluation belongs to: a sampler with several evaluations per step (Heun) calls it
more than once with the same ``step``, so per-step state (APG's momentum) advances once per step, whatever the
sampler.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from .denoiser import (
    NULL,
    Denoiser,
    _version,
    cat_conds,
    is_structured_cond,
    null_cond_like,
    tag_host_level,
    tagged_level,
)

Combiner = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def cond_and_null(denoiser: Denoiser, x: Tensor, sigma: Tensor, cond) -> tuple[Tensor, Tensor]:
    """``(D(x, sigma, cond), D(x, sigma, null))`` from one call on a doubled batch (integer labels, or a structured
    condition stacked with its null counterpart)."""
    return _doubled_call(denoiser, x, sigma, doubled_cond(cond))


def _doubled_call(denoiser: Denoiser, x: Tensor, sigma: Tensor, doubled) -> tuple[Tensor, Tensor]:
    """:func:`cond_and_null` with the doubled condition given (``doubled_cond(cond)``)."""
    sigma2 = torch.cat([sigma, sigma])
    level = tagged_level(sigma)
    if level is not None:  # the doubled batch keeps the samplers' host level (no device read downstream)
        tag_host_level(sigma2, level)
    out = denoiser(torch.cat([x, x]), sigma2, doubled)
    if out.shape[0] != 2 * x.shape[0]:
        raise ValueError(f"denoiser returned {out.shape[0]} rows for a doubled batch of {2 * x.shape[0]}")
    d_cond, d_null = out.chunk(2)  # the two halves as views, in one op
    return d_cond, d_null


_LAST_DOUBLED: list = [None]  # (weakref to a label tensor, its version, the doubled labels, their version)


def doubled_cond(cond):
    """``cat([cond, null_cond_like(cond)])``: the condition of a doubled guidance batch (conditional rows, then null).

    For integer labels the result is kept while ``cond`` is the same, unchanged tensor (a guided trajectory hands
    the same labels at every step): the same doubled tensor then comes back each step, with no per-step copy, and a
    denoiser that recognises its condition by identity (:class:`StructuredRows`) skips comparing its values.
    Changed in place (either of the two), the tensors are rebuilt.
    """
    if not isinstance(cond, Tensor):
        return cat_conds([cond, null_cond_like(cond)])
    last = _LAST_DOUBLED[0]
    if last is not None and last[0]() is cond and last[1] == _version(cond) and last[3] == _version(last[2]):
        return last[2]
    doubled = cat_conds([cond, null_cond_like(cond)])
    _LAST_DOUBLED[0] = (weakref.ref(cond), _version(cond), doubled, _version(doubled))
    return doubled


def _cond_version(cond) -> int | None:
    """The version counter of a label tensor (None for a structured condition, whose tensors are fixed)."""
    return _version(cond) if isinstance(cond, Tensor) else None


class GuidedDenoiser:
    """A denoiser ``x, sigma -> D_guided`` for a fixed condition, applying a combiner or a guider."""

    def __init__(self, denoiser: Denoiser, guidance: object, cond: Tensor | None):
        if cond is None:
            raise ValueError("guidance needs a condition: pass cond= (a [B] or [B, m] integer tensor, or a "
                             "pipeline's structured condition)")
        if not (callable(guidance) or hasattr(guidance, "guide")):
            raise TypeError(
                "guidance must be a combiner f(d_cond, d_uncond, x, sigma) or an object with a guide() method, "
                f"got {type(guidance).__name__}"
            )
        self.denoiser = denoiser
        self.guidance = guidance
        self.cond = cond
        guide = getattr(guidance, "guide", None)
        self._takes_step = guide is not None and _accepts_keyword(guide, "step")
        self._rows = None  # the StructuredRows of the last structured condition (its row selections are cached)
        self._labels, self._labels_version = None, None  # its row labels 0..B-1
        self._plan = None  # the guider's direct combiner for this trajectory (begin), taken after the first call
        # (combiner, rows, the doubled condition, versions of cond and doubled, uses sigma, lerp weight or None)
        self._direct = None

    def begin(self, sigmas) -> None:
        """Start a trajectory over ``sigmas``: hand the schedule to the guider, then reset its state.

        A guider whose calls all reduce to one combiner of a doubled batch (``direct_combiner()``, e.g.
        :meth:`steerdiff.guidance.CFG.direct_combiner`) is called through it from the trajectory's second call on,
        with the doubled condition built once: the same predictions and the same arithmetic as its ``guide``,
        without its per-call checks and dispatch (the first call ran them). Only calls with this object's own
        condition, unchanged, and the first call's batch size take that path. A direct combiner with the attribute
        ``uses_sigma = False`` (one that reads neither ``x`` nor ``sigma``, such as CFG's ``lerp``) may be handed
        ``sigma=None`` there: :class:`steerdiff.core.sampling.SampleModel` then makes no ``[B]`` sigma batch for it.
        One with the attribute ``lerp_weight`` (a float ``w``; CFG's) is ``torch.lerp(d_null, d_cond, w)`` and
        nothing else: :class:`~steerdiff.core.sampling.SampleModel` then calls that ``lerp`` itself.
        """
        set_schedule = getattr(self.guidance, "set_schedule", None)
        if set_schedule is not None:
            set_schedule(sigmas)
        self.reset()
        direct = getattr(self.guidance, "direct_combiner", None)
        self._plan = direct() if callable(direct) and hasattr(self.guidance, "guide") else None
        self._direct = None

    def reset(self) -> None:
        reset = getattr(self.guidance, "reset", None)
        if reset is not None:
            reset()

    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None, step: int | None = None) -> Tensor:
        direct = self._direct
        if direct is not None and cond is None and x.shape[0] == direct[1] and (
                direct[3] is None or (_version(self.cond) == direct[3] and _version(direct[2]) == direct[4])):
            d_cond, d_null = _doubled_call(self.denoiser, x, sigma, direct[2])
            return direct[0](d_cond, d_null, x, sigma, step)
        if self._plan is not None and cond is None:  # the trajectory's first call: guide() and its checks, once
            out = self._guided(x, sigma, self.cond, step)
            doubled = doubled_cond(self.cond)
            self._direct = (self._plan, x.shape[0], doubled, _cond_version(self.cond), _cond_version(doubled),
                            getattr(self._plan, "uses_sigma", True) is not False,
                            getattr(self._plan, "lerp_weight", None))
            self._plan = None
            return out
        return self._guided(x, sigma, self.cond if cond is None else cond, step)

    def _guided(self, x: Tensor, sigma: Tensor, cond, step: int | None) -> Tensor:
        guide = getattr(self.guidance, "guide", None)
        if guide is not None:
            if is_structured_cond(cond):
                # Guiders speak integer labels: hand them row labels 0..B-1 and a denoiser that maps labels (and
                # their nulls, -1) back to rows of the structured condition, so every guider works unchanged.
                if self._rows is None or self._rows.cond is not cond:  # one row mapping per condition
                    self._rows = StructuredRows(self.denoiser, cond)
                    self._labels = None
                labels = self._labels  # one label tensor per condition and device (same object every step)
                if labels is None or labels.device != x.device or _version(labels) != self._labels_version:
                    labels = self._labels = torch.arange(cond.batch_size, device=x.device)
                    self._labels_version = _version(labels)
                denoiser = self._rows
                if self._takes_step:
                    return guide(denoiser, x, sigma, labels, step=step)
                return guide(denoiser, x, sigma, labels)
            if self._takes_step:
                return guide(self.denoiser, x, sigma, cond, step=step)
            return guide(self.denoiser, x, sigma, cond)
        d_cond, d_uncond = cond_and_null(self.denoiser, x, sigma, cond)
        return self.guidance(d_cond, d_uncond, x, sigma)


class StructuredRows:
    """A denoiser over integer row labels of a fixed structured condition ``cond`` with ``B`` rows.

    Label ``i >= 0`` selects row ``i`` of ``cond``; ``-1`` (null) at batch position ``j`` selects row ``j mod B`` of
    its null counterpart. Guiders stack their batches from ``x`` by concatenation or tiling (``torch.cat([x, x])``,
    ``x.repeat(k, ...)``), so position ``j`` holds sample ``j mod B``: a per-sample negative prompt stays with its
    sample. Model attributes (``has_null``, ``sample_shape``, ...) are forwarded. This is the one row mapping of
    the package: :class:`GuidedDenoiser` hands it to guiders, and :class:`steerdiff.pipelines.RowDenoiser` is it
    with label checks, for methods that carry integer conditions (docs/methods/pipelines.md, "Text conditions" and
    "Methods on a pipeline").

    Args:
        denoiser: ``D(x, sigma, cond)`` taking the structured condition.
        cond: the structured condition (``is_structured_cond``, e.g. a :class:`~steerdiff.pipelines.TextCond`).
        default_row: the row evaluated for every sample when a caller passes ``cond=None`` (default: the null of
            every row).
        whole_copies: refuse batches that are not whole copies of the ``B`` samples (what a guider builds); False
            for callers whose labels name rows directly (particles, chains).
    """

    def __init__(self, denoiser: Denoiser, cond, default_row: int | None = None, whole_copies: bool = True):
        self.denoiser = denoiser
        self.cond = cond
        self.default_row = default_row
        self.whole_copies = whole_copies
        self._both = None  # cat([cond, null]): rows 0..B-1 the condition, B..2B-1 the null
        self._last = None  # (labels, the condition of their rows): a guider asks for the same labels every step

    def rows(self, labels: Tensor) -> Tensor:
        """The rows of ``cat([cond, null])`` that ``labels [n]`` select (``-1`` at position ``j``: ``B + j mod B``)."""
        b = self.cond.batch_size
        position = torch.arange(labels.shape[0], device=labels.device) % b
        return torch.where(labels == NULL, b + position, labels.long())

    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        b, n = self.cond.batch_size, x.shape[0]
        if self.whole_copies and n % b:
            raise ValueError(f"a guider evaluated {n} rows for a structured condition of {b} rows; structured "
                             "conditions need batches stacked from whole copies of the B samples")
        if cond is None:
            fill = NULL if self.default_row is None else self.default_row
            cond = torch.full((n,), fill, dtype=torch.long, device=x.device)
        if not isinstance(cond, Tensor) or cond.shape != (n,):
            raise ValueError(f"expected row labels [{n}] from the guider, got {type(cond).__name__}")
        if self._both is None:
            self._both = cat_conds([self.cond, null_cond_like(self.cond)])
        last = self._last
        if last is not None and last[2] is cond and last[3] == _version(cond):
            # The same label tensor as the last call, unchanged (a guider's doubled labels: doubled_cond): its rows
            # are the last call's, with no comparison of values (a host read per step on an accelerator).
            return self.denoiser(x, sigma, last[1])
        if cond.device.type != "cpu" and self._last is not None:
            # On an accelerator comparing the labels with the last call's is a host read per step: gather the rows
            # on the device instead (the labels were checked at the trajectory's first call).
            gather = getattr(self._both, "gather", None)
            if gather is not None:
                return self.denoiser(x, sigma, gather(self.rows(cond)))
        if last is not None and last[0].shape == cond.shape and last[0].dtype == cond.dtype \
                and last[0].device == cond.device and torch.equal(last[0], cond):
            selected = last[1]  # the same object every step: no copy, and its device check is remembered
        else:
            selected = self._both.index(self.rows(cond))
            self._last = (cond.clone(), selected, cond, _version(cond))
        return self.denoiser(x, sigma, selected)

    def __getattr__(self, name: str):
        if name in ("denoiser", "cond", "default_row", "whole_copies", "_both", "_last"):
            raise AttributeError(name)
        return getattr(self.denoiser, name)


_StructuredRows = StructuredRows  # the former private name


def _accepts_keyword(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
