"""Mask decoders of a DiffDIS segmenter, chosen by name (docs/methods/diffdis.md, "The light mask decoder").

DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity",
Sec. 3.1) decodes the predicted mask latent with the VAE's decoder. At this project's scale that decoder is the
largest cost of one-step inference (about 19 of 43 CPU ms per 64x64 image: ``benchmarks/diffdis_profile.py``), so
the one-step path is VAE-bound, not denoiser-bound. The light decoder is a few convolutions and two nearest-neighbour
upsamplings from the mask latent to the mask (about a tenth of the VAE decoder's CPU time), trained here:

* on the ground-truth mask latents of the training masks (the codec's :meth:`~LatentCodec.encode_map`), target the
  true mask (binary cross-entropy + L1 of the probability, the loss of the VAE decoder's own mask fine-tuning);
* distilled from the frozen VAE decoder on perturbed latents (convex blends of two mask latents plus Gaussian
  noise), target the VAE decoder's map there. A denoiser's one-step prediction is a conditional mean: a blend of
  plausible mask latents, off the set of clean ones, where a decoder fitted only to clean latents extrapolates
  (measured: it loses max F and MAE on the segmenters' predictions though it beats the VAE on clean latents). The
  blends use no segmenter's predictions, so the decoder favours neither the one-step nor the multi-step model.

The registry :data:`MASK_DECODERS` maps a name to a loader ``load(segmenter_directory, codec) -> decoder or None``
(``None``: the codec's VAE decoder); :func:`steerdiff.segment.load_segmenter` and ``steerdiff segment --decoder``
read it. A decoder is a module with ``decode_map(latents) -> [B, 1, H, W]`` in [0, 1].
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

LIGHT_FORMAT = "steerdiff.segment.light_decoder/1"
LIGHT_DIR = "light_decoder"
"""The light decoder's folder inside a segmenter directory."""


class LightMaskDecoder(nn.Module):
    """Latents ``[B, C, h, w]`` to mask logits ``[B, 1, f h, f w]``: a 3x3 convolution to ``channels[0]`` and a
    residual 3x3 convolution at the latent resolution, then per factor of 2 a nearest-neighbour upsampling and a
    3x3 convolution to the next width, and a 1x1 convolution to one channel (SiLU between).

    Args:
        latent_channels: the codec's latent channels.
        channels: the widths, one more than the number of upsamplings (``factor = 2 ** (len(channels) - 1)``).
        scaling_factor: the latent scale of the codec it was trained on (recorded and checked when loading: a
            decoder only reads the latents of its codec).
    """

    def __init__(self, latent_channels: int = 4, channels: Sequence[int] = (48, 24, 16),
                 scaling_factor: float = 1.0):
        super().__init__()
        channels = tuple(int(c) for c in channels)
        if len(channels) < 1 or any(c < 1 for c in channels):
            raise ValueError(f"channels must be one or more positive widths, got {channels!r}")
        if int(latent_channels) < 1:
            raise ValueError(f"latent_channels must be >= 1, got {latent_channels!r}")
        self.latent_channels, self.channels = int(latent_channels), channels
        self.scaling_factor = float(scaling_factor)
        self.factor = 2 ** (len(channels) - 1)
        self.conv_in = nn.Conv2d(self.latent_channels, channels[0], 3, padding=1)
        self.conv_mid = nn.Conv2d(channels[0], channels[0], 3, padding=1)
        pairs = zip(channels[:-1], channels[1:], strict=True)
        self.ups = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in pairs)
        self.conv_out = nn.Conv2d(channels[-1], 1, 1)

    @property
    def config(self) -> dict:
        return {"latent_channels": self.latent_channels, "channels": list(self.channels),
                "scaling_factor": self.scaling_factor}

    def forward(self, latents: Tensor) -> Tensor:
        """Mask logits ``[B, 1, f h, f w]`` (in the latents' dtype)."""
        if not isinstance(latents, Tensor) or latents.ndim != 4 or latents.shape[1] != self.latent_channels:
            raise ValueError(f"latents must be a tensor [B, {self.latent_channels}, h, w], got "
                             f"{tuple(latents.shape) if isinstance(latents, Tensor) else type(latents).__name__}")
        dtype = self.conv_in.weight.dtype
        h = F.silu(self.conv_in(latents.to(dtype)))
        h = h + F.silu(self.conv_mid(h))
        for conv in self.ups:
            h = F.silu(conv(F.interpolate(h, scale_factor=2, mode="nearest")))
        return self.conv_out(h).to(latents.dtype)

    def decode_map(self, latents: Tensor) -> Tensor:
        """Maps ``[B, 1, H, W]`` in [0, 1] (the sigmoid of the logits), as :meth:`LatentCodec.decode_map`."""
        return torch.sigmoid(self(latents))


