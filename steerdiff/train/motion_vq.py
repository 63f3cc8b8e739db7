"""Training the MotionDreamer tokeniser on one reference motion (Wang et al., ICLR 2025, Sec. 3.1 "Motion
tokenization"; docs/methods/motiondreamer.md "The tokeniser").

Single-instance setting: every batch is ``batch`` random crops of ``window`` frames of the one reference's features
(:func:`steerdiff.data.motion.random_windows`), normalised by the reference's statistics (stored in the model).
The loss is ``||x - x_hat||^2 + velocity_weight ||dx - dx_hat||^2 + beta * commit (+ codebook, "st" quantiser)
+ reg_weight * L_token``; ``reg_weight = 0`` is the ablation without codebook distribution regularisation. The
codebook is initialised from random encoder latents of the first batch (both arms). Adam with a cosine schedule
(:func:`steerdiff.train.config.cosine_lr`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.motion import FeatureStats, random_windows
from ..models.motion_vq import MotionVQVAE, codebook_stats
from .config import config_to_dict, cosine_lr


@dataclass
class MotionVQConfig:
    """Tokeniser training knobs (defaults: a few CPU-seconds to a CPU-minute per skeleton)."""

    steps: int = 500            # optimizer steps
    batch: int = 32             # crops per step
    window: int = 64            # frames per crop (a multiple of downsample)
    lr: float = 2e-3            # Adam peak learning rate (cosine to 5 %)
    beta: float = 0.25          # commitment weight (VQ-VAE)
    reg_weight: float = 0.1     # codebook distribution regularisation weight; 0 = the ablation
    reg_temperature: float = 0.3  # softmax temperature of the soft assignment in L_token (squared-distance units)
    velocity_weight: float = 1.0  # frame-difference reconstruction weight (smoothness)
    codebook_size: int = 64
    code_dim: int = 32
    hidden: int = 64
    downsample: int = 4
    quantizer: str = "ema"
    seed: int = 0


@dataclass
class MotionVQResult:
    model: MotionVQVAE
    log: dict


def _check(cfg: MotionVQConfig, frames: int) -> None:
    for name in ("steps", "batch", "window", "codebook_size", "code_dim", "hidden"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)!r}")
    if cfg.window % cfg.downsample or cfg.window > frames:
        raise ValueError(f"window must be a multiple of downsample = {cfg.downsample} and <= the reference's "
                         f"{frames} frames, got {cfg.window}")
    if cfg.reg_weight < 0 or cfg.reg_temperature <= 0:
        raise ValueError(f"reg_weight must be >= 0 and reg_temperature > 0, got {cfg.reg_weight}, "
                         f"{cfg.reg_temperature}")


def train_motion_vq(features: Tensor, config: MotionVQConfig | None = None) -> MotionVQResult:
    """Train a :class:`~steerdiff.models.motion_vq.MotionVQVAE` on one motion's features ``[T, F]`` (raw, from
    :func:`steerdiff.data.motion.motion_features`). Returns the model (eval mode, normalisation set) and a log with
    the loss curve every 100 steps, CPU seconds, and the reference's codebook statistics
    (:func:`reference_codebook_stats`)."""
    cfg = config or MotionVQConfig()
    if features.dim() != 2:
        raise ValueError(f"features must be [T, F], got {tuple(features.shape)}")
    _check(cfg, features.shape[0])
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = MotionVQVAE(features.shape[1], cfg.codebook_size, cfg.code_dim, cfg.hidden, cfg.downsample,
                        quantizer=cfg.quantizer)
    stats = FeatureStats.fit(features)
    model.set_stats(stats.mean, stats.std)
    x_all = model.normalize(features.float())
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    t0, c0 = time.perf_counter(), time.process_time()
    curve = []
    with torch.no_grad():
        model.init_codes(model.encode_latents(random_windows(x_all, cfg.window, cfg.batch, gen)), gen)
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(cfg.lr, step, cfg.steps, warmup_steps=min(50, cfg.steps // 10))
        x = random_windows(x_all, cfg.window, cfg.batch, gen)
        out = model(x, cfg.reg_temperature)
        rec = F.mse_loss(out["recon"], x)
        vel = F.mse_loss(out["recon"][:, 1:] - out["recon"][:, :-1], x[:, 1:] - x[:, :-1])
        loss = rec + cfg.velocity_weight * vel + cfg.beta * out["commit"] + out["codebook"]
        if cfg.reg_weight > 0:
            loss = loss + cfg.reg_weight * out["reg"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        model.ema_update(out["z"].detach(), out["tokens"])
        if step % 100 == 0 or step == cfg.steps - 1:
            curve.append({"step": step, "recon": float(rec.detach()), "reg": float(out["reg"].detach()),
                          "commit": float(out["commit"].detach())})
    model.eval()
    log = {"config": config_to_dict(cfg), "curve": curve, "cpu_seconds": time.process_time() - c0,
           "wall_seconds": time.perf_counter() - t0, **reference_codebook_stats(model, features)}
    return MotionVQResult(model, log)


@torch.no_grad()
def reference_codebook_stats(model: MotionVQVAE, features: Tensor) -> dict[str, float]:
    """Codebook usage and perplexity (:func:`steerdiff.models.motion_vq.codebook_stats`) of the tokens of the whole
    reference ``[T, F]`` encoded at every frame offset ``0 .. downsample - 1`` (so every local pattern counts), and
    the reconstruction error of the whole reference in normalised units (``recon_mse``)."""
    tokens = [model.encode(features[o:]) for o in range(model.downsample)]
    stats = codebook_stats(torch.cat(tokens), model.config["codebook_size"])
    rec = model.decode(tokens[0])[: features.shape[0]]
    stats["recon_mse"] = float(F.mse_loss(model.normalize(rec), model.normalize(features.float())))
    return stats
