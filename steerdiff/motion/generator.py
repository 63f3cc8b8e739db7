"""MotionDreamer's generator: a masked-token model of one motion's tokens, trained with random masking ratios and
sampled by confidence-ordered decoding (Wang et al., "MotionDreamer: One-to-Many Motion Synthesis with Localized
Generative Masked Transformer", ICLR 2025, Sec. 3.2-3.3; ``docs/methods/motiondreamer.md``, "The generator").

Training (MaskGIT's objective, Chang et al. 2022, Sec. 3.2): every step takes the reference token sequence (or random
crops of it), masks ``ceil(L cos(pi u / 2))`` positions chosen uniformly (``u ~ U(0, 1)``, the cosine mask schedule)
and minimises the cross-entropy of the clean tokens at the masked positions. A condition (a style label or per-token
beat flags) is dropped to null (``-1``) with probability ``cond_drop`` so the same network is the unconditional model
that classifier-free guidance needs. Sampling is :func:`steerdiff.discrete.sample` with ``method="maskgit"`` on the
absorbing process with the cosine schedule, guidance :class:`steerdiff.discrete.CFG`; steering
:func:`steerdiff.discrete.smc`: the model is a discrete denoiser in the convention of ``docs/methods/discrete.md``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..discrete import CFG, make_process, sample
from ..models.local_transformer import LocalMaskedTransformer


@dataclass
class GeneratorConfig:
    """The generator's network and training knobs (the shipped recipe's values are the defaults, except ``steps``: it
    trains 2000, ``docs/methods/motiondreamer.md`` "Shipped models").

    Attributes:
        window: local attention half-width in tokens (None: full attention, baseline (a)).
        absolute: add an absolute position code (the full-attention baseline uses it, as a global transformer).
        dim, depth, heads: the transformer's size.
        steps: optimiser steps.
        batch: masked copies of the sequence (or crops) per step.
        crop: train on random crops of this many tokens (None: the whole sequence).
        lr, weight_decay: AdamW.
        cond_drop: probability that a row's condition is replaced by null (classifier-free guidance).
        cond_token_drop: with per-token conditions (beat flags), the probability that each position's value is
            replaced by null on its own (0: whole rows only). The reference's flag pattern is one fixed sequence,
            so whole-row flags can tell the model where in the reference it is; dropping positions independently
            makes a flag speak for its own neighbourhood (``docs/methods/motiondreamer.md``, "Beat-aligned
            generation").
        seed: initialisation and masking seed.
    """

    window: int | None = 3
    absolute: bool = False
    dim: int = 64
    depth: int = 2
    heads: int = 4
    steps: int = 800
    batch: int = 32
    crop: int | None = None
    lr: float = 2e-3
    weight_decay: float = 0.01
    cond_drop: float = 0.1
    cond_token_drop: float = 0.0
    seed: int = 0


def random_mask(shape: tuple[int, int], generator: torch.Generator) -> Tensor:
    """``[B, L]`` bool: per row ``ceil(L cos(pi u / 2))`` positions (at least one) chosen uniformly, ``u ~ U(0,1)``
    (MaskGIT's cosine masking ratio, Chang et al. 2022, Sec. 3.2)."""
    b, n = shape
    u = torch.rand(b, generator=generator)
    count = torch.ceil(n * torch.cos(math.pi * u / 2)).clamp(1, n)
    rank = torch.rand(b, n, generator=generator).argsort(1).argsort(1)  # a uniform random order per row
    return rank < count[:, None]


def _crops(tokens: Tensor, cond: Tensor | None, batch: int, crop: int | None, g: torch.Generator):
    n_seq, n = tokens.shape
    rows = torch.randint(0, n_seq, (batch,), generator=g)
    if crop is None or crop >= n:
        x = tokens[rows]
        c = None if cond is None else cond[rows]
        return x, c
    start = torch.randint(0, n - crop + 1, (batch,), generator=g)
    idx = start[:, None] + torch.arange(crop)
    x = tokens[rows[:, None], idx]
    c = None if cond is None else (cond[rows] if cond.dim() == 1 else cond[rows[:, None], idx])
    return x, c


def train_generator(tokens: Tensor, num_tokens: int, config: GeneratorConfig | None = None, *,
                    cond: Tensor | None = None, cond_kind: str | None = None, cond_values: int = 0,
                    log_every: int = 0) -> tuple[LocalMaskedTransformer, dict]:
    """Fit a :class:`~steerdiff.models.local_transformer.LocalMaskedTransformer` to token sequences by the masked-token
    objective (see the module docstring).

    Args:
        tokens: ``[L]`` or ``[N, L]`` long codes in ``0..num_tokens-1`` (one motion: ``N = 1``).
        num_tokens: ``K``, the codebook size.
        config: :class:`GeneratorConfig`.
        cond: ``[N]`` labels (``cond_kind="label"``) or ``[N, L]`` per-token values (``"frames"``), or None.
        cond_kind, cond_values: the condition's kind and number of values (see the model).
        log_every: record the loss every so many steps (0: only the last).

    Returns:
        ``(model in eval mode, log)``; the log holds the final loss, the losses recorded and the training CPU time.
    """
    cfg = config or GeneratorConfig()
    tokens = torch.as_tensor(tokens)
    if tokens.dim() == 1:
        tokens = tokens[None]
        if cond is not None and cond_kind == "frames" and cond.dim() == 1:
            cond = cond[None]
        elif cond is not None and cond.dim() == 0:
            cond = cond[None]
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"tokens must be a long tensor [L] or [N, L], got {tokens.dtype} {tuple(tokens.shape)}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= num_tokens:
        raise ValueError(f"tokens must lie in 0..{num_tokens - 1} (num_tokens), got {int(tokens.min())}.."
                         f"{int(tokens.max())}")
    if (cond is None) != (cond_kind is None):
        raise ValueError("cond and cond_kind go together: give both or neither")
    torch.manual_seed(cfg.seed)
    model = LocalMaskedTransformer(num_tokens, dim=cfg.dim, depth=cfg.depth, heads=cfg.heads, window=cfg.window,
                                   absolute=cfg.absolute, cond_kind=cond_kind, cond_values=cond_values)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    losses, t0 = [], time.process_time()
    model.train()
    for step in range(cfg.steps):
        x0, c = _crops(tokens, cond, cfg.batch, cfg.crop, g)
        mask = random_mask(tuple(x0.shape), g)
        x = torch.where(mask, torch.full_like(x0, num_tokens), x0)
        if c is not None:
            drop = torch.rand(c.shape[0], generator=g) < cfg.cond_drop
            c = torch.where(drop.view(-1, *([1] * (c.dim() - 1))), torch.full_like(c, -1), c)
            if cfg.cond_token_drop > 0 and c.dim() == 2:  # no extra draw at 0: the shipped recipe's stream is kept
                c = torch.where(torch.rand(c.shape, generator=g) < cfg.cond_token_drop, torch.full_like(c, -1), c)
        lr = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))  # cosine decay
        for group in opt.param_groups:
            group["lr"] = lr
        logits = model(x, c)
        loss = F.cross_entropy(logits[mask], x0[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if log_every and step % log_every == 0:
            losses.append((step, float(loss.detach())))
    model.eval()
    log = {"final_loss": float(loss.detach()), "losses": losses, "train_cpu_s": time.process_time() - t0,
           "config": asdict(cfg), "num_tokens": num_tokens, "length": tokens.shape[1]}
    return model, log


def process_for(model: LocalMaskedTransformer):
    """The absorbing process over the model's codebook, with MaskGIT's cosine schedule."""
    return make_process("absorbing", model.num_tokens, schedule="cosine")


def generate(model: LocalMaskedTransformer, length: int, count: int, *, steps: int = 12, cond: Tensor | None = None,
             guidance_scale: float | None = None, x: Tensor | None = None, choice_temperature: float = 1.0,
             temperature: float = 1.0, window: int | None = -1, seed: int | list[int] | None = 0) -> Tensor:
    """``[count, length]`` token sequences by confidence-ordered decoding (``method="maskgit"``).

    Args:
        model: the trained generator.
        length: tokens per sequence (any length: a local model is translation-equivariant).
        count: sequences.
        steps: decoding rounds (NFE; a guided batch costs two).
        cond: ``[count]`` labels or ``[count, length]`` beat flags (``-1`` null), or None.
        guidance_scale: classifier-free guidance ``w`` (None or 1: the conditional model alone).
        x: a partly masked start ``[count, length]`` (mask = ``model.num_tokens``): its unmasked tokens are kept
            (temporal editing).
        choice_temperature: MaskGIT's annealed Gumbel noise on the confidences (1; MaskGIT's 4.5 accepts draws of
            low probability so often that a one-motion grammar breaks: tests/motion/test_generator.py).
        temperature: the token draws' softmax temperature, ``p0 ** (1 / T)`` renormalised (1: the model's own
            probabilities; < 1 sharper, towards fidelity; > 1 flatter, towards diversity). The draws and the
            confidences that order them both use the tempered probabilities.
        window: the attention half-width at sampling (``-1``: the trained one; see the model's ``forward``).
        seed: row ``i`` draws from ``seed + i`` (a sequence does not depend on the batch).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    guidance = CFG(guidance_scale) if guidance_scale is not None and cond is not None else None
    den = model.denoiser(window)
    if temperature != 1.0:
        den = _tempered(den, float(temperature))
    with torch.no_grad():
        return sample(den, process_for(model), steps, shape=None if x is not None else (count, length),
                      x=x, method="maskgit", cond=cond, guidance=guidance, generator=seed,
                      device=model.head.weight.device, choice_temperature=choice_temperature)


def _tempered(denoiser, temperature: float):
    """``D_T(x, t, c) = p0 ** (1 / T) / sum p0 ** (1 / T)`` (a softmax of the logits divided by ``T``)."""

    def d(x: Tensor, t: Tensor, cond=None) -> Tensor:
        p0 = denoiser(x, t, cond)
        return torch.softmax(p0.float().clamp_min(1e-30).log() / temperature, -1).to(p0.dtype)

    return d


def edit_tokens(model: LocalMaskedTransformer, tokens: Tensor, start: int, end: int, count: int = 1, **kw) -> Tensor:
    """``[count, L]``: the reference ``tokens [L]`` with ``[start, end)`` regenerated and the rest kept bit for bit
    (masked infilling; MotionDreamer's temporal editing, Sec. 4.4)."""
    n = tokens.shape[-1]
    if not 0 <= start < end <= n:
        raise ValueError(f"the edited span start:end must satisfy 0 <= start < end <= {n}, got {start}:{end}")
    x = tokens.reshape(1, n).repeat(count, 1)
    x[:, start:end] = model.num_tokens
    return generate(model, n, count, x=x, **kw)
