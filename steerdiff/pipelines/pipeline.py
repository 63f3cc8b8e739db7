"""A diffusers text-to-image pipeline in steerdiff's one convention (docs/methods/pipelines.md).

:func:`from_diffusers` wraps a ``StableDiffusionPipeline`` (SD 1.x / 2.x), ``StableDiffusionXLPipeline``,
``StableDiffusion3Pipeline`` or ``FluxPipeline`` as a :class:`Pipeline`: prompts become a structured condition
(:class:`~steerdiff.pipelines.TextCond`), the latent network a denoiser ``D(z, sigma, cond)``, the scheduler a
sigma schedule, and ``__call__`` runs :func:`steerdiff.sample` with any steerdiff sampler and guider. With the
defaults (the sampler equivalent to the pipeline's scheduler, CFG at diffusers' ``guidance_scale``) it computes what
the diffusers pipeline computes, from the same initial latents (docs/methods/pipelines.md, "Schedules, samplers and
guidance"). CFG (Ho & Salimans, NeurIPS 2021 Workshop on Deep Generative Models, "Classifier-Free Diffusion
Guidance") is :class:`steerdiff.guidance.CFG`, and any registered guider replaces it (``guidance=``); what differs
between pipelines comes from the family (:mod:`steerdiff.pipelines.families`, docs/methods/pipelines.md,
"Families").
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core import SAMPLERS
from ..core.dpm_solver import dpmpp_2m_sde_step
from ..core.sampling import ancestral_split, sample
from ..guidance import CFG, CFGRescale
from .conditions import TextCond
from .families import SCHEDULER_METHODS, Family, family_of
from .families.base import SIGMA_SPACE_SCHEDULERS, placement
from .image_inputs import check_text_to_image
from .image_inputs import prepare as prepare_image_start

__all__ = ["SCHEDULER_METHODS", "Pipeline", "PipelineOutput", "from_diffusers"]

# Scheduler options that change the timestep / sigma grid away from the one converted here.
_GRID_OPTIONS = ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "use_lu_lambdas",
                 "use_flow_sigmas", "shift_terminal", "invert_sigmas", "stochastic_sampling")
_OUTPUT_TYPES = ("pil", "pt", "np", "latent")
# Keyword arguments of steerdiff.sample that __call__ passes through to it (the samplers' own options too).
_SAMPLE_OPTIONS = ("progress", "eta", "enable_grad", "allow_out_of_range", "x0_corrector")
# Arguments refused by name, with the reason (internal arguments of steerdiff.sample that __call__ sets itself,
# and diffusers arguments with no equivalent here).
_REFUSED = {
    "callback": "it is diffusers' deprecated per-step callback (and steerdiff.sample's own); pass "
                "callback_on_step_end=fn(pipe, i, t, callback_kwargs), as diffusers does",
    "callback_steps": "it belongs to diffusers' deprecated callback=; pass callback_on_step_end",
    "masked_image_latents": "pass image= and mask_image= (the pipeline encodes the masked image itself, for "
                            "inpainting networks that take it)",
    "padding_mask_crop": "crop and resize the image and mask before the call",
    "x_start": "pass image= (and strength=), diffusers' image-to-image arguments",
    "return_stats": "the pipeline always returns its stats (PipelineOutput.nfe)",
    "cond": "the pipeline builds the condition from prompt / prompt_embeds",
}
_CALLBACK_TENSOR_INPUTS = ("latents",)


@dataclass
class PipelineOutput:
    """What :meth:`Pipeline.__call__` returns: ``images`` (PIL images, a tensor ``[B, 3, H, W]`` in [0, 1], an array
    ``[B, H, W, 3]`` in [0, 1], or latents ``[B, C, h, w]``), ``nfe`` (network evaluations per sample; a CFG step
    costs 2) and the final ``latents`` (in the diffusers pipeline's latent units, before ``decode``)."""

    images: Any
    nfe: float
    latents: Tensor


class Pipeline:
    """A text-to-image pipeline over one denoiser ``D(z, sigma, cond)`` (build it with :func:`from_diffusers`).

    Attributes:
        pipe: the wrapped diffusers pipeline.
        family: the registered family's name (``"sd"``, ``"sdxl"``, ``"sd3"``, ``"flux"``, or one registered with
            :func:`~steerdiff.pipelines.register_family`).
        denoiser: the latent denoiser in the one convention (``z = z0 + sigma * eps`` in the VAE's scaled latent
            units), taking ``cond`` = a :class:`TextCond` from :meth:`encode` (None: the empty prompt's null).
    """

    def __init__(self, pipe: Any, family: Family):
        self.pipe = pipe
        self._family = family
        self.family = family.name
        self.denoiser = family.denoiser(self._null_for)
        self._progress = True  # a progress bar by default, as diffusers (set_progress_bar_config(disable=True))

    @property
    def network(self) -> torch.nn.Module:
        """The latent network (the UNet or transformer) that :attr:`denoiser` calls."""
        return self._family.network

    def calibration_inputs(self, prompts: str | list[str], num_inference_steps: int = 8,
                           generator: torch.Generator | list[torch.Generator] | None = None,
                           **call_options) -> list[dict]:
        """The network's own inputs over sampling runs, for post-training quantization of :attr:`network`.

        Runs :meth:`__call__` on ``prompts`` (``call_options`` as there: ``guidance_scale``, ``method``, ...) and
        records every call of the network as its keyword arguments (``sample`` / ``hidden_states``, ``timestep``,
        the text embeddings, ...), the calibration list :func:`steerdiff.quant.quantize` takes for a bare module:
        ``sd.quant.quantize(p.network, "svdquant", calib=p.calibration_inputs([...]), inplace=True)`` quantizes the
        network inside the pipeline (docs/methods/pipelines.md, "Methods on a pipeline": "SVDQuant of the network").
        """
        network = self.network
        names = tuple(self._family.calibration_args)
        items: list[dict] = []

        def record(module, args, kwargs):
            item = {**dict(zip(names, args, strict=False)), **kwargs}
            if len(args) > len(names):
                raise RuntimeError(f"{type(module).__name__} was called with {len(args)} positional arguments; "
                                   "calibration_inputs records keyword calls only")
            items.append({k: (v.detach().clone() if isinstance(v, Tensor) else v) for k, v in item.items()})

        handle = network.register_forward_pre_hook(record, with_kwargs=True)
        try:
            self(prompts, num_inference_steps=num_inference_steps, generator=generator, output_type="latent",
                 **call_options)
        finally:
            handle.remove()
        return items

    # --- conditions -----------------------------------------------------------------------------------------
    def _size(self, height: int | None, width: int | None) -> tuple[int, int]:
        dh, dw = self._family.default_size()
        h, w = dh if height is None else height, dw if width is None else width
        m = self._family.size_multiple()
        for name, v in (("height", h), ("width", w)):
            if isinstance(v, bool) or not isinstance(v, int) or v < m or v % m:
                raise ValueError(f"{name} must be a positive multiple of {m} (pixels) for this pipeline, got {v!r}")
        return h, w

    def encode(self, prompts: str | list[str], negative_prompts: str | list[str] | None = None,
               height: int | None = None, width: int | None = None,
               embedded_guidance: float | None = None, max_sequence_length: int | None = None) -> TextCond:
        """Encode prompts with all the pipeline's text encoders, as its ``__call__`` does.

        Args:
            prompts: one prompt or a list of ``B`` prompts (one row each).
            negative_prompts: None (the empty prompt; SDXL with ``force_zeros_for_empty_prompt``: zero
                embeddings, as the pipeline does), one prompt for every row, or a list of ``B``.
            height, width: image size in pixels (SDXL's ``time_ids``, FLUX's latent token ids); default the
                pipeline's.
            embedded_guidance: FLUX with a guidance-distilled transformer only: the guidance value it embeds (the
                FLUX pipeline's ``guidance_scale``; default 3.5).
            max_sequence_length: SD3 / FLUX only: T5's token count (default the pipeline's, 256 / 512).

        Returns:
            A :class:`TextCond` of ``B`` rows whose ``null`` is the negative prompts' encoding.
        """
        prompts = _prompt_list(prompts, "prompts")
        negatives = None if negative_prompts is None else _prompt_list(negative_prompts, "negative_prompts")
        if negatives is not None and len(negatives) == 1 and len(prompts) > 1:
            negatives = negatives * len(prompts)
        if negatives is not None and len(negatives) != len(prompts):
            raise ValueError(f"negative_prompts has {len(negatives)} entries but prompts has {len(prompts)}: give one "
                             "negative prompt, or one per prompt")
        if embedded_guidance is not None and self._family.embedded_guidance is None:
            raise ValueError(f"embedded_guidance applies to guidance-distilled FLUX pipelines only, not {self.family}")
        if max_sequence_length is not None:
            if self._family.max_sequence_length is None:
                raise ValueError(f"max_sequence_length applies to SD3 and FLUX pipelines (families with a T5 encoder) "
                                 f"only, not {self.family}")
            if isinstance(max_sequence_length, bool) or not isinstance(max_sequence_length, int) or \
                    max_sequence_length < 1:
                raise ValueError(f"max_sequence_length must be a positive integer, got {max_sequence_length!r}")
        h, w = self._size(height, width)
        with torch.no_grad():
            return self._family.encode(prompts, negatives, h, w, embedded_guidance, max_sequence_length)

    def _null_for(self, batch: int) -> TextCond:
        return self.encode([""] * batch).null_like()

    # --- latents and images ---------------------------------------------------------------------------------
    def latent_shape(self, height: int | None = None, width: int | None = None) -> tuple[int, int, int]:
        """Per-sample latent shape ``(C, h, w)`` for an image of ``height x width`` pixels (default the pipeline's);
        FLUX's packed tokens: ``((h / 2) (w / 2), 4 C)``."""
        h, w = self._size(height, width)
        channels = int(self._family.network.config.in_channels if self._family.packed else
                       self.pipe.vae.config.latent_channels)  # an inpainting UNet takes more (image_inputs.py)
        if self._family.packed:
            f = self._family.size_multiple()
            return ((h // f) * (w // f), channels)
        f = self.pipe.vae_scale_factor
        return (channels, h // f, w // f)

    def _packed_size(self, z: Tensor, height: int | None, width: int | None) -> tuple[int, int]:
        if height is None and width is None:
            side = math.isqrt(z.shape[1])
            if side * side != z.shape[1]:
                raise ValueError(f"packed latents of {z.shape[1]} tokens are not square: pass height= and width=")
            height = width = side * self._family.size_multiple()
        h, w = self._size(height, width)
        if self.latent_shape(h, w) != tuple(z.shape[1:]):
            raise ValueError(f"z has shape {tuple(z.shape)} but a {h}x{w} image has latents [B, "
                             f"{', '.join(map(str, self.latent_shape(h, w)))}]")
        return h, w

    def _vae_factors(self) -> tuple[float, float]:
        config = self.pipe.vae.config
        shift = config.get("shift_factor", None)
        return float(config.scaling_factor), 0.0 if shift is None else float(shift)

    def decode(self, z: Tensor, height: int | None = None, width: int | None = None, grad: bool = False) -> Tensor:
        """Images ``[B, 3, H, W]`` in [-1, 1] (clamped) from latents ``z`` (the VAE decoder at
        ``z / scaling_factor + shift_factor``, as the pipelines decode). FLUX's packed latents are unpacked first
        (``height``, ``width``: the image size; default square). ``grad=True`` keeps the autograd graph through the
        decoder (rewards and measurement operators on decoded images: :mod:`steerdiff.pipelines.methods`).

        The VAE decodes on its device in its dtype; a float16 VAE whose config sets ``force_upcast`` decodes in
        float32 where the diffusers pipeline does so (SDXL), from float32 copies of its decoder weights, leaving
        the VAE itself in float16 (docs/methods/pipelines.md, "Device and dtype"). The images come back in float32
        (or the VAE's dtype when wider), on the VAE's device."""
        ndim = 3 if self._family.packed else 4
        if not isinstance(z, Tensor) or z.ndim != ndim:
            form = "[B, seq, 4 C] (packed)" if self._family.packed else "[B, C, h, w]"
            raise ValueError(f"z must be a latent tensor {form}, got {getattr(z, 'shape', type(z).__name__)}")
        if self._family.packed:
            z = self._family.unpack(z, *self._packed_size(z, height, width))
        scale, shift = self._vae_factors()
        vae = self.pipe.vae
        device, vae_dtype = placement(vae)
        upcast = self._family.upcast_vae and vae_dtype == torch.float16 and bool(vae.config.get("force_upcast", False))
        z = z / scale + shift
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            if upcast:
                x = _decode_float32(vae, z.to(device=device, dtype=torch.float32))
            else:
                x = vae.decode(z.to(device=device, dtype=vae_dtype), return_dict=False)[0]
        return x.to(torch.promote_types(x.dtype, torch.float32)).clamp(-1, 1)

    def encode_images(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Latents ``z = (E(x) - shift_factor) * scaling_factor`` of images ``x [B, 3, H, W]`` in [-1, 1]: the mean
        of the VAE posterior, or a draw from it with ``generator``."""
        if not isinstance(x, Tensor) or x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"x must be images [B, 3, H, W] in [-1, 1], got {getattr(x, 'shape', type(x).__name__)}")
        scale, shift = self._vae_factors()
        vae = self.pipe.vae
        device, vae_dtype = placement(vae)  # encoded where the VAE is, in its dtype; returned on x's device
        with torch.no_grad():
            dist = vae.encode(x.to(device=device, dtype=vae_dtype)).latent_dist
            z = dist.mean if generator is None else dist.sample(generator)
        z = ((z.float() - shift) * scale).to(device=x.device, dtype=x.dtype)
        return self._family.pack(z) if self._family.packed else z

    # --- schedule -------------------------------------------------------------------------------------------
    def default_sigmas(self, steps: int, height: int | None = None, width: int | None = None) -> Tensor:
        """The sigmas the pipeline's own scheduler uses for ``steps`` steps (float64 ``[steps + 1]``, ending in 0).

        The family's grid (:meth:`Family.default_sigmas <steerdiff.pipelines.Family.default_sigmas>`). VP
        schedulers: the scheduler's timesteps (``set_timesteps(steps)`` on a copy) converted through its
        ``alphas_cumprod``, ``sigma = sqrt((1 - abar) / abar)`` (an Euler scheduler's own sigmas, which are those).
        Flow schedulers: :func:`steerdiff.sigmas.flow` with the scheduler's ``shift``, or its dynamic shift from the
        image's token count (``height``, ``width``).
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        scheduler = self.pipe.scheduler
        config = scheduler.config
        for option in _GRID_OPTIONS:
            if config.get(option, None):
                raise ValueError(f"the pipeline's scheduler sets {option}={config.get(option)!r}, whose grid "
                                 "default_sigmas does not convert; pass sigmas explicitly (sd.sigmas)")
        return self._family.default_sigmas(self, steps, height, width)

    def _final_sigma(self) -> float:
        """DDIM with ``set_alpha_to_one=False`` and DPM-Solver with ``final_sigmas_type="sigma_min"`` end their last
        step at ``alphas_cumprod[0]``, not at the data."""
        scheduler = self.pipe.scheduler
        name = type(scheduler).__name__
        if (name == "DDIMScheduler" and not scheduler.config.set_alpha_to_one) or (
                name == "DPMSolverMultistepScheduler" and scheduler.config.get("final_sigmas_type") == "sigma_min"):
            return float(self.denoiser.sigmas[0])
        return 0.0

    def _final_second_order(self, steps: int) -> bool:
        """Whether DPM-Solver's last step (to sigma_min) is multistep: not with ``euler_at_final``, nor with
        ``lower_order_final`` below 15 steps (diffusers' rule), nor at ``solver_order=1``."""
        scheduler = self.pipe.scheduler
        if type(scheduler).__name__ != "DPMSolverMultistepScheduler":
            return False
        config = scheduler.config
        return int(config.solver_order) >= 2 and not config.euler_at_final and not (
            config.lower_order_final and steps < 15)

    def _initial_noise(self, latents: Tensor, sigmas: Tensor) -> Tensor:
        """Unit noise for :func:`steerdiff.sample` from diffusers-convention initial ``latents``.

        diffusers multiplies the latents by ``init_noise_sigma``; a VP-space scheduler (DDIM, DDPM, DPM-Solver,
        UniPC: ``init_noise_sigma = 1``) then holds ``x_vp = x / sqrt(1 + sigma_0^2)``; a sigma-space scheduler
        (Euler, Euler ancestral, LMS, Heun: ``SIGMA_SPACE_SCHEDULERS``) holds ``x`` itself, with
        ``init_noise_sigma = sqrt(1 + sigma_0^2)`` (leading spacing: the same state) or ``sigma_0`` (linspace,
        trailing); a flow scheduler holds ``x_t`` at ``t = 1`` (the unit noise, sigma = inf).
        """
        s0 = float(sigmas[0])
        if math.isinf(s0):
            return latents
        sch = self.pipe.scheduler
        if type(sch).__name__ in SIGMA_SPACE_SCHEDULERS and \
                sch.config.get("timestep_spacing", "linspace") in ("linspace", "trailing"):
            return latents  # init_noise_sigma = sigma_max: the state is sigma_0 * latents
        return latents * (math.sqrt(1.0 + s0 * s0) / s0)  # leading: init_noise_sigma = sqrt(1 + sigma_0^2)

    def scheduler_method(self, steps: int | None = None) -> str | None:
        """The steerdiff sampler equivalent to the pipeline's scheduler (the family's ``schedulers``, with the
        scheduler's options: :meth:`scheduler_options`) for ``steps`` steps (default the family's), or None.

        Raises:
            ValueError: the scheduler sets an option with no steerdiff equivalent (naming it).
        """
        plan = self._family.scheduler_plan(self._family.default_steps if steps is None else steps)
        return None if plan is None else plan[0]

    def scheduler_options(self, steps: int | None = None) -> dict[str, Any]:
        """The sampler options that make :meth:`scheduler_method` compute what the scheduler computes (DPM-Solver's
        ``solver_type``, UniPC's ``variant`` and ``order``, an SDE solver's ``eta``, ...); ``method=None`` in
        :meth:`__call__` uses them (a sampler option passed to the call replaces its entry)."""
        plan = self._family.scheduler_plan(self._family.default_steps if steps is None else steps)
        return {} if plan is None else dict(plan[1])

    def set_progress_bar_config(self, **kwargs) -> None:
        """As diffusers' ``set_progress_bar_config``: ``disable=True`` hides the per-step progress bar that
        :meth:`__call__` shows by default (``progress=`` in a call overrides it). Other tqdm options are refused by
        name (the bar is steerdiff's sampler's)."""
        unknown = sorted(set(kwargs) - {"disable"})
        if unknown:
            raise TypeError(f"set_progress_bar_config of steerdiff's Pipeline ({self.family}) takes disable= only, "
                            f"got {unknown}")
        if "disable" in kwargs:
            if not isinstance(kwargs["disable"], bool):
                raise TypeError(f"disable must be True or False, got {kwargs['disable']!r}")
            self._progress = not kwargs["disable"]

    def _check_options(self, options: dict) -> None:
        """Refuse, by name, what ``__call__`` does not take: internal arguments, diffusers arguments without an
        equivalent (naming the diffusers pipeline), and unknown names."""
        sampler_options = {o for _, spec in SAMPLERS.items() for o in spec.options}
        theirs = set(inspect.signature(type(self.pipe).__call__).parameters) - {"self", "kwargs"}
        cls = type(self.pipe).__name__
        for name in options:
            if name in _REFUSED:
                raise TypeError(f"{name}= is not supported by steerdiff's Pipeline ({self.family}, {cls}): "
                                f"{_REFUSED[name]}")
            if name in _SAMPLE_OPTIONS or name in sampler_options:
                continue
            if name in theirs:
                raise TypeError(f"{name}= (an argument of diffusers' {cls}) is not supported by steerdiff's "
                                f"Pipeline ({self.family})")
            raise TypeError(f"steerdiff's Pipeline ({self.family}) got an unexpected keyword argument {name!r}; it "
                            "takes diffusers' arguments (prompt, negative_prompt, num_inference_steps, "
                            "guidance_scale, num_images_per_prompt, guidance_rescale, prompt_embeds, "
                            "negative_prompt_embeds, latents, generator, output_type, callback_on_step_end, ...), "
                            "steerdiff's (guidance, method, sigmas) and the sampler's options "
                            f"{sorted(set(_SAMPLE_OPTIONS) | sampler_options)}")

    def _text_cond(self, prompt, negative_prompt, prompt_embeds, negative_prompt_embeds, n: int, h: int, w: int,
                   embedded, max_sequence_length) -> TextCond:
        """The condition of ``B * n`` rows (each prompt's row repeated ``n`` times, as diffusers'
        ``num_images_per_prompt`` orders them), from prompts or from ``prompt_embeds``."""
        if prompt_embeds is None:
            if negative_prompt_embeds is not None:
                raise ValueError("negative_prompt_embeds needs prompt_embeds (with prompts, pass negative_prompt)")
            if prompt is None:
                raise ValueError("pass prompt (a string or a list of strings) or prompt_embeds")
            prompts = _prompt_list(prompt, "prompt")
            negatives = None if negative_prompt is None else _prompt_list(negative_prompt, "negative_prompt")
            if negatives is not None and len(negatives) == 1 and len(prompts) > 1:
                negatives = negatives * len(prompts)
            if negatives is not None and len(negatives) != len(prompts):
                raise ValueError(f"negative_prompt has {len(negatives)} entries but prompt has {len(prompts)}: give "
                                 "one negative prompt, or one per prompt")
            if n > 1:
                prompts = [p for p in prompts for _ in range(n)]
                negatives = None if negatives is None else [p for p in negatives for _ in range(n)]
            return self.encode(prompts, negatives, h, w, embedded, max_sequence_length)
        if prompt is not None:
            raise ValueError("pass prompt or prompt_embeds, not both (as in diffusers)")
        if self._family.name != "sd":
            raise TypeError(f"prompt_embeds= is supported by steerdiff's Pipeline for the sd family only (the CLIP "
                            f"hidden states); {self.family} needs more fields: pass prompt=")
        pos = _embeds(prompt_embeds, "prompt_embeds")
        if negative_prompt_embeds is not None:
            if negative_prompt is not None:
                raise ValueError("pass negative_prompt or negative_prompt_embeds, not both (as in diffusers)")
            neg = _embeds(negative_prompt_embeds, "negative_prompt_embeds")
            if neg.shape != pos.shape:
                raise ValueError(f"negative_prompt_embeds has shape {tuple(neg.shape)} but prompt_embeds has "
                                 f"{tuple(pos.shape)}")
        else:
            negatives = [""] * pos.shape[0] if negative_prompt is None else _prompt_list(negative_prompt,
                                                                                         "negative_prompt")
            if len(negatives) == 1:
                negatives = negatives * pos.shape[0]
            if len(negatives) != pos.shape[0]:
                raise ValueError(f"negative_prompt has {len(negatives)} entries but prompt_embeds has "
                                 f"{pos.shape[0]} rows")
            neg = self.encode(negatives, None, h, w)["prompt_embeds"]
            if neg.shape != pos.shape:
                raise ValueError(f"prompt_embeds must have the text encoder's shape [B, {neg.shape[1]}, "
                                 f"{neg.shape[2]}], got {tuple(pos.shape)}")
        neg = neg.to(device=pos.device, dtype=pos.dtype)
        if n > 1:
            pos, neg = pos.repeat_interleave(n, 0), neg.repeat_interleave(n, 0)
        return TextCond({"prompt_embeds": pos}, TextCond({"prompt_embeds": neg}))

    def _timesteps(self, sig: list[float]) -> Tensor:
        """diffusers' timestep of each step's level (what its ``callback_on_step_end`` receives as ``t``)."""
        levels = torch.tensor(sig[:-1], dtype=torch.float64)
        if self._family.kind == "flow":
            t = torch.where(torch.isinf(levels), torch.ones_like(levels), levels / (1 + levels))
            return (t * 1000.0).float()
        return self.denoiser.sigma_to_t(levels).float()

    def _diffusers_latents(self, x: Tensor, s: float) -> Tensor:
        """A state ``x`` at level ``s`` in the diffusers scheduler's latent units (see :meth:`_initial_noise`)."""
        if s == 0.0 or (self._family.kind == "flow" and math.isinf(s)):
            return x
        if self._family.kind == "flow":
            return x / (1.0 + s)
        if type(self.pipe.scheduler).__name__ in SIGMA_SPACE_SCHEDULERS:
            return x
        return x / math.sqrt(1.0 + s * s)

    # --- sampling -------------------------------------------------------------------------------------------
    def __call__(
        self,
        prompt: str | list[str] | None = None,
        negative_prompt: str | list[str] | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        guidance: object | None = None,
        method: str | None = None,
        height: int | None = None,
        width: int | None = None,
        latents: Tensor | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        output_type: str = "pil",
        sigmas: Tensor | None = None,
        max_sequence_length: int | None = None,
        num_images_per_prompt: int = 1,
        guidance_rescale: float = 0.0,
        prompt_embeds: Tensor | None = None,
        negative_prompt_embeds: Tensor | None = None,
        callback_on_step_end: Any = None,
        callback_on_step_end_tensor_inputs: list[str] | tuple[str, ...] = ("latents",),
        return_dict: bool = True,
        image: Any = None,
        strength: float | None = None,
        mask_image: Any = None,
        **options,
    ) -> PipelineOutput:
        """Text to image (image-to-image, inpainting), as the diffusers pipeline's ``__call__`` with the same arguments
        computes it (its image-to-image and inpainting pipelines' for ``image=`` / ``mask_image=``).

        diffusers' arguments keep diffusers' meaning; one this pipeline does not support raises a TypeError naming
        it and the pipeline (docs/methods/pipelines.md, "Schedules, samplers and guidance").

        Args:
            prompt, negative_prompt: as :meth:`encode`.
            num_inference_steps: steps of :meth:`default_sigmas` (ignored when ``sigmas`` is given); None: the
                diffusers pipeline's default (the family's ``default_steps``: 50 for SD and SDXL, 28 for SD3 and
                FLUX).
            guidance_scale: None: the diffusers pipeline's default (the family's ``default_guidance_scale``: SD
                7.5, SDXL 5.0, SD3 7.0, FLUX 3.5); otherwise CFG in diffusers' convention ``u + s (c - u)``
                (steerdiff's ``w = s``), a finite number ``>= 0``; as in diffusers, ``s <= 1`` (0 and 1 included)
                runs the conditional model alone (one evaluation per step): diffusers' ``guidance_scale`` never
                means the unconditional model (use ``guidance=sd.guidance.CFG(0.0)`` for that). FLUX: as in its
                pipeline, the guidance value a guidance-distilled transformer embeds (not CFG; 3.5 by default).
            guidance: any steerdiff guider or combiner instead (then ``guidance_scale`` is not used).
            method: a steerdiff sampler; None the one equivalent to the pipeline's scheduler and its options
                (:meth:`scheduler_method`, :meth:`scheduler_options`), or a ValueError naming the scheduler option
                that has no steerdiff equivalent.
            height, width: image size in pixels (default the pipeline's).
            latents: initial latents ``[B n, C, h, w]`` in diffusers' convention (what its ``latents=`` takes: unit
                noise, scaled by the scheduler's ``init_noise_sigma`` there); default drawn from ``generator``.
            generator: a ``torch.Generator`` (or a list of one per image) for the initial latents and stochastic
                samplers.
            output_type: ``"pil"``, ``"pt"`` (a tensor ``[B, 3, H, W]`` in [0, 1], as diffusers), ``"np"`` (an
                array ``[B, H, W, 3]`` in [0, 1], as diffusers) or ``"latent"``.
            sigmas: a schedule to use instead of :meth:`default_sigmas`.
            max_sequence_length: as :meth:`encode`.
            num_images_per_prompt: ``n`` images per prompt, each prompt's ``n`` rows together (diffusers' order).
            guidance_rescale: diffusers' ``guidance_rescale`` (Lin et al., WACV 2024, "Common Diffusion Noise
                Schedules and Sample Steps are Flawed", Sec. 3.4): ``phi`` in [0, 1] of
                :class:`~steerdiff.guidance.CFGRescale` in eps space, applied when ``guidance_scale > 1``; SD and
                SDXL with an epsilon-predicting network.
            prompt_embeds, negative_prompt_embeds: SD only: the CLIP hidden states ``[B, seq, dim]`` instead of
                prompts (the negative: of ``negative_prompt``, or of the empty prompt, when not given).
            callback_on_step_end: ``fn(pipeline, i, t, callback_kwargs) -> dict`` after every step ``i``, with
                diffusers' timestep ``t`` and ``callback_kwargs["latents"]`` the state after the step in the
                scheduler's latent units; the returned dict may not replace ``latents`` (the sampler owns its state).
            callback_on_step_end_tensor_inputs: ``["latents"]`` (the one supported).
            return_dict: True (a :class:`PipelineOutput`) or False (the tuple ``(images,)``, as diffusers).
            image, strength: image-to-image as the family's diffusers image-to-image pipeline
                (``StableDiffusionImg2ImgPipeline``, ``StableDiffusionXLImg2ImgPipeline``,
                ``StableDiffusion3Img2ImgPipeline``, ``FluxImg2ImgPipeline``): the images (PIL, or a tensor
                ``[B, 3, H, W]`` in [0, 1]; what its ``image_processor`` takes) are encoded (a draw from the VAE
                posterior with ``generator``), noised to the level where the last part of the schedule begins
                (SDEdit; Meng et al., ICLR 2022) and denoised from there; ``strength`` in (0, 1], its default and
                step-count rule those of the diffusers pipeline (:data:`steerdiff.pipelines.image_inputs.RULES`).
                ``latents`` is not taken then.
            mask_image: inpainting as the family's diffusers inpainting pipeline: masks (PIL, or a tensor ``[B, 1,
                H, W]`` in [0, 1], 1 where to repaint; binarized at 0.5) with ``image``; after every step the state
                outside the mask is replaced by the image's latents at the next level
                (:class:`~steerdiff.pipelines.image_inputs.InpaintBlend`, any sampler); a network that takes the mask
                and the masked image's latents as extra input channels (SD / SDXL inpainting UNets) gets them
                instead.
            **options: the sampler's options (``solver_type=``, ``order=``, ``eta=``, ...) and ``progress=`` (the
                bar; default on, :meth:`set_progress_bar_config`).

        Returns:
            A :class:`PipelineOutput` with ``.images``, ``.nfe`` and ``.latents``.
        """
        self._check_options(options)
        if output_type not in _OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {list(_OUTPUT_TYPES)}, got {output_type!r}")
        if not isinstance(return_dict, bool):
            raise TypeError(f"return_dict must be True or False, got {return_dict!r}")
        if guidance_scale is None:
            guidance_scale = self._family.default_guidance_scale
        if num_inference_steps is None:
            num_inference_steps = self._family.default_steps
        if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, numbers.Real) or \
                not math.isfinite(guidance_scale) or guidance_scale < 0:
            raise ValueError(f"guidance_scale must be a finite number >= 0 (diffusers' CFG scale; <= 1 runs the "
                             f"conditional model alone), got {guidance_scale!r}")
        steps = num_inference_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"num_inference_steps must be an integer >= 1, got {steps!r}")
        if sigmas is not None and not isinstance(sigmas, Tensor):
            try:
                sigmas = torch.as_tensor(sigmas, dtype=torch.float64)
            except (TypeError, ValueError, RuntimeError) as e:
                raise ValueError(f"sigmas must be a decreasing schedule of numbers ending in 0 (a tensor or a list), "
                                 f"got {type(sigmas).__name__}") from e
        n = num_images_per_prompt
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"num_images_per_prompt must be an integer >= 1, got {n!r}")
        _check_generator(generator)
        default_method = method is None
        if default_method:
            plan = self._family.scheduler_plan(steps if sigmas is None else None)  # sigmas=: the grid is the caller's
            if plan is None:
                raise ValueError(f"the pipeline's scheduler {type(self.pipe.scheduler).__name__} has no steerdiff "
                                 f"equivalent; pass method= or use one of {sorted(self._family.schedulers)}")
            method, planned = plan
            if "eta" in options and "eta" not in inspect.signature(type(self.pipe.scheduler).step).parameters:
                raise ValueError(f"eta= with method=None: the pipeline's {type(self.pipe.scheduler).__name__} takes "
                                 "no eta (diffusers ignores it there); pass method= to set a steerdiff sampler's eta")
            options = {**planned, **options}
        h, w = self._size(height, width)
        flux = self._family.embedded_guidance is not None
        rescale = self._rescale(guidance_rescale, guidance, flux)
        tensor_inputs = self._check_callback(callback_on_step_end, callback_on_step_end_tensor_inputs)
        embedded = guidance_scale if flux and self.pipe.transformer.config.guidance_embeds else None
        cond = self._text_cond(prompt, negative_prompt, prompt_embeds, negative_prompt_embeds, n, h, w, embedded,
                               max_sequence_length)
        b = cond.batch_size
        shape = (b, *self.latent_shape(h, w))
        sig = self.default_sigmas(num_inference_steps, h, w) if sigmas is None else sigmas
        # Device and dtype follow the network (docs/methods/pipelines.md, "Device and dtype"): the sampler's state
        # lives on its device in float32 (float64 for a float64 network); the condition is moved and cast once.
        device, net_dtype = placement(self.network)
        dtype = torch.promote_types(net_dtype, torch.float32)
        # diffusers draws the latents in the prompt embeddings' dtype
        draw_dtype = cond["prompt_embeds"].dtype if "prompt_embeds" in cond else net_dtype
        keep = self._family.keep_dtype
        if not cond.is_on(device, net_dtype, keep):
            cond = cond.to(device=device, dtype=net_dtype, keep=keep)
        start: dict = {}
        given = latents is not None  # the user's latents are checked; drawn ones are finite
        img = None
        if image is None and (strength is not None or mask_image is not None):
            raise ValueError(f"{'strength' if mask_image is None else 'mask_image'} applies with image= only "
                             "(diffusers' image-to-image and inpainting)")
        if image is None:
            check_text_to_image(self)
        else:  # docs/methods/pipelines.md, "Image-to-image and inpainting"
            img = prepare_image_start(self, image, mask_image, strength, latents, height, width, b, generator,
                                      torch.as_tensor(sig, dtype=torch.float64), _randn)
            if img.size != (h, w):  # image-to-image at the image's size: the condition's size too (SDXL's time ids)
                cond = self._text_cond(prompt, negative_prompt, prompt_embeds, negative_prompt_embeds, n, *img.size,
                                       embedded, max_sequence_length).to(device=device, dtype=net_dtype, keep=keep)
            (h, w), latents, sig, shape = img.size, img.noise, img.sigmas, tuple(img.noise.shape)
            if img.x_start is not None:
                start["x_start"] = img.x_start
            if img.channels is not None:  # an inpainting network's extra input channels, beside the text's fields
                cond = TextCond({**cond, "inpaint_channels": img.channels},
                                TextCond({**cond.null, "inpaint_channels": img.channels}))
            if img.blend is not None:  # the known region, blended after every step (any sampler)
                img.blend.inner = options.get("x0_corrector")
                options["x0_corrector"] = img.blend
        if latents is None and self._family.packed:
            # The FLUX pipeline draws the VAE-shaped latents, then packs them.
            f = self.pipe.vae_scale_factor
            latents = self._family.pack(_randn((b, self._family.latent_channels(), h // f, w // f), generator,
                                               draw_dtype, device))
        elif latents is None:
            latents = _randn(shape, generator, draw_dtype, device)
        elif not isinstance(latents, Tensor) or tuple(latents.shape) != shape:
            got = tuple(latents.shape) if isinstance(latents, Tensor) else type(latents).__name__
            raise ValueError(f"latents must be a tensor of shape {shape} (B = {b} images: prompts x "
                             f"num_images_per_prompt), got {got}")
        if given and img is None and not bool(torch.isfinite(latents).all()):  # once, before the loop
            raise ValueError("latents must be finite (diffusers' initial latents: unit noise), got NaN or inf")
        latents = latents.to(device=device, dtype=dtype)
        if "x_start" in start:
            start["x_start"] = start["x_start"].to(device=device, dtype=dtype)
        noise = latents if img is not None else self._initial_noise(latents, sig)
        if guidance is None and guidance_scale > 1 and not flux:
            # diffusers' u + s (c - u) is steerdiff's w = s
            guidance = CFG(guidance_scale) if rescale is None else CFGRescale(guidance_scale, phi=rescale, space="eps")
        final_sigma = self._final_sigma() if sigmas is None else 0.0
        last: dict = {}
        prev: dict = {}
        levels = torch.as_tensor(sig, dtype=torch.float64).tolist()  # host floats, once (a CPU schedule)
        blend = None if img is None else img.blend
        timesteps = self._timesteps(levels) if callback_on_step_end is not None else None

        def step_end(i: int, x: Tensor) -> None:
            kwargs = {"latents": x}
            out = callback_on_step_end(self, i, timesteps[i], {k: kwargs[k] for k in tensor_inputs})
            if out is not None and not isinstance(out, dict):
                raise TypeError(f"callback_on_step_end must return a dict (or None), got {type(out).__name__}")
            if out and "latents" in out and out["latents"] is not kwargs["latents"]:
                raise ValueError("callback_on_step_end returned new latents; steerdiff's Pipeline does not let the "
                                 "callback replace the sampler's state (return the dict it was given)")

        def on_step(info: dict) -> None:
            if final_sigma:
                prev.clear()
                prev.update(last)
                last.update(info)
            i = int(info["i"])
            if callback_on_step_end is not None and i > 0:  # the state before step i is the state after step i - 1
                step_end(i - 1, self._diffusers_latents(info["x"], levels[i]))

        hook = on_step if (final_sigma or callback_on_step_end is not None) else None
        options.setdefault("progress", self._progress)
        final_eta = _final_eta(method, options) if final_sigma else 0.0
        states = _generator_states(generator) if final_eta else None
        with self._family.placed(device, net_dtype):  # found once above, not at every step
            z, stats = sample(self.denoiser, noise, sig, method=method, cond=cond, guidance=guidance,
                              generator=generator, callback=hook, return_stats=True, **start, **options)
        if final_sigma:
            second = method in ("dpmpp_2m", "dpmpp_2m_sde") and self._final_second_order(len(levels) - 1)
            z = self._final_step(method, options, last, prev if second else {}, final_sigma, final_eta, generator,
                                 states, len(levels) - 1)
            z = z if blend is None else blend.project(z, 0.0, len(levels) - 1)  # diffusers blends after it
        z = z.detach()
        if callback_on_step_end is not None:
            step_end(len(levels) - 2, z)
        if output_type == "latent":
            images: Any = z
        else:
            images = self.decode(z, h, w)
            if output_type == "pil":
                images = _to_pil(images)
            else:  # diffusers' postprocess: x / 2 + 0.5, clamped to [0, 1]
                images = (images / 2 + 0.5).clamp(0, 1)
                if output_type == "np":
                    images = images.permute(0, 2, 3, 1).float().cpu().numpy()
        if not return_dict:
            return (images,)
        return PipelineOutput(images=images, nfe=stats.nfe, latents=z)

    @staticmethod
    def _final_step(method: str, options: dict, last: dict, prev: dict, final_sigma: float, eta: float,
                    generator: Any, states: list | None, steps: int) -> Tensor:
        """diffusers' DDIM with ``set_alpha_to_one=False`` and DPM-Solver with ``final_sigmas_type="sigma_min"``
        land at ``alphas_cumprod[0]`` (level ``sigma_f``), not at the data. The sampler ran to 0; this retakes its
        last step from the last level ``s`` to ``sigma_f`` and returns it in VP units ``x / sqrt(1 + sigma_f^2)``:
        DDIM's (Song et al., ICLR 2021, eq. 12) ``x = D + s_down eps + s_up z`` with the ``sigma_t(eta)`` split
        (:func:`ancestral_split`; ``ddpm``: ``eta = 1``, the posterior), or DPM-Solver++(2M)'s (SDE) step, second
        order from ``prev`` (the step before; empty: first order). ``z`` is diffusers' draw of that step: the
        ``steps``-th per-image draw of each generator of a list (the sampler drew the first ``steps - 1``), which
        leaves the generators where diffusers leaves them; one generator (or None) draws the batch after the run."""
        s = float(last["sigma"])
        x, d = last["x"], last["denoised"]
        draw = (lambda: _final_noise(x, generator, states, steps)) if eta else None
        if method in ("dpmpp_2m", "dpmpp_2m_sde"):
            old, h_last = None, math.nan
            if prev and not math.isinf(float(prev["sigma"])):
                old, h_last = prev["denoised"], math.log(float(prev["sigma"]) / s)
            out, _ = dpmpp_2m_sde_step(x, d, s, final_sigma, eta, _Drawn(draw), old, h_last,
                                       options.get("solver_type", "midpoint"))
        else:
            s_down, s_up = ancestral_split(s, final_sigma, eta)
            out = d + (x - d) * (s_down / s)
            if s_up > 0:
                out = out + draw() * s_up
        return out / math.sqrt(1.0 + final_sigma**2)

    def _rescale(self, guidance_rescale: Any, guidance: object | None, flux: bool) -> float | None:
        """diffusers' ``guidance_rescale`` as CFGRescale's ``phi``; None when 0."""
        if isinstance(guidance_rescale, bool) or not isinstance(guidance_rescale, numbers.Real) or \
                not 0.0 <= guidance_rescale <= 1.0:
            raise ValueError(f"guidance_rescale must be a number in [0, 1] (Lin et al.'s phi; 0 is plain CFG), got "
                             f"{guidance_rescale!r}")
        if guidance_rescale == 0:
            return None
        cls = type(self.pipe).__name__
        if flux or "guidance_rescale" not in inspect.signature(type(self.pipe).__call__).parameters:
            raise TypeError(f"guidance_rescale= (not an argument of diffusers' {cls}) is not supported by steerdiff's "
                            f"Pipeline ({self.family}); pass guidance=sd.guidance.CFGRescale(...)")
        if guidance is not None:
            raise ValueError("pass guidance_rescale or guidance=, not both (guidance= replaces diffusers' CFG)")
        if self.pipe.scheduler.config.prediction_type != "epsilon":
            raise ValueError(f"guidance_rescale on a {self.pipe.scheduler.config.prediction_type!r} pipeline: "
                             "diffusers rescales that prediction, steerdiff's CFGRescale rescales eps or D; pass "
                             "guidance=sd.guidance.CFGRescale(scale, phi, space=...) and say which")
        return float(guidance_rescale)

    def _check_callback(self, fn: Any, tensor_inputs: Any) -> tuple[str, ...]:
        if fn is None:
            return ()
        if not callable(fn):
            raise TypeError(f"callback_on_step_end must be callable fn(pipeline, i, t, callback_kwargs), got "
                            f"{type(fn).__name__}")
        if isinstance(tensor_inputs, str) or not isinstance(tensor_inputs, (list, tuple)) or \
                any(k not in _CALLBACK_TENSOR_INPUTS for k in tensor_inputs):
            raise ValueError(f"callback_on_step_end_tensor_inputs must be a list of names from "
                             f"{list(_CALLBACK_TENSOR_INPUTS)} (steerdiff's Pipeline ({self.family})), got "
                             f"{tensor_inputs!r}")
        return tuple(tensor_inputs)


def _embeds(v: Any, name: str) -> Tensor:
    if not isinstance(v, Tensor) or v.ndim != 3 or not v.is_floating_point() or v.shape[0] < 1:
        got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
        raise ValueError(f"{name} must be a float tensor [B, seq, dim] (the text encoder's hidden states), got {got}")
    return v


def _check_generator(generator: Any) -> None:
    ok = generator is None or isinstance(generator, torch.Generator) or (
        isinstance(generator, (list, tuple)) and len(generator) > 0
        and all(isinstance(g, torch.Generator) for g in generator))
    if not ok:
        raise TypeError(f"generator must be a torch.Generator, a list of one per image, or None, got "
                        f"{type(generator).__name__}")


def _prompt_list(prompts: Any, name: str) -> list[str]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, str) for p in prompts):
        return list(prompts)
    raise TypeError(f"{name} must be a string or a non-empty list of strings, got {type(prompts).__name__}")


def _randn(shape: tuple[int, ...], generator: Any, dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """diffusers' ``randn_tensor``: standard normals ``shape`` in ``dtype`` on ``device``, drawn where the generator
    is (a CPU generator: on the CPU, then moved; a CUDA one: on its device; none: on ``device``), one draw for the
    batch, or one per sample from a list of generators."""
    device = torch.device(device)
    if isinstance(generator, (list, tuple)):
        if len(generator) != shape[0]:
            raise ValueError(f"generator is a list of {len(generator)} but the batch has {shape[0]} images")
        rows = [torch.randn((1, *shape[1:]), generator=g, dtype=dtype, device=g.device) for g in generator]
        return torch.cat([r.to(device) for r in rows])
    where = device if generator is None else generator.device
    return torch.randn(shape, generator=generator, dtype=dtype, device=where).to(device)


class _Decoder(torch.nn.Module):
    """``vae.decode`` as a module's forward (for :func:`torch.func.functional_call`); ``vae`` is not changed."""

    def __init__(self, vae: torch.nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, z: Tensor) -> Tensor:
        return self.vae.decode(z, return_dict=False)[0]


def _decode_float32(vae: torch.nn.Module, z: Tensor) -> Tensor:
    """``vae.decode(z)`` with the decoder's weights in float32, what the SDXL pipeline gets by casting its float16
    VAE to float32 for the decode (``force_upcast``: the float16 decoder overflows) and back. Here the float32
    weights are temporary copies passed to :func:`torch.func.functional_call`: the user's VAE keeps its float16
    tensors (their storage and values) during and after the call."""
    upcast = {f"vae.{name}": v.float() for name, v in [*vae.named_parameters(), *vae.named_buffers()]
              if v.is_floating_point() and not name.startswith(("encoder.", "quant_conv."))}
    return torch.func.functional_call(_Decoder(vae), upcast, (z,), strict=False)


def _final_eta(method: str, options: dict) -> float:
    """The noise share of the sampler's step, for the last step to ``sigma_f`` (0: deterministic)."""
    if method in ("ddim", "ddpm", "dpmpp_2m_sde"):
        default = 0.0 if method == "ddim" else 1.0
        eta = options.get("eta")
        return default if eta is None or method == "ddpm" else float(eta)
    return 0.0


class _Drawn:
    """The noise of one step, drawn when the step asks for it (``randn_like``)."""

    def __init__(self, draw: Any):
        self.draw = draw

    def randn_like(self, x: Tensor) -> Tensor:
        return self.draw()


def _generator_states(generator: Any) -> list | None:
    """The states of a list of generators (before a stochastic run), to draw a later step's noise as diffusers
    does; None for one generator or none."""
    if isinstance(generator, (list, tuple)):
        return [g.get_state() for g in generator]
    return None


def _final_noise(x: Tensor, generator: Any, states: list | None, steps: int) -> Tensor:
    """The unit noise of the last of ``steps`` stochastic steps, each drawing ``[1, *x.shape[1:]]`` per image from
    its generator (diffusers' ``randn_tensor`` with a list; the sampler's per-row draws are the same stream):
    replayed from the ``states`` before the run, the generators left after the last draw."""
    if states is None:
        return torch.randn(x.shape, generator=generator, dtype=x.dtype, device="cpu").to(x.device)
    rows = []
    for g, state in zip(generator, states, strict=True):
        g.set_state(state)
        rows.append(torch.randn((steps, *x.shape[1:]), generator=g, dtype=x.dtype, device=g.device)[-1:])
    return torch.cat(rows).to(x.device)


def _to_pil(images: Tensor) -> list:
    from PIL import Image

    arr = ((images + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).mul(255).round().to(torch.uint8).cpu().numpy()
    return [Image.fromarray(a) for a in arr]


def from_diffusers(pipe: Any) -> Pipeline:
    """Wrap a diffusers text-to-image pipeline as a :class:`Pipeline`.

    Supported: the registered families (:data:`~steerdiff.pipelines.FAMILIES`): built in
    ``StableDiffusionPipeline`` (SD 1.x / 2.x), ``StableDiffusionXLPipeline``, ``StableDiffusion3Pipeline`` (with or
    without T5), ``FluxPipeline``; more with :func:`~steerdiff.pipelines.register_family`.

    The pipeline's modules are used as they are: nothing is moved or cast, so a pipeline loaded in float16 or
    bfloat16 (``torch_dtype=``) and moved to a GPU (``pipe.to("cuda")``) runs there in that dtype, with the memory
    the user gave it. Each call follows the network (docs/methods/pipelines.md, "Device and dtype"): the latents
    are drawn as diffusers' ``randn_tensor`` draws them (on the generator's device, in the prompt embeddings' dtype)
    and moved to the network's device; the sampler's state is float32 there (the schedule arithmetic in float32 /
    float64, what diffusers' schedulers upcast to in their steps); the network, text encoders and VAE run in their
    own dtypes (a float16 SDXL VAE with ``force_upcast`` decodes in float32, as the SDXL pipeline does, without
    being changed). Half precision on the CPU works where torch has the kernels (torch >= 2.1 for the built-in
    families' layers); a missing one raises naming the network and dtype.

    Raises:
        ImportError: diffusers is not installed.
        ValueError: an unsupported pipeline class (naming it and listing the supported ones), or a pipeline with a
            missing component (tokenizer, text encoder, VAE, network, scheduler).
    """
    try:
        import diffusers  # noqa: F401
    except ImportError as e:
        raise ImportError("sd.pipelines needs the optional dependency diffusers (and transformers): "
                          "pip install 'steerdiff[diffusers]' transformers") from e
    family = family_of(pipe)
    required = family.required
    missing = [c for c in required if getattr(pipe, c, None) is None]
    if missing:
        raise ValueError(f"{type(pipe).__name__} is missing {missing}: sd.pipelines.from_diffusers needs its "
                         f"components {list(required)}")
    return Pipeline(pipe, family)
