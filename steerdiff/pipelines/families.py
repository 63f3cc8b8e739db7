"""The pipeline families: how each diffusers text-to-image pipeline encodes prompts and calls its network
(docs/methods/pipelines.md, "Families").

Each family turns a diffusers pipeline into three things the generic :class:`~steerdiff.pipelines.Pipeline` uses:

* ``encode(prompts, negatives, height, width) -> TextCond``: the pipeline's own ``encode_prompt`` (all its text
  encoders, as its ``__call__`` runs them) plus the family's extra inputs (SDXL's ``add_time_ids``);
* ``denoiser``: the latent network in the one convention. VP families (SD 1.x/2.x, SDXL) through
  :class:`~steerdiff.core.vp.VPDenoiser` with the scheduler's ``alphas_cumprod`` and ``prediction_type``; flow
  families through :class:`~steerdiff.core.flow.FlowDenoiser` (SD3: ``t_scale = 1000``; FLUX, whose transformer
  scales the timestep itself: ``t_scale = 1``);
* ``flow_sigmas`` / the VP schedule conversion (in ``pipeline.py``).

diffusers is imported only inside these functions (an optional dependency).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..core.flow import FlowDenoiser
from ..core.vp import PREDICTION_TYPES, VPDenoiser
from ..models.diffusers_adapter import _finite_terminal_snr
from .conditions import TextCond

SUPPORTED = ("StableDiffusionPipeline", "StableDiffusionXLPipeline", "StableDiffusion3Pipeline", "FluxPipeline")


class _Net:
    """``net(x, t, cond)`` for a diffusers UNet / transformer fed from a :class:`TextCond`."""

    def __init__(self, module: Any, call, null_for):
        self.module = module
        self.call = call  # call(module, x, t, cond) -> prediction
        self.null_for = null_for  # null_for(batch) -> the all-null TextCond (cond=None)

    def __call__(self, x: Tensor, t: Tensor, cond: TextCond | None = None) -> Tensor:
        if cond is None:
            cond = self.null_for(x.shape[0])
        if not isinstance(cond, TextCond):
            raise TypeError(f"a pipeline denoiser takes cond = a TextCond from Pipeline.encode (or None for the "
                            f"empty prompt), got {type(cond).__name__}")
        if cond.batch_size != x.shape[0]:
            raise ValueError(f"cond has {cond.batch_size} rows but x has {x.shape[0]}")
        dtype = next(self.module.parameters()).dtype
        if not cond.is_on(x.device, dtype):  # the per-step fast path: no copies of a condition already in place
            cond = cond.to(device=x.device, dtype=dtype)
        out = self.call(self.module, _cast(x, dtype), _cast(t, torch.float32), cond)
        return _cast(out, x.dtype)


def _cast(v: Tensor, dtype: torch.dtype) -> Tensor:
    """``v.to(dtype)``, without the call when ``v`` has it already (the per-step case)."""
    return v if v.dtype == dtype else v.to(dtype)


class Family:
    """Base: the pieces of one pipeline family. ``kind`` is ``"vp"`` or ``"flow"``."""

    name = "family"
    kind = "vp"
    packed = False  # latents packed into tokens [B, seq, 4 C] (FLUX)
    embedded_guidance = None  # the default guidance-embedding value of a guidance-distilled model (FLUX)

    def __init__(self, pipe: Any):
        self.pipe = pipe

    @property
    def network(self) -> Any:
        return self.pipe.unet

    @property
    def device(self) -> torch.device:
        """Where prompts are encoded: the device of the first text encoder's weights, what ``pipe.device`` finds
        for a pipeline on one device without its walk over every submodule of every component (a fixed cost of
        each call, ~0.3 ms on a small pipeline)."""
        for name in ("text_encoder", "text_encoder_2"):
            encoder = getattr(self.pipe, name, None)
            if isinstance(encoder, torch.nn.Module):
                for p in encoder.parameters():
                    return p.device
        return self.pipe.device

    def default_size(self) -> tuple[int, int]:
        size = self.network.config.sample_size
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        f = self.pipe.vae_scale_factor
        return int(h) * f, int(w) * f

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor

    def encode(self, prompts: list[str], negatives: list[str] | None, height: int, width: int,
               embedded_guidance: float | None = None, max_sequence_length: int | None = None) -> TextCond:
        raise NotImplementedError

    def call(self, module: Any, x: Tensor, t: Tensor, cond: TextCond) -> Tensor:
        raise NotImplementedError

    def denoiser(self, null_for) -> Any:
        net = _Net(self.network, self.call, null_for)
        scheduler = self.pipe.scheduler
        prediction_type = scheduler.config.prediction_type
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"the scheduler's prediction_type must be one of {PREDICTION_TYPES}, got "
                             f"{prediction_type!r}")
        abar = _finite_terminal_snr(scheduler.alphas_cumprod.detach().to("cpu", torch.float64))
        # Integer timesteps (leading / trailing spacing) are evaluated exactly; fractional ones (linspace, an Euler
        # scheduler's default) at the interpolated timestep.
        return VPDenoiser(net, abar, prediction_type, quantize=self.integral_timesteps())

    def integral_timesteps(self) -> bool:
        spacing = self.pipe.scheduler.config.get("timestep_spacing", "leading")
        return not (type(self.pipe.scheduler).__name__ == "EulerDiscreteScheduler" and spacing == "linspace")


class StableDiffusion(Family):
    """SD 1.x / 2.x (``StableDiffusionPipeline``): ``prompt_embeds`` = the CLIP text encoder's last hidden states;
    the null is the negative prompt's (the empty prompt's when none is given)."""

    name = "sd"

    def encode(self, prompts, negatives, height, width, embedded_guidance=None, max_sequence_length=None):
        pos, neg = self.pipe.encode_prompt(prompts, self.device, 1, True, negative_prompt=negatives)
        return TextCond({"prompt_embeds": pos}, TextCond({"prompt_embeds": neg}))

    def call(self, unet, x, t, cond):
        return unet(x, t, encoder_hidden_states=cond["prompt_embeds"], return_dict=False)[0]


class StableDiffusionXL(Family):
    """SDXL (``StableDiffusionXLPipeline``): both CLIP encoders' penultimate hidden states concatenated, the second
    encoder's pooled projection (``text_embeds``) and ``time_ids = (height, width, 0, 0, height, width)`` (original
    size, crop origin, target size: the pipeline's defaults). With no negative prompt and
    ``force_zeros_for_empty_prompt`` the null embeddings are zeros, as in the pipeline."""

    name = "sdxl"

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
        added = {"text_embeds": cond["text_embeds"], "time_ids": cond["time_ids"]}
        return unet(x, t, encoder_hidden_states=cond["prompt_embeds"], added_cond_kwargs=added,
                    return_dict=False)[0]


class StableDiffusion3(Family):
    """SD3 (``StableDiffusion3Pipeline``): the pipeline's three-encoder embedding (two CLIP encoders' penultimate
    states concatenated, padded to the T5 width, then T5's states along the sequence; zeros for T5 when the
    pipeline has none) and the two pooled projections; a rectified-flow transformer predicting velocity, evaluated
    at ``timestep = 1000 t``."""

    name = "sd3"
    kind = "flow"

    @property
    def network(self):
        return self.pipe.transformer

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size

    def encode(self, prompts, negatives, height, width, embedded_guidance=None, max_sequence_length=None):
        pos, neg, pooled, neg_pooled = self.pipe.encode_prompt(
            prompts, None, None, device=self.device, num_images_per_prompt=1, do_classifier_free_guidance=True,
            negative_prompt=negatives, max_sequence_length=max_sequence_length or 256)
        return TextCond({"prompt_embeds": pos, "pooled_projections": pooled},
                        TextCond({"prompt_embeds": neg, "pooled_projections": neg_pooled}))

    def call(self, transformer, x, t, cond):
        return transformer(hidden_states=x, timestep=t, encoder_hidden_states=cond["prompt_embeds"],
                           pooled_projections=cond["pooled_projections"], return_dict=False)[0]

    def denoiser(self, null_for):
        net = _Net(self.network, self.call, null_for)
        return FlowDenoiser(net, prediction="velocity", t_scale=1000.0)

    def integral_timesteps(self) -> bool:
        return False


class Flux(Family):
    """FLUX (``FluxPipeline``): CLIP's pooled projection and T5's hidden states (``encode_prompt``), rotary
    position ids of the latent tokens (``img_ids``, one ``[seq, 3]`` table per row) and, for a guidance-distilled
    transformer (``guidance_embeds``), the embedded guidance value per row (``guidance``; the pipeline's
    ``guidance_scale``, which is not CFG). Latents are packed as the pipeline packs them: 2x2 patches of the VAE
    latent become tokens, ``[B, (h/2)(w/2), 4 C]``. The transformer predicts velocity and takes ``timestep = t``
    (it scales by 1000 itself), so ``t_scale = 1``. The null is the negative prompt's encoding (the empty
    prompt's when none is given), what the pipeline's ``true_cfg_scale`` uses."""

    name = "flux"
    kind = "flow"
    packed = True
    embedded_guidance = 3.5  # FluxPipeline's default guidance_scale

    @property
    def network(self):
        return self.pipe.transformer

    def default_size(self) -> tuple[int, int]:
        size = int(self.pipe.default_sample_size) * self.pipe.vae_scale_factor
        return size, size

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2

    def latent_channels(self) -> int:
        return int(self.pipe.transformer.config.in_channels) // 4

    def encode(self, prompts, negatives, height, width, embedded_guidance=None, max_sequence_length=None):
        b = len(prompts)
        seq = {"max_sequence_length": max_sequence_length or 512}  # the FLUX pipeline's default
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
        emb = cond["prompt_embeds"]
        txt_ids = torch.zeros(emb.shape[1], 3, device=emb.device, dtype=emb.dtype)  # as encode_prompt makes them
        guidance = cond["guidance"].float() if "guidance" in cond else None
        return transformer(hidden_states=x, timestep=t, guidance=guidance, encoder_hidden_states=emb,
                           pooled_projections=cond["pooled_projections"], txt_ids=txt_ids, img_ids=cond["img_ids"][0],
                           return_dict=False)[0]

    def denoiser(self, null_for):
        net = _Net(self.network, self.call, null_for)
        return FlowDenoiser(net, prediction="velocity", t_scale=1.0)

    def integral_timesteps(self) -> bool:
        return False

    def pack(self, z: Tensor) -> Tensor:
        b, c, h, w = z.shape
        return z.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)

    def unpack(self, z: Tensor, height: int, width: int) -> Tensor:
        b, _, d = z.shape
        f = self.size_multiple()
        h, w = height // f, width // f
        return z.reshape(b, h, w, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, d // 4, 2 * h, 2 * w)


def family_of(pipe: Any) -> Family:
    """The family of a diffusers pipeline object, or a ValueError naming its class and the supported ones."""
    import diffusers

    classes = [(getattr(diffusers, "FluxPipeline", None), Flux),
               (getattr(diffusers, "StableDiffusionXLPipeline", None), StableDiffusionXL),
               (getattr(diffusers, "StableDiffusion3Pipeline", None), StableDiffusion3),
               (getattr(diffusers, "StableDiffusionPipeline", None), StableDiffusion)]
    for cls, family in classes:
        if cls is not None and type(pipe) is cls:
            return family(pipe)
    raise ValueError(f"unsupported pipeline class {type(pipe).__name__}: sd.pipelines.from_diffusers supports "
                     f"{list(SUPPORTED)}")
