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

Every linear multistep solver on the same evaluations is in this family already: each state (and so each point the
model sees) is a free combination of the noise and the earlier outputs, so learned predictor-corrector coefficients
(S4S, Frankel et al., ICML 2025, Sec. 3) or a learned per-step scale on the data prediction (DC-Solver's
compensation, Zhao et al., ECCV 2024) add no new solver. What does is a coefficient that is not one number: the band
family (:class:`LearnedSolver` ``band_*``; docs/methods/samplers.md "Band-split learned solver") gives each step
separate weights for the detail finer than ``p x p`` blocks.

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
FORMAT_BAND = "steerdiff.learned_solver/2"  # the band family: readers of /1 would silently drop its corrections


@dataclass
class LearnedSolver:
    """The fitted parameters (float64): ``sigmas`` ``[K + 1]`` (ending in 0; ``inf`` first for a flow model),
    ``gamma`` ``[K]``, ``beta`` ``[K, K]`` (lower triangular), ``shift`` ``[K]``; ``meta`` records the fit.

    The band family (images only; docs/methods/samplers.md "Band-split learned solver") adds ``band_gamma [K]`` and
    ``band_beta [K, K]``: corrections to the state and multistep weights that act only on the detail finer than
    ``band_pool x band_pool`` blocks (:func:`high_pass`), so each step's weights may differ between coarse structure
    and fine detail. At zero corrections it is the plain solver bit for bit (:meth:`with_band`)."""

    sigmas: Tensor
    gamma: Tensor
    beta: Tensor
    shift: Tensor
    meta: dict = field(default_factory=dict)
    band_gamma: Tensor | None = None
    band_beta: Tensor | None = None
    band_pool: int = 0

    def __post_init__(self):
        if (self.band_gamma is None) != (self.band_beta is None) or (self.band_gamma is None) != (self.band_pool == 0):
            raise ValueError("band_gamma, band_beta and band_pool go together (all set or none)")
        if self.band_pool and (isinstance(self.band_pool, bool) or not isinstance(self.band_pool, int)
                               or self.band_pool < 2):
            raise ValueError(f"band_pool must be an integer >= 2, got {self.band_pool!r}")

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

    def with_band(self, pool: int) -> LearnedSolver:
        """This solver in the band family with zero band corrections (the same solver, bit for bit)."""
        k = self.steps
        return LearnedSolver(self.sigmas.clone(), self.gamma.clone(), self.beta.clone(), self.shift.clone(),
                             dict(self.meta), torch.zeros(k, dtype=torch.float64),
                             torch.zeros(k, k, dtype=torch.float64), pool)

    def band_coefficients(self) -> tuple[Tensor, Tensor] | None:
        """``(state_band [K], d_band [K, K])``: the high-band part of the update, ``x_{i+1} += H(state_band[i] x_i +
        sum_j d_band[i, j] D_j)`` (:func:`high_pass`); ``None`` outside the band family."""
        if self.band_gamma is None:
            return None
        return band_coefficients(self.sigmas, self.band_gamma, self.band_beta)

    def coefficients(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(eval_sigmas [K], state_weight [K], d_weight [K, K])`` of the update ``x_{i+1} = state_weight[i] x_i +
        sum_j d_weight[i, j] D_j`` with ``D_j`` the model at ``eval_sigmas[j]``."""
        return solver_coefficients(self.sigmas, self.gamma, self.beta, self.shift)

    def save(self, path: str | Path) -> None:
        """A safetensors file (the four tensors; the metadata as JSON in the header)."""
        meta = {"format": FORMAT if self.band_gamma is None else FORMAT_BAND, "meta": json.dumps(self.meta)}
        tensors = {"sigmas": self.sigmas, "gamma": self.gamma, "beta": self.beta, "shift": self.shift}
        if self.band_gamma is not None:
            tensors.update(band_gamma=self.band_gamma, band_beta=self.band_beta)
            meta["band_pool"] = str(self.band_pool)
        save_tensors({k: v.double().contiguous() for k, v in tensors.items()}, path, metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> LearnedSolver:
        """A solver written by :meth:`save`; its shapes and schedule are checked."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
        except Exception as err:  # noqa: BLE001 - any unreadable file gets the same message
            raise ValueError(f"{path}: not a safetensors file ({err})") from err
        if header.get("format") not in (FORMAT, FORMAT_BAND):
            raise ValueError(f"{path}: not a learned solver (format {header.get('format')!r}, expected {FORMAT!r} "
                             f"or {FORMAT_BAND!r})")
        band = header["format"] == FORMAT_BAND
        t = load_tensors(path)
        missing = {"sigmas", "gamma", "beta", "shift", *(("band_gamma", "band_beta") if band else ())} - set(t)
        if missing:
            raise ValueError(f"{path}: missing tensors {sorted(missing)}")
        sig = check_sigmas(t["sigmas"].double())
        k = sig.numel() - 1
        if t["gamma"].shape != (k,) or t["shift"].shape != (k,) or t["beta"].shape != (k, k):
            raise ValueError(f"{path}: parameter shapes do not match a {k}-step schedule")
        extra = {}
        if band:
            if t["band_gamma"].shape != (k,) or t["band_beta"].shape != (k, k):
                raise ValueError(f"{path}: band parameter shapes do not match a {k}-step schedule")
            extra = {"band_gamma": t["band_gamma"].double(), "band_beta": torch.tril(t["band_beta"].double()),
                     "band_pool": int(header.get("band_pool", "0"))}
        return cls(sig, t["gamma"].double(), torch.tril(t["beta"].double()), t["shift"].double(),
                   json.loads(header.get("meta", "{}")), **extra)


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


def _step_factors(sigmas: Tensor, shift: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(eval_sigmas, r, c)``: the evaluation levels, the state's ratio ``r_i`` and the data weight ``c_i = 1 - r_i``
    (1 after a step from inf) of each step."""
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
    return torch.stack(eval_s), r, c


def solver_coefficients(sigmas: Tensor, gamma: Tensor, beta: Tensor, shift: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The update's coefficients from the parameters (see the module docstring; differentiable)."""
    eval_s, r, c = _step_factors(sigmas, shift)
    d_weight = c[:, None] * torch.tril(dpmpp_2m_weights(sigmas) + beta)
    return eval_s, r * (1 + gamma), d_weight


def band_coefficients(sigmas: Tensor, band_gamma: Tensor, band_beta: Tensor) -> tuple[Tensor, Tensor]:
    """The band family's high-band corrections in the update's units, ``(r_i band_gamma_i, c_i band_beta_ij)``: the
    fine detail of step ``i`` is updated with state weight ``r_i (1 + gamma_i + band_gamma_i)`` and data weights
    ``c_i (B_ij + beta_ij + band_beta_ij)`` (differentiable)."""
    _, r, c = _step_factors(sigmas, torch.zeros_like(band_gamma))
    return r * band_gamma, c[:, None] * torch.tril(band_beta)


def high_pass(y: Tensor, pool: int) -> Tensor:
    """The detail of images ``y [..., H, W]`` finer than ``pool x pool`` blocks: ``y`` minus its block means (each
    block's mean repeated over the block). Zero on block-constant images; its block means are zero; linear."""
    h, w = y.shape[-2:]
    if h % pool or w % pool:
        raise ValueError(f"band_pool {pool} must divide the image size {h}x{w}")
    lead = y.shape[:-2]
    blocks = y.reshape(-1, h // pool, pool, w // pool, pool)
    low = blocks.mean(dim=(2, 4), keepdim=True).expand_as(blocks)
    return (blocks - low).reshape(*lead, h, w)


def run_solver(evaluate, x: Tensor, eval_sigmas, state_weight, d_weight, *, callback=None,
               progress: bool = False, sigmas=None, band=None) -> Tensor:
    """The solver's loop; the coefficients are Python floats (sampling: no host read in the loop) or tensors (fitting:
    differentiable). ``evaluate(x, sigma, i)`` is the model at step ``i``; ``x`` the state at ``sigmas[0]``.
    ``band``: ``(pool, state_band, d_band)`` of the band family (:func:`band_coefficients`), or None."""
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
        if band is not None:
            pool, sb, db = band
            terms = [(x, sb[i]), *((outs[j], db[i][j]) for j in range(i + 1))]
            if not isinstance(sb[i], float):  # fitting: every term (the gradient reaches each coefficient)
                detail = sum(v * w for v, w in terms)
                nxt = nxt + high_pass(detail, pool)
            elif any(w != 0.0 for _, w in terms):  # sampling: a step without corrections is the plain step exactly
                nxt = nxt + high_pass(sum(v * w for v, w in terms if w != 0.0), pool)
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
        bc = solver.band_coefficients()
        band = None if bc is None else (solver.band_pool, *(t.tolist() for t in bc))
    if band is not None and x.dim() < 3:
        raise ValueError(f"a band-family solver runs on images [n, C, H, W]; got samples of shape {tuple(x.shape)}")
    return run_solver(lambda z, s, i: denoise_checked(model, z, s, i), x, ev, sw, dw, callback=callback,
                      progress=progress, sigmas=sigmas, band=band)


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
        self.band_pool = init.band_pool
        if init.band_gamma is not None:
            self.band_gamma = torch.nn.Parameter(init.band_gamma.clone())
            self.band_beta = torch.nn.Parameter(init.band_beta.clone())

    def sigmas(self) -> Tensor:
        anchor = self.log_first if self.first_free else torch.log(self.top)[None]
        logs = torch.cat([anchor, anchor - torch.cumsum(F.softplus(self.u), 0)])
        if not self.first_free:
            logs = logs[1:]
        return torch.cat([self.top[None], torch.exp(logs), self.top.new_zeros(1)])

    def solver(self) -> LearnedSolver:
        shift = self.shift * (~torch.isinf(self.sigmas()[:-1]))  # an infinite level is never shifted
        band = {} if not self.band_pool else {"band_gamma": self.band_gamma, "band_beta": torch.tril(self.band_beta),
                                              "band_pool": self.band_pool}
        return LearnedSolver(self.sigmas(), self.gamma, torch.tril(self.beta), shift, **band)


LOSSES = ("l2", "multiscale", "denoiser")


def moment_distance(a: Tensor, b: Tensor) -> Tensor:
    """Moment matching between two sets of features ``[n, ...]`` (flattened per row): the mean over features of the
    squared difference of the means plus the mean over feature pairs of the squared difference of the covariances
    (unbiased, ``n - 1``). 0 for equal sets; a constant shift ``c`` of every feature gives ``c^2``."""
    a, b = a.flatten(1), b.flatten(1)
    if a.shape != b.shape or a.shape[0] < 2:
        raise ValueError(f"moment_distance needs two sets of the same shape with at least 2 rows, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    ca, cb = a - a.mean(0), b - b.mean(0)
    n = a.shape[0]
    cov = (ca.T @ ca - cb.T @ cb) / (n - 1)
    return (a.mean(0) - b.mean(0)).pow(2).mean() + cov.pow(2).mean()


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
    band_pool: int = 0,
    moment_weight: float = 0.0,
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
        band_pool: fit the band family (:class:`LearnedSolver`; images only): besides the plain coefficients, each
            step's state and multistep weights get corrections acting on the detail finer than ``band_pool x
            band_pool`` blocks, started at 0 (so the start is the same solver). 0 (the default): the plain family.
        moment_weight: adds ``moment_weight`` times :func:`moment_distance` between the pixels of the solver's
            endpoints and the reference endpoints of the same rows (the minibatch's, or all ``n`` for the kept
            iterate): a term on the teacher's distribution (its mean and pixel covariance) rather than on each
            noise's endpoint, against the blur that the squared error rewards where the solver cannot follow each
            path. No feature network (the pixels), so nothing of an evaluation metric is trained on. 0: off.
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
    if band_pool != 0 and (isinstance(band_pool, bool) or not isinstance(band_pool, int) or band_pool < 2):
        raise ValueError(f"band_pool must be 0 (off) or an integer >= 2, got {band_pool!r}")
    if not (isinstance(moment_weight, (int, float)) and not isinstance(moment_weight, bool)
            and 0 <= moment_weight < math.inf):
        raise ValueError(f"moment_weight must be a non-negative finite number, got {moment_weight!r}")
    start = LearnedSolver.dpmpp_2m(init)
    if band_pool:
        start = start.with_band(band_pool)
    if start.steps < 2:
        raise ValueError("init must have at least 2 steps (one step has no level or history to learn)")
    t0 = time.process_time()
    if dtype is None:
        dtype = torch.float64 if hasattr(model, "n_components") else torch.float32
    shape = tuple(model.sample_shape) if hasattr(model, "sample_shape") else (model.dim,)
    if band_pool:
        if len(shape) < 2:
            raise ValueError(f"band_pool needs image samples [C, H, W]; the model's samples have shape {shape}")
        high_pass(torch.zeros(shape[-2:]), band_pool)  # the pool must divide the image: refuse before any work
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
        sol = params.solver()
        ev, sw, dw = sol.coefficients()
        bc = sol.band_coefficients()
        band = None if bc is None else (band_pool, *(t.to(dtype) for t in bc))
        z0, c = (x0, cond) if idx is None else (x0[idx], None if cond is None else cond[idx])
        if u is not None:
            z0 = z0 + (radius * u if idx is None else radius[idx] * u[idx])
        x = run_solver(lambda z, sigma, _i: model(z, sigma.to(z.device, z.dtype).expand(z.shape[0]), c), z0, ev,
                       sw.to(dtype), dw.to(dtype), band=band)
        out = distance(x, idx)
        if moment_weight > 0:
            out = out + moment_weight * moment_distance(x, ref if idx is None else ref[idx])
        return out

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
                    band = {} if not band_pool else {"band_gamma": s.band_gamma.detach().clone(),
                                                     "band_beta": s.band_beta.detach().clone(), "band_pool": band_pool}
                    best = LearnedSolver(*(v.detach().clone() for v in (s.sigmas, s.gamma, s.beta, s.shift)), **band)
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
                 **({"band_pool": band_pool} if band_pool else {}),
                 **({"moment_weight": moment_weight} if moment_weight > 0 else {}),
                 "init_sigmas": ["inf" if math.isinf(v) else v for v in sig0.tolist()],
                 "cpu_s": round(time.process_time() - t0, 1),
                 "method": "BNS-style (Shaul et al. 2024) multistep coefficients + LD3 (Tong et al. 2025) time steps"}
    return best
