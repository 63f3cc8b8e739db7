"""Logical composition of attribute values: AND / NOT by the product-of-marginals score rule, joint CFG as the
baseline, and the exact restricted-mixture oracle (which also gives OR).

Papers: Liu et al., "Compositional Visual Generation with Composable Diffusion Models" (ECCV 2022; the
product-of-marginals rule); Gaudi, Sreekumar, Boddeti, "CoInD: Enabling Logical Compositions in Diffusion Models"
(ICLR 2025; the AND / NOT sampling rules of its official code, for models trained with
:mod:`steerdiff.guidance.coind_objective`). See docs/methods/coind.md, "Product-of-marginals composition" and
"Expressions and the Compose guider".

Rule, terms ``q_k`` with weights ``w_k`` (negative = NOT), evaluated as ONE stacked batch
``[null, q_1, .., q_n]``::

    D_comp = D_u + sum_k scale * w_k (D_{q_k} - D_u)

where ``D_{q_k}`` conditions on one attribute value with every other slot null. Expressions::

    "shape=disk & colour=red"             AND (marginals composed; "joint" mode: one joint label, i.e. CFG)
    "shape=disk & !colour=red"            AND NOT  (weights +1, -1)
    "2*shape=disk & !colour={red,green}"  the NOT query of the CoInD code (+2w, -w, -w)
    "shape=disk | shape=plus"             OR: only for the exact oracle (no score rule exists)

``colour!=red`` is ``!colour=red``; values may be names or integer indices. Scale ``w = 1`` with unit weights is
the exact product of marginals; AND over ``m`` terms pushes ``m`` times, so its scale is not comparable with a
joint-CFG scale.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..core.denoiser import NULL, Denoiser
from .base import Scale, check_scale, check_x_sigma, scale_config, scale_is, scale_rows

ATTRIBUTES_FILE = "attributes.json"
_MODES = ("and", "joint")


# ------------------------------------------------------------------------------------------------- expressions
@dataclass(frozen=True)
class Lit:
    """``slot`` takes one of ``values`` (a set means OR over values); ``weight`` scales its score term."""

    slot: int
    values: tuple[int, ...]
    weight: float = 1.0


@dataclass(frozen=True)
class Not:
    node: object


@dataclass(frozen=True)
class And:
    nodes: tuple


@dataclass(frozen=True)
class Or:
    nodes: tuple


def normalize_attributes(attributes: Mapping[str, Sequence[str] | int]) -> dict[str, tuple[str, ...]]:
    """``{name: value names}``; an int ``K`` stands for values ``"0".."K-1"``."""
    if not isinstance(attributes, Mapping) or not attributes:
        raise ValueError(
            'attributes must be a non-empty mapping {name: [value names] or K}, e.g. '
            '{"shape": ["square", "disk"], "colour": 4}'
        )
    out = {}
    for name, vals in attributes.items():
        if isinstance(vals, int) and not isinstance(vals, bool):
            if vals < 1:
                raise ValueError(f"attributes[{name!r}]: a number of values must be >= 1, got {vals}")
            vals = [str(v) for v in range(vals)]
        # A string is a sequence too, but "abc" is one name, not the values "a", "b", "c".
        if isinstance(vals, (str, bytes)) or not isinstance(vals, Sequence):
            raise ValueError(f"attributes[{name!r}] must be a list of value names or a number of values K, got "
                             f"{type(vals).__name__} {vals!r}")
        vals = tuple(str(v) for v in vals)
        if not vals or len(set(vals)) != len(vals):
            raise ValueError(f"attributes[{name!r}] must list distinct value names, got {vals}")
        # An expression can only name what its tokenizer reads as one word.
        for word in (str(name), *vals):
            if not _WORD.fullmatch(word):
                raise ValueError(f"attributes: {word!r} cannot be written in an expression; attribute and value names "
                                 "are words of letters, digits and _ . + -")
        out[str(name)] = vals
    return out


_WORD = re.compile(r"[A-Za-z0-9_.+-]+")
_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?(?=\s*\*))|(?P<op>!=|[!&|()={},*])|(?P<word>[A-Za-z0-9_.+-]+))")


def _tokens(expr: str) -> list[str]:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"expr: unexpected character {expr[pos:].strip()[0]!r} at position {pos} in {expr!r}")
        out.append(m.group(m.lastgroup))
        pos = m.end()
    return out


class _Parser:
    """Recursive descent: ``or := and ('|' and)*``, ``and := unary ('&' unary)*``,
    ``unary := [NUM '*'] ('!' unary | '(' or ')' | NAME ('='|'!=') (VALUE | '{' VALUE (',' VALUE)* '}'))``."""

    def __init__(self, expr: str, attributes: dict[str, tuple[str, ...]]):
        self.expr, self.attrs, self.names = expr, attributes, list(attributes)
        self.toks, self.i = _tokens(expr), 0

    def fail(self, msg: str):
        valid = "; ".join(f"{n} in {{{', '.join(v)}}}" for n, v in self.attrs.items())
        raise ValueError(f"expr {self.expr!r}: {msg}. Valid attributes: {valid}")

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, what: str = "more") -> str:
        """The next token (``what`` describes it for the error when the expression ends)."""
        tok = self.peek()
        if tok is None:
            self.fail(f"expression ends early (expected {what})")
        self.i += 1
        return tok

    def expect(self, tok: str) -> None:
        got = self.take(repr(tok))
        if got != tok:
            self.fail(f"expected {tok!r}, got {got!r}")

    def word(self, what: str) -> str:
        got = self.take(what)
        if not _WORD.fullmatch(got):
            self.fail(f"expected {what}, got {got!r}")
        return got

    def parse(self):
        if not self.toks:
            self.fail("empty expression")
        node = self.disj()
        if self.peek() is not None:
            self.fail(f"unexpected {self.peek()!r} after a complete expression")
        return node

    def disj(self):
        nodes = [self.conj()]
        while self.peek() == "|":
            self.take()
            nodes.append(self.conj())
        return nodes[0] if len(nodes) == 1 else Or(tuple(nodes))

    def conj(self):
        nodes = [self.unary()]
        while self.peek() == "&":
            self.take()
            nodes.append(self.unary())
        return nodes[0] if len(nodes) == 1 else And(tuple(nodes))

    def unary(self, weight: float = 1.0):
        tok = self.peek()
        if tok is not None and re.fullmatch(r"\d+(?:\.\d*)?", tok) and self.i + 1 < len(self.toks) \
                and self.toks[self.i + 1] == "*":
            self.take(), self.expect("*")
            w = float(tok)
            if not math.isfinite(w) or w <= 0:
                self.fail(f"term weight must be a positive number, got {tok}")
            return self.unary(weight * w)
        if tok == "!":
            self.take()
            inner = self.unary()
            # "!!x" is x: double negation cancels, so it stays a literal the score rule can use.
            return _weighted(inner.node if isinstance(inner, Not) else Not(inner), weight)
        if tok == "(":
            self.take()
            node = self.disj()
            self.expect(")")
            return _weighted(node, weight)
        return self.literal(weight)

    def literal(self, weight: float):
        name = self.word("an attribute name")
        if name not in self.attrs:
            self.fail(f"unknown attribute {name!r}")
        op = self.take("'=' or '!='")
        if op not in ("=", "!="):
            self.fail(f"expected '=' or '!=' after {name!r}, got {op!r}")
        if self.peek() == "{":
            self.take()
            raw = [self.word("a value")]
            while self.peek() == ",":
                self.take()
                raw.append(self.word("a value"))
            self.expect("}")
        else:
            raw = [self.word("a value")]
        slot = self.names.index(name)
        values = tuple(sorted({self.value(name, v) for v in raw}))
        lit = Lit(slot, values, weight)
        return Not(lit) if op == "!=" else lit

    def value(self, name: str, raw: str) -> int:
        vals = self.attrs[name]
        if raw in vals:
            return vals.index(raw)
        if raw.isdigit() and int(raw) < len(vals):
            return int(raw)
        self.fail(f"unknown value {raw!r} for attribute {name!r} (valid: {', '.join(vals)})")


def _weighted(node, weight: float):
    if weight == 1.0:
        return node
    if isinstance(node, Lit):
        return Lit(node.slot, node.values, node.weight * weight)
    if isinstance(node, Not) and isinstance(node.node, Lit):
        return Not(_weighted(node.node, weight))
    raise ValueError("a term weight (N*...) applies to one attribute literal or its negation, not to a group")


def parse(expr: str, attributes: Mapping[str, Sequence[str] | int]):
    """Parse an expression over ``attributes`` into a tree of :class:`Lit`, :class:`Not`, :class:`And`,
    :class:`Or`.

    Raises:
        ValueError: empty or malformed expression, unknown attribute or value (the message lists the valid ones).
    """
    if not isinstance(expr, str):
        raise TypeError(f"expr must be a string such as 'shape=disk & !colour=red', got {type(expr).__name__}")
    return _Parser(expr, normalize_attributes(attributes)).parse()


def satisfies(node, labels: Tensor) -> Tensor:
    """Boolean ``[N]``: which label rows ``[N, m]`` make the expression true (the oracle's logic)."""
    if isinstance(node, Lit):
        return torch.isin(labels[:, node.slot], torch.tensor(node.values, device=labels.device))
    if isinstance(node, Not):
        return ~satisfies(node.node, labels)
    parts = [satisfies(n, labels) for n in node.nodes]
    out = parts[0]
    for p in parts[1:]:
        out = (out & p) if isinstance(node, And) else (out | p)
    return out


def score_terms(node, m: int) -> list[tuple[tuple[int, ...], float]]:
    """Terms ``(label with nulls, weight)`` of the score rule for an AND of (negated) values.

    A positive literal gives ``(slot=v, +w)``; ``!slot={v1, v2}`` gives ``(slot=v1, -w), (slot=v2, -w)``.

    Raises:
        ValueError: OR, a positive set of values, a negated group, two different values asked of one slot, or a
            value asked and negated.
    """
    lits = list(node.nodes) if isinstance(node, And) else [node]
    terms, positive, negative = [], {}, set()
    for lit in lits:
        neg = isinstance(lit, Not)
        base = lit.node if neg else lit
        if not isinstance(base, Lit):
            raise ValueError(
                "the score rule (product of marginals) composes an AND of attribute values and negated values only; "
                "OR, '|' and negated groups have no rule for a learned model (use compose_oracle on a mixture)"
            )
        if not neg and len(base.values) > 1:
            raise ValueError("'{...}' on a positive literal is an OR over values; it has no score rule")
        for v in base.values:
            if not neg:
                if positive.get(base.slot, v) != v:
                    raise ValueError(f"contradictory expression: slot {base.slot} asked to be two different values")
                positive[base.slot] = v
            else:
                negative.add((base.slot, v))
            label = [NULL] * m
            label[base.slot] = v
            terms.append((tuple(label), -base.weight if neg else base.weight))
    both = sorted((slot, v) for slot, v in positive.items() if (slot, v) in negative)
    if both:
        # Its terms would cancel and leave the unconditional model: no sample satisfies "x and not x".
        raise ValueError(f"contradictory expression: slot {both[0][0]} asked to be value {both[0][1]} and not to be it")
    return terms


# ------------------------------------------------------------------------------------------------- the guider
class Compose:
    """Guider for a logical expression over attribute values, used with :func:`steerdiff.sample`.

    ``mode="and"``: ``D_u + scale * sum_k w_k (D_{q_k} - D_u)`` over the expression's terms (product of
    marginals); ``mode="joint"``: joint CFG ``D_u + scale (D_y - D_u)`` with ``y`` the
    joint label of the positive literals (the baseline; no negation). Every evaluation is one stacked batch of
    ``1 + n_terms`` rows per sample (the null row is skipped when its coefficient ``1 - sum scale*w_k`` is 0).

    Pass ``cond=compose.cond(n)`` to ``sd.sample`` (the joint label of the positive literals; an all-null
    condition is accepted too); the expression, not ``cond``, defines the query.

    Args:
        expr: expression string (module docstring) over ``attributes``.
        scale: guidance weight ``w >= 0`` multiplying every term weight; a 1-D tensor or list ``[B]`` gives one
            ``w`` per sample (then ``terms`` holds per-sample weights ``[B]`` and ``null_coef`` is a tensor ``[B]``;
            ``query_terms`` gives the query's own weights either way).
        attributes: ``{name: [value names] or K}`` in slot order; default ``denoiser.attributes`` is not
            available at construction, so use :meth:`for_model` for models that carry it.
        mode: ``"and"`` (composition) or ``"joint"`` (joint CFG baseline).

    Raises:
        ValueError: bad expression (message lists the valid names), OR for a score rule, bad mode or scale.
    """

    name = "compose"
    prompt_conds = None  # from_prompts: the terms' structured conditions (one row per prompt) and the null row

    def __init__(
        self,
        expr: str,
        scale: float | Tensor | Sequence[float] = 1.0,
        attributes: Mapping[str, Sequence[str] | int] | None = None,
        mode: str = "and",
    ):
        if attributes is None:
            raise ValueError(
                "attributes: pass {name: [values]} in slot order, or build with Compose.for_model(model, ...)"
            )
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        self.attributes = normalize_attributes(attributes)
        self.expr, self.mode, self.scale = expr, mode, check_scale(scale, per_sample=True)
        self.tree = parse(expr, self.attributes)
        m = len(self.attributes)
        terms = score_terms(self.tree, m)
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
        """Build with ``model.attributes`` (set by :func:`load_composable`) and check the model has nulls."""
        attrs = getattr(model, "attributes", None)
        if attrs is None:
            k = tuple(getattr(model, "num_classes", ()) or ())
            if not k:
                raise ValueError("model has neither attributes nor num_classes; pass attributes= to Compose")
            attrs = {f"a{i}": ki for i, ki in enumerate(k)}
        out = cls(expr, scale, attrs, mode)
        out.check_model(model)
        return out

    @classmethod
    def from_prompts(cls, pipeline, prompts: Mapping[str, float], scale: float | Tensor | Sequence[float] = 1.0,
                     negative_prompt: str | None = None) -> Compose:
        """Composition over text prompts on a pipeline (``sd.pipelines``): terms ``q_k`` are prompts, so
        ``{"a red disk": 1.0, "a square": -1.0}`` is ``"a red disk" & !"a square"``, ``D_u + scale sum_k w_k
        (D_{q_k} - D_u)`` (Liu et al. 2022, "Compositional Visual Generation with Composable Diffusion Models",
        Sec. 4, conjunction and negation), evaluated as one stacked batch ``[q_1, .., q_n, null]``.

        Args:
            pipeline: an object with ``encode(prompts, negative_prompts) -> structured condition`` (a
                :class:`steerdiff.pipelines.Pipeline`); its condition's ``null`` is the unconditional term.
            prompts: ``{prompt: weight}`` (negative weight = NOT), at least one non-zero.
            scale: guidance weight ``w >= 0`` (or one per sample), as in :class:`Compose`.
            negative_prompt: the prompt of ``D_u`` (default the empty prompt).

        Pass ``cond=compose.cond(B)`` (a placeholder) to :func:`steerdiff.sample` with ``pipeline.denoiser``: the
        prompts are the query. The NFE per step is ``rows_per_eval`` (the non-zero terms, plus the null unless its
        coefficient is 0).
        """
        if not isinstance(prompts, Mapping) or not prompts or not all(isinstance(k, str) for k in prompts):
            raise ValueError(f"prompts must be a non-empty mapping {{prompt: weight}}, got {prompts!r}")
        weights = {}
        for text, w in prompts.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise ValueError(f"the weight of prompt {text!r} must be a finite number, got {w!r}")
            weights[text] = float(w)
        if all(w == 0.0 for w in weights.values()):
            raise ValueError("at least one prompt needs a non-zero weight")
        encode = getattr(pipeline, "encode", None)
        if not callable(encode):
            raise TypeError(f"pipeline must have encode(prompts, negative_prompts), got {type(pipeline).__name__}")
        texts = list(weights)
        conds = encode(texts, negative_prompt)
        out = cls.__new__(cls)
        out.attributes, out.mode = {}, "and"
        out.expr = " & ".join(("" if w > 0 else "!") + (f"{abs(w):g}*" if abs(w) != 1 else "") + json.dumps(t)
                              for t, w in weights.items() if w != 0.0)
        out.scale = check_scale(scale, per_sample=True)
        out.tree, out.joint_label = None, ()
        out.prompt_conds = conds
        out.query_terms = [(k, w) for k, w in enumerate(weights.values()) if w != 0.0]
        out.terms = [(k, out.scale * w) for k, w in out.query_terms if not scale_is(out.scale * w, 0.0)]
        out.null_coef = 1.0 - sum(w for _, w in out.terms)
        return out

    def _guide_prompts(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond) -> Tensor:
        b = x.shape[0]
        if cond is not None and not (isinstance(cond, Tensor) and cond.shape == (b,) and not cond.is_floating_point()
                                     and bool((cond == 0).all())):
            raise ValueError("Compose.from_prompts defines the query by its prompts: pass cond=compose.cond(B) (a "
                             "placeholder of B zeros) to sd.sample, not a prompt's condition")
        null_coef = scale_rows(self.null_coef, x)
        c = self.prompt_conds
        parts = [c.index([k] * b) for k, _ in self.terms]
        if self.needs_null:
            parts.append(c.null_like().index([0] * b))
        stacked = c.cat(parts) if len(parts) > 1 else parts[0]
        reps = len(parts)
        out = denoiser(x.repeat((reps,) + (1,) * (x.ndim - 1)), sigma.repeat(reps), stacked)
        ds = out.split(b, dim=0)
        acc = ds[-1] * null_coef if self.needs_null else torch.zeros_like(ds[0])
        for (_, w), d in zip(self.terms, ds, strict=False):
            acc = acc + scale_rows(w, d) * d
        return acc

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

    def reset(self) -> None:
        """Stateless."""

    def cond(self, n: int, device=None) -> Tensor:
        """The condition to pass to ``sd.sample``: ``n`` rows of the joint label of the positive literals
        (:meth:`from_prompts`: ``n`` zeros, a placeholder; the prompts are the query)."""
        if self.prompt_conds is not None:
            return torch.zeros(n, dtype=torch.long, device=device)
        return torch.tensor(self.joint_label, dtype=torch.long, device=device).expand(n, -1).clone()

    def check_model(self, denoiser) -> None:
        """Refuse models without null tokens and models whose slots do not match ``attributes``."""
        if self.prompt_conds is not None:
            return  # prompt terms: the pipeline builds the null (empty or negative prompt)
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

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        """``D_comp`` at ``(x, sigma)`` from one call on a stacked batch of ``rows_per_eval * B`` rows."""
        check_x_sigma(x, sigma, "Compose")
        if self.prompt_conds is not None:
            return self._guide_prompts(denoiser, x, sigma, cond)
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
        reps = len(labels)
        out = denoiser(x.repeat((reps,) + (1,) * (x.ndim - 1)), sigma.repeat(reps), conds)
        parts = out.split(b, dim=0)
        # D_u + sum w_k (D_k - D_u) written as null_coef * D_u + sum w_k D_k (the same affine combination).
        acc = parts[-1] * null_coef if self.needs_null else torch.zeros_like(parts[0])
        for (_, w), d in zip(self.terms, parts, strict=False):
            acc = acc + scale_rows(w, d) * d
        return acc

    __call__ = guide


# ------------------------------------------------------------------------------------------------- oracle
def compose_oracle(gmm, expr: str, attributes: Mapping[str, Sequence[str] | int]):
    """The exact composed model: the labelled mixture restricted to the components whose label satisfies ``expr``
    (AND, NOT, OR), prior weights renormalised; the oracle the score rules are compared with. Returns a
    ``GaussianMixture``."""
    from ..models.gmm import GaussianMixture

    if getattr(gmm, "labels", None) is None:
        raise ValueError("gmm: the mixture needs component labels [K, m] to evaluate an expression")
    attrs = normalize_attributes(attributes)
    if gmm.labels.shape[1] != len(attrs):
        raise ValueError(f"gmm labels have {gmm.labels.shape[1]} slots but attributes name {len(attrs)}")
    keep = satisfies(parse(expr, attrs), gmm.labels)
    if not bool(keep.any()):
        raise ValueError(f"expr {expr!r} is satisfied by no component of the mixture")
    return GaussianMixture(gmm.weights[keep], gmm.means[keep], gmm.covs[keep], gmm.labels[keep])


# ------------------------------------------------------------------------------------------------- models
def load_composable(name_or_dir: str | Path, device: str = "cpu"):
    """Load a model (:func:`steerdiff.models.load`) and attach ``attributes`` and ``has_null`` from the
    ``attributes.json`` next to its ``config.json`` (shipped: ``shapes_coind``, ``shapes_band``)."""
    from ..models.io import ASSETS_DIR, load

    model = load(name_or_dir, device)
    p = Path(name_or_dir)
    directory = (p.parent if p.is_file() else p) if p.exists() else ASSETS_DIR / str(name_or_dir)
    meta_path = directory / ATTRIBUTES_FILE
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        model.attributes = normalize_attributes(meta["attributes"])
        model.has_null = bool(meta.get("has_null", True))
    return model
