"""Tangential damping CFG (TCFG): Kwon, Hwang, Park, Lee, Kim, "TCFG: Tangential Damping Classifier-free Guidance"
(CVPR 2025; arXiv 2503.18137), Sec. 4; docs/methods/guidance.md, "TCFG".

Per sample, with ``c`` and ``u`` the conditional and null predictions in the chosen space flattened to vectors: the
first right singular vector ``v1`` of the 2 x d matrix ``[c; u]`` spans the direction the two predictions share;
the null prediction keeps only its component along it, ``u' = <u, v1> v1`` (its tangential part is damped away),
and guidance is CFG against it: ``p = u' + w (c - u')``.

``v1`` is computed from the 2 x 2 Gram matrix ``[c; u][c; u]^T`` (its top eigenvector ``a`` gives ``v1 = a^T [c; u] /
||a^T [c; u]||``), in float64: the SVD of the 2 x d matrix without forming its d x d factors.

Scale convention: ``w`` as every steerdiff guider; diffusers' ``TangentialClassifierFreeGuidance(guidance_scale=s)``
is ``w = s`` (``use_original_formulation=True``: ``w = s + 1``) and equals this guider on the network's own
predictions (``space="eps"`` for SD / SDXL; tests/guidance/test_output_space_guiders.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import scale_rows
from .registry import register_guider
from .spaces import SpaceGuider

NORM_FLOOR = 1e-300  # v1's norm floor: c = u = 0 has no shared direction (then u' = 0)


def shared_direction_part(c: Tensor, u: Tensor) -> Tensor:
    """``<u, v1> v1`` with ``v1`` the first right singular vector of ``[c; u]`` (per sample), shaped as ``u``."""
    m = torch.stack([c.flatten(1), u.flatten(1)], dim=1)  # [B, 2, d]
    _, vecs = torch.linalg.eigh(m @ m.transpose(1, 2))  # ascending eigenvalues: the last column is the top one
    v1 = (vecs[:, :, -1:].transpose(1, 2) @ m).squeeze(1)  # [B, d]
    v1 = v1 / torch.linalg.vector_norm(v1, dim=1, keepdim=True).clamp_min(NORM_FLOOR)
    uf = u.flatten(1)
    return ((uf * v1).sum(dim=1, keepdim=True) * v1).reshape(u.shape)


@register_guider("tcfg")
class TCFG(SpaceGuider):
    """Tangential damping CFG: ``u' + w (c - u')`` with ``u'`` the null prediction's component along the first
    singular direction of ``[c; u]``.

    Args:
        scale: ``w`` (>= 0); a 1-D tensor or list ``[B]`` gives one ``w`` per sample.
        space: ``"eps"`` (default, the paper's and diffusers' on SD), ``"v"`` or ``"D"``.
        start, stop, sigmas, enabled: as :class:`~steerdiff.guidance.CFG`.
    """

    name = "tcfg"
    default_space = "eps"

    def __init__(self, scale: float | Tensor | Sequence[float], space: str | None = None, start: float = 0.0,
                 stop: float = 1.0, sigmas: Tensor | None = None, enabled: bool = True):
        super().__init__(scale, space=space, start=start, stop=stop, sigmas=sigmas, enabled=enabled)

    def combine_in_space(self, c: Tensor, u: Tensor) -> Tensor:
        u_damped = shared_direction_part(c, u)
        return u_damped + scale_rows(self.scale, c) * (c - u_damped)
