"""Deprecated path: the OCM heads moved to :mod:`steerdiff.models.ocm_heads` (networks live under
``steerdiff.models``) and the OCM target to :mod:`steerdiff.covariance.target` (issue 34). This module re-exports
both for one release and warns on import."""

import warnings

from ..models.ocm_heads import (
    PARAMS,
    InputHead,
    OCMHead,
    TrunkHead,
    check_param,
    cout2,
    cov_to_output,
    output_to_cov,
    unet_trunk_head,
)
from .target import hutchinson_diag, ocm_target, rademacher_like

warnings.warn("steerdiff.covariance.heads is deprecated: import the heads from steerdiff.models.ocm_heads and the "
              "OCM target from steerdiff.covariance.target (or both from steerdiff.covariance)", DeprecationWarning,
              stacklevel=2)

__all__ = ["PARAMS", "InputHead", "OCMHead", "TrunkHead", "check_param", "cout2", "cov_to_output", "hutchinson_diag",
           "ocm_target", "output_to_cov", "rademacher_like", "unet_trunk_head"]
