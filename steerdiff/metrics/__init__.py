"""Metrics: distribution distances and mixture mode weights (image metrics join later)."""

from .distributions import mmd_rbf, mode_weight_error, sliced_wasserstein

__all__ = ["mmd_rbf", "mode_weight_error", "sliced_wasserstein"]
