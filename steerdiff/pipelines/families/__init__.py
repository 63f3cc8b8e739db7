"""The pipeline families (docs/methods/pipelines.md, "Families"): one registered :class:`Family` per kind of
diffusers text-to-image pipeline. Built in, one file each with its paper: ``sd`` (SD 1.x / 2.x; Rombach et al.,
CVPR 2022), ``sdxl`` (Podell et al., ICLR 2024), ``sd3`` (Esser et al., ICML 2024), ``flux`` (FLUX.1); a
new family is one more file with a ``@register_family("name")`` class and one import line here (or imported by the
user before :func:`~steerdiff.pipelines.from_diffusers` is called).
"""

from . import flux, sd, sd3, sdxl  # noqa: F401  (register the built-in families)
from .base import FAMILIES, SCHEDULER_METHODS, Family, FlowFamily, family_of, register_family, supported
from .flux import Flux
from .sd import StableDiffusion
from .sd3 import StableDiffusion3
from .sdxl import StableDiffusionXL

SUPPORTED = tuple(supported())
"""The pipeline classes of the built-in families (a snapshot at import; :func:`supported` lists the registered
ones)."""

__all__ = ["FAMILIES", "SCHEDULER_METHODS", "SUPPORTED", "Family", "FlowFamily", "Flux", "StableDiffusion",
           "StableDiffusion3", "StableDiffusionXL", "family_of", "register_family", "supported"]
