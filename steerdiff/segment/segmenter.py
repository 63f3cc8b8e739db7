"""A DiffDIS segmenter as one object: the latent codec and the denoiser, pixels in, mask and edges out, saved as
safetensors + JSON (docs/methods/diffdis.md, "Inference and the shipped model").

Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity", Sec. 3.2:
encode the image, one denoiser evaluation at the fixed timestep for the mask and edge rows together, decode.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from ..io import (
    CheckpointError,
    atomic_dir,
    load_state_strict,
    load_tensors,
    read_json,
    register_format,
    save_tensors,
    write_json,
)
from ..models.unet import UNet
from .codec import LatentCodec
from .decoders import LIGHT_DIR, MASK_DECODERS, LightMaskDecoder, save_light_decoder
from .diffdis import DiffDIS, DiffDISNet, predict_latents
from .encoders import IMAGE_ENCODERS, LIGHT_ENCODER_DIR, LightImageEncoder, save_light_encoder

FORMAT = "steerdiff.segment.diffdis/1"


@register_format("diffdis_segmenter", config_class=None, matches=lambda spec: spec.get("format") == FORMAT,
                 loadable=False)
def _refuse(directory, spec, device):
    """A segmenter directory is not a denoiser: ``steerdiff.models.load`` points to :func:`load_segmenter`."""
    raise CheckpointError(f"{directory} is a DiffDIS segmenter, not a denoiser: load it with "
                          "steerdiff.segment.load_segmenter")


class Segmenter(nn.Module):
    """Codec + DiffDIS denoiser. :meth:`segment` maps images ``[B, 3, H, W]`` in [-1, 1] to probability maps.

    Args:
        codec: the :class:`LatentCodec` (frozen encoder, mask decoder).
        model: the :class:`DiffDIS` denoiser over its latents.
        edge: whether the model was trained with the edge task (then inference runs mask and edge rows together,
            and the cross-task attention runs).
        decoder: the mask decoder of every decoded map (``decode_map(latents)``): ``None`` for the codec's VAE
            decoder, or e.g. a :class:`~steerdiff.segment.decoders.LightMaskDecoder` (docs/methods/diffdis.md,
            "The light mask decoder"). One-step and multi-step inference both decode through it. It is not part
            of the segmenter's own weights (:func:`save_segmenter` writes a light decoder to its own folder).
        encoder: the image encoder of every image latent (``encode(images)``): ``None`` for the codec's VAE
            encoder, or e.g. a :class:`~steerdiff.segment.encoders.LightImageEncoder` distilled from it
            (docs/methods/diffdis.md, "The light image encoder"). One-step and multi-step inference both condition
            on its latent. Not part of the segmenter's own weights either (its own folder, as the decoder's).
    """

    def __init__(self, codec: LatentCodec, model: DiffDIS, edge: bool = True, decoder: nn.Module | None = None,
                 encoder: nn.Module | None = None):
        super().__init__()
        self.codec, self.model, self.edge = codec, model, bool(edge)
        self.decoder = decoder
        self.encoder = encoder

    def encode(self, images: Tensor) -> Tensor:
        """Image latents ``[B, C, H/f, W/f]`` by :attr:`encoder` (the VAE's without one)."""
        return (self.codec if self.encoder is None else self.encoder).encode(images)

    def decode_map(self, latents: Tensor) -> Tensor:
        """Maps ``[B, 1, H, W]`` in [0, 1] of mask or edge latents, by :attr:`decoder` (the VAE's without one)."""
        return (self.codec if self.decoder is None else self.decoder).decode_map(latents)

    @torch.no_grad()
    def segment(self, images: Tensor, *, steps: int = 1, seed: int = 0, ensemble: int = 1,
                edges: bool = True) -> tuple[Tensor, Tensor | None]:
        """``(mask [B, 1, H, W], edges [B, 1, H, W] or None)`` in [0, 1] for images ``[B, 3, H, W]`` in [-1, 1].

        ``steps=1`` is DiffDIS; ``steps > 1`` the multi-step sampler over the same model; ``ensemble > 1``
        averages the decoded maps of that many noise draws, in output space as Marigold averages its depth maps (Ke
        et al., CVPR 2024). The members run as one batch (member ``k``'s row ``i`` is row ``k B + i`` and draws
        seed ``seed + k B + i``, the draw of a call per member with seed ``seed + k B``) and are decoded together.

        ``edges=False`` returns ``(mask, None)`` without running the decoder on the edge latents (about a third
        of one-step inference at this scale: docs/methods/diffdis.md, "Inference time"). The denoiser still runs
        the edge rows of a model trained with the edge task, since the cross-task attention lets them shape the
        mask rows: the mask is the same as with ``edges=True``, bit for bit."""
        if not isinstance(images, Tensor) or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be a tensor [B, 3, H, W] in [-1, 1], got "
                             f"{tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__}")
        if not isinstance(ensemble, int) or isinstance(ensemble, bool) or ensemble < 1:
            raise ValueError(f"ensemble must be an int >= 1, got {ensemble!r}")
        if not isinstance(edges, bool):
            raise ValueError(f"edges must be a bool, got {edges!r}")
        dtype = next(self.model.parameters()).dtype
        b = images.shape[0]
        z = self.encode(images.to(dtype))
        if ensemble > 1:
            z = z.repeat(ensemble, 1, 1, 1)
        m, e = predict_latents(self.model, z, steps=steps, edge=self.edge, seed=seed)
        mask = self._average(self.decode_map(m), ensemble, b)
        edge = self._average(self.decode_map(e), ensemble, b) if e is not None and edges else None
        return mask.to(images.dtype), None if edge is None else edge.to(images.dtype)

    @staticmethod
    def _average(maps: Tensor, ensemble: int, b: int) -> Tensor:
        """The members' mean map (rows ``k B + i``); one member is returned as it is (no copy)."""
        return maps if ensemble == 1 else maps.unflatten(0, (ensemble, b)).mean(0)

    def num_parameters(self) -> int:
        """Parameters of the denoiser (the codec is shared by every latent method and not counted)."""
        return sum(p.numel() for p in self.model.parameters())

    def config(self) -> dict:
        return {"format": FORMAT, "unet": self.model.net.unet.config, "heads": self.model.net.dbia_mid.heads,
                "sigma_data": self.model.sigma_data, "sigma_t": self.model.sigma_t,
                "sigma_embed": self.model.sigma_embed, "edge": self.edge,
                "vae": self.codec.vae_config, "scaling_factor": self.codec.scaling_factor}


