"""Forward processes over categorical tokens in continuous time, and their exact reverse steps.

Every process here is an *interpolating* one (D3PM, Austin et al., NeurIPS 2021, Sec. 3 and App. A.2;
MDLM, Sahoo et al., NeurIPS 2024, Sec. 2-3; DiGress, Vignac et al., ICLR 2023, Sec. 3-4): each token, independently,

    q(x_t | x_0) = alpha_t onehot(x_0) + (1 - alpha_t) m,

a clean token survives with probability ``alpha_t`` (``alpha_0 = 1``, decreasing) and is otherwise replaced by a draw
from a fixed distribution ``m`` over the ``S`` states. **absorbing**: ``S = K + 1``, ``m`` the mask token (index
``K``); **uniform**: ``S = K``, ``m = 1/K``; **marginal**: ``S = K``, ``m = pi`` (DiGress's data marginal). Between two
times ``s < t`` the process is the same kernel with ``alpha_{t|s} = alpha_t / alpha_s``, so the exact reverse step
given a clean token, ``q(x_s | x_t, x_0) ∝ q(x_t | x_s) q(x_s | x_0)``, and its average over the denoiser's
``p(x_0 | x_t)`` (:meth:`Process.posterior`) are closed forms (``docs/methods/discrete.md``, "Reverse step").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .registry import PROCESSES, SCHEDULES


# ------------------------------------------------------------------------------------------------ schedules
def _check_t(t: float) -> float:
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"t must lie in [0, 1], got {t!r}")
    return float(t)


@SCHEDULES.register("linear")
class LinearSchedule:
    """``alpha_t = 1 - t`` (D3PM's absorbing ``1/(T - t + 1)`` schedule in continuous time; MDLM with eps = 0)."""

    def alpha(self, t: float) -> float:
        return 1.0 - _check_t(t)

    def t_of_alpha(self, a: float) -> float:
        return 1.0 - a


@SCHEDULES.register("cosine")
class CosineSchedule:
    """``alpha_t = cos(pi t / 2)``: the cosine schedule (Nichol & Dhariwal's ``alphabar`` without offset, as DiGress
    uses for its transition weights; MaskGIT's masking ratio ``cos(pi r / 2)`` read as the masked fraction is
    ``1 - alpha``)."""

    def alpha(self, t: float) -> float:
        return 0.0 if t == 1.0 else math.cos(math.pi * _check_t(t) / 2)

    def t_of_alpha(self, a: float) -> float:
        return 2.0 / math.pi * math.acos(min(max(a, 0.0), 1.0))


@SCHEDULES.register("loglinear")
class LogLinearSchedule:
    """MDLM's log-linear noise ``sigma(t) = -log(1 - (1 - eps) t)``: ``alpha_t = e^{-sigma(t)} = 1 - (1 - eps) t``
    (Sahoo et al. 2024, Sec. 3.5; ``eps = 1e-3`` as their code), so ``alpha_1 = eps``: the run starts from the
    all-mask (or ``m``) state, a ``eps``-approximation of ``q(x_1)``."""

    def __init__(self, eps: float = 1e-3):
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps must lie in [0, 1), got {eps!r}")
        self.eps = float(eps)

    def alpha(self, t: float) -> float:
        return 1.0 - (1.0 - self.eps) * _check_t(t)

    def t_of_alpha(self, a: float) -> float:
        return min(max((1.0 - a) / (1.0 - self.eps), 0.0), 1.0)


def make_schedule(schedule) -> object:
    """A schedule object from a registered name or an object with ``alpha`` and ``t_of_alpha``."""
    if isinstance(schedule, str):
        return SCHEDULES.get(schedule)()
    if not (hasattr(schedule, "alpha") and hasattr(schedule, "t_of_alpha")):
        raise TypeError(f"schedule must be one of {SCHEDULES.names()} or an object with alpha(t) and t_of_alpha(a), "
                        f"got {schedule!r}")
    return schedule


# ------------------------------------------------------------------------------------------------ processes
class Process:
    """An interpolating categorical forward process over ``K`` clean tokens (see the module docstring).

    Attributes:
        name: the registered name.
        num_classes: ``K``, the clean tokens (what the denoiser returns probabilities over).
        num_states: ``S``: ``K + 1`` for absorbing (the mask is index ``K``), ``K`` otherwise.
        mask_index: ``K`` for absorbing, None otherwise.
        schedule: the survival schedule ``alpha_t``.
        m: ``[S]`` float64, the distribution a corrupted token is drawn from (the limit ``q(x_1)`` when
            ``alpha_1 = 0``).
    """

    def __init__(self, name: str, num_classes: int, m: Tensor, schedule="loglinear", absorbing: bool = False):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        self.name = name
        self.num_classes = num_classes
        self.absorbing = absorbing
        self.num_states = num_classes + 1 if absorbing else num_classes
        self.mask_index = num_classes if absorbing else None
        self.schedule = make_schedule(schedule)
        self.m = m.to(torch.float64)

    def __repr__(self) -> str:
        return f"Process({self.name!r}, K={self.num_classes}, schedule={type(self.schedule).__name__})"

    def alpha(self, t: float) -> float:
        """The survival probability ``alpha_t`` (host float)."""
        return self.schedule.alpha(t)

    def transition(self, t: float, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
        """``[K, S]``: ``q(x_t = j | x_0 = k) = alpha_t [j = k] + (1 - alpha_t) m_j``."""
        a = self.alpha(t)
        eye = torch.eye(self.num_classes, self.num_states, dtype=torch.float64)
        return (a * eye + (1 - a) * self.m[None]).to(dtype=dtype, device=device)

    def prior(self, shape: tuple[int, int], u: Tensor) -> Tensor:
        """The start ``x_1 [B, L]`` (long): the mask everywhere (absorbing), else a draw from ``m`` (uniforms ``u``)."""
        if self.absorbing:
            return torch.full(shape, self.num_classes, dtype=torch.long, device=u.device)
        return categorical(self.m.to(u.device, torch.float32).expand(*shape, -1), u)

    def noise(self, x0: Tensor, t: float, u: Tensor, v: Tensor) -> Tensor:
        """A draw of ``x_t ~ q(x_t | x_0)`` for clean tokens ``x0 [B, L]``, from uniforms ``u, v [B, L]``."""
        keep = u < self.alpha(t)
        return torch.where(keep, x0, self.prior(tuple(x0.shape), v))

    def posterior(self, x: Tensor, p0: Tensor, t: float, s: float) -> Tensor:
        """``[B, L, S]``: the reverse step ``p(x_s | x_t) = sum_{x_0} p0(x_0) q(x_s | x_t, x_0)``, ``s < t``.

        With ``i = x_t``, ``den_k = q(x_t = i | x_0 = k)``, ``w_k = p0_k / den_k`` and ``a = alpha_t / alpha_s``:
        ``p(x_s = j) ∝ (a [j = i] + (1 - a) m_i) (alpha_s w_j [j < K] + (1 - alpha_s) m_j sum_k w_k)``.
        Absorbing: a masked token unmasks to ``j`` with ``(alpha_s - alpha_t)/(1 - alpha_t) p0_j`` and stays masked
        with ``(1 - alpha_s)/(1 - alpha_t)`` (MDLM eq. 7); an unmasked token is carried over whatever ``p0`` says.
        Computed in at least float32 (in the state's device).
        """
        a_t, a_s = self.alpha(t), self.alpha(s)
        dtype = torch.promote_types(p0.dtype, torch.float32)
        p0 = p0.to(dtype)
        if self.absorbing:
            masked = (x == self.mask_index)[..., None]
            c = (a_s - a_t) / max(1.0 - a_t, 1e-300)
            stay = (1.0 - a_s) / max(1.0 - a_t, 1e-300)
            out = torch.cat([c * p0, torch.full_like(p0[..., :1], stay)], -1)
            return torch.where(masked, out, onehot_states(x, self.num_states, dtype))
        m = self.m.to(device=p0.device, dtype=dtype)
        onehot = onehot_states(x, self.num_states, dtype)
        m_i = m[x][..., None]  # [B, L, 1]
        den = a_t * onehot + (1 - a_t) * m_i  # q(x_t = i | x_0 = k), k = 0..K-1
        w = torch.where(den > 0, p0 / den.clamp_min(torch.finfo(dtype).tiny), torch.zeros_like(p0))
        a = a_t / a_s if a_s > 0 else 0.0
        fwd = a * onehot + (1 - a) * m_i  # q(x_t = i | x_s = j)
        out = fwd * (a_s * w + (1 - a_s) * m * w.sum(-1, keepdim=True))
        return out / out.sum(-1, keepdim=True)


def onehot_states(x: Tensor, num: int, dtype: torch.dtype) -> Tensor:
    """``[..., num]`` one-hot of ``x`` by comparison (``F.one_hot`` checks the range with two host reads)."""
    return (x[..., None] == torch.arange(num, device=x.device)).to(dtype)


def categorical(probs: Tensor, u: Tensor) -> Tensor:
    """Indices ``[...]`` drawn from (unnormalised) ``probs [..., S]`` by inverse CDF with uniforms ``u [...]``."""
    cdf = probs.cumsum(-1)
    hit = (cdf < u[..., None].to(cdf.dtype) * cdf[..., -1:]).sum(-1)
    return hit.clamp_max(probs.shape[-1] - 1)


@PROCESSES.register("absorbing")
def absorbing(num_classes: int, schedule="loglinear") -> Process:
    """The absorbing (masked) process: D3PM-absorbing (Austin et al. 2021, Sec. 3.1), MDLM (Sahoo et al. 2024)."""
    m = torch.zeros(num_classes + 1, dtype=torch.float64)
    m[num_classes] = 1.0
    return Process("absorbing", num_classes, m, schedule, absorbing=True)


@PROCESSES.register("uniform")
def uniform(num_classes: int, schedule="cosine") -> Process:
    """The uniform process: D3PM-uniform (Austin et al. 2021, Sec. 3.1; Hoogeboom et al. 2021)."""
    return Process("uniform", num_classes, torch.full((num_classes,), 1.0 / num_classes, dtype=torch.float64),
                   schedule)


@PROCESSES.register("marginal")
def marginal(num_classes: int, schedule="cosine", pi=None) -> Process:
    """DiGress's marginal process (Vignac et al. 2023, Sec. 4.1): corrupted tokens drawn from ``pi`` (the data's
    token marginal, every entry > 0)."""
    if pi is None:
        raise ValueError("pi (the marginal distribution of the clean tokens, length num_classes) is required")
    pi = torch.as_tensor(pi, dtype=torch.float64).flatten()
    if pi.numel() != num_classes or not bool((pi > 0).all()) or not bool(torch.isfinite(pi).all()):
        raise ValueError(f"pi must hold num_classes = {num_classes} positive finite numbers, got {pi.tolist()}")
    return Process("marginal", num_classes, pi / pi.sum(), schedule)


def make_process(process, num_classes: int | None = None, **options) -> Process:
    """A :class:`Process` from a registered name (``num_classes`` and options passed on) or a process itself."""
    if isinstance(process, Process):
        return process
    if num_classes is None:
        raise ValueError("num_classes is required to build a process by name")
    return PROCESSES.get(process)(num_classes, **options)
