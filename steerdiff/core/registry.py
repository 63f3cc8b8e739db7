"""The sampler registry that :func:`steerdiff.sample` dispatches on (the one plug-in pattern of steerdiff.io).

Core registers its own samplers (:mod:`.sampling`); a method package registers its samplers where they are defined
(``covariance`` its ``ocm-*`` kernels), so core knows no method by name. Listings, command-line choices and error
messages read the same registry::

    @register_sampler("euler", nfe=lambda steps: steps)
    def sample_euler(model, x, sigmas, *, callback=None, progress=False, **_): ...

The other plug-in kinds follow the same pattern beside their consumers: guiders (``steerdiff.guidance.GUIDERS``),
inverse solvers (``steerdiff.inverse.SOLVERS``), checkpoint formats (``steerdiff.io.FORMATS``), model classes
(``steerdiff.models.MODEL_REGISTRY``) and demo sections.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..io.plugins import Registry


@dataclass(frozen=True)
class SamplerSpec:
    """A registered sampler and what :func:`steerdiff.sample` needs to know to call it.

    Attributes:
        fn: ``fn(model, x, sigmas, *, callback, progress, noise, eta, denoiser, cond, **options)`` returning the
            final state, or ``(state, extras)`` with a dict of per-run statistics (kept in ``SampleStats.extras``).
            ``model(x, sigma_batch)`` is the counted (and guided) denoiser, ``x`` is already scaled to
            ``sigmas[0]``, ``sigmas`` a list of floats; ``denoiser`` is the user's object (for hooks), ``cond`` its
            condition.
        nfe: denoiser evaluations per sample for a schedule of ``steps`` steps (without guidance).
        stochastic: whether a run with this ``eta`` draws fresh noise (then per-sample generators are made).
        eta: whether the sampler takes an ``eta`` (DDIM's stochasticity, an ancestral or SDE sampler's noise
            share); ``default_eta`` is the value used when the caller gives none (0 for DDIM, 1 for ancestral
            samplers, as in k-diffusion).
        options: extra keyword arguments of :func:`steerdiff.sample` the sampler takes (e.g. ``covariance``);
            ``required`` lists those it cannot run without.
        guidance: whether the sampler can run a guided denoiser; ``note`` says why not, for the error message.
        inf_start: whether the sampler was written for an infinite first level (``sigmas[0] = inf``, a flow
            schedule's pure noise): it takes its first step in closed form from the unit noise, or refuses it with
            its own error. :func:`steerdiff.sample` refuses an infinite start for a sampler without it, which would
            otherwise receive the unit noise as its state unawares.
        corrector: whether the sampler honours :func:`steerdiff.sample`'s ``x0_corrector=`` hook (it gets each step's
            first evaluation through :func:`~steerdiff.core.sampling.denoise_step`); ``sd.sample`` refuses the hook
            for a sampler without it.
    """

    name: str
    fn: Callable
    nfe: Callable[[int], int]
    stochastic: Callable[[float], bool]
    eta: bool = False
    options: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    guidance: bool = True
    note: str = ""
    default_eta: float = 0.0
    inf_start: bool = False
    corrector: bool = False


SAMPLERS: Registry[SamplerSpec] = Registry("sampler", argument="method")


def register_sampler(
    name: str, *, nfe: Callable[[int], int] = lambda steps: steps,
    stochastic: bool | Callable[[float], bool] = False, eta: bool = False, options: tuple[str, ...] = (),
    required: tuple[str, ...] = (), guidance: bool = True, note: str = "", default_eta: float = 0.0,
    inf_start: bool = False, corrector: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator registering a sampler function under ``name`` (see :class:`SamplerSpec` for the fields)."""
    is_stochastic = stochastic if callable(stochastic) else (lambda _eta, s=bool(stochastic): s)

    def decorate(fn: Callable) -> Callable:
        SAMPLERS.add(name, SamplerSpec(name, fn, nfe, is_stochastic, eta, tuple(options), tuple(required),
                                       guidance, note, float(default_eta),
                                       bool(inf_start), bool(corrector)))
        return fn

    return decorate

