"""The SMC core shared by DAS, TDS and the baselines: an explicit particle state and small step functions.

One step of a sampler over a population of P particles per group (``docs/methods/das.md``, "One SMC step"):

* :func:`look_ahead` evaluates the denoiser, the reward of the denoised estimate and (optionally) its gradient at
  every particle, and flags the particles with a non-finite state, denoised value or reward;
* :func:`reweight` (pure) adds a log-weight increment, kills the non-finite particles (log-weight ``-inf``),
  renormalises per group with a max-shifted logsumexp and returns the evidence increment and the ESS;
  :meth:`SMCState.accept` stores its result;
* :func:`select_groups` picks the groups to resample, :func:`ancestors` (pure: log-weights and uniforms ->
  ancestor indices) draws their ancestors and :func:`reindex` gathers every per-particle quantity of the state;
  :func:`resample_groups` chains the three with uniforms from each group's generator;
* :func:`propose` (pure but for its noise draws) makes the ancestral move, optionally shifted, and returns the
  closed-form ``log p - log q`` of the shift;
* :meth:`SMCTraces.record` records a step's diagnostics (the callback's one shape is
  :func:`steerdiff.align.run_setup.step_info`).

Resamplers are vectorised over groups (``ssp``, ``systematic``, ``stratified``, ``multinomial``, ``residual``), each
a map from weights and uniforms ``[G, P]`` to ancestors ``[G, P]`` registered with
:func:`steerdiff.align.registry.register_resampler` (a new scheme is one decorated function). Every random draw comes
from per-row generators (:mod:`steerdiff.core.noise`); a group's resampling draws come from the generator of its first
row, so a group's result does not depend on how many other groups share the batch, and a sharded run that gathers the
log-weights draws the same ancestors on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from ..core.flow_sde import FlowSDE, as_flow_sde
from ..core.sampling import ancestral_mean, ancestral_split
from .registry import RESAMPLERS, register_resampler

if TYPE_CHECKING:  # .run imports this module
    from .run_setup import AlignRun
    from .shard import ParticleShard

OUTPUTS = ("sample_one", "weighted", "resample", "argmax")

HOST_DECISIONS: bool | None = None
"""Where the per-step decisions of an SMC run are taken (:func:`host_decisions`): None (the default) decides by the
state's device; True / False force the host / device path (tests run the device path on CPU with it)."""


def host_decisions(x: Tensor) -> bool:
    """Whether an SMC run on state ``x`` reads its per-step decisions on the host.

    On the CPU (``True``) a read costs nothing: a group is resampled (and draws its uniforms) only when it needs to,
    and a group left without a finite particle stops the run at once. Elsewhere (``False``) nothing is read per
    step, since each read would synchronise the device: every group draws its resampling uniforms at every
    weighting and the groups that need no resampling keep the identity (``torch.where``), and a dead group is
    recorded on the device and raised after the loop (``FloatingPointError`` naming the same step and group). The
    two paths draw the same numbers whenever every group resamples at every weighting (``ess_threshold = 1``);
    otherwise the device path consumes more uniforms, so its particles differ from the host path's draw by draw
    (not in law). Override with :data:`HOST_DECISIONS`.
    """
    return x.device.type == "cpu" if HOST_DECISIONS is None else HOST_DECISIONS


# ------------------------------------------------------------------------------------------------ weights
def normalize(logw: Tensor) -> Tensor:
    """``logw - logsumexp(logw)`` over the last dimension (``-inf`` entries stay ``-inf``)."""
    m = logw.amax(-1, keepdim=True).clamp_min(torch.finfo(logw.dtype).min)
    return logw - m - torch.logsumexp(logw - m, -1, keepdim=True)


def ess(logw: Tensor) -> Tensor:
    """Effective sample size ``1 / sum_j W_j^2`` of normalised log-weights ``[..., P]``."""
    return 1.0 / torch.exp(2 * logw).sum(-1)


class Reweighted(NamedTuple):
    """The outcome of :func:`reweight` for ``G`` groups of ``P`` particles."""

    log_weights: Tensor  # [G, P] normalised, -inf for killed particles
    log_norm: Tensor  # [G] logsumexp(l + increment): the group's log-evidence increment
    ess: Tensor  # [G] effective sample size of the new weights
    killed: Tensor  # [G, P] bool: flagged bad or a non-finite increment
    dead: Tensor  # [G] bool: no particle of the group is left


