"""The SDXL family (``StableDiffusionXLPipeline``; Podell et al., ICLR 2024, "SDXL: Improving Latent Diffusion
Models for High-Resolution Image Synthesis", Sec. 2.2 for the size conditioning): docs/methods/pipelines.md,
"Text conditions" (row ``sdxl``)."""

from __future__ import annotations

from ..conditions import TextCond
from .base import Family, register_family


@register_family("sdxl")
class StableDiffusionXL(Family):
    """SDXL: both CLIP encoders' penultimate hidden states concatenated, the second encoder's pooled projection
    (``text_embeds``) and ``time_ids = (height, width, 0, 0, height, width)`` (original size, crop origin, target
    size: the pipeline's defaults). With no negative prompt and ``force_zeros_for_empty_prompt`` the null
    embeddings are zeros, as in the pipeline."""

    pipeline_class = "StableDiffusionXLPipeline"
    required = ("tokenizer_2", "text_encoder_2", "vae", "unet", "scheduler")
    calibration_args = ("sample", "timestep")
    upcast_vae = True  # the SDXL pipeline decodes a float16 VAE with force_upcast in float32
    default_guidance_scale = 5.0  # StableDiffusionXLPipeline's default

    def encode(self, prompts, negatives, height, width, embedded_guidance=None, max_sequence_length=None):
        pos, neg, pooled, neg_pooled = self.pipe.encode_prompt(
            prompts, device=self.device, num_images_per_prompt=1, do_classifier_free_guidance=True,
            negative_prompt=negatives)
        te2 = self.pipe.text_encoder_2
        proj = int(pooled.shape[-1]) if te2 is None else te2.config.projection_dim
        ids = self.pipe._get_add_time_ids((height, width), (0, 0), (height, width), dtype=pos.dtype,
                                          text_encoder_projection_dim=proj)
        ids = ids.to(pos.device).repeat(pos.shape[0], 1)
        return TextCond({"prompt_embeds": pos, "text_embeds": pooled, "time_ids": ids},
                        TextCond({"prompt_embeds": neg, "text_embeds": neg_pooled, "time_ids": ids}))

    def call(self, unet, x, t, cond):
        fields = cond.fields  # a plain mapping: no Python call per lookup (TextCond.fields)
        added = {"text_embeds": fields["text_embeds"], "time_ids": fields["time_ids"]}
        return unet(x, t, encoder_hidden_states=fields["prompt_embeds"], added_cond_kwargs=added,
                    return_dict=False)[0]
