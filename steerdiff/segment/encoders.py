"""Image encoders of a DiffDIS segmenter, chosen by name (docs/methods/diffdis.md, "The light image encoder").

DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity",
Sec. 3.1) conditions the denoiser on the image latent of the frozen VAE encoder. At this project's scale, with the
light mask decoder (:mod:`steerdiff.segment.decoders`), that encoder is the largest cost of one-step inference
(about 8 of 16-18 CPU ms per 64x64 image: ``benchmarks/diffdis_profile.py --decoder light``), and every latent
segmenter pays it once per image. The light encoder is a few strided convolutions from the image to the same
latent, trained here by **distillation** to the frozen VAE encoder: target ``mean * scaling_factor`` (what
:meth:`~steerdiff.segment.LatentCodec.encode` returns, the latent the denoiser was fine-tuned on) of the recipe's
training images, mean squared error. It sees no mask and no segmenter, so it favours neither the one-step nor the
multi-step model; both condition on its latent.

The registry :data:`IMAGE_ENCODERS` maps a name to a loader ``load(segmenter_directory, codec) -> encoder or None``
(``None``: the codec's VAE encoder); :func:`steerdiff.segment.load_segmenter` and ``steerdiff segment --encoder``
read it. An encoder is a module with ``encode(images [B, 3, H, W] in [-1, 1]) -> latents [B, C, H/f, W/f]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..io.plugins import Registry
from .light_io import load_light_part, save_light_part

LIGHT_ENCODER_FORMAT = "steerdiff.segment.light_encoder/1"
LIGHT_ENCODER_DIR = "light_encoder"
"""The light encoder's folder inside a segmenter directory."""


class LightImageEncoder(nn.Module):
    """Images ``[B, 3, H, W]`` to latents ``[B, C, H / f, W / f]``: a 3x3 convolution to ``channels[0]`` at the
    image resolution, then per factor of 2 a stride-2 3x3 convolution to the next width, a residual 3x3
    convolution at the latent resolution and a 1x1 convolution to the ``latent_channels`` (SiLU between; the last
    layer linear, since latents are signed and unbounded). With ``context``, a global term is added before the
    last layer: a linear map of the features' spatial mean, the same at every position. It stands in for what
    the VAE encoder sees of the whole image (its group normalisations and the attention of its middle block),
    which a few local convolutions cannot.

    Args:
        latent_channels: the codec's latent channels.
        channels: the widths, one more than the number of downsamplings (``factor = 2 ** (len(channels) - 1)``).
        scaling_factor: the latent scale of the codec it was distilled from (recorded and checked when loading: an
            encoder only writes the latents of its codec).
        context: add the global term (above).
    """

    def __init__(self, latent_channels: int = 4, channels: Sequence[int] = (16, 32, 64),
                 scaling_factor: float = 1.0, context: bool = True):
        super().__init__()
        channels = tuple(int(c) for c in channels)
        if len(channels) < 1 or any(c < 1 for c in channels):
            raise ValueError(f"channels must be one or more positive widths, got {channels!r}")
        if int(latent_channels) < 1:
            raise ValueError(f"latent_channels must be >= 1, got {latent_channels!r}")
        self.latent_channels, self.channels = int(latent_channels), channels
        self.scaling_factor = float(scaling_factor)
        self.factor = 2 ** (len(channels) - 1)
        self.conv_in = nn.Conv2d(3, channels[0], 3, padding=1)
        pairs = zip(channels[:-1], channels[1:], strict=True)
        self.downs = nn.ModuleList(nn.Conv2d(a, b, 3, stride=2, padding=1) for a, b in pairs)
        self.conv_mid = nn.Conv2d(channels[-1], channels[-1], 3, padding=1)
        self.conv_out = nn.Conv2d(channels[-1], self.latent_channels, 1)
        self.context = nn.Linear(channels[-1], channels[-1]) if context else None

    @property
    def config(self) -> dict:
        return {"latent_channels": self.latent_channels, "channels": list(self.channels),
                "scaling_factor": self.scaling_factor, "context": self.context is not None}

    def forward(self, images: Tensor) -> Tensor:
        """Latents ``[B, C, H / f, W / f]`` (in the images' dtype) of images in [-1, 1]."""
        if not isinstance(images, Tensor) or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be a tensor [B, 3, H, W], got "
                             f"{tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__}")
        if images.shape[-1] % self.factor or images.shape[-2] % self.factor:
            raise ValueError(f"images: H and W must be multiples of {self.factor} (the encoder's downsampling), "
                             f"got {tuple(images.shape[-2:])}")
        dtype = self.conv_in.weight.dtype
        h = F.silu(self.conv_in(images.to(dtype)))
        for conv in self.downs:
            h = F.silu(conv(h))
        h = h + F.silu(self.conv_mid(h))
        if self.context is not None:
            h = h + self.context(h.mean((-2, -1)))[..., None, None]
        return self.conv_out(h).to(images.dtype)

    def encode(self, images: Tensor) -> Tensor:
        """The latents, as :meth:`LatentCodec.encode <steerdiff.segment.LatentCodec.encode>` names it."""
        return self(images)


@torch.no_grad()
def vae_targets(codec, images: Tensor, chunk: int = 64) -> Tensor:
    """The frozen VAE encoder's latents (``codec.encode``: posterior mean times the scaling factor) of ``images``."""
    return torch.cat([codec.encode(images[i:i + chunk]) for i in range(0, images.shape[0], chunk)])


