"""A few-step solver learned for one model: per-step multistep coefficients and the time steps, fitted jointly.

Shaul, Singer, Chen, Le, Thabet, Pumarola, Lipman, "Bespoke Non-Stationary Solvers for Fast Sampling of Diffusion
and Flow Models" (ICML 2024), Sec. 3: a non-stationary solver takes step ``i`` as a linear combination of the state
and all previous model outputs, ``x_{i+1} = a_i x_i + sum_{j <= i} b_ij u_j``, with every ``a_i, b_ij`` and the time
grid free parameters, fitted by regression of the solver's endpoint to a fine ODE solution from the same noise (their
RMSE objective, Sec. 3.2); Tong, Tran, Dao, Nguyen, "Learning to Discretize Denoising Diffusion ODEs" (LD3, ICLR
2025), Sec. 3: learn the time steps (and a decoupled evaluation time, their "decoupled" variant) of a given solver by
the same teacher-endpoint regression on a few hundred noises.

We take BNS's solver family in DPM-Solver++'s parametrisation (Lu et al. 2022, Algorithm 2), so that its initial
value is DPM-Solver++ 2M exactly: with ``r_i = s_{i+1} / s_i`` (``s_{i+1}`` itself from ``s_i = inf``, 0 on the
step to 0),

    x_{i+1} = r_i (1 + gamma_i) x_i + (1 - r_i) sum_{j <= i} (B_ij(s) + beta_ij) D(x_j, s_j e^{c_j})

where ``B(s)`` is DPM-Solver++ 2M's data-prediction weights on the grid ``s`` (``1 + w, -w`` with ``w = h_i / (2
h_{i-1})``, first order on the first step and on the step to 0). The learned parameters are the interior levels
``s_1 .. s_{K-1}`` (``s_0`` and the final 0 fixed), the state-weight corrections ``gamma``, the multistep weight
corrections ``beta`` (lower triangular: the full history, as BNS) and LD3's decoupled evaluation shifts ``c`` (the
model sees ``s_j e^{c_j}`` while the step runs from ``s_j``). At ``gamma = beta = c = 0`` the solver is
``dpmpp_2m`` on ``s``: :func:`fit_learned_solver` starts there (on a given schedule, e.g. the AYS-style one of
:mod:`.schedule_opt`) and keeps the best iterate by the training objective, so it can only improve on its training
noises; held-out noises are what the tests and ``benchmarks/frontier.py`` score.

Fitting is Adam on the mean squared endpoint error against Heun on a fine Karras grid (as :mod:`.schedule_opt`),
with gradients through the model (BNS Sec. 3.2; LD3 backpropagates the same way). Other objectives
(:func:`endpoint_loss`; docs/methods/samplers.md "Fitting objectives"): a multiscale L2, a perceptual distance through
the model's own data prediction at one noise level, and LD3's relaxed objective (Sec. 3.2: the solver may start
anywhere in a small ball around each noise). The parameters travel as a
safetensors file (:meth:`LearnedSolver.save`); ``sd.sample(..., method="learned", solver=solver)`` runs them, with
``sigmas=solver.sigmas`` (the schedule is part of the solver).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..io.tensors import load_tensors, save_tensors
from .calls import emit
from .noise import randn
from .registry import register_sampler
from .sampling import Model, denoise_checked, step_range
from .sigmas import check_sigmas

FORMAT = "steerdiff.learned_solver/1"


@dataclass
class LearnedSolver:
    """The fitted parameters (float64): ``sigmas`` ``[K + 1]`` (ending in 0; ``inf`` first for a flow model),
    ``gamma`` ``[K]``, ``beta`` ``[K, K]`` (lower triangular), ``shift`` ``[K]``; ``meta`` records the fit."""

    sigmas: Tensor
    gamma: Tensor
    beta: Tensor
    shift: Tensor
    meta: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return self.sigmas.numel() - 1

    @classmethod
    def dpmpp_2m(cls, sigmas: Tensor) -> LearnedSolver:
        """The solver at its initial value: DPM-Solver++ 2M on ``sigmas`` (all corrections 0)."""
        sig = check_sigmas(sigmas).to(torch.float64)
        k = sig.numel() - 1
        z = torch.zeros(k, dtype=torch.float64)
        return cls(sig.clone(), z.clone(), torch.zeros(k, k, dtype=torch.float64), z.clone())

    def coefficients(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(eval_sigmas [K], state_weight [K], d_weight [K, K])`` of the update ``x_{i+1} = state_weight[i] x_i +
        sum_j d_weight[i, j] D_j`` with ``D_j`` the model at ``eval_sigmas[j]``."""
        return solver_coefficients(self.sigmas, self.gamma, self.beta, self.shift)

    def save(self, path: str | Path) -> None:
        """A safetensors file (the four tensors; the metadata as JSON in the header)."""
        meta = {"format": FORMAT, "meta": json.dumps(self.meta)}
        save_tensors({"sigmas": self.sigmas.double().contiguous(), "gamma": self.gamma.double().contiguous(),
                      "beta": self.beta.double().contiguous(), "shift": self.shift.double().contiguous()},
                     path, metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> LearnedSolver:
        """A solver written by :meth:`save`; its shapes and schedule are checked."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
        except Exception as err:  # noqa: BLE001 - any unreadable file gets the same message
            raise ValueError(f"{path}: not a safetensors file ({err})") from err
        if header.get("format") != FORMAT:
            raise ValueError(f"{path}: not a learned solver (format {header.get('format')!r}, expected {FORMAT!r})")
        t = load_tensors(path)
        missing = {"sigmas", "gamma", "beta", "shift"} - set(t)
        if missing:
            raise ValueError(f"{path}: missing tensors {sorted(missing)}")
        sig = check_sigmas(t["sigmas"].double())
        k = sig.numel() - 1
        if t["gamma"].shape != (k,) or t["shift"].shape != (k,) or t["beta"].shape != (k, k):
            raise ValueError(f"{path}: parameter shapes do not match a {k}-step schedule")
        return cls(sig, t["gamma"].double(), torch.tril(t["beta"].double()), t["shift"].double(),
                   json.loads(header.get("meta", "{}")))


def dpmpp_2m_weights(sigmas: Tensor) -> Tensor:
    """DPM-Solver++ 2M's data-prediction weights ``B [K, K]`` on ``sigmas`` (Lu et al. 2022, Algorithm 2): row ``i``
    is ``e_i`` on the first step, on the step to 0 and after a step from inf, else ``(1 + w) e_i - w e_{i-1}`` with
    ``w = h_i / (2 h_{i-1})``, ``h = log(s / s_next)``. Differentiable in the finite positive levels."""
    k = sigmas.numel() - 1
    levels = sigmas.detach().tolist()  # the structure (which levels are 0 or inf) is fixed during a fit: one read
    rows = []
    for i in range(k):
        row = [sigmas.new_zeros(()) for _ in range(k)]
        s_prev, s, s_next = (sigmas[i - 1] if i else None), sigmas[i], sigmas[i + 1]
        if i == 0 or levels[i + 1] == 0 or math.isinf(levels[i - 1]):
            row[i] = sigmas.new_ones(())
        else:
            w = torch.log(s / s_next) / (2 * torch.log(s_prev / s))
            row[i], row[i - 1] = 1 + w, -w
        rows.append(torch.stack(row))
    return torch.stack(rows)


def solver_coefficients(sigmas: Tensor, gamma: Tensor, beta: Tensor, shift: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The update's coefficients from the parameters (see the module docstring; differentiable)."""
    k = sigmas.numel() - 1
    levels = sigmas.detach().tolist()
    ratio, eval_s = [], []
    for i in range(k):
        s, s_next = sigmas[i], sigmas[i + 1]
        if math.isinf(levels[i]):
            ratio.append(s_next)  # the state at inf is the unit noise: x_1 = D_0 + s_1 eps
            eval_s.append(s)  # no shift of an infinite level
        else:
            ratio.append(s_next / s)
            eval_s.append(s * torch.exp(shift[i]))
    r = torch.stack(ratio)
    c = torch.where(torch.isinf(sigmas[:-1]), torch.ones_like(r), 1 - r)
    d_weight = c[:, None] * torch.tril(dpmpp_2m_weights(sigmas) + beta)
    return torch.stack(eval_s), r * (1 + gamma), d_weight


def run_solver(evaluate, x: Tensor, eval_sigmas, state_weight, d_weight, *, callback=None,
               progress: bool = False, sigmas=None) -> Tensor:
    """The solver's loop; the coefficients are Python floats (sampling: no host read in the loop) or tensors (fitting:
    differentiable). ``evaluate(x, sigma, i)`` is the model at step ``i``; ``x`` the state at ``sigmas[0]``."""
    k = len(eval_sigmas)
    outs: list[Tensor] = []
    for i in step_range([0.0] * (k + 1), progress, "learned"):
        d = evaluate(x, eval_sigmas[i], i)
        outs.append(d)
        if sigmas is not None:
            emit(callback, i, sigmas[i], sigmas[i + 1], x, d)
        nxt = x * state_weight[i]
        for j in range(i + 1):
            nxt = nxt + outs[j] * d_weight[i][j]
        x = nxt
    return x


@register_sampler("learned", inf_start=True, options=("solver",), required=("solver",),
                  note="a LearnedSolver (steerdiff.core.learned_solver; `steerdiff schedule --learned`)")
def sample_learned(model: Model, x: Tensor, sigmas: list[float], *, solver: LearnedSolver, callback=None,
                   progress: bool = False, **_) -> Tensor:
    """A learned non-stationary multistep solver (Shaul et al. 2024, Sec. 3; :class:`LearnedSolver`); NFE = steps.
    ``sigmas`` must be the solver's own schedule (``solver.sigmas``)."""
    if isinstance(solver, (str, Path)):
        solver = LearnedSolver.load(solver)
    if not isinstance(solver, LearnedSolver):
        raise ValueError(f"solver must be a LearnedSolver or the path of one, got {type(solver).__name__}")
    own = solver.sigmas.tolist()
    same = len(own) == len(sigmas) and all(a == b or math.isclose(a, b, rel_tol=1e-6)
                                           for a, b in zip(own, sigmas, strict=True))
    if not same:
        raise ValueError(f"method='learned' runs the solver's own schedule: pass sigmas=solver.sigmas ({len(own) - 1} "
                         f"steps), got {len(sigmas) - 1} steps")
    with torch.no_grad():
        ev, sw, dw = (t.tolist() for t in solver.coefficients())  # once, before the loop
    return run_solver(lambda z, s, i: denoise_checked(model, z, s, i), x, ev, sw, dw, callback=callback,
                      progress=progress, sigmas=sigmas)


def _inv_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


class _Params(torch.nn.Module):
    """The unconstrained parameters: the interior levels as softplus decrements of ``log s`` (ordered by
    construction), and the corrections."""

    def __init__(self, init: LearnedSolver):
        super().__init__()
        sig = init.sigmas
        self.top = sig[0].clone()
        self.first_free = math.isinf(float(sig[0]))  # from inf, log s_1 is free and the decrements start below it
        logs = torch.log(sig[1:-1] if self.first_free else sig[:-1])
        self.log_first = torch.nn.Parameter(logs[:1].clone()) if self.first_free else None
        self.u = torch.nn.Parameter(_inv_softplus(-torch.diff(logs)))
        self.gamma = torch.nn.Parameter(init.gamma.clone())
        self.beta = torch.nn.Parameter(init.beta.clone())
        self.shift = torch.nn.Parameter(init.shift.clone())

    def sigmas(self) -> Tensor:
        anchor = self.log_first if self.first_free else torch.log(self.top)[None]
        logs = torch.cat([anchor, anchor - torch.cumsum(F.softplus(self.u), 0)])
        if not self.first_free:
            logs = logs[1:]
        return torch.cat([self.top[None], torch.exp(logs), self.top.new_zeros(1)])

    def solver(self) -> LearnedSolver:
        shift = self.shift * (~torch.isinf(self.sigmas()[:-1]))  # an infinite level is never shifted
        return LearnedSolver(self.sigmas(), self.gamma, torch.tril(self.beta), shift)


LOSSES = ("l2", "multiscale", "denoiser")


def endpoint_loss(model, ref: Tensor, cond: Tensor | None, loss: str = "l2", *, loss_sigma: float = 0.5,
                  scales: tuple[int, ...] = (1, 2, 4), seed: int = 0):
    """The fitting objective of :func:`fit_learned_solver` against the reference endpoints ``ref [n, ...]``: a
    function ``(x, idx) -> scalar`` of the solver's endpoints ``x`` for the rows ``idx`` of ``ref`` (all when
    ``None``). ``loss`` and its options as in :func:`fit_learned_solver`; ``"denoiser"`` draws its fixed noise from
    ``seed`` and evaluates the model on ``ref`` once here."""
    if loss == "l2":
        return lambda x, idx: (x - (ref if idx is None else ref[idx])).pow(2).mean()
    if loss == "multiscale":
        if ref.dim() < 4:
            raise ValueError(f"loss='multiscale' pools images [n, C, H, W]; the samples have shape "
                             f"{tuple(ref.shape[1:])}")
        size = min(ref.shape[-2:])
        if not scales or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= size for k in scales):
            raise ValueError(f"scales must be pooling sizes between 1 and {size}, got {scales!r}")

        def multiscale(x: Tensor, idx: Tensor | None) -> Tensor:
            d = x - (ref if idx is None else ref[idx])  # pooling is linear: pool the difference once per scale
            return torch.stack([(F.avg_pool2d(d, k, ceil_mode=True) if k > 1 else d).pow(2).mean()
                                for k in scales]).mean()

        return multiscale
    if loss == "denoiser":
        eps = randn(tuple(ref.shape), seeds=seed * 1_000_003 + 500_000, dtype=ref.dtype, device=ref.device)
        sig = torch.full((ref.shape[0],), float(loss_sigma), dtype=ref.dtype, device=ref.device)
        with torch.no_grad():
            target = model(ref + loss_sigma * eps, sig, cond)

        def through_model(x: Tensor, idx: Tensor | None) -> Tensor:
            e, t, s, c = (eps, target, sig, cond) if idx is None else (
                eps[idx], target[idx], sig[idx], None if cond is None else cond[idx])
            return (model(x + loss_sigma * e, s, c) - t).pow(2).mean()

        return through_model
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")


