"""Schedules optimised for one model and one sampler: Align-Your-Steps-style iterative refinement of the grid.

Sabour, Fidler, Kreis, "Align Your Steps: Optimizing Sampling Schedules in Diffusion Models" (ICML 2024). Sec. 3.2
bounds the KL divergence between the true and the discretised process by the sum over steps of the local
discretisation error, estimated from samples; Sec. 3.3 ("Optimization") minimises it over the interior time points
with the end points fixed, one coordinate at a time, initialised from a hand-designed schedule and stopped early
when it stops improving. We keep that optimisation (coordinate-wise refinement of the interior levels from Karras'
schedule, end points fixed, a few hundred Monte-Carlo samples with fixed noise) and replace the KL upper bound by
the quantity it bounds for a deterministic sampler: the mean squared distance between the sampler's endpoint on the
candidate grid and the ODE solution from the same noise on a fine reference grid (Heun, 200 steps by default). Why
this and not GITS (Chen et al. 2024, "On the Trajectory Regularity of ODE-based Diffusion Sampling", Sec. 4, dynamic
programming over a fine grid with one-step costs): GITS' step cost assumes a one-step method started on the teacher
trajectory, so it does not see a multistep sampler's history (DPM-Solver++ 2M, UniPC, iPNDM), while the endpoint
error of the whole run scores every registered sampler exactly as it will be used, at the price of one sampler run
per candidate (cheap: a few hundred samples at 5-20 NFE).

Parametrisation: each interior level moves inside the bracket its neighbours leave, searched by golden section in
``g = log(atan(sigma))``, which is ``log sigma`` at small sigma and stays finite at ``sigma = inf`` (a flow model's
first level), so one rule serves EDM and flow grids. The first level (``sigma_max``) and the final 0 are fixed; the
last positive level moves too, down to ``sigma_min``: at 5 NFE a step from 0.002 to 0 is a wasted evaluation.
Only candidates that lower the objective are taken, so the result is never worse than the initial schedule on the
optimisation samples (held-out samples are what the tests and ``benchmarks/frontier.py`` score).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..io.files import atomic_write_text
from .noise import randn
from .registry import SAMPLERS
from .sampling import nfe_of, sample
from .sigmas import check_sigmas, flow, karras

GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass
class OptimisedSchedule:
    """The result of :func:`optimise_schedule`: ``sigmas`` (float64 ``[steps + 1]``, ending in 0), the objective
    (mean squared endpoint error per coordinate against the reference) before and after, and its value after each
    sweep."""

    sigmas: Tensor
    sampler: str
    steps: int
    nfe: int
    loss: float
    init_loss: float
    history: list[float] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        levels = ["inf" if math.isinf(s) else s for s in self.sigmas.tolist()]
        return {"sigmas": levels, "sampler": self.sampler, "steps": self.steps, "nfe": self.nfe, "loss": self.loss,
                "init_loss": self.init_loss, "history": self.history, **self.meta}

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")


def load_sigmas(path: str | Path) -> Tensor:
    """A schedule from a JSON file: a list of levels or an object with ``"sigmas"`` (as :meth:`OptimisedSchedule.
    save` writes; ``"inf"`` is a level), validated by :func:`check_sigmas`; float64."""
    data = json.loads(Path(path).read_text())
    levels = data.get("sigmas") if isinstance(data, dict) else data
    if not isinstance(levels, list):
        raise ValueError(f"{path}: expected a JSON list of sigmas or an object with a 'sigmas' list")
    try:
        values = [float(v) for v in levels]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: sigmas must be numbers (or 'inf' first), got {levels!r}") from e
    return check_sigmas(values)


def _g(s: float) -> float:
    return math.log(math.atan(s))


def _g_inv(g: float) -> float:
    return math.tan(math.exp(g))


def default_initial(model, steps: int, sigma_min: float, sigma_max: float, rho: float = 7.0) -> Tensor:
    """The schedule the optimiser starts from: Karras et al. 2022 eq. 5 (``rho``), or for a model run from
    ``sigma = inf`` the uniform flow grid ``flow(steps, grid="flux")``."""
    if math.isinf(sigma_max):
        return flow(steps, grid="flux")
    return karras(steps, sigma_min, sigma_max, rho)


def endpoint_error(model, noise: Tensor, sigmas: Tensor, sampler: str, reference: Tensor, cond: Tensor | None = None,
                   **options) -> float:
    """Mean over samples and coordinates of ``(x_sampler - x_reference)^2`` for the run of ``sampler`` on
    ``sigmas`` from ``noise``: the discretisation error the optimiser minimises."""
    with torch.no_grad():
        x = sample(model, noise, sigmas, method=sampler, cond=cond, **options)
    err = (x.double() - reference.double()).pow(2).mean()
    return float(err) if torch.isfinite(err) else math.inf


def reference_solution(model, noise: Tensor, sigma_max: float, sigma_min: float, ref_steps: int = 200,
                       ref_method: str = "heun", cond: Tensor | None = None) -> Tensor:
    """The ODE endpoint from ``noise`` on a fine grid (Karras' with ``ref_steps`` levels from ``sigma_max`` to
    ``min(sigma_min, 0.002)``, or the flow grid from ``sigma = inf``), integrated by ``ref_method``."""
    if math.isinf(sigma_max):
        fine = flow(ref_steps, grid="flux")
    else:
        fine = karras(ref_steps, min(sigma_min, 0.002), sigma_max, 7.0)
    with torch.no_grad():
        return sample(model, noise, fine, method=ref_method, cond=cond)


def optimise_schedule(
    model,
    sampler: str,
    steps: int,
    *,
    n: int = 256,
    seed: int = 0,
    sigma_min: float | None = None,
    sigma_max: float | None = None,
    init: Tensor | None = None,
    rho: float = 7.0,
    cond: Tensor | None = None,
    sweeps: int = 4,
    evals: int = 8,
    tol: float = 1e-3,
    ref_steps: int = 200,
    ref_method: str = "heun",
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    progress: bool = False,
    **options,
) -> OptimisedSchedule:
    """An AYS-style schedule (Sabour et al. 2024, Sec. 3.3) for ``model`` and ``sampler`` at ``steps`` steps.

    Args:
        model: a denoiser ``D(x, sigma, cond)`` with ``sample_shape`` (or a mixture with ``dim``).
        sampler: a deterministic registered sampler (the objective pairs each run with the ODE solution from the
            same noise, which a stochastic sampler does not follow).
        steps: sampler steps (the schedule has ``steps + 1`` entries; NFE from the registry).
        n: Monte-Carlo samples (per-sample noise from ``seed``: deterministic given the seed).
        sigma_min, sigma_max: the fixed top level and the floor of the last positive level; default the model's
            ``sigma_range`` clipped to ``[0.002, 80]`` (``sigma_max = inf`` when the model can start from pure noise
            and ``init`` does).
        init: the starting schedule (default :func:`default_initial`: Karras, rho 7; flow grid from inf).
        cond: the condition of each of the ``n`` samples (e.g. ``arange(n) % 10`` for a class model).
        sweeps, evals, tol: at most ``sweeps`` passes over the interior levels, ``evals`` objective evaluations per
            golden-section search; stop when a sweep lowers the objective by less than ``tol`` (relative).
        ref_steps, ref_method: the reference ODE solve.
        dtype, device: of the noise (default float64 for a mixture, float32 otherwise).
        progress: a tqdm bar over the coordinate searches.
        **options: options of the sampler.

    Raises:
        ValueError: unknown or stochastic sampler, ``steps`` < 2, ``n`` < 1, a bad ``init``.
    """
    spec = SAMPLERS.get(sampler)
    if spec.stochastic(options.get("eta", spec.default_eta) or 0.0):
        raise ValueError(f"sampler={sampler!r} is stochastic; the optimiser's objective (endpoint error against the "
                         "ODE solution from the same noise) needs a deterministic sampler")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an integer >= 2 (one step has no level to move), got {steps!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    lo_rng, hi_rng = getattr(model, "sigma_range", (0.0, math.inf))
    sigma_min = max(float(lo_rng), 0.002) if sigma_min is None else float(sigma_min)
    if init is not None:
        cur = check_sigmas(init).clone()
        if cur.numel() != steps + 1:
            raise ValueError(f"init has {cur.numel() - 1} steps, expected steps={steps}")
    else:
        if sigma_max is None:
            sigma_max = math.inf if (math.isinf(hi_rng) and spec.inf_start and _is_flow(model)) else \
                min(float(hi_rng), 80.0)
        cur = default_initial(model, steps, sigma_min, sigma_max, rho)
    sigma_max = float(cur[0])
    sigma_min = min(sigma_min, float(cur[-2]))
    if dtype is None:
        dtype = torch.float64 if hasattr(model, "n_components") else torch.float32
    shape = tuple(model.sample_shape) if hasattr(model, "sample_shape") else (model.dim,)
    noise = randn((n, *shape), seeds=seed * 1_000_003, dtype=dtype, device=device)
    ref = reference_solution(model, noise, sigma_max, sigma_min, ref_steps, ref_method, cond)

    def loss_of(levels: Tensor) -> float:
        return endpoint_error(model, noise, levels, sampler, ref, cond, **options)

    best = loss_of(cur)
    init_loss, history = best, []
    bar = tqdm(total=sweeps * (steps - 1), disable=not progress, desc=f"schedule {sampler} x{steps}")
    for _ in range(sweeps):
        start = best
        for i in range(1, steps):
            upper = _g(float(cur[i - 1]))
            lower = _g(float(cur[i + 1])) if i + 1 < steps else _g(sigma_min)
            if not lower < upper:
                bar.update(1)
                continue
            val, g = _golden(lambda g, i=i, c=cur: loss_of(_with(c, i, _g_inv(g))), lower, upper, evals)
            if val < best:
                best, cur = val, _with(cur, i, _g_inv(g))
            bar.update(1)
        history.append(best)
        if start - best <= tol * start:
            break
    bar.close()
    meta = {"n": n, "seed": seed, "ref_steps": ref_steps, "ref_method": ref_method, "sigma_min": sigma_min,
            "sigma_max": "inf" if math.isinf(sigma_max) else sigma_max, "method": "AYS-style (Sabour et al. 2024, "
            "Sec. 3.3) coordinate refinement of the endpoint error"}
    return OptimisedSchedule(cur, sampler, steps, nfe_of(sampler, steps), best, init_loss, history, meta)


def _is_flow(model) -> bool:
    from .flow import FlowDenoiser

    return isinstance(model, FlowDenoiser) or isinstance(getattr(model, "model", None), FlowDenoiser)


def _with(levels: Tensor, i: int, value: float) -> Tensor:
    out = levels.clone()
    out[i] = value
    return out


def _golden(f, a: float, b: float, evals: int) -> tuple[float, float]:
    """Golden-section search of ``f`` on the open interval ``(a, b)`` with ``evals`` evaluations; the best seen."""
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    seen = [(fc, c), (fd, d)]
    for _ in range(max(evals - 2, 0)):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
            seen.append((fc, c))
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
            seen.append((fd, d))
    return min(seen)