def reweight(log_weights: Tensor, increment: Tensor, bad: Tensor | None = None) -> Reweighted:
    """Add a log-weight ``increment [G, P]`` to normalised ``log_weights``; pure.

    Particles flagged ``bad`` or with a non-finite increment get ``-inf``. The evidence increment uses the weights
    *before* the update, ``log Z += logsumexp(l + increment)``, which keeps ``Z`` unbiased.
    """
    killed = ~torch.isfinite(increment) if bad is None else bad | ~torch.isfinite(increment)
    total = log_weights + torch.where(killed, torch.full_like(increment, -math.inf), increment)
    new = normalize(total)
    return Reweighted(new, torch.logsumexp(total, 1), ess(new), killed, torch.isneginf(total).all(1))


# ------------------------------------------------------------------------------------------------ resampling
def _counts_to_ancestors(counts: Tensor) -> Tensor:
    """Offspring counts ``[G, P]`` (summing to P) -> ancestors ``[G, P]``, particle j repeated ``counts_j`` times."""
    p = counts.shape[1]
    cum = counts.cumsum(1)
    slots = torch.arange(p, device=counts.device).expand_as(counts).contiguous()
    return torch.searchsorted(cum, slots, right=True).clamp_max(p - 1)


def _inverse_cdf(weights: Tensor, positions: Tensor) -> Tensor:
    """First j with ``cumsum(W)_j >= position`` (positions in [0, 1)), clipped to ``P - 1``."""
    cum = weights.cumsum(1)
    return torch.searchsorted(cum, positions.contiguous(), right=False).clamp_max(weights.shape[1] - 1)


def _ssp_counts(weights: Tensor, u: Tensor) -> Tensor:
    """Srinivasan sampling process (Gerber, Chopin and Whiteley 2019), vectorised over groups.

    Counts start at ``floor(P W_j)``; the fractional parts are merged pairwise, two "open" indices at a time, so
    that every count ends in ``{floor(P W_j), floor(P W_j) + 1}`` with mean ``P W_j``. Uses ``u[:, :P-1]``.
    """
    g, p = weights.shape
    pw = p * weights
    n = torch.zeros(g, p + 1, dtype=torch.int64, device=weights.device)
    n[:, :p] = pw.floor().long()
    f = torch.zeros(g, p + 1, dtype=weights.dtype, device=weights.device)  # column p: an empty sentinel
    f[:, :p] = pw - pw.floor()
    rows = torch.arange(g, device=weights.device)
    a = torch.zeros(g, dtype=torch.int64, device=weights.device)
    b = torch.ones(g, dtype=torch.int64, device=weights.device)
    for k in range(p - 1):
        fa, fb = f[rows, a], f[rows, b]
        uu, vv = torch.minimum(fb, 1 - fa), torch.minimum(fa, 1 - fb)
        tot = uu + vv
        p_swap = torch.where(tot > 0, uu / tot.clamp_min(1e-300), torch.zeros_like(tot))
        swap = u[:, k] < p_swap
        a, b = torch.where(swap, b, a), torch.where(swap, a, b)
        fa, fb = torch.where(swap, fb, fa), torch.where(swap, fa, fb)
        amount = torch.where(swap, vv, uu)
        nxt = torch.full_like(a, min(k + 2, p))
        b_empties = fb < 1 - fa
        # b empties into a: f_a += amount, b is closed and the next index opens in its place.
        f[rows, a] = torch.where(b_empties, fa + amount, torch.zeros_like(fa))
        f[rows, b] = torch.where(b_empties, torch.zeros_like(fb), fb - amount)
        n[rows, a] += (~b_empties).long()  # a fills up to one more offspring and closes
        a, b = torch.where(b_empties, a, nxt), torch.where(b_empties, nxt, b)
    # One index stays open with a fractional part of (numerically) 0 or 1.
    last = torch.where(a < p, a, b)
    n[rows, last] += (f[rows, last] > 0.5).long()
    counts = n[:, :p]
    # Rounding in extreme weights only leaves a deficit: it goes to the heaviest particle (added unconditionally, 0
    # almost always, so that no host read decides it).
    counts[rows, weights.argmax(1)] += p - counts.sum(1)
    return counts


