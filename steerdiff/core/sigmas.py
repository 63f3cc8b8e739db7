"""Noise-level schedules and their validation: each schedule is a decreasing float64 1-D tensor.

``karras`` is Karras et al. 2022, eq. 5. ``from_alphas_cumprod`` turns a discrete VP/DDPM schedule into the
sigma convention, ``sigma_t = sqrt((1 - alphabar_t) / alphabar_t)``, with diffusers' timestep spacings. The two
grids on DDPM's linear schedule (betas ``linspace(1e-4, 0.02, 1000)``) that the methods' official code uses are
here too: :func:`vp_linear` (OCM and Analytic-DPM's index choice, ending in 0) and :func:`vp_linear_levels`
(HRDIS's strided timesteps, positive levels for the inverse solvers). :func:`flow` is a flow-matching model's
time grid (diffusers' ``FlowMatchEulerDiscreteScheduler``, static or dynamic shift) as sigmas, starting at
``sigma = inf``. :func:`check_sigmas` validates a schedule for every consumer (``inf`` only as the first level).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable

import torch
from torch import Tensor

from ..io.plugins import Registry

SPACINGS = ("leading", "trailing", "linspace")
FINALS = ("zero", "any", "positive")
VP_BETA_START, VP_BETA_END, VP_TRAIN_STEPS = 1e-4, 0.02, 1000  # DDPM's linear schedule (Ho et al. 2020)


def karras(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0) -> Tensor:
    """Karras et al. (2022) eq. 5: ``steps`` noise levels from ``sigma_max`` to ``sigma_min``, then 0.

    Returns a float64 tensor of shape ``[steps + 1]``.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not (0 < sigma_min < sigma_max) or not math.isfinite(sigma_max):
        raise ValueError(f"need 0 < sigma_min < sigma_max < inf, got sigma_min={sigma_min}, sigma_max={sigma_max}")
    if rho <= 0:
        raise ValueError(f"rho must be positive, got {rho}")
    if steps == 1:
        return torch.tensor([sigma_max, 0.0], dtype=torch.float64)
    ramp = torch.linspace(0, 1, steps, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    sig = (hi + ramp * (lo - hi)) ** rho
    return torch.cat([sig, sig.new_zeros(1)])


def sigmas_from_alphas_cumprod(alphas_cumprod: Tensor) -> Tensor:
    """Per-timestep sigmas of a discrete VP schedule, ``sqrt((1 - abar) / abar)`` (float64)."""
    abar = torch.as_tensor(alphas_cumprod, dtype=torch.float64)
    if abar.ndim != 1 or abar.numel() < 2:
        raise ValueError(f"alphas_cumprod must be 1-D with at least 2 entries, got shape {tuple(abar.shape)}")
    if not torch.all((abar > 0) & (abar <= 1)):
        raise ValueError("alphas_cumprod must lie in (0, 1]")
    if not torch.all(abar[1:] <= abar[:-1]):
        raise ValueError("alphas_cumprod must be non-increasing in t")
    return ((1 - abar) / abar).sqrt()


def vp_timesteps(num_train_timesteps: int, steps: int, spacing: str = "leading", offset: int = 0) -> Tensor:
    """Decreasing integer timesteps used for ``steps`` sampling steps (diffusers' ``timestep_spacing``).

    ``leading``: ``arange(steps) * (T // steps) + offset``; ``trailing``: ``round(arange(T, 0, -T/steps)) - 1``;
    ``linspace``: ``round(linspace(0, T - 1, steps))``.
    """
    T = num_train_timesteps
    if not isinstance(steps, int) or not 1 <= steps <= T:
        raise ValueError(f"steps must be an integer in [1, {T}], got {steps!r}")
    if spacing == "leading":
        ts = torch.arange(steps, dtype=torch.int64) * (T // steps) + offset
    elif spacing == "trailing":
        ts = torch.round(torch.arange(T, 0, -T / steps, dtype=torch.float64)).to(torch.int64).flip(0) - 1
    elif spacing == "linspace":
        ts = torch.round(torch.linspace(0, T - 1, steps, dtype=torch.float64)).to(torch.int64)
    else:
        raise ValueError(f"spacing must be one of {SPACINGS}, got {spacing!r}")
    return ts.clamp(0, T - 1).flip(0)


def from_alphas_cumprod(
    alphas_cumprod: Tensor, steps: int | None = None, spacing: str = "leading", offset: int = 0
) -> Tensor:
    """Sigma schedule of a discrete VP model: sigmas at the sampling timesteps (decreasing), then 0.

    With ``steps=None`` every training timestep is used. Returns float64 ``[steps + 1]``.
    """
    table = sigmas_from_alphas_cumprod(alphas_cumprod)
    if steps is None:
        return torch.cat([table.flip(0), table.new_zeros(1)])
    ts = vp_timesteps(table.numel(), steps, spacing, offset)
    return torch.cat([table[ts], table.new_zeros(1)])


FLOW_GRIDS = ("auto", "scheduler", "flux")


def flow(
    steps: int,
    shift: float = 1.0,
    *,
    mu: float | None = None,
    image_seq_len: int | None = None,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    num_train_timesteps: int = 1000,
    grid: str = "auto",
) -> Tensor:
    """A flow-matching model's time grid (diffusers' ``FlowMatchEulerDiscreteScheduler``) in the sigma convention:
    ``sigma = t / (1 - t)``, first level ``inf`` (``t = 1``, pure noise), last 0; float64 ``[steps + 1]``.

    The base grid ``u`` is one of two (``grid``): ``"scheduler"``, the scheduler's own
    ``linspace(1, u_min, steps)`` with ``u_min`` its smallest training sigma (``1 / num_train_timesteps``, through the
    static shift when there is one), which the SD3 pipeline uses; ``"flux"``, ``linspace(1, 1 / steps, steps)``,
    which the FLUX pipeline passes as ``sigmas=``. ``"auto"`` takes the first with the static shift and the second
    with the dynamic one. The grid is then shifted:

    * static (SD3; Esser et al. 2024, "Scaling Rectified Flow Transformers", Sec. 5.3.2, resolution-dependent
      shifting): ``t = s u / (1 + (s - 1) u)`` with ``s = shift``;
    * dynamic (FLUX), when ``mu`` or ``image_seq_len`` is given: ``t = e^mu / (e^mu + (1/u - 1))`` (the scheduler's
      exponential ``time_shift``), with ``mu`` given or, as the FLUX pipeline's ``calculate_shift``, linear in the
      image's token count: ``mu = base_shift + (max_shift - base_shift) (image_seq_len - base_seq_len) /
      (max_seq_len - base_seq_len)``.

    Both shifts keep ``t = 1`` at ``u = 1``, so ``sigmas[0] = inf`` exactly.

    Raises:
        ValueError: ``steps`` not an integer >= 1; ``shift`` not positive and finite; the dynamic shift given both
            ``mu`` and ``image_seq_len``, or combined with ``shift != 1``; ``mu``, ``base_shift`` or ``max_shift``
            not finite; ``image_seq_len`` not a positive integer; ``base_seq_len >= max_seq_len``; an unknown
            ``grid``; ``num_train_timesteps`` not an integer >= 1.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not (math.isfinite(shift) and shift > 0):
        raise ValueError(f"shift must be a positive finite number (the static time shift s, 3.0 for SD3), got "
                         f"{shift!r}")
    if grid not in FLOW_GRIDS:
        raise ValueError(f"grid must be one of {FLOW_GRIDS}, got {grid!r}")
    if isinstance(num_train_timesteps, bool) or not isinstance(num_train_timesteps, int) or num_train_timesteps < 1:
        raise ValueError(f"num_train_timesteps must be an integer >= 1, got {num_train_timesteps!r}")
    dynamic = mu is not None or image_seq_len is not None
    if dynamic:
        mu = _dynamic_mu(shift, mu, image_seq_len, base_shift, max_shift, base_seq_len, max_seq_len)
    if grid == "auto":
        grid = "flux" if dynamic else "scheduler"
    if grid == "flux":
        u_min = 1.0 / steps
    else:
        u_min = 1.0 / num_train_timesteps
        if not dynamic:
            u_min = shift * u_min / (1 + (shift - 1) * u_min)
    u = torch.linspace(1.0, u_min, steps, dtype=torch.float64)
    if dynamic:
        t = math.exp(mu) / (math.exp(mu) + (1 / u - 1))
    else:
        t = shift * u / (1 + (shift - 1) * u)
    t[0] = 1.0  # both shifts fix u = 1 (exactly, not up to rounding): the start is pure noise
    sig = torch.cat([t / (1 - t), t.new_zeros(1)])
    if steps > 1 and not torch.all(sig[1:] < sig[:-1]):
        raise ValueError(f"steps={steps} with this shift gives repeated levels in float64; use fewer steps")
    return sig


def _dynamic_mu(shift, mu, image_seq_len, base_shift, max_shift, base_seq_len, max_seq_len) -> float:
    """The dynamic shift's ``mu``: given, or from ``image_seq_len`` (FLUX's ``calculate_shift``)."""
    if shift != 1.0:
        raise ValueError(f"shift={shift!r} is the static shift; the dynamic shift (mu= or image_seq_len=) replaces "
                         "it (as in diffusers with use_dynamic_shifting=True): leave shift=1")
    if mu is not None and image_seq_len is not None:
        raise ValueError("give the dynamic shift as mu= or as image_seq_len= (mu is then computed from it), "
                         "not both")
    if mu is not None:
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not math.isfinite(mu):
            raise ValueError(f"mu must be a finite number, got {mu!r}")
        return float(mu)
    if isinstance(image_seq_len, bool) or not isinstance(image_seq_len, int) or image_seq_len < 1:
        raise ValueError(f"image_seq_len must be a positive integer (the latent's token count), got "
                         f"{image_seq_len!r}")
    for name, value in (("base_shift", base_shift), ("max_shift", max_shift)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    for name, value in (("base_seq_len", base_seq_len), ("max_seq_len", max_seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if base_seq_len >= max_seq_len:
        raise ValueError(f"need base_seq_len < max_seq_len, got base_seq_len={base_seq_len}, "
                         f"max_seq_len={max_seq_len}")
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return float(base_shift + slope * (image_seq_len - base_seq_len))


def check_sigmas(sigmas, final: str = "zero", allow_inf_start: bool | None = None) -> Tensor:
    """Validate a schedule: 1-D, strictly decreasing, finite except (for samplers) an infinite first level;
    returned as a float64 CPU tensor.

    Args:
        sigmas: the schedule (a tensor or a sequence of numbers).
        final: what the last entry must be. ``"zero"`` (samplers): it is 0. ``"any"`` (SMC, whose grid may end at
            ``sigma_min > 0``): every entry is >= 0 and the first > 0. ``"positive"`` (inverse solvers, which visit
            levels): a single trailing 0 is dropped and every remaining level is > 0.
        allow_inf_start: whether ``sigmas[0]`` may be ``inf`` (pure noise: a flow schedule's ``t = 1``, see
            :func:`flow`); ``inf`` is never allowed anywhere else. Default: allowed for ``final="zero"`` (every core
            sampler takes it), refused for the other consumers unless they opt in.
    """
    if final not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    if allow_inf_start is None:
        allow_inf_start = final == "zero"
    if not isinstance(sigmas, Tensor):
        try:
            sigmas = torch.as_tensor(sigmas, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"sigmas must be a 1-D tensor or a sequence of numbers, got {type(sigmas).__name__}") from e
    if sigmas.dtype == torch.bool or sigmas.is_complex():
        raise TypeError(f"sigmas must be real numbers, got dtype {sigmas.dtype}")
    s = sigmas.detach().to("cpu", torch.float64)
    if s.ndim != 1 or s.numel() < (1 if final == "positive" else 2):
        need = "noise levels" if final == "positive" else "at least 2 entries"
        raise ValueError(f"sigmas must be a 1-D tensor with {need}, got shape {tuple(s.shape)}")
    if final == "zero" and _valid_sampler_schedule(s.tolist(), allow_inf_start):
        return s  # the common case, checked on one host copy (no read of a value per check)
    _check_inf_and_nan(s, allow_inf_start, final)
    if final == "positive":
        if s.numel() > 1 and s[-1] == 0:
            s = s[:-1]
        if (s <= 0).any():
            raise ValueError("sigmas must be finite and positive (a single trailing 0 is allowed and ignored)")
        if not torch.all(s[1:] < s[:-1]):
            raise ValueError("sigmas must be strictly decreasing (levels are visited from high to low)")
        return s
    if final == "zero":
        if s[-1] != 0:
            raise ValueError(f"sigmas must end at 0 (got last value {s[-1].item():g}); append a 0")
    elif (s < 0).any():
        raise ValueError("sigmas must be finite and non-negative")
    if not torch.all(s[1:] < s[:-1]):
        i = int(torch.nonzero(s[1:] >= s[:-1])[0])
        raise ValueError(
            f"sigmas must be strictly decreasing; sigmas[{i}]={s[i].item():g} <= sigmas[{i + 1}]={s[i + 1].item():g}"
        )
    if final == "any" and s[0] <= 0:
        raise ValueError("sigmas[0] must be positive")
    return s


def _valid_sampler_schedule(levels: list[float], allow_inf_start: bool) -> bool:
    """Whether ``levels`` passes every check of ``final="zero"``: strictly decreasing (so no NaN, and ``inf`` at most
    first), ending at 0, ``inf`` first only where allowed. False sends it to the checks that name what is wrong."""
    return (levels[-1] == 0 and all(map(operator.gt, levels[:-1], levels[1:]))  # (no Python frame per level)
            and (allow_inf_start or levels[0] != math.inf))


def _check_inf_and_nan(s: Tensor, allow_inf_start: bool, final: str) -> None:
    """NaN and -inf are never levels; +inf only as the first one, and only where the consumer takes it."""
    bad = torch.isnan(s) | (s == -math.inf)
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        raise ValueError(f"sigmas must be finite (sigmas[{i}] = {s[i].item()})")
    inf = torch.isposinf(s)
    if not inf.any():
        return
    i = int(torch.nonzero(inf)[-1])
    if i > 0:
        raise ValueError(f"sigmas must be finite except the first level: sigmas[{i}] = inf (sigma = inf is pure "
                         "noise, a flow schedule's t = 1, and may only start a schedule)")
    if not allow_inf_start:
        raise ValueError(f"sigmas must be finite here (final={final!r}): this consumer cannot start at sigma = inf; "
                         "drop the first level (sigmas[1:]) or use a schedule with a finite sigma_max")

@functools.lru_cache(maxsize=4)
def _vp_linear_table(n: int) -> Tensor:
    betas = torch.linspace(VP_BETA_START, VP_BETA_END, n, dtype=torch.float64)
    return sigmas_from_alphas_cumprod(torch.cumprod(1 - betas, 0))


def vp_linear_table(n: int = VP_TRAIN_STEPS) -> Tensor:
    """``[n]`` increasing sigmas of DDPM's linear schedule (timestep 1..n maps to entry 0..n-1); a float64 copy."""
    return _vp_linear_table(n).clone()


def vp_linear(steps: int, n: int = VP_TRAIN_STEPS) -> Tensor:
    """OCM's (Ou et al. 2025) and Analytic-DPM's grid: ``[steps + 1]`` decreasing sigmas on the linear schedule,
    ending in 0.

    ``K = steps`` uses the timesteps ``round(1 + k (n - 1) / (K - 1))``, ``k = 0..K-1`` (the official code's
    ``_choice_steps_linear``), then 0 is appended; ``K = 1`` uses the single timestep ``n`` (one deterministic step
    ``x0 = D(x_{sigma_n})``). ``sigma_1 = 0.0100``, ``sigma_1000 = 157.4``.

    Raises:
        ValueError: ``steps`` is not an integer in ``[1, n]``.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= n:
        raise ValueError(f"steps must be an integer in [1, {n}], got {steps!r}")
    table = _vp_linear_table(n)
    if steps == 1:
        idx = torch.tensor([n])
    else:
        k = torch.arange(steps, dtype=torch.float64)
        idx = torch.round(1 + k * (n - 1) / (steps - 1)).to(torch.int64)
    sig = table[idx - 1].flip(0)
    return torch.cat([sig, sig.new_zeros(1)])


def vp_linear_levels(steps: int = 100, start: int = VP_TRAIN_STEPS, end: int = 0) -> Tensor:
    """HRDIS's ``get_timesteps`` grid (the inverse solvers' levels): ``[steps]`` positive decreasing sigmas on the
    linear schedule, **without** a trailing 0.

    ``skip = (start - end) // steps``, timesteps ``t_k = end + k * skip`` for ``k = steps-1 ... 0`` (0-based into
    the table, so ``t = 0`` is ``sigma = 0.0100``). For 100 steps: 143.78 (t = 990) down to 0.0100; ``end=100``
    stops at 0.342.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= end < start <= VP_TRAIN_STEPS):
        raise ValueError(f"need integers 0 <= end < start <= {VP_TRAIN_STEPS}, got start={start}, end={end}")
    skip = (start - end) // steps
    if skip < 1:
        raise ValueError(f"steps={steps} is more than the {start - end} timesteps between end={end} and start={start}")
    t = end + skip * torch.arange(steps - 1, -1, -1)
    return _vp_linear_table(VP_TRAIN_STEPS)[t].clone()


