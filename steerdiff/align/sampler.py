"""Deprecated path of :mod:`steerdiff.align.run_setup` (the shared setup of an alignment run; it is not a sampler).

Importing ``steerdiff.align.sampler`` warns with ``DeprecationWarning`` and re-exports the names of
:mod:`steerdiff.align.run_setup` (the same objects); it will be removed in the next release.
"""

import warnings

from .run_setup import (  # noqa: F401  (re-exported)
    CALLBACK_KEYS,
    AlignRun,
    Callback,
    ModelCalls,
    Reward,
    RewardCalls,
    check_common,
    expand_cond,
    prepare,
    step_info,
)

warnings.warn("steerdiff.align.sampler is deprecated: import from steerdiff.align.run_setup (the same names)",
              DeprecationWarning, stacklevel=2)
