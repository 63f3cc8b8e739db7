"""Text-to-image pipelines over the one denoiser interface (docs/methods/pipelines.md).

``sd.pipelines.from_diffusers(pipe)`` wraps a diffusers SD 1.x/2.x, SDXL, SD3 or FLUX pipeline as a :class:`Pipeline`
(prompts -> :class:`TextCond`, a latent denoiser ``D(z, sigma, cond)``, the scheduler's sigmas, the VAE);
``sd.pipelines.load(dir)`` loads a local ``save_pretrained`` directory safely first (or a shipped pipeline by name,
``sd.pipelines.load("shapes_pipeline")``).
"""

from .conditions import TextCond
from .families import SUPPORTED
from .load import load, shipped_pipelines
from .methods import DecodedOperator, DecodedReward, RowDenoiser, bind, on_images, through_decoder
from .pipeline import SCHEDULER_METHODS, Pipeline, PipelineOutput, from_diffusers

__all__ = ["SCHEDULER_METHODS", "SUPPORTED", "DecodedOperator", "DecodedReward", "Pipeline", "PipelineOutput",
           "RowDenoiser", "TextCond", "bind", "from_diffusers", "load", "on_images", "shipped_pipelines",
           "through_decoder"]
