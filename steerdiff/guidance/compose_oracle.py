"""The exact composed model for a labelled Gaussian mixture: the mixture restricted to the components whose label
satisfies a logical expression (AND, NOT and OR), prior weights renormalised; the oracle the score rules of
:class:`steerdiff.guidance.Compose` are compared with (Gaudi, Sreekumar, Boddeti, "CoInD: Enabling Logical
Compositions in Diffusion Models", ICLR 2025; docs/methods/coind.md, "Expressions and the Compose guider", its
paragraph "The exact oracle").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .compose_expr import normalize_attributes, parse, satisfies


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
