"""Local geometry of generative models: scaling psi, rank nu, complexity delta, and geometry-reward guidance.

Paper: "What Secrets Do Your Manifolds Hold? Understanding the Local Geometry of Generative Models" (Humayun et al.,
ICLR 2025); docs/methods/geometry.md ("Which map", "Definitions", "Geometry-reward guidance", "Validation").

* :func:`local_descriptors` (``descriptors``): psi, nu under three rank conventions, delta (total and per layer) and
  the singular values of a map at latents; exact or sketched Jacobians;
* ``maps``: the latent-to-image map of a deterministic sampler (default), the denoiser at a fixed sigma, any decoder;
* the digits claims' measurements (volume vs spread, memorisation labels, Laplacian energy, ...) are the protocol
  :mod:`steerdiff.app.protocols.geometry`;
* ``reward``: the noise-aware psi regressor of geometry-reward guidance, used with
  :class:`steerdiff.guidance.RewardGuidance`;
"""

from . import reward
from .descriptors import (
    Descriptors,
    activation_units,
    complexity,
    jacobian,
    local_descriptors,
    neighbourhood,
    orthonormal_directions,
    spectral_descriptors,
)
from .maps import MAP_KINDS, DecoderMap, DenoiserMap, GeneratorMap, as_map
from .reward import PsiRegressor, train_psi_regressor, trajectory_states

__all__ = [
    "MAP_KINDS",
    "PsiRegressor",
    "DecoderMap",
    "DenoiserMap",
    "Descriptors",
    "GeneratorMap",
    "activation_units",
    "as_map",
    "complexity",
    "jacobian",
    "local_descriptors",
    "neighbourhood",
    "orthonormal_directions",
    "reward",
    "spectral_descriptors",
    "train_psi_regressor",
    "trajectory_states",
]
