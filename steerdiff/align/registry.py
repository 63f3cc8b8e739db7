"""The registries of :mod:`steerdiff.align`: aligners, DAS tempering schedules, SMC resamplers and FK potentials.

One plug-in pattern (:class:`steerdiff.io.Registry`, as for samplers and guiders): each entry registers itself where
it is defined, and listings, the ``steerdiff align`` command's choices and options, and the error messages read the
registries. A new aligner is one decorated function::

    @register_aligner("my_smc", cost=lambda steps, particles, **_: {"nfe": particles * steps, "nfe_grad": 0})
    def my_smc(denoiser, reward, noise, sigmas, *, alpha, particles=16, my_option=1.0, ...) -> AlignResult: ...

    sd.align.run("my_smc", denoiser, reward, noise, sigmas, alpha=0.1, my_option=2.0)

The aligners' calling shape, the SMC pieces and the cost accounting are those of ``docs/methods/das.md`` ("One SMC
step", "Cost in NFE"; DAS: Kim, Kim, Park, ICLR 2025) and ``docs/methods/fk_steering.md`` ("The potentials"; Singhal
et al. 2025). This module imports nothing of the package but :mod:`steerdiff.io`, so every module of
:mod:`steerdiff.align` can register into it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..io.plugins import Registry

# The positional arguments of every aligner; everything after them is an option (keyword).
POSITIONAL = ("denoiser", "reward", "noise", "sigmas")


@dataclass(frozen=True, eq=False)
class AlignerSpec:
    """A registered aligner and what a caller (``sd.align.run``, the CLI, the demo) needs to know to call it.

    Attributes:
        name: the registered name (``steerdiff align --method NAME``).
        fn: ``fn(denoiser, reward, noise, sigmas, **options) -> AlignResult`` (:class:`steerdiff.align.AlignResult`).
        options: the keyword options ``fn`` takes, in signature order, with their defaults (``inspect.Parameter.empty``
            for a required one), read from its signature.
        options_class: the dataclass holding the method's own options where it has one (``SMCOptions`` for DAS and
            TDS, ``FKOptions`` for FK steering), for reference; None otherwise.
        cost: ``cost(steps, particles, **options) -> {"nfe": ..., "nfe_grad": ...}``, the nominal denoiser
            evaluations and reward-gradient VJPs per output (per group of ``particles`` rows) of a run of ``steps``
            steps, as :class:`~steerdiff.align.AlignResult` counts them (``nfe_grad`` is an upper bound: no gradient
            is taken into ``sigma = 0`` nor at ``sigma = inf``); None where the method has no cost model.
        pipelines: whether it runs on a pipeline's latent denoiser with a reward of the decoded images
            (``steerdiff align --pipeline``).
        particles: whether ``particles`` are the particles (or chains) behind each output; False for a method that
            makes one output per chain (reward guidance), whose ``particles`` only groups the cost accounting.
        note: a line for listings.
        aliases: other names it answers to (the CLI's short ones: ``bon``, ``guidance``).
    """

    name: str
    fn: Callable
    options: dict[str, Any] = field(default_factory=dict)
    options_class: type | None = None
    cost: Callable[..., dict] | None = None
    pipelines: bool = True
    particles: bool = True
    note: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def distributed(self) -> bool:
        """Whether the aligner spreads its particles over processes (it takes ``dist``)."""
        return "dist" in self.options

    def defaults(self) -> dict[str, Any]:
        """The options that have a default, with it."""
        return {k: v for k, v in self.options.items() if v is not inspect.Parameter.empty}

    def check_options(self, options: dict) -> None:
        """Refuse an option the aligner does not take (a ``TypeError`` naming it and listing those it takes) and a
        missing required one."""
        unknown = [k for k in options if k not in self.options]
        if unknown:
            raise TypeError(f"aligner {self.name!r} does not take option(s) {unknown}; it takes "
                            f"{list(self.options)}")
        missing = [k for k, v in self.options.items() if v is inspect.Parameter.empty and k not in options]
        if missing:
            raise TypeError(f"aligner {self.name!r} needs option(s) {missing}")


ALIGNERS: Registry[AlignerSpec] = Registry("aligner", argument="method")


def signature_options(fn: Callable) -> dict[str, Any]:
    """The keyword options of an aligner function: its parameters after ``denoiser, reward, noise, sigmas``."""
    params = list(inspect.signature(fn).parameters.values())
    head = [p.name for p in params[:len(POSITIONAL)]]
    if head != list(POSITIONAL):
        raise TypeError(f"an aligner takes ({', '.join(POSITIONAL)}, *, options...) first, got {head}")
    rest = params[len(POSITIONAL):]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in rest):
        raise TypeError("an aligner's options are named keyword arguments (no *args or **kwargs), so that the CLI "
                        "and sd.align.run can check them")
    return {p.name: p.default for p in rest}


def register_aligner(
    name: str, *, aliases: tuple[str, ...] = (), cost: Callable[..., dict] | None = None, pipelines: bool = True,
    particles: bool = True, options_class: type | None = None, note: str = "",
) -> Callable[[Callable], Callable]:
    """Decorator registering an aligner function under ``name`` (see :class:`AlignerSpec` for the fields); its options
    are read from its signature."""

    def decorate(fn: Callable) -> Callable:
        ALIGNERS.add(name, AlignerSpec(name, fn, signature_options(fn), options_class, cost, bool(pipelines),
                                       bool(particles), note, tuple(aliases)), aliases)
        return fn

    return decorate


def run(method: str, denoiser: Callable, reward: Callable, noise, sigmas, **options):
    """Run the aligner registered as ``method``: ``ALIGNERS.get(method).fn(denoiser, reward, noise, sigmas,
    **options)``, after checking the options against its signature.

    Raises:
        ValueError: an unknown ``method`` (the message lists the registered ones), and whatever the aligner refuses.
        TypeError: an option the aligner does not take (the message lists those it takes), or a missing required one.
    """
    spec = ALIGNERS.get(method)
    spec.check_options(options)
    return spec.fn(denoiser, reward, noise, sigmas, **options)


# ------------------------------------------------------------------------------------------------ DAS tempering
TEMPERING: Registry[Callable] = Registry("tempering schedule", argument="tempering")
"""Named tempering schedules ``fn(k, gamma, span) -> lambda [steps] or None`` (None: adaptive, chosen by the sampler
from the ESS); ``k`` is ``arange(steps) - i_s`` in float64, ``span = steps - i_s`` the tempered steps, ``gamma`` the
user's rate or None (``docs/methods/das.md``, "Tempering")."""


def register_tempering(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a DAS tempering schedule (see :data:`TEMPERING`)."""
    return TEMPERING.register(name)


# ------------------------------------------------------------------------------------------------ resamplers
RESAMPLERS: Registry[Callable] = Registry("resampler", argument="resampler")
"""Named resampling schemes ``fn(weights [G, P], u [G, P]) -> ancestors [G, P]``: normalised weights and uniforms in
[0, 1) to ancestor indices, vectorised over groups (``docs/methods/das.md``, "Resampling")."""


def register_resampler(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a resampling scheme (see :data:`RESAMPLERS`)."""
    return RESAMPLERS.register(name)


# ------------------------------------------------------------------------------------------------ FK potentials
@dataclass(frozen=True)
class Potential:
    """An FK steering potential (``docs/methods/fk_steering.md``, "The potentials").

    Attributes:
        fn: ``fn(rho, carried) -> (log G_i, carried')`` from ``rho = r(D(x_i)) / alpha`` and the lineage's carried
            statistic; pure.
        initial: the carried statistic before the first potential step.
    """

    name: str
    fn: Callable
    initial: float = 0.0


POTENTIALS: Registry[Potential] = Registry("FK potential", argument="potential")


def register_potential(name: str, initial: float = 0.0) -> Callable[[Callable], Callable]:
    """Decorator registering an FK potential's step function (see :class:`Potential`)."""

    def decorate(fn: Callable) -> Callable:
        POTENTIALS.add(name, Potential(name, fn, float(initial)))
        return fn

    return decorate
