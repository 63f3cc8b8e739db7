"""MAMBO-G, magnitude-aware guidance: "Magnitude-Aware Mitigation for Boosted Guidance" (arXiv 2508.03442, 2025);
docs/methods/guidance.md, "MAMBO-G".

CFG whose weight falls where the guidance update is large relative to the null prediction: per sample, with ``c``
and ``u`` the conditional and null predictions in the chosen space,

    r = ||c - u|| / ||u||,    w_eff = 1 + (w - 1) exp(-alpha r),    p = u + w_eff (c - u).

``r`` is large at high noise (where CFG's large early updates oversaturate), so guidance there is damped toward the
conditional model (``w_eff -> 1``) and returns to ``w`` as ``r`` shrinks. ``||u|| = 0`` gives ``w_eff = 1``.

Scale convention: ``w`` as every steerdiff guider; diffusers' ``MagnitudeAwareGuidance(guidance_scale=s, alpha)``
is ``w = s`` (``use_original_formulation=True``: ``w = s + 1``) and equals this guider on the network's own
predictions (tests/guidance/test_output_space_guiders.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import check_real, sample_dims, scale_rows
from .registry import register_guider
from .spaces import SpaceGuider


def magnitude_ratio(c: Tensor, u: Tensor) -> Tensor:
    """``||c - u|| / ||u||`` per sample ``[B, 1, ..., 1]`` (inf where ``||u|| = 0``)."""
    dims = sample_dims(c)
    num = torch.linalg.vector_norm(c - u, dim=dims, keepdim=True)
    den = torch.linalg.vector_norm(u, dim=dims, keepdim=True)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.full_like(den, torch.inf))


@register_guider("mambo")
class MAMBOG(SpaceGuider):
    """Magnitude-aware CFG: ``u + (1 + (w - 1) exp(-alpha ||c - u|| / ||u||)) (c - u)``.

    Args:
        scale: ``w`` (>= 0); a 1-D tensor or list ``[B]`` gives one ``w`` per sample.
        alpha: damping strength (>= 0; diffusers' default 8; 0 is CFG).
        space: ``"eps"`` (default), ``"v"`` or ``"D"``.
        start, stop, sigmas, enabled: as :class:`~steerdiff.guidance.CFG`.
    """

    name = "mambo"
    default_space = "eps"

    def __init__(self, scale: float | Tensor | Sequence[float], alpha: float = 8.0, space: str | None = None,
                 start: float = 0.0, stop: float = 1.0, sigmas: Tensor | None = None, enabled: bool = True):
        self.alpha = check_real(alpha, "alpha", 0.0)
        super().__init__(scale, space=space, start=start, stop=stop, sigmas=sigmas, enabled=enabled)

    @property
    def config(self) -> dict:
        return {**super().config, "alpha": self.alpha}

    def combine_in_space(self, c: Tensor, u: Tensor) -> Tensor:
        r = magnitude_ratio(c, u)
        inf = torch.isinf(r)
        # ||u|| = 0: w_eff = 1 (damped fully), except alpha = 0, which is CFG everywhere (never exp(-0 * inf)).
        damp = torch.where(inf, 0.0 if self.alpha > 0 else 1.0, torch.exp(-self.alpha * torch.where(inf, 0.0, r)))
        w_eff = 1.0 + (scale_rows(self.scale, c) - 1.0) * damp
        return u + w_eff * (c - u)
