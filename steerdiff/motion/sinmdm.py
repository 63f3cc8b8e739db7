"""The single-motion continuous diffusion baseline: the SinMDM idea (Raab et al., "Single Motion Diffusion", ICLR 2024,
Sec. 3: a denoiser whose temporal receptive field is narrow, so it learns the motion's local patterns and not the whole
sequence) on steerdiff's continuous core (``docs/methods/motiondreamer.md``, "Baselines").

:class:`TemporalConvNet` is a small 1-D convolutional backbone over normalised per-frame features ``[B, F, T]`` (any
``T``), its receptive field ``1 + layers (kernel - 1)`` frames; it is wrapped by
:class:`~steerdiff.models.precond.EDMPrecond`, trained with :func:`steerdiff.train.edm_loss` on random crops of the one
motion, and sampled by :func:`steerdiff.sample` (Heun on the Karras schedule). SinMDM's own backbone is a UNet with
shifted-window attention (QnA); a plain narrow conv net keeps the idea (a bounded receptive field) at CPU scale.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from ..core.sampling import sample as sd_sample
from ..core.sigmas import karras
from ..models.embed import FourierFeatures, json_config
from ..models.io import register_model
from ..models.precond import EDMPrecond
from ..train.edm import edm_loss


@register_model()
class TemporalConvNet(nn.Module):
    """``F(x_in [B, F, T], c_noise [B]) -> [B, F, T]``: residual 1-D conv blocks with the noise level added per channel.

    Args:
        features: ``F``, channels per frame.
        length: ``T`` the denoiser is built for (``sample_shape``; the weights apply to any ``T``).
        hidden: channels of the hidden blocks.
        layers: residual blocks.
        kernel: odd temporal kernel (the receptive field is ``1 + layers (kernel - 1)`` frames).
    """

    def __init__(self, features: int, length: int, hidden: int = 64, layers: int = 4, kernel: int = 5):
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"kernel must be odd, got {kernel}")
        self.config = json_config(features=features, length=length, hidden=hidden, layers=layers, kernel=kernel)
        self.sample_shape = (features, length)
        self.num_classes = ()
        self.inp = nn.Conv1d(features, hidden, 1)
        self.noise = nn.Sequential(FourierFeatures(16), nn.Linear(16, hidden), nn.SiLU())
        self.convs = nn.ModuleList(nn.Conv1d(hidden, hidden, kernel, padding=kernel // 2, padding_mode="replicate")
                                   for _ in range(layers))
        self.films = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        # per-frame LayerNorm over channels: a GroupNorm would pool over time and widen the field to the whole clip
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.out = nn.Conv1d(hidden, features, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    @property
    def receptive_field(self) -> int:
        return 1 + len(self.convs) * (self.convs[0].kernel_size[0] - 1)

    def forward(self, x: Tensor, c_noise: Tensor, cond: Tensor | None = None) -> Tensor:
        h = self.inp(x)
        e = self.noise(c_noise)
        for conv, film, norm in zip(self.convs, self.films, self.norms, strict=True):
            hn = norm(h.transpose(1, 2)).transpose(1, 2)
            h = h + conv(torch.nn.functional.silu(hn + film(e)[..., None]))
        return self.out(h)


def at_length(model: EDMPrecond, length: int) -> EDMPrecond:
    """The same weights as a denoiser of ``length`` frames (the conv net is length-agnostic)."""
    net = model.net
    net.sample_shape = (net.sample_shape[0], int(length))
    return EDMPrecond(net, sigma_data=model.sigma_data, sigma_max=model.sigma_max)


@dataclass
class SinMDMConfig:
    """Baseline (b)'s knobs: backbone size, crop length, optimiser steps and batch."""

    hidden: int = 64
    layers: int = 4
    kernel: int = 5
    crop: int = 64
    steps: int = 1500
    batch: int = 16
    lr: float = 2e-3
    seed: int = 0


def train_sinmdm(features: Tensor, config: SinMDMConfig | None = None) -> tuple[EDMPrecond, dict]:
    """Fit the baseline to one motion's normalised features ``[T, F]`` by the EDM loss on random crops."""
    cfg = config or SinMDMConfig()
    if features.dim() != 2:
        raise ValueError(f"features must be [T, F], got shape {tuple(features.shape)}")
    feats = features.float().T.contiguous()  # [F, T]
    n_f, n_t = feats.shape
    crop = min(cfg.crop, n_t)
    torch.manual_seed(cfg.seed)
    model = EDMPrecond(TemporalConvNet(n_f, crop, cfg.hidden, cfg.layers, cfg.kernel), sigma_data=1.0)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    t0 = time.process_time()
    for step in range(cfg.steps):
        start = torch.randint(0, n_t - crop + 1, (cfg.batch,), generator=g)
        x0 = feats[:, start[:, None] + torch.arange(crop)].permute(1, 0, 2)  # [B, F, crop]
        for group in opt.param_groups:
            group["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        loss = edm_loss(model, x0, None, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return model, {"final_loss": float(loss.detach()), "train_cpu_s": time.process_time() - t0,
                   "config": asdict(cfg), "receptive_field": model.net.receptive_field}


def sample_sinmdm(model: EDMPrecond, length: int, count: int, *, steps: int = 18, seed: int = 0,
                  noise_scale: float = 1.0) -> Tensor:
    """``[count, length, F]`` normalised feature sequences (Heun, Karras schedule from 80; per-row seeds).

    ``noise_scale`` multiplies the starting noise (a sampling temperature for the deterministic ODE sampler: < 1
    starts nearer the data's mode, trading diversity for fidelity; 1 is the model's own distribution)."""
    if not noise_scale > 0:
        raise ValueError(f"noise_scale must be > 0, got {noise_scale!r}")
    d = at_length(model, length)
    n_f = d.sample_shape[0]
    noise = torch.stack([torch.randn(n_f, length, generator=torch.Generator().manual_seed(seed + i))
                         for i in range(count)]) * noise_scale
    with torch.no_grad():
        x = sd_sample(d, noise, karras(steps, 0.002, 80.0), method="heun")
    return x.transpose(1, 2)