@register_resampler("ssp")
def resample_ssp(w: Tensor, u: Tensor) -> Tensor:
    """Srinivasan sampling process: ``floor(P W_j)`` or ``floor(P W_j) + 1`` offspring (the official code's)."""
    return _counts_to_ancestors(_ssp_counts(w, u))


@register_resampler("systematic")
def resample_systematic(w: Tensor, u: Tensor) -> Tensor:
    """One uniform per group, P evenly spaced positions: ``floor(P W_j)`` or ``floor(P W_j) + 1`` offspring."""
    steps = torch.arange(w.shape[1], dtype=w.dtype, device=w.device)
    return _inverse_cdf(w, (steps[None] + u[:, :1]) / w.shape[1])


@register_resampler("stratified")
def resample_stratified(w: Tensor, u: Tensor) -> Tensor:
    """One position per stratum ``[j / P, (j + 1) / P)``."""
    steps = torch.arange(w.shape[1], dtype=w.dtype, device=w.device)
    return _inverse_cdf(w, (steps[None] + u) / w.shape[1])


@register_resampler("multinomial")
def resample_multinomial(w: Tensor, u: Tensor) -> Tensor:
    """P independent ancestors."""
    return _inverse_cdf(w, u)


@register_resampler("residual")
def resample_residual(w: Tensor, u: Tensor) -> Tensor:
    """``floor(P W_j)`` copies of each particle, the rest drawn multinomially from the remainders."""
    p = w.shape[1]
    base = (p * w).floor()
    rest = p * w - base
    r = (p - base.sum(1)).round().long()
    extra = _inverse_cdf(rest / rest.sum(1, keepdim=True).clamp_min(1e-300), u)
    take = torch.arange(p, device=w.device)[None] < r[:, None]
    counts = base.long().scatter_add(1, extra, take.long())
    return _counts_to_ancestors(counts)


def resample(weights: Tensor, u: Tensor, scheme: str = "ssp") -> Tensor:
    """Ancestor indices ``[G, P]`` from normalised weights ``[G, P]`` and uniforms ``u`` in [0, 1) ``[G, P]``.

    ``scheme`` is a registered resampler (:data:`steerdiff.align.registry.RESAMPLERS`; ``docs/methods/das.md``,
    "Resampling"): ``ssp`` and ``systematic`` give every particle ``floor(P W_j)`` or ``floor(P W_j) + 1``
    offspring; ``stratified`` draws one position per stratum; ``multinomial`` draws P independent ancestors;
    ``residual`` keeps ``floor(P W_j)`` copies and draws the rest multinomially.
    """
    fn = RESAMPLERS.get(scheme)
    return fn(weights / weights.sum(1, keepdim=True), u)


