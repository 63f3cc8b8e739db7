"""Tiny random-weight diffusers pipelines built from configs (no download): SD 1.x, SDXL, SD3 (with or without T5),
FLUX; the harness of ``tests/pipelines`` and ``benchmarks/pipeline_overhead.py``.

The CLIP tokenizer is read from files written by :func:`steerdiff.app.recipes.clip_tokenizer.write_clip_tokenizer` (pass
their directory ``d``): a byte-level vocabulary (every byte symbol, alone and word-final) with no merges, so every
prompt tokenizes character by character. The T5 tokenizer is word-level, built in memory. Every network is seeded,
so a builder returns the same weights on every call.

diffusers, transformers and tokenizers are optional dependencies: they are imported inside the builders, so
importing this module (or ``steerdiff``) does not need them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

MAX_TOKENS = 8
"""The CLIP (and T5) tokenizers' ``model_max_length``: the CLIP encoders' sequence length."""
HIDDEN = 16
"""The CLIP encoders' width."""

__all__ = ["HIDDEN", "MAX_TOKENS", "TinyPipelines", "make_flux", "make_sd", "make_sd3", "make_sdxl", "make_t5_encoder",
           "make_t5_tokenizer", "make_text_encoder", "make_tokenizer", "make_vae", "sd_scheduler"]


def make_tokenizer(d: str | Path) -> Any:
    """A CLIP tokenizer from the byte-level vocabulary files in ``d`` (``model_max_length = MAX_TOKENS``)."""
    import transformers

    d = Path(d)
    return transformers.CLIPTokenizer(str(d / "vocab.json"), str(d / "merges.txt"), model_max_length=MAX_TOKENS)


