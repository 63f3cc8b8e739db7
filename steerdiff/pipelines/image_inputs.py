"""Image-to-image and inpainting for a :class:`~steerdiff.pipelines.Pipeline`, as diffusers' image-to-image and
inpainting pipelines compute them (docs/methods/pipelines.md, "Image-to-image and inpainting").

* Image-to-image is SDEdit (Meng et al., "SDEdit: Guided Image Synthesis and Editing with Stochastic Differential
  Equations", ICLR 2022, Sec. 3): the image's latents ``z0`` (a draw from the VAE posterior) are noised to the level
  where the last part of the schedule begins, ``z0 + sigma_start eps``, and denoised from there. In the one
  convention that is diffusers' ``scheduler.add_noise`` (VP: ``sqrt(abar) z0 + sqrt(1 - abar) eps``, divided by
  ``sqrt(abar)``) and FLUX / SD3's ``scheduler.scale_noise`` (flow: ``(1 - t) z0 + t eps``, divided by ``1 - t``)
  alike: :func:`steerdiff.sample`'s ``x_start``.
* Inpainting with a network that takes the latents alone (a 4-channel UNet, an SD3 / FLUX transformer) is the
  known-region replacement of diffusers' inpainting pipelines (the blend of Avrahami et al., "Blended Latent
  Diffusion", SIGGRAPH 2023, Sec. 3; RePaint's known part, Lugmayr et al., CVPR 2022, eq. 8, without resampling):
  after every step the state outside the mask is replaced by the image latents noised to the next level with the
  start's own noise, ``(1 - m) (z0 + sigma_next eps) + m x``, and after the last step by ``z0`` itself
  (:class:`InpaintBlend`, a state projection every steerdiff sampler applies: ``x0_corrector.project``,
  :func:`steerdiff.core.sampling.project_state`). The mask ``m`` (1: repaint) is diffusers' ``mask_processor``
  (grayscale, binarized at 0.5) downsampled to the latent grid by nearest-neighbour interpolation.
* Inpainting with an inpainting network (SD / SDXL inpainting UNets, ``2 C + 1`` input channels) has no blend: the
  mask and the masked image's latents are the network's extra input channels at every evaluation
  (``inpaint_channels``, a field of the condition that the family's network call appends).

What differs between diffusers' pipelines (default strength, the step-count rule, the size) is in :data:`RULES`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["RULES", "ImageRules", "ImageStart", "InpaintBlend", "prepare", "run_schedule"]


@dataclass(frozen=True)
class ImageRules:
    """How one family's diffusers image-to-image and inpainting pipelines differ.

    Attributes:
        img2img, inpaint: the diffusers pipeline classes (for messages).
        img2img_strength, inpaint_strength: their default ``strength``.
        fractional: the run's step count: ``steps - int(steps - steps * strength)`` (SD3, FLUX: ``get_timesteps``
            with a fractional ``init_timestep``) instead of ``int(steps * strength)`` (SD, SDXL).
        img2img_keeps_size: image-to-image keeps the image's size (SD, SDXL); otherwise the image is resized to
            ``height x width`` (default the pipeline's), as inpainting always is.
    """

    img2img: str
    inpaint: str
    img2img_strength: float
    inpaint_strength: float
    fractional: bool
    img2img_keeps_size: bool


RULES: dict[str, ImageRules] = {
    "sd": ImageRules("StableDiffusionImg2ImgPipeline", "StableDiffusionInpaintPipeline", 0.8, 1.0, False, True),
    "sdxl": ImageRules("StableDiffusionXLImg2ImgPipeline", "StableDiffusionXLInpaintPipeline", 0.3, 0.9999, False,
                       True),
    "sd3": ImageRules("StableDiffusion3Img2ImgPipeline", "StableDiffusion3InpaintPipeline", 0.6, 0.6, True, False),
    "flux": ImageRules("FluxImg2ImgPipeline", "FluxInpaintPipeline", 0.6, 0.6, True, False),
}
"""Per built-in family; a registered family without an entry follows ``sd`` (VP) or ``sd3`` (flow)."""


def rules_of(pipeline: Any) -> ImageRules:
    """The :class:`ImageRules` of ``pipeline``'s family."""
    return RULES.get(pipeline.family) or RULES["sd3" if pipeline._family.kind == "flow" else "sd"]


def check_strength(strength: Any) -> float:
    """``strength`` as a float in (0, 1], or a ValueError naming it."""
    if isinstance(strength, bool) or not isinstance(strength, numbers.Real) or not 0 < strength <= 1:
        raise ValueError(f"strength must be a number in (0, 1] (the share of the schedule to run), got {strength!r}")
    return float(strength)


def run_schedule(sigmas: Tensor, strength: float, fractional: bool) -> Tensor:
    """The part of ``sigmas`` (``steps + 1`` levels) a run at ``strength`` covers: the last ``int(steps * strength)``
    steps (diffusers' SD / SDXL ``get_timesteps``) or, ``fractional``, the steps from ``int(steps - steps *
    strength)`` on (its SD3 / FLUX ``get_timesteps``). Raises a ValueError naming ``strength`` when no step is left.
    """
    steps = len(sigmas) - 1
    if fractional:
        start = int(max(steps - min(steps * strength, steps), 0))
    else:
        start = steps - min(int(steps * strength), steps)
    if start >= steps:
        raise ValueError(f"strength={strength} runs no step of a {steps}-step schedule; raise strength or "
                         "num_inference_steps")
    return sigmas[start:]


class InpaintBlend:
    """The known-region replacement of diffusers' inpainting pipelines as a state projection (module docstring).

    An ``x0_corrector`` for :func:`steerdiff.sample` that leaves the denoised estimate alone (or hands it to
    ``inner``, a corrector of the caller's) and, through ``project(x, sigma, i)``, replaces the state outside the
    mask at the start of every step after the first and at the end: ``(1 - m) (z0 + sigma eps) + m x``, ``z0`` at
    ``sigma = 0``. ``mask``, ``image_latents`` and ``noise`` are in the state's layout (FLUX: packed), on its
    device; ``sigma`` and ``i`` are host numbers (no device read per step).
    """

    def __init__(self, mask: Tensor, image_latents: Tensor, noise: Tensor, inner: Any = None):
        self.mask = mask
        self.keep = 1 - mask
        self.image_latents = image_latents
        self.noise = noise
        self.inner = inner

    def begin(self, sigmas: list[float]) -> None:
        if callable(getattr(self.inner, "begin", None)):
            self.inner.begin(sigmas)

    def __call__(self, denoised: Tensor, x: Tensor, sigma: float, i: int) -> Tensor:
        return denoised if self.inner is None else self.inner(denoised, x, sigma, i)

    def target(self, sigma: float) -> Tensor:
        """The known region's state at level ``sigma``: ``z0 + sigma eps`` (``z0`` at 0)."""
        return self.image_latents if sigma == 0 else self.image_latents + sigma * self.noise

    def project(self, x: Tensor, sigma: float, i: int) -> Tensor:
        if i > 0 and not math.isinf(sigma):  # diffusers blends after each step, not before the first
            x = self.keep * self.target(sigma) + self.mask * x
        inner = getattr(self.inner, "project", None)
        return x if inner is None else inner(x, sigma, i)


@dataclass
class ImageStart:
    """What :func:`prepare` hands :meth:`Pipeline.__call__`: the image size, the unit noise for
    :func:`steerdiff.sample`, its ``x_start`` (None: a start from noise alone), the run's schedule and the inpainting
    blend (None for image-to-image)."""

    size: tuple[int, int]
    noise: Tensor
    x_start: Tensor | None
    sigmas: Tensor
    blend: InpaintBlend | None
    channels: Tensor | None = None  # an inpainting network's extra input: [mask, masked image latents] [B, 1 + C, h, w]


def _images(pipeline: Any, image: Any, size: tuple[int, int] | None) -> Tensor:
    """The images through the pipeline's own ``image_processor`` (``[n, 3, H, W]`` in [-1, 1])."""
    if isinstance(image, Tensor) and (image.ndim != 4 or image.shape[1] != 3 or not image.is_floating_point()):
        raise ValueError(f"image must be PIL images or a float tensor [B, 3, H, W] in [0, 1], got a tensor of "
                         f"shape {tuple(image.shape)}")
    kw = {} if size is None else {"height": size[0], "width": size[1]}
    try:
        x = pipeline.pipe.image_processor.preprocess(image, **kw)
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"image must be PIL images or a float tensor [B, 3, H, W] in [0, 1]: {e}") from e
    if not bool(torch.isfinite(x).all()):
        raise ValueError("image must be finite (PIL images or a tensor in [0, 1]), got NaN or inf")
    return x.float()


