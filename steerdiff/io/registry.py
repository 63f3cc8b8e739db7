"""Deprecated path: the :class:`Registry` class (the one plug-in pattern) moved to :mod:`steerdiff.io.plugins`
(issue 34: a module called ``registry.py`` holds its package's registry, and io's registry, ``FORMATS``, is in
:mod:`steerdiff.io.formats`). This module re-exports it for one release and warns on import."""

import warnings

from .plugins import Registry

warnings.warn("steerdiff.io.registry is deprecated: import Registry from steerdiff.io (or steerdiff.io.plugins)",
              DeprecationWarning, stacklevel=2)

__all__ = ["Registry"]