def _map_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Binary cross-entropy (on the logits) + L1 of the probability, to a target map in [0, 1]."""
    return F.binary_cross_entropy_with_logits(logits, target) + (torch.sigmoid(logits) - target).abs().mean()


@torch.no_grad()
def _blends(latents: Tensor, n: int, noise: float, g: torch.Generator) -> Tensor:
    """``n`` latents ``lam z_a + (1 - lam) z_b + s std(z) eps``: ``lam``, ``s / noise`` uniform in [0, 1]."""
    a = torch.randint(0, latents.shape[0], (n,), generator=g)
    b = torch.randint(0, latents.shape[0], (n,), generator=g)
    lam = torch.rand(n, 1, 1, 1, generator=g)
    s = noise * float(latents.std()) * torch.rand(n, 1, 1, 1, generator=g)
    return lam * latents[a] + (1 - lam) * latents[b] + s * torch.randn(latents[a].shape, generator=g)


def train_light_decoder(codec, latents: Tensor, maps: Tensor, *, channels: Sequence[int] = (48, 24, 16),
                        steps: int = 600, batch_size: int = 32, lr: float = 2e-3, distill: float = 1.0,
                        n_distill: int = 1024, noise: float = 0.3, seed: int = 0) -> tuple[LightMaskDecoder, dict]:
    """Train a :class:`LightMaskDecoder` for ``codec``'s mask latents (module docstring).

    Each Adam step (learning rate ``lr``, cosine decay to 5%) draws ``batch_size`` ground-truth latents, loss
    ``BCE + L1`` to their true maps, plus ``distill`` times the same loss on ``batch_size`` of ``n_distill``
    perturbed latents (:func:`_blends`, noise up to ``noise`` latent standard deviations) to the frozen VAE
    decoder's maps of them (``codec.decode_map``, computed once before training and counted in ``cpu_s``).

    Args:
        codec: the :class:`~steerdiff.segment.LatentCodec` (left unchanged).
        latents: ``[N, C, h, w]`` ground-truth mask latents (``codec.encode_map(maps)``).
        maps: ``[N, 1, H, W]`` the masks in [0, 1].
        distill: weight of the distillation term (0: the true masks alone).

    Returns:
        The decoder (eval mode) and ``{"steps", "final_loss", "cpu_s", "distill_targets_cpu_s", ...}``.
    """
    if latents.ndim != 4 or maps.ndim != 4 or maps.shape[1] != 1 or latents.shape[0] != maps.shape[0]:
        raise ValueError(f"latents [N, C, h, w] and maps [N, 1, H, W] with the same N are needed, got "
                         f"{tuple(latents.shape)} and {tuple(maps.shape)}")
    if isinstance(distill, bool) or not isinstance(distill, (int, float)) or not math.isfinite(distill) or distill < 0:
        raise ValueError(f"distill must be a finite number >= 0, got {distill!r}")
    t0 = time.process_time()
    torch.manual_seed(seed)
    dec = LightMaskDecoder(latents.shape[1], channels, codec.scaling_factor)
    if maps.shape[-1] != latents.shape[-1] * dec.factor:
        raise ValueError(f"channels {tuple(channels)} upsample by {dec.factor}, but the maps are "
                         f"{maps.shape[-1] / latents.shape[-1]:g} times the latents")
    g = torch.Generator().manual_seed(seed)
    soft_z = soft = None
    if distill > 0:
        soft_z = _blends(latents, n_distill, noise, g)
        with torch.no_grad():
            soft = torch.cat([codec.decode_map(soft_z[i:i + 64]) for i in range(0, n_distill, 64)])
    target_cpu = time.process_time() - t0
    opt = torch.optim.Adam(dec.parameters(), lr=lr)
    dec.train()
    loss = torch.zeros(())
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        idx = torch.randint(0, latents.shape[0], (batch_size,), generator=g)
        loss = _map_loss(dec(latents[idx]), maps[idx])
        if soft is not None:
            j = torch.randint(0, soft.shape[0], (batch_size,), generator=g)
            loss = loss + distill * _map_loss(dec(soft_z[j]), soft[j])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dec.eval()
    info = {"steps": steps, "batch_size": batch_size, "lr": lr, "distill": distill, "n_distill": n_distill,
            "noise": noise, "seed": seed, "channels": list(channels), "final_loss": float(loss.detach()),
            "distill_targets_cpu_s": target_cpu, "cpu_s": time.process_time() - t0,
            "parameters": sum(p.numel() for p in dec.parameters())}
    return dec, info


def save_light_decoder(dec: LightMaskDecoder, directory: str | Path, metadata: dict | None = None) -> Path:
    """Write ``config.json`` (format, architecture, ``metadata``) and ``model.safetensors`` (float32) atomically."""
    return save_light_part(dec, directory, LIGHT_FORMAT, metadata)


def load_light_decoder(directory: str | Path, codec=None) -> LightMaskDecoder:
    """Read a folder written by :func:`save_light_decoder` (safetensors only), float32, eval mode.

    With ``codec``, the decoder must read its latents: same latent channels and scaling factor, and its
    upsampling equal to the codec's downsampling. Anything else is a :class:`~steerdiff.io.CheckpointError`.
    """
    def build(c: dict) -> LightMaskDecoder:
        return LightMaskDecoder(int(c["latent_channels"]), [int(v) for v in c["channels"]], float(c["scaling_factor"]))

    return load_light_part(directory, LIGHT_FORMAT, "light mask decoder", build, codec, made="trained")


@dataclass(frozen=True)
class MaskDecoderEntry:
    """A registered mask decoder: ``load(segmenter_directory, codec)`` returns the decoder module, or ``None`` for
    the codec's own VAE decoder."""

    name: str
    load: Callable[[Path, object], nn.Module | None]
    summary: str = ""


MASK_DECODERS: Registry[MaskDecoderEntry] = Registry("mask decoder", argument="decoder")
"""Mask decoders by name (``load_segmenter(..., decoder=name)``, ``steerdiff segment --decoder``)."""

MASK_DECODERS.add("vae", MaskDecoderEntry("vae", lambda _directory, _codec: None,
                                          "the codec's VAE decoder, fine-tuned on masks (DiffDIS's; the default)"))
MASK_DECODERS.add("light", MaskDecoderEntry(
    "light", lambda directory, codec: load_light_decoder(Path(directory) / LIGHT_DIR, codec),
    f"a small convolutional decoder trained here (the segmenter folder's {LIGHT_DIR}/)"))
