"""The three-stroke-style digits of the RB-Modulation digits protocol (RB-Modulation, Rout et al., ICLR 2025;
docs/methods/rb_modulation.md "The digits protocol").

sklearn's 8x8 digits (``x / 8 - 1`` in [-1, 1]) in three stroke styles: ``normal``; ``thick`` =
``scipy.ndimage.grey_dilation`` with the 3x3 plus footprint; ``thin`` = ``(x + grey_erosion(x)) / 2`` with the same
footprint. The generator is trained on all three styles without style labels, so its prior holds every style.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage
from torch import Tensor

STYLES = ("normal", "thick", "thin")
PLUS = np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], dtype=bool)


def stylize_images(x: Tensor, style: str) -> Tensor:
    """Images ``[N, 1, 8, 8]`` in [-1, 1] redrawn in ``style`` (one of :data:`STYLES`)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if style == "normal":
        return x.clone()
    a = x.detach().cpu().numpy().astype(np.float32)
    fp = PLUS.reshape(1, 1, 3, 3)
    if style == "thick":
        out = ndimage.grey_dilation(a, footprint=fp)
    else:
        out = 0.5 * (a + ndimage.grey_erosion(a, footprint=fp))
    return torch.from_numpy(np.ascontiguousarray(out)).to(x.dtype)


def styled_digits(split: str = "all") -> tuple[Tensor, Tensor, Tensor]:
    """``(x [3N, 1, 8, 8], digit class [3N], style index [3N])``: every digit of ``split`` in each style of
    :data:`STYLES` (style-major order: all normal, then all thick, then all thin)."""
    from ..data.digits import load_digits

    x, y = load_digits(split)
    x = torch.as_tensor(x, dtype=torch.float32)
    y = torch.as_tensor(y, dtype=torch.long)
    xs = torch.cat([stylize_images(x, s) for s in STYLES])
    return xs, y.repeat(len(STYLES)), torch.arange(len(STYLES)).repeat_interleave(x.shape[0])


def reference_image(style: str = "thick", label: int = 0) -> Tensor:
    """The protocol's style reference ``[1, 1, 8, 8]``: the first image of class ``label`` in sklearn's order,
    redrawn in ``style``."""
    from ..data.digits import load_digits

    x, y = load_digits("all")
    idx = int(torch.nonzero(torch.as_tensor(y) == label)[0])
    return stylize_images(torch.as_tensor(x[idx: idx + 1], dtype=torch.float32), style)


def style_refs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Training data of the style-token DiT (:class:`steerdiff.models.style_dit.StyleTokenDiT`): three-style digits
    ``x``, condition ``[N, 2]`` = (class, index of a random other image of the same style, fixed by ``seed``), and the
    style index ``[N]``."""
    x, y, s = styled_digits("all")
    rs = np.random.RandomState(seed)
    ref = torch.empty_like(y)
    for k in range(int(s.max()) + 1):
        idx = torch.nonzero(s == k).flatten()
        ref[idx] = idx[torch.from_numpy(rs.randint(0, len(idx), len(idx)))]
    return x, torch.stack([y, ref], dim=1), s
