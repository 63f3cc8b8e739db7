"""``solve``: one entry point for DPS, DR (RED-diff), CR, HR, DDNM, PiGDM, DDRM, DiffPIR, DAPS and MCGDiff over one
operator interface (docs/methods/inverse.md).

    res = solve(D, Inpaint.center((1, 8, 8)), y, method="hr", noise_std=0.05, chains=8, generator=0)
    res.samples  # [M, 8, 1, 8, 8]; res.mean(), res.std(), res.nfe, res.nfe_vjp, res.n_nonfinite

Defaults: levels ``vp_linear_levels(steps=100)`` (HRDIS ``get_timesteps``; the DPS paper used 1000); DR/CR/HR
``lam=0.25, v=1, weight="linear", sigma_x0=0``, ``lr = 0.1 x (prior scale / 0.5)`` (0.1, the published value, for
images in [-1, 1] and wherever the prior's scale is unknown; :func:`~steerdiff.inverse.hybrid.default_lr`), Adam
betas (0.9, 0.99), init ``operator.pinv(y)``, HR ``beta=0.2``; DPS ``eta=1`` (DDPM ancestral) and ``scale`` = the
DPS config of the task (0.5 inpainting, 0.3 super-resolution and deblurring; none for ``Matrix``, ``HDR`` and
function operators, which must be given one).

``noise_std`` is validated and recorded (it defines the chi-square check of :meth:`InverseResult.chi2`). DPS and
DR/CR/HR do not read it (DPS balances through ``scale``, DR/CR/HR through ``v`` and ``lam``, as in the published
code); DDNM(+), PiGDM, DDRM, DiffPIR and DAPS weigh the measurement by it (``SolveContext.noise_std``).
"""

from __future__ import annotations

import numbers
import time
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from ..core.denoiser import NFECounter
from ..core.noise import GeneratorLike, SampleNoise, make_generators
from ..core.sigmas import check_sigmas, vp_linear_levels
from . import daps, ddnm, ddrm, diffpir, dps, hybrid, mcgdiff, pigdm  # noqa: F401 - importing them registers their solvers
from .noise import GaussianNoise, PoissonNoise, noise_model
from .operators import Operator, as_operator
from .registry import SOLVERS, SolveContext, Solver
from .result import InverseResult


def _options(solver: Solver, operator: Operator, given: dict) -> dict:
    unknown = sorted(set(given) - set(solver.defaults))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {solver.name!r}; valid options: "
                         f"{sorted(solver.defaults)}")
    return solver.check({**solver.defaults, **given}, operator)


def _bind(operator, denoiser) -> Operator:
    operator = as_operator(operator)
    shape = getattr(denoiser, "sample_shape", None)
    if shape is None:
        if operator.shape is None:
            raise ValueError(f"{operator!r} has no sample shape and the denoiser declares none: pass shape= to the "
                             "operator (e.g. steerdiff.inverse.FunctionOperator(forward, adjoint, shape=(...)))")
        return operator
    return operator.bind(tuple(shape))


