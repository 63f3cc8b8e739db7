"""The MotionDreamer motion tokeniser: a small 1-D convolutional VQ-VAE over motion features with codebook
distribution regularisation (Wang et al., ICLR 2025, "MotionDreamer: One-to-Many Motion Synthesis with Localized
Generative Masked Transformer", Sec. 3.1 "Motion tokenization"; docs/methods/motiondreamer.md "The tokeniser").

Interface (stable; the generator, applications and baselines build on it):

* ``MotionVQVAE(in_dim, codebook_size=32, code_dim=32, hidden=64, downsample=4, ...)``, a registered model
  (``steerdiff.models.save`` / ``load``). It carries the feature normalisation (``mean`` / ``std`` buffers, set
  with :meth:`MotionVQVAE.set_stats`), so :meth:`~MotionVQVAE.encode` takes raw features from
  :func:`steerdiff.data.motion.motion_features` and :meth:`~MotionVQVAE.decode` returns raw features.
* ``encode(features [T, F] or [B, T, F]) -> tokens long [T'] or [B, T']`` with ``T' = ceil(T / downsample)`` (the
  last frame is repeated to a multiple of ``downsample``); ``decode(tokens [T'] or [B, T']) -> features
  [T' * downsample, F]`` (or batched). ``codebook()`` is ``[K, D]`` and ``decode_latents(z [B, T', D])`` decodes any
  code vectors (soft / dequantised mixtures of codes included), the hook a differentiable dequantisation needs.
* :meth:`~MotionVQVAE.forward` ``(x_normalised [B, T, F]) -> dict`` with the reconstruction and the losses the
  trainer (:func:`steerdiff.train.motion_vq.train_motion_vq`) combines.

The quantiser picks the nearest code (squared Euclidean distance); the encoder gets the straight-through gradient
and a commitment loss; the codebook is updated either by exponential moving averages of assigned encoder outputs
(``quantizer="ema"``, the VQ-VAE-2 update) or by gradient (``"st"``, a codebook loss). Codebook distribution
regularisation (:func:`code_distribution_loss`) is a loss on the batch's average soft assignment, so it reaches the
encoder in both cases.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embed import json_config
from .io import register_model


def soft_assignment(z: Tensor, codebook: Tensor, temperature: float) -> Tensor:
    """``q[n, k] = softmax_k(-||z_n - c_k||^2 / temperature)`` for ``z [N, D]``, ``codebook [K, D]`` -> ``[N, K]``."""
    d = torch.cdist(z, codebook).pow(2)
    return torch.softmax(-d / temperature, dim=-1)


def code_distribution_loss(z: Tensor, codebook: Tensor, temperature: float = 1.0) -> Tensor:
    """Codebook distribution regularisation (MotionDreamer Sec. 3.1, ``L_token``): the KL divergence from the
    batch's average soft code assignment ``p_k = mean_n q[n, k]`` (:func:`soft_assignment`) to the uniform
    distribution over the ``K`` codes, ``KL(p || U) = sum_k p_k log(K p_k) = log K - H(p)``.

    It is 0 exactly when the latents of the batch spread evenly over the codebook, and ``log K`` when they all sit
    on one code, so minimising it keeps a single training sequence from collapsing onto a few codes. It penalises
    only the aggregate usage, not each latent's confidence (a per-latent entropy term would fight quantisation).
    """
    p = soft_assignment(z.reshape(-1, z.shape[-1]), codebook, temperature).mean(0)
    k = codebook.shape[0]
    return (p * (p.clamp_min(1e-12) * k).log()).sum()


def codebook_stats(tokens: Tensor, codebook_size: int) -> dict[str, float]:
    """Usage statistics of a token set: ``usage`` (fraction of the ``K`` codes that occur), ``perplexity``
    (``exp`` of the entropy of the empirical code histogram; ``K`` when uniform, 1 when one code) and ``used``."""
    counts = torch.bincount(tokens.reshape(-1).long().cpu(), minlength=codebook_size).double()
    p = counts / counts.sum().clamp_min(1)
    h = -(p[p > 0] * p[p > 0].log()).sum()
    used = int((counts > 0).sum())
    return {"usage": used / codebook_size, "perplexity": float(h.exp()), "used": used}


class _Res(nn.Module):
    def __init__(self, ch: int, dilation: int):
        super().__init__()
        self.c1 = nn.Conv1d(ch, ch, 3, padding=dilation, dilation=dilation)
        self.c2 = nn.Conv1d(ch, ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.c2(F.relu(self.c1(F.relu(x))))


@register_model()
class MotionVQVAE(nn.Module):
    """1-D conv encoder (``log2(downsample)`` stride-2 stages, each followed by dilated residual blocks), a codebook
    of ``codebook_size`` vectors of ``code_dim``, and a mirrored decoder (nearest upsampling + conv).

    Args:
        in_dim: feature width ``F`` (:class:`steerdiff.data.motion.FeatureLayout` ``.dim``).
        codebook_size: ``K`` codes.
        code_dim: code vector width ``D``.
        hidden: conv channels.
        downsample: temporal downsampling, 1, 2 or 4 (one token per ``downsample`` frames).
        res_blocks: residual blocks per stage (dilations 1, 3, 9, ...).
        quantizer: ``"ema"`` (moving-average codebook) or ``"st"`` (codebook learned by gradient).
        ema_decay: moving-average decay of the ``"ema"`` codebook.
    """

    def __init__(self, in_dim: int, codebook_size: int = 32, code_dim: int = 32, hidden: int = 64,
                 downsample: int = 4, res_blocks: int = 2, quantizer: str = "ema", ema_decay: float = 0.99):
        super().__init__()
        if downsample not in (1, 2, 4, 8):
            raise ValueError(f"downsample must be 1, 2, 4 or 8, got {downsample!r}")
        if quantizer not in ("ema", "st"):
            raise ValueError(f"quantizer must be 'ema' or 'st', got {quantizer!r}")
        if min(in_dim, codebook_size, code_dim, hidden) < 1:
            raise ValueError("in_dim, codebook_size, code_dim and hidden must be positive")
        self.config = json_config(in_dim=in_dim, codebook_size=codebook_size, code_dim=code_dim, hidden=hidden,
                                  downsample=downsample, res_blocks=res_blocks, quantizer=quantizer,
                                  ema_decay=ema_decay)
        self.downsample, self.quantizer, self.ema_decay = downsample, quantizer, float(ema_decay)
        stages = int(math.log2(downsample))
        res = [_Res(hidden, 3**i) for i in range(res_blocks)]
        enc: list[nn.Module] = [nn.Conv1d(in_dim, hidden, 3, padding=1), *res]
        for _ in range(stages):
            enc += [nn.Conv1d(hidden, hidden, 4, stride=2, padding=1), *[_Res(hidden, 3**i) for i in range(res_blocks)]]
        enc += [nn.ReLU(), nn.Conv1d(hidden, code_dim, 3, padding=1)]
        self.encoder = nn.Sequential(*enc)
        dec: list[nn.Module] = [nn.Conv1d(code_dim, hidden, 3, padding=1)]
        for _ in range(stages):
            dec += [*[_Res(hidden, 3**i) for i in range(res_blocks)], nn.Upsample(scale_factor=2, mode="nearest"),
                    nn.Conv1d(hidden, hidden, 3, padding=1)]
        dec += [*[_Res(hidden, 3**i) for i in range(res_blocks)], nn.ReLU(), nn.Conv1d(hidden, in_dim, 3, padding=1)]
        self.decoder = nn.Sequential(*dec)
        init = torch.randn(codebook_size, code_dim) / math.sqrt(code_dim)
        if quantizer == "st":
            self.codes = nn.Parameter(init)
        else:
            self.register_buffer("codes", init)
            self.register_buffer("ema_count", torch.ones(codebook_size))
            self.register_buffer("ema_sum", init.clone())
        self.register_buffer("mean", torch.zeros(in_dim))
        self.register_buffer("std", torch.ones(in_dim))

    # ---- normalisation ------------------------------------------------------------------------------------------
    def set_stats(self, mean: Tensor, std: Tensor) -> None:
        """Feature normalisation stored with the model (:class:`steerdiff.data.motion.FeatureStats`)."""
        self.mean.copy_(mean.to(self.mean))
        self.std.copy_(std.to(self.std))

    def normalize(self, features: Tensor) -> Tensor:
        return (features - self.mean.to(features)) / self.std.to(features)

    def denormalize(self, x: Tensor) -> Tensor:
        return x * self.std.to(x) + self.mean.to(x)

    # ---- pieces ---------------------------------------------------------------------------------------------------
    def codebook(self) -> Tensor:
        """The code vectors ``[K, D]``."""
        return self.codes

    def _pad(self, x: Tensor) -> Tensor:
        extra = (-x.shape[1]) % self.downsample
        return torch.cat([x, x[:, -1:].expand(-1, extra, -1)], dim=1) if extra else x

    def encode_latents(self, x: Tensor) -> Tensor:
        """Pre-quantisation latents ``[B, T', D]`` of normalised features ``[B, T, F]``."""
        return self.encoder(self._pad(x).transpose(1, 2)).transpose(1, 2)

    def decode_latents(self, z: Tensor) -> Tensor:
        """Normalised features ``[B, T' * downsample, F]`` of code vectors ``[B, T', D]``."""
        return self.decoder(z.transpose(1, 2)).transpose(1, 2)

    def nearest(self, z: Tensor) -> Tensor:
        """Index of the nearest code of each latent: ``[..., D] -> [...]`` long."""
        flat = z.reshape(-1, z.shape[-1])
        d = flat.pow(2).sum(-1, keepdim=True) - 2 * flat @ self.codes.t() + self.codes.pow(2).sum(-1)[None]
        return d.argmin(-1).reshape(z.shape[:-1])

    # ---- public interface -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, features: Tensor) -> Tensor:
        """Tokens ``long [T']`` (or ``[B, T']``) of raw features ``[T, F]`` (or ``[B, T, F]``)."""
        single = features.dim() == 2
        x = features[None] if single else features
        if x.dim() != 3 or x.shape[-1] != self.config["in_dim"]:
            raise ValueError(f"features must be [T, {self.config['in_dim']}] or [B, T, {self.config['in_dim']}], "
                             f"got {tuple(features.shape)}")
        tok = self.nearest(self.encode_latents(self.normalize(x.to(self.mean))))
        return tok[0] if single else tok

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> Tensor:
        """Raw features ``[T' * downsample, F]`` (or batched) of tokens ``[T']`` (or ``[B, T']``)."""
        single = tokens.dim() == 1
        t = tokens[None] if single else tokens
        k = self.config["codebook_size"]
        if t.dim() != 2 or t.dtype not in (torch.int64, torch.int32) or bool(((t < 0) | (t >= k)).any()):
            raise ValueError(f"tokens must be a long tensor [T'] or [B, T'] of codes in [0, {k}), "
                             f"got {tuple(tokens.shape)} {tokens.dtype}")
        out = self.denormalize(self.decode_latents(self.codes[t.long()]))
        return out[0] if single else out

    def forward(self, x: Tensor, reg_temperature: float = 1.0) -> dict[str, Tensor]:
        """One training pass on normalised features ``x [B, T, F]``: reconstruction ``recon``, ``tokens``, the
        commitment loss ``commit`` (``||z - sg(c)||^2``), the codebook loss ``codebook`` (``||sg(z) - c||^2``, zero
        for the EMA quantiser, whose codes move in :meth:`ema_update`), the distribution loss ``reg``
        (:func:`code_distribution_loss`, always computed: the trainer weights it, 0 for the ablation) and the
        latents ``z``."""
        z = self.encode_latents(x)
        tokens = self.nearest(z.detach())
        q = self.codes[tokens]
        commit = F.mse_loss(z, q.detach())
        codebook = F.mse_loss(q, z.detach()) if self.quantizer == "st" else z.new_zeros(())
        zq = z + (q - z).detach()  # straight-through estimator
        recon = self.decode_latents(zq)[:, : x.shape[1]]
        reg = code_distribution_loss(z, self.codes, reg_temperature)
        return {"recon": recon, "tokens": tokens, "commit": commit, "codebook": codebook, "reg": reg, "z": z}

    @torch.no_grad()
    def ema_update(self, z: Tensor, tokens: Tensor, eps: float = 1e-5) -> None:
        """Moving-average codebook step (VQ-VAE-2): counts and sums of the latents assigned to each code, Laplace
        smoothed, give the new codes."""
        if self.quantizer != "ema":
            return
        flat, idx = z.reshape(-1, z.shape[-1]).to(self.codes), tokens.reshape(-1)
        onehot = F.one_hot(idx, self.codes.shape[0]).to(flat)
        g = self.ema_decay
        self.ema_count.mul_(g).add_(onehot.sum(0), alpha=1 - g)
        self.ema_sum.mul_(g).add_(onehot.t() @ flat, alpha=1 - g)
        n = self.ema_count.sum()
        count = (self.ema_count + eps) / (n + self.codes.shape[0] * eps) * n
        self.codes.copy_(self.ema_sum / count[:, None])

    @torch.no_grad()
    def init_codes(self, z: Tensor, generator: torch.Generator | None = None) -> None:
        """Initialise the codebook from ``K`` random latents ``z [..., D]`` (with replacement if fewer)."""
        flat = z.reshape(-1, z.shape[-1]).to(self.codes)
        k = self.codes.shape[0]
        idx = torch.randint(0, flat.shape[0], (k,), generator=generator) if flat.shape[0] < k else \
            torch.randperm(flat.shape[0], generator=generator)[:k]
        self.codes.copy_(flat[idx.to(flat.device)])
        if self.quantizer == "ema":
            self.ema_sum.copy_(self.codes)
            self.ema_count.fill_(1.0)