# ------------------------------------------------------------------------------------------------ ComfyUI's schedules
# The schedules of ComfyUI's KSampler (comfy/samplers.py, comfy/k_diffusion/sampling.py), in float64. Those over a
# model's discrete table (``simple``, ``ddim_uniform``, ``sgm_uniform``, ``beta``) take ``table``: the model's
# per-timestep sigmas in increasing order (ComfyUI's ``model_sampling.sigmas``; :func:`sigmas_from_alphas_cumprod`
# of a VP model, DDPM's linear table by default). ``linear_quadratic`` is given in ComfyUI's sigma, which for a
# flow model is the flow time ``t`` (convert with :func:`flow_t_to_sigma`).

SCHEDULES: Registry[Callable[..., Tensor]] = Registry("schedule", argument="schedule")


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")


def _check_range(sigma_min: float, sigma_max: float) -> None:
    if not (0 < sigma_min < sigma_max) or not math.isfinite(sigma_max):
        raise ValueError(f"need 0 < sigma_min < sigma_max < inf, got sigma_min={sigma_min}, sigma_max={sigma_max}")


def _table(table: Tensor | None) -> Tensor:
    t = vp_linear_table() if table is None else torch.as_tensor(table, dtype=torch.float64)
    if t.ndim != 1 or t.numel() < 2 or not torch.all(t[1:] >= t[:-1]) or not torch.all(t >= 0):
        raise ValueError("table must be the model's per-timestep sigmas: 1-D, non-negative, increasing, "
                         f"at least 2 entries (got shape {tuple(t.shape)})")
    return t