def _count(value, name: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _cond(cond, m: int, chains: int):
    if cond is None:
        return None
    cond = torch.as_tensor(cond)
    if cond.dtype.is_floating_point or cond.dtype == torch.bool or cond.ndim not in (1, 2) or cond.shape[0] != m:
        raise ValueError(f"cond must be an integer tensor [M] or [M, k] with M={m} measurements (-1 = null)")
    return cond.repeat_interleave(chains, 0)


def solve(denoiser, operator: Operator | Tensor | Callable | tuple[Callable, Callable], y: Tensor, method: str = "hr",
          *, noise_std: float | None = None,
          chains: int = 1, steps: int = 100, sigmas: Tensor | None = None, cond: Tensor | None = None,
          noise: str | GaussianNoise | PoissonNoise = "gaussian", generator: GeneratorLike = 0,
          progress: bool = False, callback=None, **options) -> InverseResult:
    """Posterior samples for measurements ``y = A(x0) + noise`` under the prior of ``denoiser``.

    Args:
        denoiser: ``D(x, sigma, cond=None) -> E[x0 | x]`` (any steerdiff denoiser, e.g. a ``GaussianMixture`` or a
            shipped EDM model).
        operator: the measurement operator (:mod:`steerdiff.inverse.operators`), or what
            :func:`~steerdiff.inverse.operators.as_operator` accepts: a ``[m, d]`` matrix (tensor), a pair
            ``(forward, adjoint)`` of functions (linear), a single ``forward`` function (nonlinear; DPS, or DR/CR/HR
            with ``init="zeros"`` or a tensor); bound to the denoiser's ``sample_shape`` when it declares one.
        y: measurements ``[M, m]`` (or one ``[m]``), finite, float32 or float64: the dtype of the run (float64 for
            mixtures; half precision is refused: Adam's moments and the DPS step underflow in it).
        method: a registered solver (:data:`steerdiff.inverse.SOLVERS`): ``"dps"``, ``"dr"`` (RED-diff), ``"cr"``
            or ``"hr"``.
        noise_std: Gaussian measurement noise in model units (>= 0); required for Gaussian noise.
        chains: posterior samples per measurement (independent chains).
        steps: number of levels of :func:`steerdiff.core.sigmas.vp_linear_levels` (ignored when ``sigmas`` is given).
        sigmas: descending positive levels (a trailing 0 is ignored). ``dps``, ``ddnm``, ``pigdm``, ``ddrm``,
            ``diffpir`` and ``daps`` also take a first level ``inf`` (a flow schedule, :func:`steerdiff.sigmas.flow`;
            PiGDM and DAPS start at a finite level there, docs/methods/inverse.md, "Flow priors and latent
            pipelines"); DR / CR / HR refuse it.
        cond: integer condition ``[M]`` or ``[M, k]`` for a conditional denoiser (``None`` = unconditional).
        noise: ``"gaussian"``, ``"poisson"`` or a noise model; Poisson weights DPS's residual norm.
        generator: per-chain randomness: an int seed (chain ``r`` of the flattened ``[M * chains]`` batch gets
            ``seed + r``), a list of seeds or generators, or None (global RNG).
        progress: show a progress bar.
        callback: called once per level with a dict (see :func:`dps` and :func:`variational_solve`).
        **options: method hyperparameters. DPS: ``scale`` (``"auto"``, ``"config"``, a number or one per level),
            ``eta``, ``step_form`` (``"code"``, ``"paper"`` or ``"score"``: the weight of a likelihood term added to
            the score, deepinv's form). DR/CR/HR: ``lam``, ``v``, ``lr``
            (None: scaled to the prior), ``lr_cap`` (Adam's step at level sigma is ``min(lr, lr_cap x sigma)``; HR
            1, DR/CR None: fixed), ``weight``, ``sigma_x0``, ``init`` (``"pinv"``, ``"adjoint"``, ``"zeros"`` or a
            tensor ``[M, *shape]`` / ``[M * chains, *shape]``); HR: ``beta``. DDNM: ``eta``; PiGDM: ``eta``,
            ``scale``; DDRM: ``eta``, ``eta_b``; DiffPIR: ``lam``, ``zeta``; DAPS: ``ode_steps``, ``langevin_steps``,
            ``lr``, ``lr_scale`` (docs/methods/inverse.md, "DDNM, PiGDM, DDRM, DiffPIR and DAPS"); MCGDiff:
            ``resampler``, ``ess_threshold`` (its chains are one interacting particle population per measurement).

    Returns:
        An :class:`InverseResult` with samples ``[M, chains, *shape]``, NFE and VJP counts per chain, wall time,
        the guarded (non-finite) chains, and for DR/CR/HR ``extras["lag"]`` ``[M, chains]``: how far each chain ends
        from where the denoiser puts data (above 3: between modes or behind the denoiser; warned about), and
        ``extras["noise_share"]`` (linear operator, Gaussian noise, ``noise_std > 0``; ``hybrid.noise_share``).

    Warns:
        RuntimeWarning: non-finite chains; for DR/CR/HR, more than 5% of the chains ending off the prior's support
            (a multimodal posterior the run did not sample: docs/methods/inverse.md, "Multimodal posteriors"), naming
            the level count that should sample it (also ``extras["levels_suggested"]``), or a noise share above
            0.7 (the measurement noise, which no DR/CR/HR update reads, sets much of the posterior: the chains are
            not posterior samples there); for CR/HR, a re-used noise estimate that grows (rms above 10).

    Raises:
        ValueError: unknown method or option, a measurement whose shape does not match the operator, NaN in ``y``,
            half-precision ``y``, a negative noise level, an operator that does not fit the denoiser's samples,
            ``init="adjoint"`` with a nonlinear operator (:class:`~steerdiff.inverse.operators.NoAdjointError`),
            ``init="pinv"`` with an operator that has none (:class:`~steerdiff.inverse.operators.NoPinvError`).
        TypeError: an operator of none of the accepted forms; a non-callable denoiser.
    """
    solver = SOLVERS.get(method)
    if not callable(denoiser):
        raise TypeError(f"denoiser must be callable D(x, sigma, cond), got {type(denoiser).__name__}")
    if noise_std is None and not isinstance(noise, PoissonNoise) and noise != "poisson":
        raise ValueError("noise_std is required for Gaussian measurement noise (model units, >= 0)")
    model = noise_model(noise, 0.0 if noise_std is None else noise_std)
    noise_std = model.std if noise_std is None else GaussianNoise(noise_std).std  # validates: finite, >= 0
    chains = _count(chains, "chains")
    if sigmas is None:
        steps = _count(steps, "steps")
    operator = _bind(operator, denoiser)
    y = operator.check_y(y)
    if y.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"y must be float32 or float64 (the dtype of the solver's state), got {y.dtype}: pass "
                         "y.float() or y.double()")
    y = y.detach()
    opts = _options(solver, operator, options)
    if sigmas is not None and not solver.inf_start and _starts_at_inf(sigmas):
        raise ValueError(f"sigmas[0] = inf (a flow schedule's pure-noise start): method={method!r} cannot start at "
                         f"sigma = inf (methods that can: {[n for n, s in SOLVERS.items() if s.inf_start]}); drop "
                         "the first level (sigmas[1:]) or pass steps=")
    sigmas = check_sigmas(vp_linear_levels(steps) if sigmas is None else sigmas, final="positive",
                          allow_inf_start=solver.inf_start).tolist()
    rows = y.shape[0] * chains
    y_rep = y.repeat_interleave(chains, 0)
    cond_rep = _cond(cond, y.shape[0], chains)
    rng = SampleNoise(make_generators(generator, rows, "cpu"))
    counter = NFECounter(denoiser)
    ctx = SolveContext(denoiser=counter, operator=operator, y=y, y_rep=y_rep, chains=chains, sigmas=sigmas, noise=rng,
                       weight=model.weights(y_rep), cond=cond_rep, callback=callback, progress=progress,
                       method=method, noise_std=noise_std)

    start = time.perf_counter()
    x, dead_at, vjp = solver.run(ctx, opts)
    wall = time.perf_counter() - start
    if (dead_at >= 0).any():
        warnings.warn(f"{method}: {int((dead_at >= 0).sum())} of {rows} chains turned non-finite; they are kept as NaN "
                      "and flagged in result.dead_at", RuntimeWarning, stacklevel=2)
    if isinstance(opts.get("init"), Tensor):
        opts["init"] = "tensor"
    return InverseResult(samples=x.reshape(y.shape[0], chains, *operator.shape), method=method, options=opts,
                         sigmas=torch.tensor(sigmas, dtype=torch.float64), nfe=counter.nfe(rows), nfe_vjp=vjp,
                         wall_time=wall, dead_at=dead_at.reshape(y.shape[0], chains), noise_std=noise_std,
                         extras=ctx.extras)


def _starts_at_inf(sigmas) -> bool:
    try:
        first = torch.as_tensor(sigmas, dtype=torch.float64).flatten()[:1]
    except (TypeError, ValueError, RuntimeError):
        return False  # check_sigmas names the problem
    return bool(first.numel() and torch.isposinf(first).all())
