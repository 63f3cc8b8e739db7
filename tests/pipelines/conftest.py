"""Tiny random-weight diffusers pipelines built from configs (no download): SD 1.x, SDXL, SD3 without T5.

The CLIP tokenizer is written by ``steerdiff.pipelines.tokenizer.write_clip_tokenizer``: a byte-level vocabulary
(every byte symbol, alone and word-final) with no merges, so every prompt tokenizes character by character.
"""


import pytest
import torch

from steerdiff.pipelines.tokenizer import write_clip_tokenizer

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

MAX_TOKENS = 8
HIDDEN = 16


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("clip_tokenizer")
    write_clip_tokenizer(d)  # a byte-level vocabulary: any prompt tokenizes
    return d


def make_tokenizer(d):
    return transformers.CLIPTokenizer(str(d / "vocab.json"), str(d / "merges.txt"), model_max_length=MAX_TOKENS)


def make_text_encoder(tok, seed, projection=False, hidden=HIDDEN):
    torch.manual_seed(seed)
    config = transformers.CLIPTextConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=2, num_hidden_layers=2,
        vocab_size=len(tok), max_position_embeddings=MAX_TOKENS, projection_dim=hidden)
    cls = transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel
    return cls(config).eval()


def make_vae(seed, shift_factor=None):
    torch.manual_seed(seed)
    vae = diffusers.AutoencoderKL(
        block_out_channels=(8, 8), in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), latent_channels=4, norm_num_groups=4,
        sample_size=16, scaling_factor=0.5, shift_factor=shift_factor)
    return vae.eval()


def sd_scheduler(kind, prediction_type="epsilon", **extra):
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


def make_sd(tokenizer_dir, scheduler="ddim", prediction_type="epsilon"):
    tok = make_tokenizer(tokenizer_dir)
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


def make_sdxl(tokenizer_dir, force_zeros=True):
    tok, tok2 = make_tokenizer(tokenizer_dir), make_tokenizer(tokenizer_dir)
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


def make_sd3(tokenizer_dir, shift=3.0):
    tok, tok2 = make_tokenizer(tokenizer_dir), make_tokenizer(tokenizer_dir)
    te, te2 = make_text_encoder(tok, 1, projection=True), make_text_encoder(tok2, 4, projection=True)
    torch.manual_seed(2)
    tr = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=2 * HIDDEN, caption_projection_dim=16, pooled_projection_dim=2 * HIDDEN,
        out_channels=4).eval()
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=tr, vae=make_vae(3, shift_factor=0.1), text_encoder=te, tokenizer=tok, text_encoder_2=te2,
        tokenizer_2=tok2, text_encoder_3=None, tokenizer_3=None,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=shift))
    pipe.set_progress_bar_config(disable=True)
    return pipe


class _Tiny:
    """The builders above, bound to the session's tokenizer files."""

    def __init__(self, d):
        self.d = d

    def sd(self, scheduler="ddim", prediction_type="epsilon"):
        return make_sd(self.d, scheduler, prediction_type)

    def sdxl(self, force_zeros=True):
        return make_sdxl(self.d, force_zeros)

    def sd3(self, shift=3.0):
        return make_sd3(self.d, shift)

    def flux(self, guidance_embeds=True):
        return make_flux(self.d, guidance_embeds)


@pytest.fixture(scope="session")
def tiny(tokenizer_dir):
    return _Tiny(tokenizer_dir)


def make_t5_tokenizer():
    """A word-level T5 tokenizer (pad 0, eos 1, unk 2) built in memory."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for w in ("a", "cat", "dog", "blurry"):
        vocab[w] = len(vocab)
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.T5TokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                        extra_ids=0, model_max_length=MAX_TOKENS)


def make_flux(tokenizer_dir, guidance_embeds=True):
    tok = make_tokenizer(tokenizer_dir)
    clip = make_text_encoder(tok, 1, projection=False)
    t5tok = make_t5_tokenizer()
    torch.manual_seed(5)
    t5 = transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=len(t5tok), d_model=HIDDEN, d_kv=8, d_ff=2 * HIDDEN, num_layers=1, num_heads=2, pad_token_id=0,
        eos_token_id=1, decoder_start_token_id=0)).eval()
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