def fit_learned_solver(
    model,
    init: Tensor,
    *,
    n: int = 256,
    seed: int = 0,
    cond: Tensor | None = None,
    iters: int = 300,
    lr: float = 0.05,
    batch: int = 64,
    eval_every: int = 10,
    ref_steps: int = 200,
    ref_method: str = "heun",
    loss: str = "l2",
    loss_sigma: float = 0.5,
    scales: tuple[int, ...] = (1, 2, 4),
    slack: float = 0.0,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> LearnedSolver:
    """Fit a :class:`LearnedSolver` for ``model`` from DPM-Solver++ 2M on ``init`` (BNS / LD3 regression, see the
    module docstring).

    Args:
        model: a denoiser ``D(x, sigma, cond)`` with ``sample_shape`` (or a mixture with ``dim``), differentiable in
            ``x``.
        init: the starting schedule ``[K + 1]`` ending in 0 (e.g. :func:`~steerdiff.core.schedule_opt.
            optimise_schedule`'s); its first level stays fixed.
        n, seed: the fitting noises (per-sample, from ``seed`` as :mod:`.schedule_opt`).
        cond: the condition of each of the ``n`` samples.
        iters, lr, batch: Adam iterations on ``batch`` of the ``n`` noises drawn afresh each time, and the step size
            (cosine decay to a tenth).
        eval_every: iterations between evaluations of the full objective (on all ``n``); the best evaluated iterate
            is returned.
        ref_steps, ref_method: the reference ODE solve (:func:`~steerdiff.core.schedule_opt.reference_solution`).
        loss: the fitting objective between the solver's endpoint ``x`` and the reference ``r`` (:data:`LOSSES`):
            ``"l2"`` the mean squared error (BNS Sec. 3.2, LD3 Sec. 3); ``"multiscale"`` the mean over ``scales`` of
            the squared error after ``k x k`` average pooling (one scale ``(1,)`` is ``"l2"``; images only);
            ``"denoiser"`` the squared error of the model's own data prediction at ``loss_sigma`` from both ends
            with the same fixed noise, ``|D(x + s e, s) - D(r + s e, s)|^2`` (a perceptual distance through the
            model: errors the model would denoise away count little, errors in the data's structure fully).
        loss_sigma: ``s`` of ``"denoiser"``.
        scales: the pooling sizes of ``"multiscale"``.
        slack: LD3's relaxed objective (Tong et al. 2025, Sec. 3.2) when positive: the solver is run from ``x_i +
            delta_i`` with ``|delta_i| <= slack |x_i|`` (``x_i`` the starting state of noise ``i``), each ``delta_i``
            fitted alongside (its own Adam, projected back onto the ball after each step), against the reference from
            ``x_i`` itself: the solver need only reach the teacher's endpoint from somewhere near its noise, which
            asks less of the pairing and more of the law. Sampling runs from ``x_i``; the kept iterate is the best
            by this relaxed objective. 0 (the default): the plain regression.
        dtype, device: of the noise (default float64 for a mixture, float32 otherwise).
        progress: a tqdm bar.

    Returns:
        the iterate with the lowest training objective (the initial one included); ``meta`` holds the objective
        before and after, its history, the settings and the CPU seconds.
    """
    from tqdm.auto import tqdm

    from .schedule_opt import reference_solution

    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be a non-negative integer, got {iters!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    for name, v in (("batch", batch), ("eval_every", eval_every)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not (isinstance(slack, (int, float)) and not isinstance(slack, bool) and 0 <= slack < math.inf):
        raise ValueError(f"slack must be a non-negative finite number, got {slack!r}")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if loss == "denoiser" and not (isinstance(loss_sigma, (int, float)) and 0 < loss_sigma < math.inf):
        raise ValueError(f"loss_sigma must be a positive finite number, got {loss_sigma!r}")
    start = LearnedSolver.dpmpp_2m(init)
    if start.steps < 2:
        raise ValueError("init must have at least 2 steps (one step has no level or history to learn)")
    t0 = time.process_time()
    if dtype is None:
        dtype = torch.float64 if hasattr(model, "n_components") else torch.float32
    shape = tuple(model.sample_shape) if hasattr(model, "sample_shape") else (model.dim,)
    noise = randn((n, *shape), seeds=seed * 1_000_003, dtype=dtype, device=device)
    sig0 = start.sigmas
    ref = reference_solution(model, noise, float(sig0[0]), float(sig0[-2]), ref_steps, ref_method, cond)
    x0 = noise if math.isinf(float(sig0[0])) else noise * float(sig0[0])
    distance = endpoint_loss(model, ref, cond, loss, loss_sigma=loss_sigma, scales=scales, seed=seed)

    params = _Params(start)
    opt = torch.optim.Adam(params.parameters(), lr=lr)
    cosine = lambda t: 0.1 + 0.45 * (1 + math.cos(math.pi * t / max(iters, 1)))  # noqa: E731
    decay = torch.optim.lr_scheduler.LambdaLR(opt, cosine)
    gen = torch.Generator().manual_seed(seed)
    # LD3's slack: delta_i = slack |x_i| u_i with |u_i| <= 1 (u in units of the ball, so one step size fits any level)
    radius = slack * x0.flatten(1).norm(dim=1).view(-1, *[1] * (x0.dim() - 1))
    u = torch.nn.Parameter(torch.zeros_like(x0)) if slack > 0 else None
    opt_u = torch.optim.Adam([u], lr=lr) if u is not None else None
    decay_u = torch.optim.lr_scheduler.LambdaLR(opt_u, cosine) if u is not None else None

    def run(idx: Tensor | None) -> Tensor:
        ev, sw, dw = params.solver().coefficients()
        z0, c = (x0, cond) if idx is None else (x0[idx], None if cond is None else cond[idx])
        if u is not None:
            z0 = z0 + (radius * u if idx is None else radius[idx] * u[idx])
        x = run_solver(lambda z, sigma, _i: model(z, sigma.to(z.device, z.dtype).expand(z.shape[0]), c), z0, ev,
                       sw.to(dtype), dw.to(dtype))
        return distance(x, idx)

    best, best_loss, history = start, math.inf, []
    bar = tqdm(total=iters, disable=not progress, desc=f"learned solver x{start.steps}")
    for t in range(iters + 1):
        if t % eval_every == 0 or t == iters:  # the full training objective: the kept iterate is the best by it
            with torch.no_grad():
                val = float(run(None))
            history.append(val)
            if not math.isfinite(val):
                break
            if val < best_loss:
                best_loss = val
                with torch.no_grad():
                    s = params.solver()
                    best = LearnedSolver(*(v.detach().clone() for v in (s.sigmas, s.gamma, s.beta, s.shift)))
        if t == iters:
            break
        idx = None if batch >= n else torch.randperm(n, generator=gen)[:batch].to(x0.device)
        opt.zero_grad()
        if opt_u is not None:
            opt_u.zero_grad()
        with torch.enable_grad():
            objective = run(idx)
        objective.backward()
        opt.step()
        decay.step()
        if opt_u is not None:
            opt_u.step()
            decay_u.step()
            with torch.no_grad():  # back onto the unit ball, row by row
                u /= u.flatten(1).norm(dim=1).clamp_min(1.0).view(-1, *[1] * (u.dim() - 1))
        bar.update(1)
    bar.close()
    best.meta = {"init_loss": history[0], "loss": best_loss, "history": history,
                 "n": n, "seed": seed, "iters": iters, "lr": lr,
                 "batch": batch, "eval_every": eval_every, "ref_steps": ref_steps, "ref_method": ref_method,
                 "objective": loss, **({"loss_sigma": loss_sigma} if loss == "denoiser" else {}),
                 **({"scales": list(scales)} if loss == "multiscale" else {}),
                 **({"slack": slack} if slack > 0 else {}),
                 "init_sigmas": ["inf" if math.isinf(v) else v for v in sig0.tolist()],
                 "cpu_s": round(time.process_time() - t0, 1),
                 "method": "BNS-style (Shaul et al. 2024) multistep coefficients + LD3 (Tong et al. 2025) time steps"}
    return best
