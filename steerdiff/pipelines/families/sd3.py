"""The SD3 family (``StableDiffusion3Pipeline``; Esser et al., ICML 2024, "Scaling Rectified Flow Transformers for
High-Resolution Image Synthesis", Sec. 4 for the three text encoders, Sec. 5.3.2 for the shifted schedule):
docs/methods/pipelines.md, "Text conditions" (row ``sd3``)."""

from __future__ import annotations

from ..conditions import TextCond
from .base import FlowFamily, register_family


@register_family("sd3")
class StableDiffusion3(FlowFamily):
    """SD3: the pipeline's three-encoder embedding (two CLIP encoders' penultimate states concatenated, padded to
    the T5 width, then T5's states along the sequence; zeros for T5 when the pipeline has none) and the two pooled
    projections; a rectified-flow transformer predicting velocity, evaluated at ``timestep = 1000 t``."""

    pipeline_class = "StableDiffusion3Pipeline"
    required = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2", "vae", "transformer", "scheduler")
    max_sequence_length = 256  # the SD3 pipeline's default T5 token count
    default_steps = 28  # StableDiffusion3Pipeline's defaults
    default_guidance_scale = 7.0
    t_scale = 1000.0

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size

    def encode(self, prompts, negatives, height, width, embedded_guidance=None, max_sequence_length=None):
        pos, neg, pooled, neg_pooled = self.pipe.encode_prompt(
            prompts, None, None, device=self.device, num_images_per_prompt=1, do_classifier_free_guidance=True,
            negative_prompt=negatives, max_sequence_length=max_sequence_length or self.max_sequence_length)
        return TextCond({"prompt_embeds": pos, "pooled_projections": pooled},
                        TextCond({"prompt_embeds": neg, "pooled_projections": neg_pooled}))

    def call(self, transformer, x, t, cond):
        return transformer(hidden_states=x, timestep=t, encoder_hidden_states=cond.fields["prompt_embeds"],
                           pooled_projections=cond.fields["pooled_projections"], return_dict=False)[0]
