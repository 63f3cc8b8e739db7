"""The inverse-solver registry: each solver registers its options and its run function where it is defined.

:func:`steerdiff.inverse.solve` validates the shared arguments (operator, measurements, noise model, sigmas, chains,
per-chain randomness), then hands the registered solver its options and a :class:`SolveContext`::

    @register_solver("dps", defaults={"scale": None, "eta": 1.0}, check=check_dps_options)
    def run_dps(ctx: SolveContext, opts: dict) -> tuple[Tensor, Tensor, float]:
        ...  # returns (samples [rows, *shape], dead_at [rows], VJPs per chain)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from ..core.noise import SampleNoise
from ..io.plugins import Registry


@dataclass
class SolveContext:
    """What every solver receives from :func:`~steerdiff.inverse.solve`.

    Attributes:
        denoiser: the counted denoiser (:class:`~steerdiff.core.NFECounter`).
        operator: the measurement operator, bound to the denoiser's sample shape.
        y: the measurements ``[M, m]``; ``y_rep`` the same repeated per chain ``[M * chains, m]``.
        chains: chains per measurement; ``rows = M * chains``.
        sigmas: the noise levels, descending and positive (``levels``: its deprecated name, warns).
        noise: per-chain random draws; ``weight``: the noise model's residual weights (Poisson) or None.
        cond: the condition per chain or None; ``callback``, ``progress``: as given to ``solve``.
        method: the registered name the solver runs under.
        noise_std: the Gaussian measurement noise ``sigma_y`` (model units; DDNM+, PiGDM, DDRM, DiffPIR and DAPS
            read it, DPS and DR/CR/HR do not).
        extras: per-run diagnostics a solver reports (they land in ``InverseResult.extras``; DR/CR/HR: ``"lag"``).
    """

    denoiser: Callable
    operator: object
    y: Tensor
    y_rep: Tensor
    chains: int
    sigmas: list[float]
    noise: SampleNoise
    weight: Tensor | None
    cond: Tensor | None
    callback: Callable | None
    progress: bool
    method: str = ""
    noise_std: float = 0.0
    extras: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.y_rep.shape[0]

    @property
    def levels(self) -> list[float]:
        """Deprecated name of :attr:`sigmas`."""
        warnings.warn("SolveContext.levels is deprecated: use ctx.sigmas", DeprecationWarning, stacklevel=2)
        return self.sigmas


@dataclass(frozen=True)
class Solver:
    """A registered solver: its option ``defaults``, ``check(opts, operator) -> opts`` and ``run(ctx, opts)``;
    ``inf_start``: whether it takes ``sigmas[0] = inf`` (a flow schedule's pure-noise start)."""

    name: str
    run: Callable[[SolveContext, dict], tuple[Tensor, Tensor, float]]
    defaults: dict
    check: Callable[[dict, object], dict]
    inf_start: bool = False

    @property
    def fn(self) -> Callable:  # the registry's duplicate check compares the run function
        return self.run


SOLVERS: Registry[Solver] = Registry("inverse solver", argument="method")


def register_solver(name: str, *, defaults: dict, check: Callable[[dict, object], dict],
                    inf_start: bool = False) -> Callable:
    """Decorator registering ``run(ctx, opts) -> (samples, dead_at, vjp per chain)`` as solver ``name``
    (``inf_start``: it takes ``sigmas[0] = inf``, starting from the unit noise itself)."""

    def decorate(run: Callable) -> Callable:
        SOLVERS.add(name, Solver(name, run, dict(defaults), check, inf_start))
        return run

    return decorate