def make_text_encoder(tok: Any, seed: int, projection: bool = False, hidden: int = HIDDEN) -> Any:
    """A 2-layer CLIP text encoder of width ``hidden`` for ``tok`` (``projection``: with the pooled projection)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.CLIPTextConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=2, num_hidden_layers=2,
        vocab_size=len(tok), max_position_embeddings=MAX_TOKENS, projection_dim=hidden)
    cls = transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel
    return cls(config).eval()


def make_vae(seed: int, shift_factor: float | None = None) -> Any:
    """A 2-block ``AutoencoderKL`` (4 latent channels, scale factor 2, ``scaling_factor = 0.5``)."""
    import diffusers

    torch.manual_seed(seed)
    vae = diffusers.AutoencoderKL(
        block_out_channels=(8, 8), in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), latent_channels=4, norm_num_groups=4,
        sample_size=16, scaling_factor=0.5, shift_factor=shift_factor)
    return vae.eval()


def sd_scheduler(kind: str, prediction_type: str = "epsilon", **extra) -> Any:
    """An SD-style scheduler: ``ddim``, ``euler``, ``dpm``, ``unipc``, ``euler_trailing`` or ``euler_linspace``."""
    import diffusers

    common = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", prediction_type=prediction_type)
    if kind == "ddim":
        return diffusers.DDIMScheduler(**common, clip_sample=False, set_alpha_to_one=False, steps_offset=1, **extra)
    if kind == "euler":
        return diffusers.EulerDiscreteScheduler(**common, timestep_spacing="leading", steps_offset=1, **extra)
    if kind == "dpm":
        return diffusers.DPMSolverMultistepScheduler(**common, steps_offset=1, **extra)
    if kind in ("euler_trailing", "euler_linspace"):
        return diffusers.EulerDiscreteScheduler(**common, timestep_spacing=kind.split("_")[1], **extra)
    if kind == "unipc":
        return diffusers.UniPCMultistepScheduler(**common, steps_offset=1, **extra)
    raise ValueError(kind)


def make_t5_tokenizer() -> Any:
    """A word-level T5 tokenizer (pad 0, eos 1, unk 2; words a, cat, dog, blurry) built in memory."""
    import tokenizers
    import transformers

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for w in ("a", "cat", "dog", "blurry"):
        vocab[w] = len(vocab)
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.T5TokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                        extra_ids=0, model_max_length=MAX_TOKENS)


def make_t5_encoder(tok: Any, seed: int, d_model: int = HIDDEN) -> Any:
    """A 1-layer ``T5EncoderModel`` of width ``d_model`` for the T5 tokenizer ``tok``."""
    import transformers

    torch.manual_seed(seed)
    return transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=len(tok), d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=1, num_heads=2, pad_token_id=0,
        eos_token_id=1, decoder_start_token_id=0)).eval()


def make_sd(d: str | Path, scheduler: str = "ddim", prediction_type: str = "epsilon") -> Any:
    """A ``StableDiffusionPipeline``: one CLIP encoder, a 2-block UNet, the scheduler ``sd_scheduler(scheduler)``."""
    import diffusers

    tok = make_tokenizer(d)
    te = make_text_encoder(tok, 1)
    torch.manual_seed(2)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=HIDDEN, norm_num_groups=4, attention_head_dim=4).eval()
    pipe = diffusers.StableDiffusionPipeline(
        unet=unet, vae=make_vae(3), text_encoder=te, tokenizer=tok, scheduler=sd_scheduler(scheduler, prediction_type),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_sdxl(d: str | Path, force_zeros: bool = True) -> Any:
    """A ``StableDiffusionXLPipeline``: two CLIP encoders (the second with projection), Euler (leading spacing)."""
    import diffusers

    tok, tok2 = make_tokenizer(d), make_tokenizer(d)
    te, te2 = make_text_encoder(tok, 1), make_text_encoder(tok2, 4, projection=True)
    time_dim = 4
    torch.manual_seed(2)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=2 * HIDDEN, norm_num_groups=4, attention_head_dim=4, use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=time_dim,
        projection_class_embeddings_input_dim=6 * time_dim + HIDDEN).eval()
    pipe = diffusers.StableDiffusionXLPipeline(
        unet=unet, vae=make_vae(3), text_encoder=te, tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok2,
        scheduler=sd_scheduler("euler"), force_zeros_for_empty_prompt=force_zeros)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_sd3(d: str | Path, shift: float = 3.0, t5: bool = False) -> Any:
    """A ``StableDiffusion3Pipeline``: two CLIP encoders, a 1-layer transformer, FlowMatchEuler at ``shift``; with
    ``t5`` a T5 encoder of the joint-attention width (``2 HIDDEN``) as ``text_encoder_3``, else none."""
    import diffusers

    tok, tok2 = make_tokenizer(d), make_tokenizer(d)
    te, te2 = make_text_encoder(tok, 1, projection=True), make_text_encoder(tok2, 4, projection=True)
    tok3 = make_t5_tokenizer() if t5 else None
    te3 = make_t5_encoder(tok3, 6, d_model=2 * HIDDEN) if t5 else None
    torch.manual_seed(2)
    tr = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=2 * HIDDEN, caption_projection_dim=16, pooled_projection_dim=2 * HIDDEN,
        out_channels=4).eval()
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=tr, vae=make_vae(3, shift_factor=0.1), text_encoder=te, tokenizer=tok, text_encoder_2=te2,
        tokenizer_2=tok2, text_encoder_3=te3, tokenizer_3=tok3,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=shift))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_flux(d: str | Path, guidance_embeds: bool = True) -> Any:
    """A ``FluxPipeline``: CLIP and a T5 encoder, a 1+1-layer transformer, FlowMatchEuler with dynamic shifting."""
    import diffusers

    tok = make_tokenizer(d)
    clip = make_text_encoder(tok, 1, projection=False)
    t5tok = make_t5_tokenizer()
    t5 = make_t5_encoder(t5tok, 5)
    torch.manual_seed(2)
    tr = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=HIDDEN, pooled_projection_dim=HIDDEN, guidance_embeds=guidance_embeds,
        axes_dims_rope=(4, 2, 2)).eval()
    sch = diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                    base_image_seq_len=256, max_image_seq_len=4096)
    pipe = diffusers.FluxPipeline(scheduler=sch, vae=make_vae(3, shift_factor=0.1), text_encoder=clip, tokenizer=tok,
                                  text_encoder_2=t5, tokenizer_2=t5tok, transformer=tr)
    pipe.set_progress_bar_config(disable=True)
    return pipe


class TinyPipelines:
    """The builders above, bound to one directory ``d`` of CLIP tokenizer files."""

    def __init__(self, d: str | Path):
        self.d = Path(d)

    def sd(self, scheduler: str = "ddim", prediction_type: str = "epsilon") -> Any:
        """:func:`make_sd` on ``d``."""
        return make_sd(self.d, scheduler, prediction_type)

    def sdxl(self, force_zeros: bool = True) -> Any:
        """:func:`make_sdxl` on ``d``."""
        return make_sdxl(self.d, force_zeros)

    def sd3(self, shift: float = 3.0, t5: bool = False) -> Any:
        """:func:`make_sd3` on ``d``."""
        return make_sd3(self.d, shift, t5)

    def flux(self, guidance_embeds: bool = True) -> Any:
        """:func:`make_flux` on ``d``."""
        return make_flux(self.d, guidance_embeds)
