"""Text-to-image pipelines over the one denoiser interface (docs/methods/pipelines.md).

``sd.pipelines.from_diffusers(pipe)`` wraps a diffusers pipeline of a registered family (built in: SD 1.x/2.x, SDXL,
SD3, FLUX; :data:`FAMILIES`, :func:`register_family`) as a :class:`Pipeline` (prompts -> :class:`TextCond`, a
latent denoiser ``D(z, sigma, cond)``, the scheduler's sigmas, the VAE); ``sd.pipelines.load(dir)`` loads a local
``save_pretrained`` directory safely first (or a shipped pipeline by name, ``sd.pipelines.load("shapes_pipeline")``).
This package sits above the method packages: the pipeline guides through :mod:`steerdiff.guidance`'s registered
guiders and core's row mapping.
"""

from .conditions import TextCond
from .families import FAMILIES, SCHEDULER_METHODS, SUPPORTED, Family, FlowFamily, register_family
from .load import load, shipped_pipelines
from .methods import DecodedOperator, DecodedReward, RowDenoiser, bind, on_images, through_decoder
from .pipeline import Pipeline, PipelineOutput, from_diffusers

__all__ = ["FAMILIES", "SCHEDULER_METHODS", "SUPPORTED", "DecodedOperator", "DecodedReward", "Family", "FlowFamily",
           "Pipeline", "PipelineOutput", "RowDenoiser", "TextCond", "bind", "from_diffusers", "load", "on_images",
           "register_family", "shipped_pipelines", "through_decoder"]
