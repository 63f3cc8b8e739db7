"""The code-faithful VP-linear sigma grid of OCM / Analytic-DPM (spec ``methods/covariance.md`` section 3, "Grid").

VP betas ``linspace(1e-4, 0.02, 1000)``; ``sigma_n = sqrt((1 - abar_n) / abar_n)`` (``sigma_1 = 0.0100``,
``sigma_1000 = 157.4``). ``K`` steps use the indices ``round(1 + k (N - 1) / (K - 1))``, ``k = 0..K-1``
(``_choice_steps_linear``), then 0 is appended. ``K = 1`` uses the single index ``N`` (one deterministic step
``x0 = D(x_{sigma_N})``).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from ..core.sigmas import sigmas_from_alphas_cumprod

N_TRAIN = 1000


@functools.lru_cache(maxsize=4)
def _table(n: int) -> Tensor:
    betas = torch.linspace(1e-4, 0.02, n, dtype=torch.float64)
    return sigmas_from_alphas_cumprod(torch.cumprod(1 - betas, 0))


def vp_linear_table(n: int = N_TRAIN) -> Tensor:
    """``[n]`` increasing sigmas of the VP-linear schedule (index 1..n maps to entry 0..n-1); float64 copy."""
    return _table(n).clone()


def vp_linear_sigmas(steps: int, n: int = N_TRAIN) -> Tensor:
    """Decreasing ``[steps + 1]`` schedule on the VP-linear grid, ending in 0 (spec 3).

    Raises:
        ValueError: ``steps`` is not an integer in ``[1, n]``.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= n:
        raise ValueError(f"steps must be an integer in [1, {n}], got {steps!r}")
    table = _table(n)
    if steps == 1:
        idx = torch.tensor([n])
    else:
        k = torch.arange(steps, dtype=torch.float64)
        idx = torch.round(1 + k * (n - 1) / (steps - 1)).to(torch.int64)
    sig = table[idx - 1].flip(0)
    return torch.cat([sig, sig.new_zeros(1)])


def draw_training_sigmas(
    n: int, generator: torch.Generator | None = None, mode: str = "mixed", n_train: int = N_TRAIN,
    sigma_max: float | None = None,
) -> Tensor:
    """Training noise levels ``[n]`` float64 (spec 2.4 "Sigma sampling").

    ``mode="vp_index"``: uniform over the VP-linear indices 1..N (the official code). ``mode="mixed"``
    (steerdiff): the first half from that, the second half log-uniform on ``[sigma_1, sigma_N]``.
    ``sigma_max`` (steerdiff option, default None = ``sigma_N``) truncates both parts to ``sigma <= sigma_max``.
    """
    table = _table(n_train)
    if mode not in ("mixed", "vp_index"):
        raise ValueError(f"mode must be 'mixed' or 'vp_index', got {mode!r}")
    if sigma_max is not None:
        if not sigma_max > table[0]:
            raise ValueError(f"sigma_max must exceed sigma_1={float(table[0]):.4g}, got {sigma_max}")
        table = table[table <= sigma_max]
    idx = torch.randint(0, table.numel(), (n,), generator=generator)
    sig = table[idx]
    if mode == "mixed":
        m = n // 2
        lo, hi = math.log(float(table[0])), math.log(float(sigma_max) if sigma_max is not None else float(table[-1]))
        u = torch.rand(n - m, generator=generator, dtype=torch.float64)
        sig = torch.cat([sig[:m], (lo + u * (hi - lo)).exp()])
    return sig