def _masks(pipeline: Any, mask_image: Any, size: tuple[int, int]) -> Tensor:
    """The masks as diffusers' ``mask_processor`` makes them: grayscale, in [0, 1], binarized at 0.5, resized to
    ``size`` (``[n, 1, H, W]``)."""
    from diffusers.image_processor import VaeImageProcessor

    if isinstance(mask_image, Tensor):
        if not mask_image.is_floating_point() or mask_image.ndim not in (2, 3, 4) or \
                (mask_image.ndim == 4 and mask_image.shape[1] != 1):
            raise ValueError(f"mask_image must be PIL images or a float tensor [B, 1, H, W] (or [B, H, W], [H, W]) "
                             f"in [0, 1], 1 where to repaint, got a {mask_image.dtype} tensor of shape "
                             f"{tuple(mask_image.shape)}")
        if not bool(torch.isfinite(mask_image).all()) or bool((mask_image < 0).any() | (mask_image > 1).any()):
            raise ValueError("mask_image must lie in [0, 1] (1 where to repaint), got values outside it or NaN")
    processor = VaeImageProcessor(vae_scale_factor=pipeline.pipe.image_processor.config.vae_scale_factor,
                                  do_normalize=False, do_binarize=True, do_convert_grayscale=True)
    try:
        m = processor.preprocess(mask_image, height=size[0], width=size[1])
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"mask_image must be PIL images or a float tensor [B, 1, H, W] in [0, 1]: {e}") from e
    return m.float()


