"""The SD 1.x / 2.x family (``StableDiffusionPipeline``; Rombach et al., CVPR 2022, "High-Resolution Image
Synthesis with Latent Diffusion Models"): docs/methods/pipelines.md, "Text conditions" (row ``sd``)."""

from __future__ import annotations

from ..conditions import TextCond
from .base import Family, register_family


@register_family("sd")
class StableDiffusion(Family):
    """SD 1.x / 2.x: ``prompt_embeds`` = the CLIP text encoder's last hidden states; the null is the negative
    prompt's (the empty prompt's when none is given). A VP UNet on the scheduler's ``alphas_cumprod``."""

    pipeline_class = "StableDiffusionPipeline"
    required = ("tokenizer", "text_encoder", "vae", "unet", "scheduler")
    calibration_args = ("sample", "timestep")

    def encode(self, prompts, negatives, height, width, embedded_guidance=None, max_sequence_length=None):
        pos, neg = self.pipe.encode_prompt(prompts, self.device, 1, True, negative_prompt=negatives)
        return TextCond({"prompt_embeds": pos}, TextCond({"prompt_embeds": neg}))

    def call(self, unet, x, t, cond):
        return unet(x, t, encoder_hidden_states=cond.fields["prompt_embeds"], return_dict=False)[0]
