"""Denoisers: the analytic Gaussian mixture, trained backbones, adapters, and checkpoint I/O."""

from .gmm import BUILTIN_MIXTURES, GaussianMixture, builtin_mixture

__all__ = ["BUILTIN_MIXTURES", "GaussianMixture", "builtin_mixture"]
