"""MotionDreamer's applications on decoded motion (Wang et al., ICLR 2025, Sec. 4.4; ``docs/methods/motiondreamer.md``,
"Applications"): temporal editing with the kept frames copied exactly, crowds, beat-aligned generation, and SMC
steering of the token sampler towards a reward on the decoded motion (a root trajectory).

A *tokeniser* here is any object with ``encode(features [T, F]) -> tokens [T'] long`` and ``decode(tokens [T'] or
[B, T']) -> features [T, F] or [B, T, F]``, ``T = downsample * T'`` (the motion VQ-VAE of
:mod:`steerdiff.models.motion_vq`); its ``downsample`` attribute, or ``T // T'``, is the frames per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..discrete import smc
from ..models.local_transformer import LocalMaskedTransformer
from .generator import edit_tokens, generate, process_for


def frames_per_token(tokenizer, features: Tensor | None = None, tokens: Tensor | None = None) -> int:
    """The tokeniser's temporal downsampling: its ``downsample`` attribute, else ``T // T'``."""
    d = getattr(tokenizer, "downsample", None)
    if d is not None:
        return int(d)
    if features is None or tokens is None:
        raise ValueError("tokenizer has no downsample attribute: pass features and tokens to infer it")
    return max(features.shape[-2] // tokens.shape[-1], 1)


def decode_batch(tokenizer, tokens: Tensor) -> Tensor:
    """``[B, T, F]`` decoded features of ``tokens [B, T']`` (one row at a time if the tokeniser decodes one)."""
    with torch.no_grad():
        out = tokenizer.decode(tokens)
        if out.dim() == 3 and out.shape[0] == tokens.shape[0]:
            return out
        return torch.stack([tokenizer.decode(row) for row in tokens])


# ------------------------------------------------------------------------------------------------ editing
@dataclass
class EditResult:
    """A temporal edit. ``features [count, T, F]``; ``span``: the regenerated frames ``(start, end)`` (the request
    widened to token boundaries); ``tokens [count, T']``; ``seams``: :func:`seam_statistics`."""

    features: Tensor
    span: tuple[int, int]
    tokens: Tensor
    seams: dict


def edit_motion(model: LocalMaskedTransformer, tokenizer, features: Tensor, start: int, end: int, *, count: int = 1,
                steps: int = 12, seed: int = 0, blend: int = 4, seam_step: float | None = 0.1,
                tokens: Tensor | None = None) -> EditResult:
    """Regenerate frames ``[start, end)`` of a motion and keep every other frame bit for bit (Sec. 4.4).

    The span is widened to whole tokens, its tokens masked and infilled by the generator (the kept tokens fixed),
    the result decoded; frames outside the span are then copied from ``features`` exactly. So that the seams are
    as smooth as the decoded motion, the offset between the kept frame just before (after) the span and the edit's
    decoding of that frame is carried into the span and decays linearly to zero over a ramp of ``n`` frames (the
    two ramps add where they overlap). A linear ramp adds ``offset / (n + 1)`` to every frame-to-frame step on it
    (the least largest change of any ramp of that length), so ``n`` is chosen per edit and seam as the shortest ramp,
    at least ``blend`` frames and at most the span, that keeps this added step within ``seam_step`` times the
    median frame-to-frame step of ``features``: the decoder spreads the new tokens' influence into the kept
    frames, and a fixed short ramp turns a large offset into a jump where the reference's steps are uniform (the
    snake's steps all lie within 0.12-0.16, while offsets reach 1.0).

    Args:
        model, tokenizer: the generator and its tokeniser.
        features: the reference ``[T, F]`` (in the tokeniser's feature space).
        start, end: the frames to regenerate.
        count: edits (rows ``seed + i``).
        steps, seed: the sampler's rounds and seed.
        blend: the shortest ramp (frames) over which a seam's offset decays.
        seam_step: the most a ramp may add to a frame-to-frame step, in units of the median step of ``features``
            (None: every ramp is ``blend`` frames).
        tokens: the reference's tokens (default: ``tokenizer.encode(features)``).
    """
    n_t = features.shape[0]
    if not 0 <= start < end <= n_t:
        raise ValueError(f"the edited span start:end must satisfy 0 <= start < end <= {n_t} frames, got {start}:{end}")
    with torch.no_grad():
        tok = tokenizer.encode(features) if tokens is None else tokens
    d = frames_per_token(tokenizer, features, tok)
    t0, t1 = start // d, min(-(-end // d), tok.shape[-1])
    f0, f1 = t0 * d, min(t1 * d, n_t)
    new = edit_tokens(model, tok, t0, t1, count, steps=steps, seed=seed)
    dec = decode_batch(tokenizer, new)[:, :n_t].to(features.dtype)
    out = features.expand(count, -1, -1).clone()
    span = dec[:, f0:f1].clone()
    k = torch.arange(f1 - f0, dtype=features.dtype, device=features.device)
    tol = None
    if seam_step is not None and n_t > 1:
        tol = seam_step * (features[1:] - features[:-1]).norm(dim=-1).median()
    if f0 > 0:
        off = features[f0 - 1] - dec[:, f0 - 1]  # [count, F]
        n = _ramp_length(off, tol, blend, f1 - f0)  # [count, 1]
        span += (1 - (k + 1) / (n + 1)).clamp_min(0)[..., None] * off[:, None]
    if f1 < n_t:
        off = features[f1] - dec[:, f1]
        n = _ramp_length(off, tol, blend, f1 - f0)
        span += (1 - (f1 - f0 - k) / (n + 1)).clamp_min(0)[..., None] * off[:, None]
    out[:, f0:f1] = span
    return EditResult(out, (f0, f1), new, seam_statistics(features, out, f0, f1))


def _ramp_length(offset: Tensor, tol: Tensor | None, blend: int, span: int) -> Tensor:
    """``[count, 1]`` ramp lengths: the least ``n >= blend`` with ``||offset|| / (n + 1) <= tol``, at most
    ``span`` (``blend`` when ``tol`` is None)."""
    n = torch.full((offset.shape[0], 1), float(blend), dtype=offset.dtype, device=offset.device)
    if tol is not None:
        need = torch.ceil(offset.norm(dim=-1, keepdim=True) / tol.clamp_min(1e-12)) - 1
        n = torch.maximum(n, need)
    return n.clamp(max=float(span))


def seam_statistics(reference: Tensor, edited: Tensor, start: int, end: int) -> dict:
    """Frame-to-frame step norms ``||x_{t+1} - x_t||`` at the seams of ``edited [B, T, F]`` (into ``start``, out of
    ``end - 1``) against the reference's steps: their maximum and 99th percentile, and each seam's percentile rank
    among the reference's steps (``within``: every seam step <= the reference's largest)."""
    ref_steps = (reference[1:] - reference[:-1]).norm(dim=-1)
    seams = []
    if start > 0:
        seams.append((edited[:, start] - edited[:, start - 1]).norm(dim=-1))
    if end < reference.shape[0]:
        seams.append((edited[:, end] - edited[:, end - 1]).norm(dim=-1))
    s = torch.stack(seams, 1) if seams else torch.zeros(edited.shape[0], 0)
    rank = (ref_steps[None, None] <= s[..., None]).float().mean(-1) if seams else s
    return {"seam_steps": s, "reference_max": float(ref_steps.max()), "reference_p99": float(ref_steps.quantile(0.99)),
            "seam_percentile": rank, "within": bool((s <= ref_steps.max()).all())}


# ------------------------------------------------------------------------------------------------ crowds
def crowd(model: LocalMaskedTransformer, tokenizer, length: int, count: int, *, steps: int = 12, seed: int = 0,
          cond: Tensor | None = None, guidance_scale: float | None = None) -> Tensor:
    """``[count, length * downsample, F]``: many motions from one reference's generator (Sec. 4.4, crowd
    animation); row ``i`` is seed ``seed + i``, so a crowd member does not depend on the crowd's size."""
    tok = generate(model, length, count, steps=steps, seed=seed, cond=cond, guidance_scale=guidance_scale)
    return decode_batch(tokenizer, tok)


# ------------------------------------------------------------------------------------------------ beats
def kinematic_beats(features: Tensor, min_gap: int = 4) -> Tensor:
    """Frames where the motion pauses: local minima of the frame-to-frame speed ``||x_{t+1} - x_t||`` below its
    median, at least ``min_gap`` frames apart (the kinematic beats of dance-music alignment, Li et al. 2021, "AI
    Choreographer", Sec. 5.1, on feature speed). ``features [T, F]`` -> long indices."""
    v = (features[1:] - features[:-1]).norm(dim=-1)
    if v.numel() < 3:
        return torch.zeros(0, dtype=torch.long)
    is_min = (v[1:-1] <= v[:-2]) & (v[1:-1] <= v[2:]) & (v[1:-1] < v.median())
    cand = (is_min.nonzero().flatten() + 1).tolist()
    out: list[int] = []
    for c in cand:
        if not out or c - out[-1] >= min_gap:
            out.append(c)
    return torch.tensor(out, dtype=torch.long)


def beat_flags(beats: Tensor | list[int], n_tokens: int, frames_per_tok: int) -> Tensor:
    """``[n_tokens]`` long: 1 where a beat frame falls in the token's frames, 0 elsewhere (the generator's
    per-token condition)."""
    flags = torch.zeros(n_tokens, dtype=torch.long)
    idx = torch.as_tensor(beats, dtype=torch.long) // frames_per_tok
    flags[idx[(idx >= 0) & (idx < n_tokens)]] = 1
    return flags


def beat_alignment(beats: Tensor | list[int], features: Tensor, tolerance: int = 2) -> float:
    """Fraction of the requested ``beats`` (frames) with a kinematic beat of ``features [T, F]`` within ``tolerance``
    frames (a beat-hit rate; 1 = every requested beat is met by a pause of the motion)."""
    req = torch.as_tensor(beats, dtype=torch.long)
    got = kinematic_beats(features)
    if req.numel() == 0:
        return 1.0
    if got.numel() == 0:
        return 0.0
    return float(((req[:, None] - got[None]).abs().min(1).values <= tolerance).float().mean())


def beat_reward(beats: Tensor | list[int], *, tolerance: int = 2, soft: float = 0.0,
                normalize: Callable[[Tensor], Tensor] | None = None) -> Callable[[Tensor], Tensor]:
    """A reward ``features [N, T, F] -> [N]`` for beat-aligned generation by SMC steering (:func:`align_to_beats`).

    Per requested beat frame ``b``: 1 if a pause of the row (a frame whose speed ``v_f = ||x_{f+1} - x_f||`` is a
    local minimum below the row's median speed: :func:`kinematic_beats` without its ``min_gap`` thinning) lies within
    ``tolerance`` frames of ``b``, plus ``soft`` times the largest ``max(0, 1 - v_f / median v)`` within ``tolerance``
    (how nearly the motion pauses there: a graded signal while no pause is met yet; 0 by default, since on the
    shipped models it raised neither the hit rate nor fidelity); averaged over the beats that fall inside the
    motion. The hard part is the beat-hit rate of :func:`beat_alignment` up to the thinning, computed on
    the whole batch at once (no host reads: it runs inside the sampler's loop). ``normalize`` maps the features
    first (the tokeniser's normalisation, the space :func:`beat_alignment` is measured in)."""
    req = torch.as_tensor(beats, dtype=torch.long).flatten()
    if req.numel() == 0 or bool((req < 0).any()):
        raise ValueError(f"beats must be a non-empty list of non-negative frame indices, got {req.tolist()}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
    offsets = torch.arange(-tolerance, tolerance + 1)

    def reward(features: Tensor) -> Tensor:
        x = normalize(features) if normalize is not None else features
        n, t = x.shape[0], x.shape[1]
        if t < 4:
            return torch.zeros(n, dtype=x.dtype, device=x.device)
        b = req.to(x.device)
        inside = (b < t).to(x.dtype)  # beats past the motion's end do not count (no host read to drop them)
        v = (x[:, 1:] - x[:, :-1]).norm(dim=-1)  # [N, T-1]: v[:, f] leaves frame f
        med = v.median(-1, keepdim=True).values
        is_min = (v[:, 1:-1] <= v[:, :-2]) & (v[:, 1:-1] <= v[:, 2:]) & (v[:, 1:-1] < med)
        pause = torch.zeros(n, t, dtype=x.dtype, device=x.device)
        pause[:, 1:t - 2] = is_min.to(x.dtype)  # frames 1..T-3, as kinematic_beats
        slow = torch.zeros(n, t, dtype=x.dtype, device=x.device)
        slow[:, : t - 1] = (1 - v / med.clamp_min(1e-12)).clamp(0, 1)
        idx = b[:, None] + offsets.to(x.device)  # [B, 2 tol + 1]
        ok = ((idx >= 0) & (idx < t)).to(x.dtype)
        idx = idx.clamp(0, t - 1)
        hit = (pause[:, idx] * ok).amax(-1)  # [N, B]
        near = (slow[:, idx] * ok).amax(-1)
        return ((hit + soft * near) * inside).sum(-1) / inside.sum().clamp_min(1)

    return reward


@dataclass
class BeatResult:
    """Beat-aligned motions from :func:`align_to_beats`: ``features [count, T, F]`` (one particle per output, drawn
    from its group's final SMC weights), ``tokens [count, T']``, ``rewards [count]`` (the chosen particles'
    :func:`beat_reward`) and the whole :class:`~steerdiff.discrete.DiscreteSteerResult` (``steered``; its ``nfe`` is
    per output)."""

    features: Tensor
    tokens: Tensor
    rewards: Tensor
    steered: object


def align_to_beats(model: LocalMaskedTransformer, tokenizer, beats: Tensor | list[int], length: int, *,
                   count: int = 1, particles: int = 32, alpha: float = 0.02, steps: int = 12, seed: int = 0,
                   tolerance: int = 2, soft: float = 0.0, cond: Tensor | None = None,
                   guidance_scale: float | None = None, choice_temperature: float = 1.0) -> BeatResult:
    """Beat-aligned generation by SMC steering (FK steering of the token sampler, :func:`steer`) towards
    ``p(x) exp(r(decode(x)) / alpha)`` with ``r`` the :func:`beat_reward` of ``beats`` (frames) in the tokeniser's
    normalised feature space (Wang et al., ICLR 2025, Sec. 4.4, beat-aligned dance, reached here by steering instead
    of the beat condition alone: ``docs/methods/motiondreamer.md``, "Beat-aligned generation").

    Each of the ``count`` outputs is one particle of its group of ``particles``, drawn from the group's normalised
    final weights (seeded by ``seed``): a draw from the SMC estimate of the tilted law, not the best particle.
    ``cond`` / ``guidance_scale``: the beat flags and CFG scale (optional; steering needs no condition);
    ``choice_temperature``: the sampler's (as :func:`steerdiff.motion.generator.generate`). Costs
    ``particles`` times the sampler's NFE (twice that with CFG) and one decoding of every particle per round."""
    if isinstance(particles, bool) or not isinstance(particles, int) or particles < 1:
        raise ValueError(f"particles must be a positive integer, got {particles!r}")
    normalize = getattr(tokenizer, "normalize", None)
    reward = beat_reward(beats, tolerance=tolerance, soft=soft, normalize=normalize)
    res, decoded = steer(model, tokenizer, reward, length, count=count, particles=particles, steps=steps,
                         alpha=alpha, seed=seed, cond=cond, guidance_scale=guidance_scale,
                         choice_temperature=choice_temperature)
    g = torch.Generator(device="cpu").manual_seed(int(seed) + 2**41)
    pick = torch.multinomial(res.log_weights.exp().float().cpu(), 1, generator=g).flatten().to(decoded.device)
    rows = torch.arange(count, device=decoded.device) * particles + pick
    return BeatResult(decoded[rows], res.samples[rows], res.rewards[rows], res)


# ------------------------------------------------------------------------------------------------ steering
def steer(model: LocalMaskedTransformer, tokenizer, reward: Callable[[Tensor], Tensor], length: int, *,
          count: int = 1, particles: int = 8, steps: int = 12, alpha: float = 0.1, seed: int = 0,
          cond: Tensor | None = None, guidance_scale: float | None = None, choice_temperature: float = 1.0):
    """FK-steered generation (:func:`steerdiff.discrete.smc`, ``method="maskgit"``) towards
    ``p(x) exp(r(decode(x)) / alpha)``, ``reward(features [N, T, F]) -> [N]`` (e.g. :func:`root_path_reward`).
    The particles move by the same confidence-ordered step as :func:`steerdiff.motion.generator.generate`, with its
    choice temperature (default 1, as there; the discrete sampler's own default, MaskGIT's 4.5, breaks a one-motion
    token grammar and costs fidelity: ``docs/methods/motiondreamer.md``, "Beat-aligned generation").

    Returns the :class:`~steerdiff.discrete.DiscreteSteerResult` (tokens, weights, rewards, ESS, NFE) and the
    decoded particles ``[count * particles, T, F]``."""
    from ..discrete import CFG

    def r(x: Tensor) -> Tensor:
        return reward(decode_batch(tokenizer, x))

    guidance = CFG(guidance_scale) if guidance_scale is not None and cond is not None else None
    with torch.no_grad():
        res = smc(model.denoiser(), process_for(model), r, length=length, steps=steps, alpha=alpha,
                  num_samples=count, particles=particles, method="maskgit", cond=cond, guidance=guidance,
                  generator=seed, choice_temperature=choice_temperature)
    return res, decode_batch(tokenizer, res.samples)


def root_path_reward(path_of: Callable[[Tensor], Tensor], target: Tensor) -> Callable[[Tensor], Tensor]:
    """A reward ``-mean_t ||path(x)_t - target_t||^2`` for ``path_of(features [N, T, F]) -> [N, T, 2]`` (the root's
    ground-plane trajectory) and a ``target [T, 2]`` (truncated to the shorter of the two)."""

    def reward(features: Tensor) -> Tensor:
        p = path_of(features)
        n = min(p.shape[1], target.shape[0])
        return -(p[:, :n] - target[:n].to(p)).pow(2).sum(-1).mean(-1)

    return reward