def save_segmenter(seg: Segmenter, directory: str | Path, metadata: dict | None = None,
                   dtype: torch.dtype = torch.float16, prior: nn.Module | None = None) -> Path:
    """Write ``config.json`` (architecture and ``metadata``) and ``model.safetensors`` (weights in ``dtype``;
    float16 halves the shipped size) atomically, with the latent prior (a registered model) in ``prior/``."""
    from ..models.io import save as save_model

    directory = Path(directory)
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in seg.state_dict().items()
               if not k.startswith(("decoder.", "encoder."))}
    if seg.decoder is not None and not isinstance(seg.decoder, LightMaskDecoder):
        raise ValueError(f"save_segmenter writes the VAE decoder or a LightMaskDecoder, got "
                         f"{type(seg.decoder).__name__}")
    if seg.encoder is not None and not isinstance(seg.encoder, LightImageEncoder):
        raise ValueError(f"save_segmenter writes the VAE encoder or a LightImageEncoder, got "
                         f"{type(seg.encoder).__name__}")
    with atomic_dir(directory) as tmp:
        save_tensors(tensors, tmp / "model.safetensors")
        write_json(tmp / "config.json", {**seg.config(), "metadata": metadata or {}})
        if prior is not None:
            save_model(prior, tmp / "prior")
        if seg.decoder is not None:
            save_light_decoder(seg.decoder, tmp / LIGHT_DIR)
        if seg.encoder is not None:
            save_light_encoder(seg.encoder, tmp / LIGHT_ENCODER_DIR)
    return directory


def load_segmenter(directory: str | Path, device: str | torch.device = "cpu", decoder: str = "vae",
                   encoder: str = "vae") -> Segmenter:
    """Read a directory written by :func:`save_segmenter` (safetensors only), in float32 and eval mode, with the
    mask decoder registered as ``decoder`` (:data:`steerdiff.segment.decoders.MASK_DECODERS`: ``"vae"``, the
    codec's, or ``"light"``, the folder's ``light_decoder/``) and the image encoder registered as ``encoder``
    (:data:`steerdiff.segment.encoders.IMAGE_ENCODERS`: ``"vae"`` or ``"light"``, the folder's
    ``light_encoder/``)."""
    entry = MASK_DECODERS.get(decoder)
    enc_entry = IMAGE_ENCODERS.get(encoder)
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{directory}: no config.json (not a DiffDIS segmenter directory)")
    cfg = read_json(cfg_path)
    if cfg.get("format") != FORMAT:
        raise CheckpointError(f"{cfg_path}: format {cfg.get('format')!r} is not {FORMAT!r}")
    try:
        unet = UNet(**cfg["unet"])
        embed = cfg.get("sigma_embed")  # absent in segmenters saved before the shift existed (no shift)
        model = DiffDIS(DiffDISNet(unet, heads=int(cfg["heads"])), float(cfg["sigma_data"]), float(cfg["sigma_t"]),
                        None if embed is None else float(embed))
        codec = LatentCodec.from_config(cfg["vae"], float(cfg["scaling_factor"]))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{cfg_path}: corrupt config ({err})") from err
    seg = Segmenter(codec, model, edge=bool(cfg.get("edge", True)))
    tensors = {k: v.float() if v.is_floating_point() else v
               for k, v in load_tensors(directory / "model.safetensors").items()}
    load_state_strict(seg, tensors, str(directory / "model.safetensors"))
    seg.decoder = entry.load(directory, seg.codec)
    seg.encoder = enc_entry.load(directory, seg.codec)
    return seg.to(device).eval()


def read_metadata(directory: str | Path) -> dict:
    """The ``metadata`` block of a saved segmenter's config (training time, recipe command, measurements)."""
    return json.loads((Path(directory) / "config.json").read_text()).get("metadata", {})