def _tile(x: Tensor, b: int, name: str) -> Tensor:
    if b % x.shape[0]:
        raise ValueError(f"{name} has {x.shape[0]} images, which do not divide the batch of {b}")
    return torch.cat([x] * (b // x.shape[0]))


def _encode(pipeline: Any, x: Tensor, generator: Any, per_row: bool) -> Tensor:
    """Draws from the VAE posterior, ``(z - shift_factor) * scaling_factor``: one generator for the whole batch,
    or ``generator[i]`` for row ``i`` of a list (``per_row``: the batch has a row per generator)."""
    vae = pipeline.pipe.vae
    x = x.to(device=next(vae.parameters()).device, dtype=vae.dtype)
    with torch.no_grad():
        if isinstance(generator, (list, tuple)):
            rows = len(generator) if per_row else x.shape[0]
            z = torch.cat([vae.encode(x[i:i + 1]).latent_dist.sample(generator[i]) for i in range(rows)])
        else:
            z = vae.encode(x).latent_dist.sample(generator)
    scale, shift = pipeline._vae_factors()
    return (z.float() - shift) * scale


def check_text_to_image(pipeline: Any) -> None:
    """Refuse a text-to-image call on an inpainting network (one that takes the mask as extra input channels)."""
    family = pipeline._family
    width = int(family.network.config.in_channels)
    if not family.packed and width != int(pipeline.pipe.vae.config.latent_channels):
        raise TypeError(f"this {type(family.network).__name__} takes {width} input channels (an inpainting network: "
                        "the latents, the mask and the masked image's latents): pass image= and mask_image=")


def prepare(pipeline: Any, image: Any, mask_image: Any, strength: Any, latents: Any, height: Any, width: Any,
            batch: int, generator: Any, sigmas: Tensor, randn: Any) -> ImageStart:
    """The start of an image-to-image (``mask_image`` None) or inpainting run of ``batch`` images, as the family's
    diffusers pipeline prepares it: the images preprocessed, encoded with ``generator`` (image-to-image with a list of
    generators: the images tiled to the batch first, one draw per row; otherwise one draw per image, then tiled),
    then the unit noise ``randn(shape, generator)`` drawn, and the schedule cut to the run (:func:`run_schedule`).
    Inpainting at ``strength = 1`` starts from the noise alone (diffusers' ``is_strength_max``) and blends with the
    same noise."""
    rules = rules_of(pipeline)
    family = pipeline._family
    inpaint = mask_image is not None
    name = rules.inpaint if inpaint else rules.img2img
    if latents is not None:
        raise ValueError(f"pass image= or latents=, not both (diffusers' {name} draws the noise)")
    if strength is None:
        strength = rules.inpaint_strength if inpaint else rules.img2img_strength
    strength = check_strength(strength)
    channels = int(pipeline.pipe.vae.config.latent_channels)
    net_in = int(family.network.config.in_channels)
    concat = inpaint and not family.packed and net_in == 2 * channels + 1  # SD / SDXL inpainting checkpoints
    if inpaint and not concat and net_in != channels * (4 if family.packed else 1):
        raise TypeError(f"mask_image= with a {net_in}-channel {type(family.network).__name__} is not supported by "
                        f"steerdiff's Pipeline ({pipeline.family}): it takes networks of the latents alone "
                        f"({channels} channels; diffusers' {name} then blends the known region after every step) or "
                        f"of the latents, the mask and the masked image's latents ({2 * channels + 1})")
    if not inpaint and net_in != channels * (4 if family.packed else 1):
        raise TypeError(f"image= without mask_image= on a {net_in}-channel {type(family.network).__name__} (an "
                        "inpainting network): pass mask_image= too")
    keep_size = rules.img2img_keeps_size and not inpaint
    x = _images(pipeline, image, None if keep_size else pipeline._size(height, width))
    size = (int(x.shape[-2]), int(x.shape[-1]))
    if keep_size:
        if (height is not None and height != size[0]) or (width is not None and width != size[1]):
            raise ValueError(f"height, width = {height}, {width} but the image is {size[0]}x{size[1]} "
                             f"(image-to-image with {name} keeps the image's size)")
        pipeline._size(*size)
    lists = isinstance(generator, (list, tuple))
    if lists and len(generator) != batch:
        raise ValueError(f"generator is a list of {len(generator)} but the batch has {batch} images")
    if batch % x.shape[0]:
        raise ValueError(f"image has {x.shape[0]} images, which do not divide the batch of {batch}")
    masks = _masks(pipeline, mask_image, size) if inpaint else None
    mask = _tile(masks, batch, "mask_image") if inpaint else None
    run = run_schedule(sigmas, strength, rules.fractional)
    if concat:
        return _concat_start(pipeline, x, masks, mask, strength, batch, generator, run, randn, size)
    if lists and not inpaint:
        z0 = _encode(pipeline, _tile(x, batch, "image"), generator, per_row=True)
    else:
        z0 = _tile(_encode(pipeline, x, generator, per_row=False), batch, "image")
    noise = randn(tuple(z0.shape), generator, torch.float32).to(z0.device)  # CPU draws, as diffusers
    blend = None
    if inpaint:  # the mask on the latent grid (nearest), as the pipelines' prepare_mask_latents
        m = torch.nn.functional.interpolate(mask, size=tuple(z0.shape[-2:])).to(z0.device)
        if family.packed:
            m = family.pack(m.repeat(1, channels, 1, 1))
    if family.packed:
        z0, noise = family.pack(z0), family.pack(noise)
    if inpaint:
        blend = InpaintBlend(m, z0, noise)
    if inpaint and strength == 1.0 and not math.isinf(float(run[0])):
        # diffusers' is_strength_max: the run starts from noise * init_noise_sigma, not from the image.
        return ImageStart(size, pipeline._initial_noise(noise, run), None, run, blend)
    return ImageStart(size, noise, z0, run, blend)


def _concat_start(pipeline: Any, x: Tensor, masks: Tensor, mask: Tensor, strength: float, batch: int, generator: Any,
                  run: Tensor, randn: Any, size: tuple[int, int]) -> ImageStart:
    """Inpainting with a network that takes ``[latents, mask, masked image latents]`` (SD / SDXL inpainting
    checkpoints, 2 C + 1 input channels), as diffusers' inpainting pipelines prepare it: the image's latents only
    below strength 1 (drawn first), the noise, then the masked image ``x (m < 0.5)`` encoded with the same generator;
    the mask on the latent grid (nearest). No blend: the network sees the known region."""
    if masks.shape[0] not in (1, x.shape[0]) and x.shape[0] != 1:
        raise ValueError(f"mask_image has {masks.shape[0]} masks for {x.shape[0]} images: give one mask, one per "
                         "image, or one image")
    z0 = _tile(_encode(pipeline, x, generator, per_row=False), batch, "image") if strength < 1 else None
    f = pipeline.pipe.vae_scale_factor
    shape = (batch, int(pipeline.pipe.vae.config.latent_channels), size[0] // f, size[1] // f)
    device = next(pipeline.pipe.vae.parameters()).device
    noise = randn(shape, generator, torch.float32).to(device)
    masked = _tile(_encode(pipeline, x * (masks < 0.5), generator, per_row=False), batch, "image")
    m = torch.nn.functional.interpolate(mask, size=shape[-2:]).to(device)
    extra = torch.cat([m, masked], 1)
    if z0 is None and not math.isinf(float(run[0])):
        return ImageStart(size, pipeline._initial_noise(noise, run), None, run, None, extra)
    return ImageStart(size, noise, z0, run, None, extra)
