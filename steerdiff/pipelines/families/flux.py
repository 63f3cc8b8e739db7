"""The FLUX family (``FluxPipeline``; Black Forest Labs 2024, FLUX.1, a rectified-flow transformer after Esser et
al., ICML 2024, "Scaling Rectified Flow Transformers for High-Resolution Image Synthesis"):
docs/methods/pipelines.md, "Text conditions" (row ``flux``) and "The latent denoiser" (packed latents)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..conditions import TextCond
from .base import FlowFamily, register_family


@register_family("flux")
class Flux(FlowFamily):
    """FLUX: CLIP's pooled projection and T5's hidden states (``encode_prompt``), rotary position ids of the latent
    tokens (``img_ids``, one ``[seq, 3]`` table per row) and, for a guidance-distilled transformer
    (``guidance_embeds``), the embedded guidance value per row (``guidance``; the pipeline's ``guidance_scale``,
    which is not CFG). Latents are packed as the pipeline packs them: 2x2 patches of the VAE latent become tokens,
    ``[B, (h/2)(w/2), 4 C]``. The transformer predicts velocity and takes ``timestep = t`` (it scales by 1000
    itself), so ``t_scale = 1``. The null is the negative prompt's encoding (the empty prompt's when none is
    given), what the pipeline's ``true_cfg_scale`` uses. The schedule is the one the FLUX pipeline passes:
    ``sigmas = linspace(1, 1/steps, steps)`` shifted by ``mu`` from the latent token count."""

    pipeline_class = "FluxPipeline"
    required = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2", "vae", "transformer", "scheduler")
    packed = True
    embedded_guidance = 3.5  # FluxPipeline's default guidance_scale
    default_steps = 28  # FluxPipeline's defaults (guidance_scale: the embedded guidance)
    default_guidance_scale = 3.5
    max_sequence_length = 512  # the FLUX pipeline's default T5 token count
    t_scale = 1.0
    sigma_grid = "flux"
    max_shift = 1.15
    keep_dtype = ("guidance",)  # the pipeline passes the embedded guidance in float32, whatever the model's dtype

    def default_size(self) -> tuple[int, int]:
        size = int(self.pipe.default_sample_size) * self.pipe.vae_scale_factor
        return size, size

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2

    def latent_channels(self) -> int:
        return int(self.pipe.transformer.config.in_channels) // 4

    def image_seq_len(self, pipeline: Any, height: int | None, width: int | None) -> int:
        return pipeline.latent_shape(height, width)[0]  # packed latents: one token per row

    def encode(self, prompts, negatives, height, width, embedded_guidance=None, max_sequence_length=None):
        b = len(prompts)
        seq = {"max_sequence_length": max_sequence_length or self.max_sequence_length}
        pos, pooled, _ = self.pipe.encode_prompt(prompts, None, device=self.device, num_images_per_prompt=1, **seq)
        neg, neg_pooled, _ = self.pipe.encode_prompt(negatives if negatives is not None else [""] * b, None,
                                                     device=self.device, num_images_per_prompt=1, **seq)
        f = self.size_multiple()
        ids = self.pipe._prepare_latent_image_ids(b, height // f, width // f, pos.device, pos.dtype)
        extra = {"img_ids": ids.expand(b, *ids.shape)}
        if self.pipe.transformer.config.guidance_embeds:
            value = self.embedded_guidance if embedded_guidance is None else float(embedded_guidance)
            extra["guidance"] = torch.full((b,), value, dtype=torch.float32, device=pos.device)
        return TextCond({"prompt_embeds": pos, "pooled_projections": pooled, **extra},
                        TextCond({"prompt_embeds": neg, "pooled_projections": neg_pooled, **extra}))

    def call(self, transformer, x, t, cond):
        fields = cond.fields  # a plain mapping: no Python call per lookup (TextCond.fields)
        emb = fields["prompt_embeds"]
        txt_ids = torch.zeros(emb.shape[1], 3, device=emb.device, dtype=emb.dtype)  # as encode_prompt makes them
        guidance = fields["guidance"].float() if "guidance" in fields else None
        if t.dtype != x.dtype:  # the pipeline rounds the timestep 1000 t to the latents' dtype, then divides by 1000
            t = (t * 1000.0).to(x.dtype) / 1000.0
        return transformer(hidden_states=x, timestep=t, guidance=guidance, encoder_hidden_states=emb,
                           pooled_projections=fields["pooled_projections"], txt_ids=txt_ids,
                           img_ids=fields["img_ids"][0], return_dict=False)[0]

    def pack(self, z: Tensor) -> Tensor:
        b, c, h, w = z.shape
        return z.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)

    def unpack(self, z: Tensor, height: int, width: int) -> Tensor:
        b, _, d = z.shape
        f = self.size_multiple()
        h, w = height // f, width // f
        return z.reshape(b, h, w, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, d // 4, 2 * h, 2 * w)
