"""Composition over text prompts on a pipeline: the terms ``q_k`` are prompts, so ``{"a red disk": 1.0, "a square":
-1.0}`` is ``"a red disk" & !"a square"``, ``D_u + scale sum_k w_k (D_{q_k} - D_u)`` (Liu et al., "Compositional
Visual Generation with Composable Diffusion Models", ECCV 2022, Sec. 4, conjunction and negation;
docs/methods/pipelines.md, "Methods on a pipeline", and docs/methods/coind.md, "Product-of-marginals composition").

The adapter between :class:`~steerdiff.guidance.compose.Compose` and a pipeline's structured condition: the
pipeline encodes the prompts once, and every evaluation stacks their rows with the null (empty or negative prompt)
into one denoiser call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..core.denoiser import Denoiser
from .base import Guider, check_x_sigma, scale_is, scale_rows
from .compose import Compose, _tile, combine_terms


class PromptCompose(Compose):
    """:class:`~steerdiff.guidance.compose.Compose` over text prompts (build with :meth:`Compose.from_prompts`).

    Args:
        scale: guidance weight ``w >= 0`` (or one per sample), as in :class:`Compose`.
        pipeline: an object with ``encode(prompts, negative_prompts) -> structured condition`` (a
            :class:`steerdiff.pipelines.Pipeline`); its condition's ``null`` is the unconditional term.
        prompts: ``{prompt: weight}`` (negative weight = NOT), at least one non-zero.
        negative_prompt: the prompt of ``D_u`` (default the empty prompt).

    Pass ``cond=compose.cond(B)`` (a placeholder) to :func:`steerdiff.sample` with ``pipeline.denoiser``: the
    prompts are the query. The NFE per step is ``rows_per_eval`` (the non-zero terms, plus the null unless its
    coefficient is 0), evaluated as one stacked batch ``[q_1, .., q_n, null]``.
    """

    def __init__(self, scale: float | Tensor | Sequence[float] = 1.0, *, pipeline=None,
                 prompts: Mapping[str, float] | None = None, negative_prompt: str | None = None):
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
        self.attributes, self.mode = {}, "and"
        self.expr = " & ".join(("" if w > 0 else "!") + (f"{abs(w):g}*" if abs(w) != 1 else "") + json.dumps(t)
                               for t, w in weights.items() if w != 0.0)
        Guider.__init__(self, scale)
        self.tree, self.joint_label = None, ()
        self.prompt_conds = conds  # the terms' structured conditions (one row per prompt) and the null row
        self.query_terms = [(k, w) for k, w in enumerate(weights.values()) if w != 0.0]
        self.terms = [(k, self.scale * w) for k, w in self.query_terms if not scale_is(self.scale * w, 0.0)]
        self.null_coef = 1.0 - sum(w for _, w in self.terms)

    def cond(self, n: int, device=None) -> Tensor:
        """``n`` zeros: a placeholder for ``sd.sample`` (the prompts are the query)."""
        return torch.zeros(n, dtype=torch.long, device=device)

    def check_model(self, denoiser) -> None:
        """Nothing to check: the pipeline builds the null (empty or negative prompt)."""

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor | None = None,
              step: int | None = None) -> Tensor:
        """``D_comp`` from one call on the stacked prompt rows ``[q_1, .., q_n, null]`` (``step`` is ignored)."""
        check_x_sigma(x, sigma, "Compose")
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
        return combine_terms(denoiser(_tile(x, len(parts)), sigma.repeat(len(parts)), stacked), self.terms,
                             null_coef if self.needs_null else None, b)

    __call__ = guide