def _zero_end(levels: Tensor) -> Tensor:
    return torch.cat([levels, levels.new_zeros(1)])


@SCHEDULES.register("karras")
def _karras(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0) -> Tensor:
    return karras(steps, sigma_min, sigma_max, rho)


@SCHEDULES.register("exponential")
def exponential(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0) -> Tensor:
    """``steps`` levels evenly spaced in ``log sigma`` from ``sigma_max`` to ``sigma_min``, then 0 (k-diffusion's
    ``get_sigmas_exponential``, ComfyUI's "exponential"); float64 ``[steps + 1]``."""
    _check_steps(steps)
    _check_range(sigma_min, sigma_max)
    return _zero_end(torch.linspace(math.log(sigma_max), math.log(sigma_min), steps, dtype=torch.float64).exp())


@SCHEDULES.register("polyexponential")
def polyexponential(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 1.0) -> Tensor:
    """``log sigma_k = log sigma_min + r_k^rho (log sigma_max - log sigma_min)``, ``r`` from 1 to 0 in ``steps``
    points, then 0 (k-diffusion's ``get_sigmas_polyexponential``; ``rho = 1`` is :func:`exponential`)."""
    _check_steps(steps)
    _check_range(sigma_min, sigma_max)
    if not rho > 0:
        raise ValueError(f"rho must be positive, got {rho}")
    ramp = torch.linspace(1, 0, steps, dtype=torch.float64) ** rho
    return _zero_end(torch.exp(ramp * (math.log(sigma_max) - math.log(sigma_min)) + math.log(sigma_min)))