def group_uniforms(generators: Sequence[torch.Generator] | None, groups: Tensor | Sequence[int], n: int,
                   dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> Tensor:
    """``[len(groups), n]`` uniforms on ``device`` (None: the CPU); row ``k`` from ``generators[groups[k]]`` (the
    global RNG of ``device`` if None).

    Each row is drawn on its generator's own device and moved, as diffusers' ``randn_tensor`` does, so a CPU
    generator serves a model on any device. ``groups`` is best a host-side sequence (a device tensor is read).
    """
    idx = groups.tolist() if isinstance(groups, Tensor) else [int(g) for g in groups]
    if generators is None:
        return torch.rand(len(idx), n, dtype=dtype, device=device)
    u = torch.stack([torch.rand(n, generator=generators[g], dtype=dtype, device=generators[g].device) for g in idx])
    # A host-to-device copy without a stream synchronisation (pageable memory is staged before the call returns).
    return u if device is None else u.to(device, non_blocking=True)


def select_groups(ess_: Tensor, killed: Tensor, threshold: float) -> Tensor:
    """``[G]`` bool: resample where ``ESS < threshold * P``, where a particle was killed, or always if
    ``threshold >= 1`` (a killed particle is replaced at once, so it never spreads)."""
    return (ess_ < threshold * killed.shape[1]) | (killed.sum(1) > 0) | (threshold >= 1)


def ancestors(log_weights: Tensor, groups: Tensor, uniforms: Tensor, scheme: str) -> Tensor:
    """Ancestors ``[G, P]``: the identity except for the rows ``groups``, resampled from their normalised
    ``log_weights`` with ``uniforms [len(groups), P]``. Pure, so every rank of a sharded run that holds the
    gathered log-weights and the same per-group uniforms computes the same ancestors."""
    g, p = log_weights.shape
    anc = torch.arange(p, device=log_weights.device).repeat(g, 1)
    anc[groups] = resample(log_weights[groups].exp(), uniforms.to(log_weights.device), scheme)
    return anc


def ancestor_rows(anc: Tensor, particles: int | None = None) -> Tensor:
    """Flat row indices into ``[G * P, ...]`` tensors (group-major) of per-group picks ``anc [G, n]`` (n = P for
    ancestors; ``particles`` defaults to ``n``)."""
    p = anc.shape[1] if particles is None else particles
    return (anc + p * torch.arange(anc.shape[0], device=anc.device)[:, None]).flatten()


# ------------------------------------------------------------------------------------------------ the state
@dataclass
class SMCTraces:
    """Per-step diagnostics of ``G`` groups over ``N`` steps (row ``N`` is the final weight)."""

    ess: Tensor  # [N + 1, G] float64, NaN where no weighting happened
    lambdas: Tensor  # [N + 1, G] float64 tempering level of the twist
    resampled: Tensor  # [N, G] bool
    nonfinite: Tensor  # [N + 1, G] int64 particles killed
    reward_mean: Tensor  # [N + 1, G] float64 mean finite look-ahead reward, NaN where none

    @classmethod
    def empty(cls, steps: int, groups: int, device) -> SMCTraces:
        f64 = dict(dtype=torch.float64, device=device)
        return cls(torch.full((steps + 1, groups), math.nan, **f64), torch.zeros(steps + 1, groups, **f64),
                   torch.zeros(steps, groups, dtype=torch.bool, device=device),
                   torch.zeros(steps + 1, groups, dtype=torch.int64, device=device),
                   torch.full((steps + 1, groups), math.nan, **f64))

    def record(self, i: int, w: Reweighted, reward: Tensor, bad: Tensor) -> None:
        """The weighting ``w`` of step ``i``: its ESS and kills, and the mean ``reward [G, P]`` over the particles
        not flagged ``bad``."""
        self.ess[i] = w.ess
        self.nonfinite[i] = w.killed.sum(1)
        self.reward_mean[i] = torch.where(bad, torch.nan, reward).nanmean(1)


@dataclass
class SMCState:
    """Everything an SMC sampler carries from one step to the next, for ``G`` groups of ``P`` particles.

    Per row (``[G * P, ...]``, group-major): ``x``, ``cond``, ``denoised``, ``grad``. Per particle (``[G, P]``,
    float64): ``reward``, ``log_weights``, ``log_twist``, ``log_proposal``. Per group (``[G]``): ``log_evidence``,
    ``lam``. ``log_proposal`` is ``log p - log q`` of the move that produced ``x``; it is consumed by the next
    :func:`reweight`, so resampling leaves it alone. ``log_twist`` is ``log psi`` at the last look-ahead, the
    term the next increment subtracts.
    """

    x: Tensor
    cond: Tensor | None
    log_weights: Tensor
    log_twist: Tensor
    log_proposal: Tensor
    log_evidence: Tensor
    lam: Tensor
    traces: SMCTraces
    denoised: Tensor | None = None
    grad: Tensor | None = None
    reward: Tensor | None = None
    dead: Tensor | None = None  # int64 scalar: step * G + group of the first group left with no particle, -1 if none

    def __post_init__(self) -> None:
        if self.dead is None:
            self.dead = torch.full((), -1, dtype=torch.int64, device=self.log_weights.device)

    ROWS = ("x", "cond", "denoised", "grad")
    PARTICLES = ("reward", "log_twist")

    @classmethod
    def start(cls, x: Tensor, cond: Tensor | None, groups: int, particles: int, steps: int) -> SMCState:
        """Equal weights ``-log P``, no twist, no evidence yet."""
        f64 = dict(dtype=torch.float64, device=x.device)
        return cls(x=x, cond=cond, log_weights=torch.full((groups, particles), -math.log(particles), **f64),
                   log_twist=torch.zeros(groups, particles, **f64), log_proposal=torch.zeros(groups, particles, **f64),
                   log_evidence=torch.zeros(groups, **f64), lam=torch.zeros(groups, **f64),
                   traces=SMCTraces.empty(steps, groups, x.device))

    @property
    def groups(self) -> int:
        return self.log_weights.shape[0]

    @property
    def particles(self) -> int:
        return self.log_weights.shape[1]

    def accept(self, w: Reweighted) -> None:
        """Store the new weights and add the evidence increment."""
        self.log_evidence = self.log_evidence + w.log_norm
        self.log_weights = w.log_weights


def _dead_error(run: AlignRun, step: int, g: int) -> FloatingPointError:
    alpha = "" if run.alpha is None else f" (or lower alpha's inverse, 1/alpha={1 / run.alpha:.3g})"
    return FloatingPointError(
        f"{run.method}: every particle of group {g} has a non-finite state, denoised value, reward or weight "
        f"at step {step} (sigma={run.sigmas[min(step, run.steps)]:.6g}); check the reward and the denoiser{alpha}")


def accept_weights(run: AlignRun, state: SMCState, increment: Tensor, bad: Tensor, step: int) -> Reweighted:
    """:func:`reweight` ``state`` by ``increment`` and accept it; every SMC sampler weighs through this.

    A group left with no finite particle stops the run (``FloatingPointError`` naming the step and sigma): at once
    on the host path of :func:`host_decisions`; on the device path the first such step is recorded in
    ``state.dead`` (no host read) and raised by :func:`raise_if_dead` after the loop."""
    w = reweight(state.log_weights, increment, bad)
    if run.host_decisions:
        if w.dead.any():
            raise _dead_error(run, step, int(w.dead.nonzero()[0]))
    else:
        first = step * state.groups + w.dead.long().argmax()
        state.dead = torch.where((state.dead < 0) & w.dead.any(), first, state.dead)
    state.accept(w)
    return w


def raise_if_dead(run: AlignRun, state: SMCState) -> None:
    """Raise the ``FloatingPointError`` of the first dead group recorded by the device path (one host read)."""
    if not run.host_decisions:
        code = int(state.dead)
        if code >= 0:
            raise _dead_error(run, code // state.groups, code % state.groups)


def reindex(state: SMCState, anc: Tensor, shard: ParticleShard | None = None) -> None:
    """Replace every per-row and per-particle quantity of ``state`` by its ancestor's (``anc [G, P]``), in place.

    The weights are left to the caller (:func:`resample_groups` resets the resampled groups to ``-log P``). With a
    ``shard`` the per-row fields (``SMCState.ROWS``) hold this rank's rows and the ancestors' rows come from the
    ranks that hold them (:meth:`~steerdiff.align.shard.ParticleShard.reindex_rows`); the per-particle fields
    (``SMCState.PARTICLES``) are whole on every rank.
    """
    rows = ancestor_rows(anc)
    if shard is None or shard.local:
        moved = [None if getattr(state, n) is None else getattr(state, n)[rows] for n in SMCState.ROWS]
    else:
        moved = shard.reindex_rows([getattr(state, n) for n in SMCState.ROWS], anc)
    for name, t in zip(SMCState.ROWS, moved, strict=True):
        setattr(state, name, t)
    for name in SMCState.PARTICLES:
        t = getattr(state, name)
        setattr(state, name, None if t is None else t.flatten()[rows].view(anc.shape))


def resample_groups(state: SMCState, do: Tensor, group_generators, scheme: str,
                    shard: ParticleShard | None = None, host: bool = True) -> Tensor | None:
    """Resample the groups ``do [G]``: ancestors from each group's generator, :func:`reindex`, weights reset to
    ``-log P``. Returns the ancestors ``[G, P]`` (the identity for the other groups), or None if none resampled.
    With a ``shard``, a group's uniforms are drawn by the rank that holds its first row and shared.

    ``host=False`` (the device path of :func:`host_decisions`) reads nothing: every group draws its uniforms, the
    groups not in ``do`` keep the identity, and the ancestors are always returned."""
    local = shard is None or shard.local
    dev = state.log_weights.device
    if not host:
        g, p = state.groups, state.particles
        u = (group_uniforms(group_generators, range(g), p, device=dev) if local
             else shard.group_uniforms(group_generators, torch.arange(g), p).to(dev))
        every = resample(state.log_weights.exp(), u, scheme)
        anc = torch.where(do[:, None], every, torch.arange(p, device=dev).expand(g, p))
        reindex(state, anc, shard)
        state.log_weights = torch.where(do[:, None], torch.full_like(state.log_weights, -math.log(p)),
                                        state.log_weights)
        return anc
    if not do.any():
        return None
    gi = do.nonzero().flatten()
    u = (group_uniforms(group_generators, gi.tolist(), state.particles, device=dev) if local
         else shard.group_uniforms(group_generators, gi, state.particles))
    anc = ancestors(state.log_weights, gi, u, scheme)
    reindex(state, anc, shard)
    state.log_weights[gi] = -math.log(state.particles)
    return anc


# ------------------------------------------------------------------------------------------------ steps
def row_finite(t: Tensor) -> Tensor:
    """``[B]`` bool: the row holds only finite values (one reduction: a row sum is finite iff every entry is,
    barring overflow of the sum itself, which is then treated as non-finite too)."""
    return torch.isfinite(t.flatten(1).sum(1))


def flat_dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-row inner product ``[B]`` in float64."""
    return (a.double() * b.double()).flatten(1).sum(1)


def look_ahead(state: SMCState, calls, sigma: float, grad: bool, step: int) -> Tensor:
    """Set ``state.denoised``, ``state.reward`` ``[G, P]`` and ``state.grad`` (``grad_x r(D(x, sigma))``, or None)
    at the particles; returns ``bad [G, P]``, the particles whose state, denoised value or reward is not finite.

    A non-finite gradient, and the gradient of a bad particle, is set to 0: the proposal then stays the plain
    kernel for that particle and the weights remain exact for the move actually made.
    """
    d, rho, g = calls.twist(state.x, sigma, state.cond, grad, step)
    shard = getattr(calls, "shard", None)
    local_bad = ~torch.isfinite(rho) | ~(row_finite(d) & row_finite(state.x))
    if shard is not None and not shard.local:  # one gather for both (the flag travels as a float64 0 / 1)
        both = shard.gather(torch.stack([rho.double(), local_bad.double()], 1))
        rho, bad = both[:, 0].view(state.groups, state.particles), both[:, 1].view(state.groups, state.particles) > 0
    else:
        rho, bad = rho.view(state.groups, state.particles), local_bad.view(state.groups, state.particles)
    if g is not None:  # on the device, no host read: where() instead of a masked assignment behind any()
        zero = (local_bad | ~row_finite(g)).view(-1, *([1] * (g.ndim - 1)))
        g = torch.where(zero, torch.zeros_like(g), g)
    state.denoised, state.reward, state.grad = d, rho, g
    return bad


def ancestral_coeffs(s: float, s_next: float, eta: float) -> tuple[float, float]:
    """``(keep, s_up)`` of the ancestral step: mean ``D + keep (x - D)``, noise std ``s_up``.

    With ``eta = 1``: ``keep = s'^2 / s^2`` and ``s_up^2 = s'^2 (s^2 - s'^2) / s^2`` (the DDPM posterior;
    ``docs/methods/das.md``, "The model chain").
    """
    s_down, s_up = ancestral_split(s, s_next, eta)
    return s_down / s, s_up


NOISE_BLOCK = 32
"""Draws buffered per row by :class:`~steerdiff.core.noise.SampleNoise` (fixed, so a row's noise depends only on
its own generator; larger than the core default to halve the per-row generator calls on cheap models)."""


def start_state(noise: Tensor, sigma0: float, vp_compat: bool = False) -> Tensor:
    """The chains' start: ``noise * sigma_0`` (``noise * sqrt(1 + sigma_0^2)`` with ``vp_compat``), or, at
    ``sigma_0 = inf`` (a flow schedule), the unit noise itself, as :func:`steerdiff.sample` hands it to samplers."""
    if math.isinf(sigma0):
        return noise
    return noise * (math.sqrt(1 + sigma0**2) if vp_compat else sigma0)


def use_sde(run: AlignRun, sde: str | FlowSDE | None) -> AlignRun:
    """Make ``run``'s moves the steps of the flow SDE ``sde`` (a name of
    :data:`steerdiff.core.flow_sde.FLOW_SDES` or a :class:`~steerdiff.core.flow_sde.FlowSDE`;
    ``docs/methods/flow_sde.md``): the proposal kernel's split ``(s_down, s_up)`` replaces the ancestral ``eta``'s,
    the weights' closed form is unchanged (any Gaussian kernel). None: ``run`` unchanged.

    Raises:
        ValueError: ``sde`` is not a registered name or a FlowSDE; ``eta`` was set too (they choose the same thing).
    """
    if sde is None:
        return run
    if run.eta != 1.0:
        raise ValueError(f"sde={sde!r} and eta={run.eta!r}: both set the noise of each step; pass one of them")
    run.eta = as_flow_sde(sde)  # ancestral_split takes its split in place of eta's
    return run


def propose(x: Tensor, denoised: Tensor, sigma: float, sigma_next: float, eta: float, noise,
            shift: Callable[[float], Tensor] | None = None, log_ratio: bool = True) -> tuple[Tensor, Tensor | None]:
    """The ancestral move ``x' = mu(x) + delta + tau z`` from ``sigma`` to ``sigma_next``.

    Args:
        x, denoised: the particles and ``D(x, sigma)``.
        noise: a :class:`~steerdiff.core.noise.SampleNoise` (one generator per row) for ``z``.
        shift: ``delta`` as a function of the step's noise std ``tau`` (e.g. ``tau^2 lambda grad / alpha``);
            None for the plain kernel.
        log_ratio: return ``log p - log q = -(delta . z) / tau - |delta|^2 / (2 tau^2)`` per row (closed form:
            the two Gaussians differ only in the mean, so their densities are never subtracted).

    Returns:
        ``(x_next, log_ratio [B] or None)``; None when there is no shift (the ratio is 0) or not asked for. A step
        to ``sigma_next = 0`` is deterministic, ``x_next = denoised``, and draws no noise. From ``sigma = inf``
        (a flow schedule's start) ``x`` is the unit noise and the move is the limit, ``D + s_down x + tau z``.
    """
    if sigma_next == 0:
        return denoised, None
    # core's ancestral mean D + (s_down / s)(x - D), at sigma = inf (x the unit noise) its limit D + s_down x
    mean, tau = ancestral_mean(x, denoised, sigma, sigma_next, eta)
    z = noise.randn_like(x)
    if shift is None:
        return mean + tau * z, None
    delta = shift(tau)
    x_next = mean + delta + tau * z
    if not log_ratio:
        return x_next, None
    return x_next, -flat_dot(delta, z) / tau - flat_dot(delta, delta) / (2 * tau**2)


def twist_shift(grad: Tensor, lam_next: Tensor, alpha: float, kappa: float = 1.0) -> Callable[[float], Tensor]:
    """The locally optimal shift ``delta = kappa tau^2 lambda_{i+1} grad / alpha`` (``lam_next [G]``, one level per
    group, ``grad [G * P, ...]``), as the ``shift`` of :func:`propose`."""
    rows = lam_next.repeat_interleave(grad.shape[0] // lam_next.shape[0])

    def delta(tau: float) -> Tensor:
        scale = (kappa * tau**2 / alpha) * rows
        return grad * scale.to(grad.dtype).view(-1, *([1] * (grad.ndim - 1)))

    return delta


# ------------------------------------------------------------------------------------------------ outputs
def select_output(x: Tensor, rewards: Tensor, log_weights: Tensor, output: str, resampler: str,
                  group_generators, shard: ParticleShard | None = None) -> tuple[Tensor, Tensor]:
    """The returned samples and their rewards (``rewards [G, P]``) from the final particles ``x [G * P, ...]``.

    ``weighted``: all particles; ``argmax``: the largest ``log_weights`` per group (any score works: best-of-N
    passes its rewards); ``sample_one``: one multinomial draw per group; ``resample``: P draws per group with
    ``resampler``. Draws use each group's generator. With a ``shard``, ``x`` holds this rank's rows and the picked
    rows are gathered, so every rank returns the same samples.
    """
    groups, p = log_weights.shape
    sharded = shard is not None and not shard.local
    if output == "weighted":
        return (shard.gather(x) if sharded else x), rewards.flatten()

    def uniforms(n: int) -> Tensor:
        if sharded:
            return shard.group_uniforms(group_generators, torch.arange(groups), n).to(log_weights.device)
        return group_uniforms(group_generators, range(groups), n, device=log_weights.device)

    if output == "argmax":
        pick = log_weights.argmax(1, keepdim=True)
    elif output == "sample_one":
        pick = resample(log_weights.exp(), uniforms(1), "multinomial")
        pick = pick[:, :1]
    else:
        pick = resample(log_weights.exp(), uniforms(p), resampler)
    rows = ancestor_rows(pick, p)
    return (shard.gather_rows(x, rows) if sharded else x[rows]), rewards.flatten()[rows]
