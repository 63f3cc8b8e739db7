"""The latent codec of DiffDIS (docs/methods/diffdis.md, "Latent space and the mask decoder").

DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity",
Sec. 3.1) encodes the image, the mask and the edge map with the frozen VAE of the pre-trained latent diffusion model
(a one-channel map is repeated to three channels) and decodes the predicted mask latent with the same VAE.

Here the VAE is the shipped shapes pipeline's ``AutoencoderKL`` (factor-4 downsampling, 4 latent channels). Its
decoder was trained on grey-background shapes and reproduces binary masks poorly (the decoded ground-truth mask
latents reach max F 0.72 and MAE 0.49 on the procedural DIS set: measured in the recipe), and its encoder does
not see these images either (it reconstructs them worse than a flat grey image). DiffDIS's VAE was trained on
natural images like DIS5K's; standing in for that, the recipe first fine-tunes the whole VAE on the segmentation
images and their maps (:func:`finetune_codec`, a reconstruction objective), then a copy of the decoder further on
mask and edge latents (:func:`finetune_mask_decoder`; the codec keeps the VAE's own encoder, so the encoder a
codec is built with is the one fine-tuned). The decoded ground-truth latents' accuracy is the ceiling every latent
segmenter here shares; the recipe records it at each stage.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LatentCodec(nn.Module):
    """A frozen VAE encoder (images and maps to latents) and a mask decoder (latents to maps in [0, 1]).

    Args:
        vae: a diffusers ``AutoencoderKL``; its encoder and ``quant_conv`` are used as they are, its decoder and
            ``post_quant_conv`` are copied (so fine-tuning the mask decoder leaves ``vae`` untouched).
        scaling_factor: the latent scale (the VAE config's ``scaling_factor``): latents are ``mean * scaling_factor``.
    """

    def __init__(self, vae: nn.Module, scaling_factor: float | None = None):
        super().__init__()
        self.vae_config = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
        self.scaling_factor = float(scaling_factor if scaling_factor is not None else vae.config.scaling_factor)
        self.encoder = vae.encoder
        self.quant_conv = vae.quant_conv
        self.decoder = copy.deepcopy(vae.decoder)
        self.post_quant_conv = copy.deepcopy(vae.post_quant_conv)
        self.factor = 2 ** (len(self.vae_config["block_out_channels"]) - 1)
        self.latent_channels = int(self.vae_config["latent_channels"])

    @classmethod
    def from_config(cls, vae_config: dict, scaling_factor: float) -> LatentCodec:
        """An untrained codec of the given ``AutoencoderKL`` config (weights are loaded afterwards)."""
        from diffusers import AutoencoderKL

        return cls(AutoencoderKL.from_config(vae_config), scaling_factor)

    def _check(self, x: Tensor, channels: int, what: str) -> None:
        if not isinstance(x, Tensor) or x.ndim != 4 or x.shape[1] != channels:
            raise ValueError(f"{what} must be a tensor [B, {channels}, H, W], got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        if x.shape[-1] % self.factor or x.shape[-2] % self.factor:
            raise ValueError(f"{what}: H and W must be multiples of {self.factor} (the VAE's downsampling), got "
                             f"{tuple(x.shape[-2:])}")

    def encode(self, images: Tensor) -> Tensor:
        """Latents ``[B, 4, H/f, W/f]`` (posterior mean times the scaling factor) of images ``[B, 3, H, W]`` in
        [-1, 1]."""
        self._check(images, 3, "images")
        dtype = next(self.encoder.parameters()).dtype
        moments = self.quant_conv(self.encoder(images.to(dtype)))
        return moments[:, : self.latent_channels] * self.scaling_factor

    def encode_map(self, maps: Tensor) -> Tensor:
        """Latents of one-channel maps ``[B, 1, H, W]`` in [0, 1] (mask or edges), as DiffDIS encodes them: mapped
        to [-1, 1] and repeated to three channels."""
        self._check(maps, 1, "maps")
        return self.encode((maps * 2 - 1).expand(-1, 3, -1, -1))

    def decode_rgb(self, latents: Tensor) -> Tensor:
        """The decoder's three-channel output ``[B, 3, H, W]`` (about [-1, 1]; unclamped): an image reconstruction."""
        dtype = next(self.decoder.parameters()).dtype
        return self.decoder(self.post_quant_conv((latents / self.scaling_factor).to(dtype))).to(latents.dtype)

    def decode_raw(self, latents: Tensor) -> Tensor:
        """The decoder's output averaged over its three channels, ``[B, 1, H, W]`` (about [-1, 1]; unclamped)."""
        if not isinstance(latents, Tensor) or latents.ndim != 4 or latents.shape[1] != self.latent_channels:
            raise ValueError(f"latents must be a tensor [B, {self.latent_channels}, h, w], got "
                             f"{tuple(latents.shape) if isinstance(latents, Tensor) else type(latents).__name__}")
        return self.decode_rgb(latents).mean(dim=1, keepdim=True)

    def decode_map(self, latents: Tensor) -> Tensor:
        """Maps ``[B, 1, H, W]`` in [0, 1] from latents (the inverse of :meth:`encode_map`)."""
        return ((self.decode_raw(latents) + 1) / 2).clamp(0, 1)


def finetune_mask_decoder(codec: LatentCodec, latents: Tensor, maps: Tensor, *, steps: int = 300,
                          batch_size: int = 16, lr: float = 3e-4, seed: int = 0) -> dict:
    """Fine-tune the codec's decoder (and ``post_quant_conv``) so that ``decode_map(latents) ~ maps``.

    The loss is the L1 distance of the raw output to ``2 maps - 1`` plus the binary cross-entropy of
    ``decode_map`` (clamped) to the maps: L1 keeps the output in range, the cross-entropy sharpens thin structures.

    Args:
        codec: the codec, changed in place.
        latents: ``[N, 4, h, w]`` ground-truth map latents (``codec.encode_map(maps)``).
        maps: ``[N, 1, H, W]`` the maps in [0, 1].
        steps, batch_size, lr, seed: Adam steps, rows per step, learning rate, the row-draw seed.

    Returns:
        ``{"steps", "final_loss", "cpu_s"}``.
    """
    if latents.shape[0] != maps.shape[0]:
        raise ValueError(f"latents and maps must have the same rows, got {latents.shape[0]} and {maps.shape[0]}")
    params = list(codec.decoder.parameters()) + list(codec.post_quant_conv.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    g = torch.Generator().manual_seed(seed)
    codec.decoder.train()
    t0 = time.process_time()
    loss = torch.zeros(())
    for _ in range(steps):
        idx = torch.randint(0, latents.shape[0], (batch_size,), generator=g)
        raw = codec.decode_raw(latents[idx])
        target = maps[idx]
        p = ((raw + 1) / 2).clamp(1e-4, 1 - 1e-4)
        loss = (raw - (2 * target - 1)).abs().mean() + F.binary_cross_entropy(p, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    codec.decoder.eval()
    return {"steps": steps, "final_loss": float(loss.detach()), "cpu_s": time.process_time() - t0}


def finetune_codec(codec: LatentCodec, images: Tensor, maps: Tensor, *, steps: int = 200, batch_size: int = 16,
                   lr: float = 3e-4, latent_l2: float = 1e-4, seed: int = 0) -> dict:
    """Fine-tune the whole VAE (encoder, ``quant_conv``, decoder, ``post_quant_conv``) on the segmentation data so
    that its latents carry the image: reconstruction of images and of maps (repeated to three channels).

    Every step draws ``batch_size`` images and ``batch_size`` maps; the loss is the mean squared error of
    ``decode_rgb(encode(x))`` to ``x`` over both (the posterior mean is used, as :meth:`LatentCodec.encode`; no
    sampling, so the KL term of the VAE is replaced by a small L2 penalty ``latent_l2 * mean(z^2)`` that keeps the
    latent scale from drifting). Stands in for DiffDIS's VAE having been trained on images like the task's
    (Yu et al. 2025, Sec. 3.1 keep Stable Diffusion's VAE frozen; the shapes VAE here has never seen such images).

    Args:
        codec: the codec, changed in place (its encoder stops being the prior's original one).
        images: ``[N, 3, H, W]`` in [-1, 1].
        maps: ``[M, 1, H, W]`` in [0, 1] (masks and edge maps).
        steps, batch_size, lr, latent_l2, seed: Adam steps, rows of each kind per step, learning rate, latent
            penalty, the row-draw seed.

    Returns:
        ``{"steps", "final_loss", "cpu_s"}``.
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [N, 3, H, W], got {tuple(images.shape)}")
    if maps.ndim != 4 or maps.shape[1] != 1:
        raise ValueError(f"maps must be [M, 1, H, W], got {tuple(maps.shape)}")
    modules = (codec.encoder, codec.quant_conv, codec.decoder, codec.post_quant_conv)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=lr)
    g = torch.Generator().manual_seed(seed)
    for m in modules:
        m.train()
    t0 = time.process_time()
    loss = torch.zeros(())
    for _ in range(steps):
        i = torch.randint(0, images.shape[0], (batch_size,), generator=g)
        j = torch.randint(0, maps.shape[0], (batch_size,), generator=g)
        x = torch.cat([images[i], (maps[j] * 2 - 1).expand(-1, 3, -1, -1)])
        z = codec.encode(x)
        loss = (codec.decode_rgb(z) - x).pow(2).mean() + latent_l2 * z.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for m in modules:
        m.eval()
    return {"steps": steps, "final_loss": float(loss.detach()), "cpu_s": time.process_time() - t0}


@torch.no_grad()
def reconstruction_mse(codec: LatentCodec, images: Tensor, chunk: int = 64) -> float:
    """Mean squared error of ``decode_rgb(encode(images))`` (clamped to [-1, 1]) to ``images`` in [-1, 1]: compare
    with ``images.var()``, the error of the best flat image."""
    err = [(codec.decode_rgb(codec.encode(images[k:k + chunk])).clamp(-1, 1) - images[k:k + chunk]).pow(2).sum()
           for k in range(0, images.shape[0], chunk)]
    return float(torch.stack(err).sum() / images.numel())
