"""The expression language of logical composition: a parser from strings such as ``"shape=disk & !colour=red"`` over
named attribute values to a tree of literals, the truth of a tree on label rows (the exact oracle's logic), and the
score-rule terms of an AND of (negated) values (Liu et al., "Compositional Visual Generation with Composable Diffusion
Models", ECCV 2022, Sec. 4; Gaudi, Sreekumar, Boddeti, "CoInD: Enabling Logical Compositions in Diffusion Models",
ICLR 2025, the AND / NOT queries of its official code; docs/methods/coind.md, "Expressions and the Compose guider").

Expressions::

    "shape=disk & colour=red"             AND
    "shape=disk & !colour=red"            AND NOT  (weights +1, -1)
    "2*shape=disk & !colour={red,green}"  the NOT query of the CoInD code (+2w, -w, -w)
    "shape=disk | shape=plus"             OR: only for the exact oracle (no score rule exists)

``colour!=red`` is ``!colour=red``; values may be names or integer indices. The guider that evaluates the terms is
:class:`steerdiff.guidance.compose.Compose`; the exact oracle is
:func:`steerdiff.guidance.compose_oracle.compose_oracle`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.denoiser import NULL


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