@SCHEDULES.register("kl_optimal")
def kl_optimal(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0) -> Tensor:
    """The KL-optimal schedule (Sabour, Fidler, Kreis, "Align Your Steps", ICML 2024, eq. 11 / A1111 PR 15608, as
    ComfyUI's "kl_optimal"): ``sigma_k = tan((1 - a_k) atan(sigma_max) + a_k atan(sigma_min))``,
    ``a_k = k / (steps - 1)``, then 0 (one step: ``[sigma_max, 0]``)."""
    _check_steps(steps)
    _check_range(sigma_min, sigma_max)
    a = torch.arange(steps, dtype=torch.float64) / max(steps - 1, 1)
    return _zero_end(torch.tan(a * math.atan(sigma_min) + (1 - a) * math.atan(sigma_max)))


@SCHEDULES.register("simple")
def simple(steps: int, table: Tensor | None = None) -> Tensor:
    """ComfyUI's "simple": ``steps`` entries of the model's table taken every ``len(table) / steps`` from the top
    (entry ``-(1 + int(k len / steps))``), then 0."""
    _check_steps(steps)
    t = _table(table)
    stride = len(t) / steps
    return _zero_end(t[[-(1 + int(k * stride)) for k in range(steps)]])


@SCHEDULES.register("ddim_uniform")
def ddim_uniform(steps: int, table: Tensor | None = None) -> Tensor:
    """ComfyUI's "ddim_uniform": the table's entries ``1, 1 + c, 1 + 2c, ...`` (``c = max(len // steps, 1)``), in
    decreasing order, then 0 (a table whose entry 1 is already 0 takes one more step and no extra 0)."""
    _check_steps(steps)
    t = _table(table)
    levels = t[1::max(len(t) // (steps + 1 if math.isclose(float(t[1]), 0, abs_tol=1e-5) else steps), 1)]
    levels = levels.flip(0)
    return levels if math.isclose(float(t[1]), 0, abs_tol=1e-5) else _zero_end(levels)


def table_sigma(table: Tensor, timestep: Tensor) -> Tensor:
    """ComfyUI's ``ModelSamplingDiscrete.sigma``: the table interpolated linearly in ``log sigma`` at fractional
    ``timestep`` (clamped to ``[0, len - 1]``)."""
    t = timestep.to(torch.float64).clamp(0, len(table) - 1)
    lo, hi = t.floor().long(), t.ceil().long()
    w = t - lo
    log_t = table.log()
    return ((1 - w) * log_t[lo] + w * log_t[hi]).exp()


@SCHEDULES.register("sgm_uniform")
def sgm_uniform(steps: int, table: Tensor | None = None) -> Tensor:
    """ComfyUI's "sgm_uniform" (its ``normal_scheduler`` with ``sgm=True``): ``steps + 1`` timesteps evenly from the
    top of the table to its bottom, the last dropped, mapped through :func:`table_sigma`, then 0."""
    _check_steps(steps)
    t = _table(table)
    ts = torch.linspace(len(t) - 1, 0, steps + 1, dtype=torch.float64)[:-1]
    return _zero_end(table_sigma(t, ts))


@SCHEDULES.register("normal")
def normal(steps: int, table: Tensor | None = None) -> Tensor:
    """ComfyUI's "normal" (its ``normal_scheduler``, ``sgm=False``; k-diffusion's ``DiscreteSchedule.get_sigmas``,
    A1111's default "Uniform"): ``steps`` timesteps evenly from the top of the table to its bottom, both ends
    included, mapped through :func:`table_sigma`, then 0."""
    _check_steps(steps)
    t = _table(table)
    return _zero_end(table_sigma(t, torch.linspace(len(t) - 1, 0, steps, dtype=torch.float64)))


@SCHEDULES.register("beta")
def beta(steps: int, table: Tensor | None = None, alpha: float = 0.6, beta: float = 0.6) -> Tensor:
    """Beta-distributed timesteps (Lee et al., "Beta Sampling is All You Need", arXiv:2407.12173, as ComfyUI's
    "beta"): timesteps ``rint(F^{-1}(1 - k/steps) (len - 1))`` with ``F`` the Beta(alpha, beta) CDF, repeats in a row
    dropped, mapped to the table's sigmas, then 0."""
    from scipy.special import betaincinv  # the Beta quantile (scipy.stats.beta.ppf)

    _check_steps(steps)
    if not (alpha > 0 and beta > 0):
        raise ValueError(f"alpha and beta must be positive, got alpha={alpha}, beta={beta}")
    t = _table(table)
    q = 1 - torch.arange(steps, dtype=torch.float64) / steps
    idx = [int(i) for i in torch.round(torch.as_tensor(betaincinv(alpha, beta, q.numpy())) * (len(t) - 1))]
    keep = [i for k, i in enumerate(idx) if k == 0 or i != idx[k - 1]]
    return _zero_end(t[keep])


@SCHEDULES.register("linear_quadratic")
def linear_quadratic(steps: int, sigma_max: float = 1.0, threshold_noise: float = 0.025,
                     linear_steps: int | None = None) -> Tensor:
    """Mochi's linear-quadratic schedule (Genmo, ``mochi_preview/infer.py``; ComfyUI's "linear_quadratic") in
    ComfyUI's sigma (the flow time ``t`` for a flow model, ``sigma_max = 1``): ``1 - u`` times ``sigma_max``, ``u``
    rising linearly to ``threshold_noise`` over the first ``linear_steps`` (default ``steps // 2``) steps, then on a
    quadratic continuing it with matching slope to 1."""
    _check_steps(steps)
    if steps == 1:
        return torch.tensor([sigma_max, 0.0], dtype=torch.float64)
    n_lin = steps // 2 if linear_steps is None else linear_steps
    if not 1 <= n_lin < steps:
        raise ValueError(f"linear_steps must lie in [1, steps - 1], got {n_lin}")
    n_quad = steps - n_lin
    gap = n_lin - threshold_noise * steps
    a = gap / (n_lin * n_quad**2)
    b = threshold_noise / n_lin - 2 * gap / n_quad**2
    c = a * n_lin**2
    k = torch.arange(steps, dtype=torch.float64)
    u = torch.where(k < n_lin, k * threshold_noise / n_lin, a * k**2 + b * k + c)
    return torch.cat([1 - u, u.new_zeros(1)]) * sigma_max


def flow_t_to_sigma(t: Tensor) -> Tensor:
    """A flow time grid in steerdiff's sigma: ``sigma = t / (1 - t)`` (``t = 1`` gives ``inf``, ``t = 0`` gives 0)."""
    t = torch.as_tensor(t, dtype=torch.float64)
    return torch.where(t >= 1, torch.full_like(t, math.inf), t / (1 - t).clamp(min=0))
