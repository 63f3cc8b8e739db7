"""Training the sequence denoisers of :mod:`steerdiff.temporal.precond` on the driven trajectories
(:mod:`steerdiff.data.driven`), for both strategies compared in DAWN (Cheng et al. 2025, "DAWN: Dynamic frame
Avatar With Non-autoregressive diffusion framework", Sec. 1 and Sec. 3): at equal budget, on one data stream.

* ``mode="all_at_once"``: every step draws one length ``S`` uniform in ``[min_length, max_length]`` and trains on the
  first ``S`` frames after the ``context`` known frames (DAWN trains on clips and samples any length).
* ``mode="autoregressive"``: the same trajectories, cut at a random offset per sample into a window of ``chunk``
  frames after ``overlap`` known frames (the chunk the baseline generates at a time).

Step ``n`` draws samples ``n * batch .. (n + 1) * batch - 1`` of ``data_seed`` (fresh data every step), its lengths
and offsets from a numpy stream keyed by ``(data_seed, 2, n)``, and its sigmas and noise from a torch generator seeded
by ``(seed, n)``: every draw is a function of the step, so a killed run resumed from its last checkpoint ends with the
weights of an uninterrupted one. The loss is :func:`steerdiff.train.edm.edm_loss`; the optimiser AdamW with
:func:`steerdiff.train.config.cosine_lr`, an :class:`~steerdiff.train.ema.EMA`, and checkpoints in
:mod:`steerdiff.train.checkpoint`'s format (atomic, safetensors).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..data.driven import DrivenSpring, driven_batch
from ..io import load_state_strict
from ..models.io import model_spec
from ..train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ..train.config import config_from_dict, config_to_dict, cosine_lr
from ..train.edm import edm_loss
from ..train.ema import EMA
from .cond import SequenceCond

MODES = ("all_at_once", "autoregressive")


@dataclass
class SequenceTrainConfig:
    """Hyper-parameters (JSON-serialisable) of one arm."""

    mode: str = "all_at_once"  # "all_at_once" or "autoregressive"
    steps: int = 3000          # optimizer steps
    batch_size: int = 32
    lr: float = 1e-3           # peak AdamW learning rate (cosine decay after warm-up)
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    grad_clip: float = 1.0
    ema_decay: float = 0.999
    min_length: int = 16       # all-at-once training lengths: uniform in [min_length, max_length]
    max_length: int = 32
    context: int = 4           # known frames before the first generated one
    chunk: int = 16            # autoregressive: frames per chunk
    overlap: int = 4           # autoregressive: conditioning frames per chunk (<= context + max_length - chunk)
    p_mean: float = -1.2       # ln sigma ~ N(p_mean, p_std^2) (EDM)
    p_std: float = 1.2
    data_seed: int = 0
    seed: int = 0
    checkpoint_every: int = 250

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.steps < 0 or self.batch_size < 1 or self.checkpoint_every < 1:
            raise ValueError("steps must be >= 0, batch_size and checkpoint_every >= 1")
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {self.min_length}, {self.max_length}")
        if self.chunk < 1 or self.overlap < 0 or self.context < 0:
            raise ValueError("chunk must be >= 1, overlap and context >= 0")
        if self.overlap + self.chunk > self.context + self.max_length:
            raise ValueError(f"overlap + chunk = {self.overlap + self.chunk} frames do not fit in a trajectory of "
                             f"context + max_length = {self.context + self.max_length}")

    def to_dict(self) -> dict:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, values: dict) -> SequenceTrainConfig:
        return config_from_dict(cls, values, "sequence training config")


def training_batch(cfg: SequenceTrainConfig, step: int, system: DrivenSpring | None = None
                   ) -> tuple[torch.Tensor, SequenceCond]:
    """The clean frames ``[B, S, frame_dim]`` and condition of optimizer step ``step`` (a function of the step)."""
    data = driven_batch(cfg.batch_size, cfg.max_length, cfg.data_seed, step * cfg.batch_size, cfg.context, system)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.data_seed, 2, step]))
    length = int(rng.integers(cfg.min_length, cfg.max_length + 1))
    offsets = rng.integers(0, cfg.context + cfg.max_length - cfg.overlap - cfg.chunk + 1, size=cfg.batch_size)
    if cfg.mode == "all_at_once":
        end = cfg.context + length
        past = data.frames[:, : cfg.context] if cfg.context else None
        return data.frames[:, cfg.context:end], SequenceCond(data.signal[:, cfg.context:end], past)
    rows = torch.arange(cfg.batch_size)[:, None]
    ctx_idx = torch.as_tensor(offsets)[:, None] + torch.arange(cfg.overlap)[None]
    gen_idx = torch.as_tensor(offsets)[:, None] + cfg.overlap + torch.arange(cfg.chunk)[None]
    past = data.frames[rows, ctx_idx] if cfg.overlap else None
    return data.frames[rows, gen_idx], SequenceCond(data.signal[rows, gen_idx], past)


def _step_generator(seed: int, step: int) -> torch.Generator:
    state = int(np.random.SeedSequence([seed, step]).generate_state(1, np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(state)


def train_sequence(model: nn.Module, cfg: SequenceTrainConfig, out_dir: str | Path | None = None,
                   system: DrivenSpring | None = None, log_every: int = 100, log=print,
                   stop_at: int | None = None) -> dict:
    """Train ``model`` (a :class:`~steerdiff.temporal.precond.SequencePrecond`) in place, resuming from the newest
    checkpoint under ``out_dir`` when there is one; the EMA weights are loaded into ``model`` at the end.

    Args:
        model: the denoiser to train. cfg: the arm's config. out_dir: checkpoint folder (None: no checkpoints).
        system: the driven dynamics (default :class:`~steerdiff.data.driven.DrivenSpring`).
        log_every, log: loss logging. stop_at: stop after this many steps in all, checkpointing there (a time-boxed
            run to be resumed later: the schedule still runs to ``cfg.steps``).

    Returns:
        ``{"history": [{"step", "loss"}...], "train_seconds", "steps", "resumed_from"}`` (seconds of this process).

    Raises:
        ValueError: the checkpoint under ``out_dir`` was written with another config or model.
    """
    spec = model_spec(model)
    system_dict = (DrivenSpring() if system is None else system).to_dict()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    ema = EMA(model, cfg.ema_decay)
    step, history, resumed_from, seconds = 0, [], None, 0.0
    ckpt = latest_checkpoint(out_dir) if out_dir is not None else None
    if ckpt is not None:
        saved = load_checkpoint(ckpt)
        st = saved["state"]
        if SequenceTrainConfig.from_dict(st.get("config", {})) != cfg or st.get("model") != spec or \
                st.get("system", system_dict) != system_dict:
            raise ValueError(f"the checkpoint in {ckpt} was written with another config, model or system; use a fresh "
                             "out_dir")
        load_state_strict(model, saved["model"], str(ckpt))
        opt.load_state_dict(saved["optimizer"])
        ema.load_state_dict(saved["ema"], st["ema_updates"])
        step, history, resumed_from, seconds = int(st["step"]), st["history"], int(st["step"]), st["seconds"]
    model.train()
    start = time.perf_counter()
    running = []
    end = cfg.steps if stop_at is None else min(cfg.steps, int(stop_at))
    while step < end:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(cfg.lr, step, cfg.steps, warmup_steps=cfg.warmup_steps,
                                    min_lr_ratio=cfg.min_lr_ratio)
        x0, cond = training_batch(cfg, step, system)
        loss = edm_loss(model, x0, cond, _step_generator(cfg.seed, step), cfg.p_mean, cfg.p_std)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        ema.update(model)
        running.append(float(loss.detach()))
        step += 1
        if step % log_every == 0 or step == cfg.steps:
            history.append({"step": step, "loss": float(np.mean(running))})
            running = []
            log(f"[{cfg.mode}] step {step}/{cfg.steps} loss {history[-1]['loss']:.4f}")
        if out_dir is not None and (step % cfg.checkpoint_every == 0 or step == end):
            elapsed = seconds + time.perf_counter() - start
            save_checkpoint(out_dir, step, model, ema.state_dict(), opt, {}, {
                "config": cfg.to_dict(), "model": spec, "system": system_dict, "history": history,
                "ema_updates": ema.num_updates,
                "seconds": elapsed})
    seconds += time.perf_counter() - start
    ema.copy_to(model)
    model.eval()
    return {"history": history, "train_seconds": seconds, "steps": step, "resumed_from": resumed_from}
