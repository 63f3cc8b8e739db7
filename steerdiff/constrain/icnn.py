"""Deprecated path: the NAMM forward map's input-convex networks moved to :mod:`steerdiff.models.icnn` (issue 34:
networks live under ``steerdiff.models``). This module re-exports them for one release and warns on import."""

import warnings

from ..models.icnn import NEGATIVE_SLOPE, NONNEG_INIT, ConvICNNMap, ICNNMap

warnings.warn("steerdiff.constrain.icnn is deprecated: import ICNNMap and ConvICNNMap from steerdiff.models.icnn "
              "(or steerdiff.constrain / steerdiff.models)", DeprecationWarning, stacklevel=2)

__all__ = ["NEGATIVE_SLOPE", "NONNEG_INIT", "ConvICNNMap", "ICNNMap"]
