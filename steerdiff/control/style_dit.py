"""Deprecated path: the style-token DiT moved to :mod:`steerdiff.models.style_dit` (networks live under
``steerdiff.models``), its joint attention to :mod:`steerdiff.models.style_attention` and the reference sampler
``style_refs`` to :mod:`steerdiff.control.styles` (issue 34). This module re-exports them for one release and warns
on import."""

import warnings

from ..models.style_attention import joint_block
from ..models.style_dit import StyleTokenDenoiser, StyleTokenDiT, no_style
from .styles import style_refs

warnings.warn("steerdiff.control.style_dit is deprecated: import StyleTokenDiT, StyleTokenDenoiser and no_style from "
              "steerdiff.models.style_dit, style_refs from steerdiff.control.styles", DeprecationWarning,
              stacklevel=2)

__all__ = ["StyleTokenDenoiser", "StyleTokenDiT", "joint_block", "no_style", "style_refs"]
