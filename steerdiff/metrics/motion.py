"""Single-instance motion metrics and the motion feature extractor they use (MotionDreamer, Wang et al., ICLR 2025,
Sec. 4.1 "Evaluation metrics", which takes coverage and global / local diversity from GANimator, Li et al., SIGGRAPH
2022, Sec. 6.1, and SIFID / intra- and inter-diversity from SinMDM, Raab et al., ICLR 2024, Sec. 5;
docs/methods/motiondreamer.md "Metrics").

Motions enter as feature sequences ``[T, F]`` (:func:`steerdiff.data.motion.motion_features`), normalised by the
reference's statistics before any distance (pass ``stats``), so one unit is one reference standard deviation.

* :func:`coverage`: the fraction of the reference's windows (``window`` frames, stride 1) whose nearest window in
  the generated motion(s) lies within ``threshold`` (root-mean-square distance per element). 1 when the generated
  motion contains the reference.
* :func:`local_diversity`: the mean, over the generated motion's windows, of the distance to its nearest reference
  window (GANimator uses 15-frame windows): 0 for a copy; higher = locally new content.
* :func:`global_diversity`: the generated motion matched, as a whole, to reference fragments of at least
  ``min_fragment`` frames by dynamic programming (GANimator's patched nearest neighbour): the per-frame distance of
  the best segmentation. 0 for a copy or a re-ordering of long reference pieces; higher = new at the sequence level.
* With a feature extractor (:class:`MotionFeatureEncoder`): :func:`sifid` (Frechet distance of window features,
  reference vs generated: fidelity, 0 for the reference itself), :func:`intra_diversity` (mean pairwise feature
  distance between windows of one motion) and :func:`inter_diversity` (mean pairwise SIFID between generated
  motions).

The extractor is a tiny 1-D conv encoder trained **here, self-supervised** (SimCLR-style InfoNCE: two views of a crop,
jittered in time by a few frames and in value by noise, must pick each other out of the batch) on motions of one
skeleton; it is independent of the tokeniser, so the methods it compares do not grade themselves.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..io import atomic_write_text, load_tensors, save_tensors
from .images import frechet_distance


def _windows(x: Tensor, window: int) -> Tensor:
    if x.dim() != 2 or x.shape[0] < window:
        raise ValueError(f"motion features must be [T, F] with T >= window = {window}, got {tuple(x.shape)}")
    return x.unfold(0, window, 1).transpose(1, 2)  # [N, window, F]


def _norm(x: Tensor, stats) -> Tensor:
    x = torch.as_tensor(x).double()
    return x if stats is None else stats.normalize(x)


def _gen_list(generated: Tensor | Sequence[Tensor]) -> list[Tensor]:
    if isinstance(generated, Tensor) and generated.dim() == 2:
        return [generated]
    return list(generated)


def _nn_dist(query: Tensor, bank: Tensor) -> Tensor:
    """RMS distance per element from each query window ``[N, L, F]`` to its nearest bank window ``[M, L, F]``."""
    q, b = query.flatten(1), bank.flatten(1)
    d = torch.cdist(q, b).min(dim=1).values
    return d / math.sqrt(q.shape[1])


def coverage(reference: Tensor, generated: Tensor | Sequence[Tensor], window: int = 30, threshold: float = 0.25,
             stats=None) -> float:
    """Fraction of reference windows reproduced (nearest generated window within ``threshold``), GANimator Sec. 6.1.

    The default 0.25 (RMS, in reference standard deviations) accepts a copy with 0.1 noise per element (about twice
    a trained tokeniser's reconstruction error) and rejects windows of the same gait at another seed (the biped's
    other-seed windows are 0.29 away on average, ``local_diversity``); measured on the three references
    (docs/methods/motiondreamer.md "Metrics")."""
    bank = torch.cat([_windows(_norm(g, stats), window) for g in _gen_list(generated)])
    return float((_nn_dist(_windows(_norm(reference, stats), window), bank) <= threshold).double().mean())


def local_diversity(reference: Tensor, generated: Tensor | Sequence[Tensor], window: int = 15, stats=None) -> float:
    """Mean distance of each generated window to its nearest reference window (GANimator's local diversity)."""
    ref = _windows(_norm(reference, stats), window)
    vals = [_nn_dist(_windows(_norm(g, stats), window), ref).mean() for g in _gen_list(generated)]
    return float(torch.stack(vals).mean())


def global_diversity(reference: Tensor, generated: Tensor | Sequence[Tensor], min_fragment: int = 30,
                     stats=None) -> float:
    """Per-frame distance of the best segmentation of each generated motion into fragments (>= ``min_fragment``
    frames) each copied from some reference fragment of the same length, averaged over motions (GANimator's global
    diversity, by dynamic programming over segment ends with diagonal cumulative sums of the frame distances)."""
    ref = _norm(reference, stats)
    out = []
    for g in _gen_list(generated):
        g = _norm(g, stats)
        tg, tr = g.shape[0], ref.shape[0]
        if min(tg, tr) < min_fragment:
            raise ValueError(f"motions must be at least min_fragment = {min_fragment} frames")
        d = torch.cdist(g, ref).pow(2) / g.shape[1]  # [Tg, Tr] mean squared distance per element
        c = torch.zeros(tg + 1, tr + 1, dtype=torch.float64)  # c[i, j] = sum_{k<min(i,j)} d[i-1-k, j-1-k]
        for i in range(tg):
            c[i + 1, 1:] = c[i, :-1] + d[i]
        best = torch.full((tg + 1,), math.inf, dtype=torch.float64)
        best[0] = 0.0
        for e in range(min_fragment, tg + 1):
            s = torch.arange(0, e - min_fragment + 1)
            length = e - s  # [S]
            r_end = torch.arange(tr + 1)  # fragment ends in the reference
            ok = r_end[None] >= length[:, None]
            start = (r_end[None] - length[:, None]).clamp_min(0)
            seg = c[e, r_end][None] - c[s[:, None], start]
            seg = torch.where(ok, seg, torch.full_like(seg, math.inf)).min(dim=1).values
            best[e] = (best[s] + seg).min()
        out.append(math.sqrt(float(best[tg]) / tg))
    return float(sum(out) / len(out))


# ---- the learned feature extractor ------------------------------------------------------------------------------

class MotionFeatureEncoder(nn.Module):
    """Window features: ``[B, L, F] -> [B, out_dim]`` (three conv layers, global average pool, L2-normalised)."""

    def __init__(self, in_dim: int, width: int = 64, out_dim: int = 32):
        super().__init__()
        self.config = {"in_dim": in_dim, "width": width, "out_dim": out_dim}
        self.net = nn.Sequential(nn.Conv1d(in_dim, width, 5, padding=2), nn.GELU(),
                                 nn.Conv1d(width, width, 5, padding=4, dilation=2), nn.GELU(),
                                 nn.Conv1d(width, out_dim, 5, padding=8, dilation=4))
        self.register_buffer("mean", torch.zeros(in_dim))
        self.register_buffer("std", torch.ones(in_dim))

    def forward(self, x: Tensor) -> Tensor:
        x = (x - self.mean.to(x)) / self.std.to(x)
        return F.normalize(self.net(x.transpose(1, 2)).mean(-1), dim=-1)

    @torch.no_grad()
    def window_features(self, motion: Tensor, window: int = 30, stride: int = 5) -> Tensor:
        """Features ``[N, out_dim]`` of the windows of raw features ``[T, F]`` (stride ``stride``)."""
        w = torch.as_tensor(motion).float().unfold(0, window, stride).transpose(1, 2)
        return self(w.to(self.mean))

    def save(self, path: str | Path, meta: dict | None = None) -> Path:
        """Write ``<path>.safetensors`` (weights) and ``<path>.json`` (config and ``meta``), each atomically; not the
        ``config.json`` directory of denoisers, since this is no model ``steerdiff.models.load`` builds. Returns the
        ``.json`` path."""
        path = Path(path)
        save_tensors(self.state_dict(), path.with_suffix(".safetensors"))
        atomic_write_text(path.with_suffix(".json"), json.dumps({"class": "MotionFeatureEncoder",
                                                                 "config": self.config, **(meta or {})}, indent=1))
        return path.with_suffix(".json")

    @classmethod
    def load(cls, path: str | Path) -> MotionFeatureEncoder:
        """Read what :meth:`save` wrote (``path`` with or without its suffix; safetensors only)."""
        path = Path(path)
        cfg = json.loads(path.with_suffix(".json").read_text())
        if cfg.get("class") != "MotionFeatureEncoder":
            raise ValueError(f"{path} does not hold a MotionFeatureEncoder (class {cfg.get('class')!r})")
        enc = cls(**cfg["config"])
        enc.load_state_dict(load_tensors(path.with_suffix(".safetensors")))
        return enc.eval()


def train_feature_encoder(motions: Sequence[Tensor], steps: int = 400, window: int = 30, batch: int = 64,
                          temperature: float = 0.1, jitter: int = 3, noise: float = 0.1, lr: float = 2e-3,
                          seed: int = 0) -> tuple[MotionFeatureEncoder, dict]:
    """Train a :class:`MotionFeatureEncoder` on raw feature sequences ``[T, F]`` of one skeleton with InfoNCE: the
    two views of a crop are the crop shifted by up to ``jitter`` frames plus Gaussian noise of ``noise`` reference
    standard deviations; the other crops of the batch are the negatives. Returns the encoder and a log."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    flat = torch.cat([m.float() for m in motions])
    enc = MotionFeatureEncoder(flat.shape[1])
    enc.mean.copy_(flat.mean(0))
    enc.std.copy_(flat.std(0).clamp_min(1e-2))
    opt = torch.optim.Adam(enc.parameters(), lr=lr)
    lengths = torch.tensor([m.shape[0] for m in motions])
    c0 = time.process_time()
    losses = []
    for step in range(steps):
        which = torch.randint(0, len(motions), (batch,), generator=gen)
        views = []
        starts = (torch.rand(batch, generator=gen) * (lengths[which] - window - 2 * jitter)).long() + jitter
        for _ in range(2):
            shift = torch.randint(-jitter, jitter + 1, (batch,), generator=gen)
            crops = torch.stack([motions[int(w)][int(s) + int(o): int(s) + int(o) + window].float()
                                 for w, s, o in zip(which, starts, shift, strict=True)])
            crops = crops + noise * enc.std * torch.randn(crops.shape, generator=gen)
            views.append(enc(crops))
        logits = views[0] @ views[1].t() / temperature
        target = torch.arange(batch)
        loss = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            losses.append({"step": step, "loss": float(loss.detach())})
    enc.eval()
    return enc, {"curve": losses, "cpu_seconds": time.process_time() - c0, "steps": steps, "window": window,
                 "seed": seed}


def sifid(encoder: MotionFeatureEncoder, reference: Tensor, generated: Tensor | Sequence[Tensor],
          window: int = 30, stride: int = 2) -> float:
    """Frechet distance between the window features of the reference and of the generated motion(s) (SinMDM's
    SIFID; fidelity, lower is better; 0 up to numerics for the reference itself)."""
    ref = encoder.window_features(reference, window, stride)
    gen = torch.cat([encoder.window_features(g, window, stride) for g in _gen_list(generated)])
    return frechet_distance(ref, gen)


def intra_diversity(encoder: MotionFeatureEncoder, motion: Tensor, window: int = 30) -> float:
    """Mean pairwise distance between the features of the non-overlapping windows of one motion (0 when frozen)."""
    f = encoder.window_features(motion, window, window)
    if f.shape[0] < 2:
        raise ValueError(f"motion must hold at least two windows of {window} frames")
    d = torch.cdist(f, f)
    n = f.shape[0]
    return float(d.sum() / (n * (n - 1)))


def inter_diversity(encoder: MotionFeatureEncoder, generated: Sequence[Tensor], window: int = 30,
                    stride: int = 2) -> float:
    """Mean pairwise SIFID between generated motions (SinMDM's inter-diversity; 0 when all are equal)."""
    feats = [encoder.window_features(g, window, stride) for g in generated]
    if len(feats) < 2:
        raise ValueError("inter_diversity needs at least two generated motions")
    vals = [frechet_distance(a, b) for i, a in enumerate(feats) for b in feats[i + 1:]]
    return float(sum(vals) / len(vals))