def distillation_error(encoder: nn.Module, images: Tensor, targets: Tensor, chunk: int = 64) -> float:
    """Mean squared error of ``encoder.encode(images)`` to ``targets`` over the targets' variance (0: exact, 1: no
    better than their mean)."""
    with torch.no_grad():
        err = sum(float((encoder.encode(images[i:i + chunk]) - targets[i:i + chunk]).pow(2).sum())
                  for i in range(0, images.shape[0], chunk))
    return err / targets.numel() / float(targets.var())


def train_light_encoder(codec, images: Tensor, *, channels: Sequence[int] = (16, 32, 64), steps: int = 1500,
                        batch_size: int = 32, lr: float = 2e-3, flip: bool = True, context: bool = True,
                        seed: int = 0, targets: Tensor | None = None) -> tuple[LightImageEncoder, dict]:
    """Distil a :class:`LightImageEncoder` from ``codec``'s frozen VAE encoder (module docstring).

    The targets ``codec.encode(images)`` are computed once (counted in ``cpu_s``; with ``flip`` also of the
    horizontally flipped images, a second set of rows). Each Adam step (learning rate ``lr``, cosine decay to 5%)
    draws ``batch_size`` rows, loss the mean squared error of the encoder's latents to the targets.

    Args:
        codec: the :class:`~steerdiff.segment.LatentCodec` (left unchanged); only ``encode``, ``latent_channels``,
            ``scaling_factor`` and ``factor`` are read.
        images: ``[N, 3, H, W]`` in [-1, 1] (the recipe's training images).
        targets: the latents to fit instead of ``codec.encode(images)`` (e.g. computed another way; no flip rows
            are added then).

    Returns:
        The encoder (eval mode) and ``{"steps", "final_loss", "cpu_s", "targets_cpu_s", "train_error", ...}``
        (``train_error``: :func:`distillation_error` on the training rows).
    """
    if not isinstance(images, Tensor) or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be a tensor [N, 3, H, W], got "
                         f"{tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__}")
    if targets is not None and (targets.ndim != 4 or targets.shape[0] != images.shape[0]):
        raise ValueError(f"targets must be [N, C, h, w] with the images' N, got {tuple(targets.shape)} for "
                         f"{images.shape[0]} images")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    t0 = time.process_time()
    x = images
    if targets is None:
        if flip:
            x = torch.cat([images, images.flip(-1)])
        targets = vae_targets(codec, x)
    targets_cpu = time.process_time() - t0
    torch.manual_seed(seed)
    enc = LightImageEncoder(targets.shape[1], channels, codec.scaling_factor, context)
    if (x.shape[-2] // enc.factor, x.shape[-1] // enc.factor) != tuple(targets.shape[-2:]):
        raise ValueError(f"channels {tuple(channels)} downsample by {enc.factor}, but the images are "
                         f"{x.shape[-1] / targets.shape[-1]:g} times the latents")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(enc.parameters(), lr=lr)
    enc.train()
    loss = torch.zeros(())
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        idx = torch.randint(0, x.shape[0], (batch_size,), generator=g)
        loss = (enc(x[idx]) - targets[idx]).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    enc.eval()
    info = {"steps": steps, "batch_size": batch_size, "lr": lr, "flip": flip, "context": context, "seed": seed,
            "channels": list(channels), "rows": int(x.shape[0]), "final_loss": float(loss.detach()),
            "targets_cpu_s": targets_cpu, "cpu_s": time.process_time() - t0,
            "parameters": sum(p.numel() for p in enc.parameters())}
    info["train_error"] = distillation_error(enc, x, targets)
    return enc, info


def save_light_encoder(enc: LightImageEncoder, directory: str | Path, metadata: dict | None = None) -> Path:
    """Write ``config.json`` (format, architecture, ``metadata``) and ``model.safetensors`` (float32) atomically."""
    return save_light_part(enc, directory, LIGHT_ENCODER_FORMAT, metadata)


def load_light_encoder(directory: str | Path, codec=None) -> LightImageEncoder:
    """Read a folder written by :func:`save_light_encoder` (safetensors only), float32, eval mode.

    With ``codec``, the encoder must write its latents: same latent channels and scaling factor, and its
    downsampling equal to the codec's. Anything else is a :class:`~steerdiff.io.CheckpointError`.
    """
    def build(c: dict) -> LightImageEncoder:
        return LightImageEncoder(int(c["latent_channels"]), [int(v) for v in c["channels"]], float(c["scaling_factor"]),
                                 bool(c["context"]))

    return load_light_part(directory, LIGHT_ENCODER_FORMAT, "light image encoder", build, codec, made="distilled")


@dataclass(frozen=True)
class ImageEncoderEntry:
    """A registered image encoder: ``load(segmenter_directory, codec)`` returns the encoder module, or ``None`` for
    the codec's own VAE encoder."""

    name: str
    load: Callable[[Path, object], nn.Module | None]
    summary: str = ""


IMAGE_ENCODERS: Registry[ImageEncoderEntry] = Registry("image encoder", argument="encoder")
"""Image encoders by name (``load_segmenter(..., encoder=name)``, ``steerdiff segment --encoder``)."""

IMAGE_ENCODERS.add("vae", ImageEncoderEntry("vae", lambda _directory, _codec: None,
                                            "the codec's VAE encoder (DiffDIS's; the default)"))
IMAGE_ENCODERS.add("light", ImageEncoderEntry(
    "light", lambda directory, codec: load_light_encoder(Path(directory) / LIGHT_ENCODER_DIR, codec),
    f"a small convolutional encoder distilled from the VAE's (the segmenter folder's {LIGHT_ENCODER_DIR}/)"))
