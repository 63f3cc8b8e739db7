"""A confidence corrector for discrete diffusion: after sampling, re-decide the tokens the denoiser doubts
(``docs/methods/discrete.md``, "Remasking and the confidence corrector").

A reverse step of a factorised discrete chain draws every position independently given the current state, so it
cannot move two positions jointly and, at the last steps, rarely changes a finished token (DiGress, Vignac et al.
2023, Sec. 3: the reverse kernel factorises over nodes and edges). A denoiser at a small time ``t_c`` was trained
to say which tokens of an almost clean state are noise. The corrector asks it, on the sampled state ``x``, for
``p(x_0 | x_t = x)`` at ``t_c`` and, in each of ``sweeps`` sweeps, replaces the ``per_sweep`` positions whose
current token has the lowest probability (below ``threshold``) by the denoiser's most probable token (``"argmax"``:
iterated conditional modes, Besag 1986, with the denoiser's conditionals) or a draw from it (``"draw"``: a
Gibbs-like move on the chosen positions). This is the "corrector" of predictor-corrector samplers for discrete
diffusion (Campbell et al., NeurIPS 2022, Sec. 4.2) restricted to the doubted positions, and the remasking of
ReMDM (Wang et al., 2025, "Remasking discrete diffusion models with inference-time scaling", Sec. 3) with the
re-decision made at once. It does not sample a stated law: it is a sampling-side heuristic measured on what it is
asked to improve.

Cost: one denoiser evaluation per sweep (two with a doubled CFG batch; :class:`CorrectorStats` counts them). The
loop reads no tensor on the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.noise import GeneratorLike
from .process import Process, categorical
from .sampling import RowCounter, RowRandom, checked_probs

MODES = ("argmax", "draw")


@dataclass
class CorrectorStats:
    """What a correction cost and did: ``nfe`` denoiser evaluations per sample, ``changed [B]`` positions whose
    token changed."""

    nfe: float
    changed: Tensor


def _check(sweeps, t, threshold, per_sweep, mode) -> None:
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 0:
        raise ValueError(f"sweeps must be an integer >= 0, got {sweeps!r}")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 1.0:
        raise ValueError(f"t must be a number in [0, 1], got {t!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
    if isinstance(per_sweep, bool) or not isinstance(per_sweep, int) or per_sweep < 1:
        raise ValueError(f"per_sweep must be an integer >= 1, got {per_sweep!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def correct(denoiser: Callable, process: Process, x: Tensor, *, sweeps: int, t: float = 0.05,
            threshold: float = 0.5, per_sweep: int = 1, mode: str = "argmax", cond=None, guidance=None,
            generator: GeneratorLike = None, return_stats: bool = False):
    """Re-decide the doubted tokens of states ``x [B, L]`` (see the module docstring).

    Args:
        denoiser: ``D(x [B, L], t [B], cond) -> p(x_0 | x_t) [B, L, K]`` (for graphs:
            :func:`steerdiff.discrete.graph.flat_denoiser`).
        process: the process ``x`` lives in; only tokens ``< K`` (neither the mask nor a graph's ``pad``) are
            re-decided.
        x: long ``[B, L]``.
        sweeps: denoiser evaluations; ``0`` returns ``x``.
        t: the time the denoiser is asked at.
        threshold: a position is doubted when the probability of its current token is below this.
        per_sweep: positions re-decided per sweep and row at most (the least probable first).
        mode: ``"argmax"`` or ``"draw"``.
        cond, guidance: as :func:`steerdiff.discrete.sample` (a guider's ``wrap``; CFG on logits).
        generator: the randomness of ``"draw"`` (as :func:`steerdiff.discrete.sample`).
        return_stats: also return :class:`CorrectorStats`.
    """
    _check(sweeps, t, threshold, per_sweep, mode)
    if x.dim() != 2 or x.dtype != torch.long:
        raise ValueError(f"x must be a long tensor [B, L], got {x.dtype} of shape {tuple(x.shape)}")
    b, length = x.shape
    k = process.num_classes
    counter = RowCounter(denoiser)
    model = guidance.wrap(counter) if guidance is not None else counter
    rand = RowRandom.make(generator, b) if mode == "draw" else None
    start = x
    clean = x < k  # neither mask nor pad: fixed over the sweeps (re-decided tokens stay clean)
    take = min(per_sweep, length)
    for i in range(sweeps):
        p0 = checked_probs(model, x, t, cond, i, k).float()
        conf = p0.gather(-1, x.clamp_max(k - 1)[..., None])[..., 0]
        doubt = clean & (conf < threshold)
        score = torch.where(doubt, -conf, torch.full_like(conf, -math.inf))
        chosen = torch.zeros_like(doubt).scatter(1, score.topk(take, dim=1).indices, True) & doubt
        if mode == "argmax":
            new = p0.argmax(-1)
        else:
            new = categorical(p0, rand.rand(b, length, x.device))
        x = torch.where(chosen, new, x)
    if return_stats:
        return x, CorrectorStats(counter.rows / max(b, 1), (x != start).sum(1))
    return x
