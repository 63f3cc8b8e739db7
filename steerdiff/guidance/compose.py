"""The Compose guider: logical composition of attribute values, AND / NOT by the product-of-marginals score rule, with
joint CFG as the baseline (Liu et al., "Compositional Visual Generation with Composable Diffusion Models", ECCV 2022,
Sec. 4, the product-of-marginals rule; Gaudi, Sreekumar, Boddeti, "CoInD: Enabling Logical Compositions in Diffusion
Models", ICLR 2025, the AND / NOT sampling rules of its official code, for models trained with
:mod:`steerdiff.guidance.coind_objective`). See docs/methods/coind.md, "Product-of-marginals composition" and
"Expressions and the Compose guider".

Rule, terms ``q_k`` with weights ``w_k`` (negative = NOT), evaluated as ONE stacked batch ``[q_1, .., q_n, null]``::

    D_comp = D_u + sum_k scale * w_k (D_{q_k} - D_u)

where ``D_{q_k}`` conditions on one attribute value with every other slot null. Scale ``w = 1`` with unit weights is
the exact product of marginals; AND over ``m`` terms pushes ``m`` times, so its scale is not comparable with a
joint-CFG scale.

Rooms: the expression language is :mod:`.compose_expr`, the composition over a pipeline's text prompts
:mod:`.compose_prompts` (:meth:`Compose.from_prompts`), the exact oracle :mod:`.compose_oracle` and the loader of
models that name their attributes :mod:`.composable`. ``Compose`` is a registered guider (``"compose"``), built as
the others are: ``build_guider("compose", scale, expr=..., attributes=...)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..core.denoiser import NULL, Denoiser
from . import compose_expr as _expr  # a module alias: its names are not attributes of this module (see __getattr__)
from .base import Guider, Scale, check_x_sigma, scale_config, scale_is, scale_rows
from .registry import register_guider

MODES = ("and", "joint")


@register_guider("compose")
class Compose(Guider):
    """Guider for a logical expression over attribute values, used with :func:`steerdiff.sample`.

    ``mode="and"``: ``D_u + scale * sum_k w_k (D_{q_k} - D_u)`` over the expression's terms (product of
    marginals); ``mode="joint"``: joint CFG ``D_u + scale (D_y - D_u)`` with ``y`` the joint label of the positive
    literals (the baseline; no negation). Every evaluation is one stacked batch of ``1 + n_terms`` rows per sample
    (the null row is skipped when its coefficient ``1 - sum scale*w_k`` is 0).

    Pass ``cond=compose.cond(n)`` to ``sd.sample`` (the joint label of the positive literals; an all-null
    condition is accepted too); the expression, not ``cond``, defines the query.

    Built as every registered guider is, ``Compose(scale, expr=..., attributes=...)``
    (``build_guider("compose", scale, expr=..., attributes=...)``); the expression-first order
    ``Compose(expr, scale, attributes, mode)`` of earlier releases is accepted too (a scale is never a string).

    Args:
        scale: guidance weight ``w >= 0`` multiplying every term weight; a 1-D tensor or list ``[B]`` gives one
            ``w`` per sample (then ``terms`` holds per-sample weights ``[B]`` and ``null_coef`` is a tensor ``[B]``;
            ``query_terms`` gives the query's own weights either way).
        expr: expression string (:mod:`steerdiff.guidance.compose_expr`) over ``attributes``.
        attributes: ``{name: [value names] or K}`` in slot order; the model's own ``attributes`` are not available
            at construction, so use :meth:`for_model` for models that carry them.
        mode: ``"and"`` (composition) or ``"joint"`` (joint CFG baseline).

    Raises:
        ValueError: bad expression (message lists the valid names), OR for a score rule, bad mode or scale.
    """

    name = "compose"

    def __init__(
        self,
        scale: float | Tensor | Sequence[float] = 1.0,
        expr: str = "",
        attributes: Mapping[str, Sequence[str] | int] | None = None,
        mode: str = "and",
    ):
        if isinstance(scale, str):  # the expression-first order of earlier releases: Compose(expr, scale, attributes)
            scale, expr = (1.0 if isinstance(expr, str) and expr == "" else expr), scale  # type: ignore[assignment]
        if attributes is None:
            raise ValueError(
                "attributes: pass {name: [values]} in slot order, or build with Compose.for_model(model, ...)"
            )
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.attributes = _expr.normalize_attributes(attributes)
        super().__init__(scale)
        self.expr, self.mode = expr, mode
        self.tree = _expr.parse(expr, self.attributes)
        m = len(self.attributes)
        terms = _expr.score_terms(self.tree, m)
        joint = [NULL] * m
        for label, w in terms:
            if w > 0:
                slot = next(i for i, v in enumerate(label) if v != NULL)
                joint[slot] = label[slot]
        self.joint_label = tuple(joint)
        if mode == "joint":
            if any(w < 0 for _, w in terms) or any(w != 1.0 for _, w in terms):
                raise ValueError("mode='joint' (joint CFG) takes an AND of plain attribute values: no '!', no weights")
            terms = [(self.joint_label, 1.0)]
        query: dict[tuple[int, ...], float] = {}
        merged: dict[tuple[int, ...], Scale] = {}
        for label, w in terms:
            query[label] = query.get(label, 0.0) + w
            merged[label] = merged.get(label, 0.0) + self.scale * w  # float, or [B] per-sample weights
        self.query_terms = [(lab, w) for lab, w in query.items() if w != 0.0]
        self.terms = [(lab, w) for lab, w in merged.items() if not scale_is(w, 0.0)]
        self.null_coef = 1.0 - sum(w for _, w in self.terms)

    @classmethod
    def for_model(cls, model, expr: str, scale: float = 1.0, mode: str = "and") -> Compose:
        """Build with ``model.attributes`` (set by :func:`~steerdiff.guidance.composable.load_composable`) and check
        the model has nulls."""
        attrs = getattr(model, "attributes", None)
        if attrs is None:
            k = tuple(getattr(model, "num_classes", ()) or ())
            if not k:
                raise ValueError("model has neither attributes nor num_classes; pass attributes= to Compose")
            attrs = {f"a{i}": ki for i, ki in enumerate(k)}
        out = cls(scale, expr, attrs, mode)
        out.check_model(model)
        return out

    @classmethod
    def from_prompts(cls, pipeline, prompts: Mapping[str, float], scale: float | Tensor | Sequence[float] = 1.0,
                     negative_prompt: str | None = None) -> Compose:
        """Composition over text prompts on a pipeline: a :class:`~steerdiff.guidance.compose_prompts.PromptCompose`
        (see there for the arguments)."""
        from .compose_prompts import PromptCompose

        return PromptCompose(scale, pipeline=pipeline, prompts=prompts, negative_prompt=negative_prompt)

    @property
    def config(self) -> dict:
        return {"expr": self.expr, "scale": scale_config(self.scale),
                "attributes": {k: list(v) for k, v in self.attributes.items()}, "mode": self.mode}

    def __repr__(self) -> str:
        return f"Compose({self.expr!r}, scale={scale_config(self.scale)}, mode={self.mode!r})"

    @property
    def needs_null(self) -> bool:
        """Whether the null row is evaluated: its coefficient ``1 - sum scale*w_k`` is not 0 in every row."""
        return not scale_is(self.null_coef, 0.0)

    @property
    def rows_per_eval(self) -> int:
        """Denoiser rows per sample per evaluation (the NFE cost of one guided call)."""
        return len(self.terms) + self.needs_null

    def cond(self, n: int, device=None) -> Tensor:
        """The condition to pass to ``sd.sample``: ``n`` rows of the joint label of the positive literals."""
        return torch.tensor(self.joint_label, dtype=torch.long, device=device).expand(n, -1).clone()

    def check_model(self, denoiser) -> None:
        """Refuse models without null tokens and models whose slots do not match ``attributes``."""
        needs_null = self.needs_null or any(NULL in lab for lab, _ in self.terms)
        if needs_null and getattr(denoiser, "has_null", True) is False:
            raise ValueError(
                f"Compose({self.expr!r}) needs per-slot null tokens (D with some slots = -1), but the model declares "
                "has_null = False: it was trained without condition dropout; train it with p_null > 0 "
                "(e.g. configs/shapes_coind.json) to compose attributes"
            )
        k = getattr(denoiser, "num_classes", None)
        if k is not None:
            want = tuple(len(v) for v in self.attributes.values())
            if tuple(k) != want:
                raise ValueError(
                    f"the model's condition slots have {tuple(k)} values but attributes "
                    f"{list(self.attributes)} have {want}; pass the model's attributes"
                )

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor | None = None,
              step: int | None = None) -> Tensor:
        """``D_comp`` at ``(x, sigma)`` from one call on a stacked batch of ``rows_per_eval * B`` rows (stateless:
        ``step`` is accepted and ignored)."""
        check_x_sigma(x, sigma, "Compose")
        b, m = x.shape[0], len(self.attributes)
        if cond is not None:
            if not isinstance(cond, Tensor):
                raise ValueError(f"cond must be compose.cond(B), an integer tensor [B, {m}], got {type(cond).__name__}")
            c = cond[:, None] if cond.ndim == 1 else cond
            ok = c.shape == (b, m) and bool(((c == NULL).all(1) | (c == self.cond(1, c.device)).all(1)).all())
            if not ok:
                raise ValueError(
                    f"cond must be compose.cond(B) (rows {list(self.joint_label)}) or all-null with shape [B, {m}]; "
                    "the expression defines the query"
                )
        self.check_model(denoiser)
        null_coef = scale_rows(self.null_coef, x)  # checks a per-sample scale against the batch first
        labels = [lab for lab, _ in self.terms] + ([tuple([NULL] * m)] if self.needs_null else [])
        conds = torch.tensor(labels, dtype=torch.long, device=x.device).repeat_interleave(b, dim=0)
        return combine_terms(denoiser(_tile(x, len(labels)), sigma.repeat(len(labels)), conds), self.terms,
                             null_coef if self.needs_null else None, b)

    __call__ = guide


def _tile(x: Tensor, reps: int) -> Tensor:
    return x.repeat((reps,) + (1,) * (x.ndim - 1))


def combine_terms(out: Tensor, terms: list, null_coef: float | Tensor | None, b: int) -> Tensor:
    """``null_coef * D_u + sum_k w_k D_k`` from one stacked output ``[D_1; ..; D_n; D_u]`` of ``b`` rows each (no
    ``D_u`` part when ``null_coef`` is None): ``D_u + sum_k w_k (D_k - D_u)`` written as one affine combination."""
    parts = out.split(b, dim=0)
    acc = parts[-1] * null_coef if null_coef is not None else torch.zeros_like(parts[0])
    for (_, w), d in zip(terms, parts, strict=False):
        acc = acc + scale_rows(w, d) * d
    return acc


def __getattr__(name: str):
    # Names that lived in this module before it was split (issue 34): the expression language, the oracle and the
    # loader moved to their own modules; the old path re-exports them for one release, with a DeprecationWarning.
    moved = {"Lit": "compose_expr", "Not": "compose_expr", "And": "compose_expr", "Or": "compose_expr",
             "normalize_attributes": "compose_expr", "parse": "compose_expr", "satisfies": "compose_expr",
             "score_terms": "compose_expr", "compose_oracle": "compose_oracle", "load_composable": "composable",
             "ATTRIBUTES_FILE": "composable"}
    if name in moved:
        import importlib
        import warnings

        warnings.warn(f"steerdiff.guidance.compose.{name} is deprecated: import it from "
                      f"steerdiff.guidance.{moved[name]} (or steerdiff.guidance)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f"{__package__}.{moved[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
