"""Signal-driven 2-D trajectories: the procedural task of all-at-once sequence generation (DAWN, Cheng et al. 2025,
"DAWN: Dynamic frame Avatar With Non-autoregressive diffusion framework", Sec. 1 and Sec. 3: a whole motion sequence
generated from a per-frame driving signal, there audio, here a smooth random 2-D signal).

Each axis of the position ``p`` follows a damped spring whose velocity relaxes towards the signal::

    p' = v,    v' = -omega^2 p - v / tau + (gain / tau) u(t),    omega = 2 pi / period

with the signal ``u`` held constant over each frame (zero-order hold, one frame = one time unit), so the noise-free
frame-to-frame map is exact: ``s_{t+1} = A s_t + b u_t`` with ``A = expm(M)``, ``b = M^-1 (A - I) [0, gain/tau]``.
Process noise of std ``noise`` is added to the velocity after every frame. The frames the models see are the
positions ``p_t`` (a ``[2]`` vector per frame); the signal is ``u_t`` (``[2]``). The velocity tracks the signal with a
lag of about ``tau`` frames and the spring pulls the position back towards the origin; the state forgets its past at
the slower decay rate of ``M`` (the eigenvalues of ``A`` have modulus 0.78 per frame for the defaults, so about 4
frames), so a frame depends on the signal of a bounded past only: the response a model with a local receptive field
can learn on short sequences and apply to long ones. A long period (a weak spring) makes the position persist.

A persistent quantity (the analogue of a talking head's identity, which DAWN's source frame carries and every frame
keeps): with ``anchor_std > 0`` each trajectory's spring pulls towards its own rest point ``c`` (per axis
``N(0, anchor_std^2)``, drawn once per trajectory and constant along it), so the positions are ``c`` plus the
displacement above. With ``marker_noise`` set, each frame also carries a marker at the rest point, observed with
per-frame jitter of that std: frames become ``[p_x, p_y, m_x, m_y]`` with ``m_t = c + marker_noise * eps_t``. A
generator that re-estimates ``c`` from its own last frames (autoregressive chunks) can let it drift; one that reads it
from the known frames keeps it.

The signal is white noise through two one-pole filters (``rho`` each), scaled to unit variance. A run starts at rest
at the origin, burns in ``burn_in`` frames, then records ``context + length`` frames: the first ``context`` frames
are the known past a generator starts from (DAWN's source frame), the rest the frames to generate.

Randomness (docs/methods/conventions.md, "Randomness"): sample ``i`` of ``seed`` draws its signal and its process
noise from two numpy streams keyed ``(seed, 0, i)`` and ``(seed, 1, i)``, one time step after another, so a sample
depends on neither the batch size nor its position in the batch, and a shorter trajectory is the prefix of a longer
one. Training streams use ``start = step * batch`` (fresh samples at every step, a function of the step alone, so a
resumed run sees the same data); the test set is a fixed ``seed``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import scipy.linalg
import torch
from torch import Tensor

from ._rng import check_count, check_number, check_seed

# Stream keys: the signal, the process noise, the rest point and the marker jitter never share a stream (and the
# default system draws from the first two only, so its trajectories do not depend on the later options).
_SIGNAL, _PROCESS, _ANCHOR, _MARKER = 0, 1, 2, 3


@dataclass(frozen=True)
class DrivenSpring:
    """Parameters of the driven system (per axis; the two axes are independent, with their own signal).

    Attributes:
        period: natural period ``2 pi / omega`` of the spring, in frames.
        tau: velocity relaxation time in frames (the velocity follows ``gain * u`` with this lag).
        gain: velocity the system settles to per unit of signal, before the spring pulls it back.
        noise: std of the process noise added to the velocity after every frame.
        rho: pole of each of the two smoothing filters of the signal (correlation time ~ ``1 / (1 - rho)`` frames).
        burn_in: frames simulated from rest before the recorded part starts (forgets the start at the origin).
        anchor_std: std (per axis) of each trajectory's rest point; 0 puts every rest point at the origin.
        marker_noise: None for frames of the position only (``[2]``); a std >= 0 adds the rest point as two more
            channels (``[4]``), observed with per-frame jitter of this std.
    """

    period: float = 24.0
    tau: float = 2.0
    gain: float = 0.08
    noise: float = 0.015
    rho: float = 0.8
    burn_in: int = 64
    anchor_std: float = 0.0
    marker_noise: float | None = None

    def __post_init__(self) -> None:
        for name in ("period", "tau", "gain"):
            check_number(getattr(self, name), name, positive=True)
        check_number(self.noise, "noise")
        if not 0.0 <= self.rho < 1.0:
            raise ValueError(f"rho must lie in [0, 1), got {self.rho!r}")
        check_count(self.burn_in, "burn_in")
        check_number(self.anchor_std, "anchor_std")
        check_number(self.marker_noise, "marker_noise", optional=True)

    @property
    def frame_dim(self) -> int:
        """Values per frame: 2 (the position), 4 with the rest-point marker."""
        return 2 if self.marker_noise is None else 4

    @property
    def omega(self) -> float:
        return 2.0 * math.pi / self.period

    def generator_matrix(self) -> np.ndarray:
        """``M`` of the state ``(p, v)``: ``d/dt (p, v) = M (p, v) + (0, gain / tau) u``."""
        return np.array([[0.0, 1.0], [-self.omega**2, -1.0 / self.tau]])

    def discrete(self) -> tuple[np.ndarray, np.ndarray]:
        """The exact one-frame map under a zero-order-hold signal: ``(A [2, 2], b [2])``."""
        m = self.generator_matrix()
        a = scipy.linalg.expm(m)
        b = np.linalg.solve(m, (a - np.eye(2)) @ np.array([0.0, self.gain / self.tau]))
        return a, b

    def to_dict(self) -> dict:
        # The rest-point options enter only when set, so the dicts (and checkpoints) of earlier systems are unchanged.
        out = asdict(self)
        if out["anchor_std"] == 0.0:
            del out["anchor_std"]
        if out["marker_noise"] is None:
            del out["marker_noise"]
        return out


@dataclass(frozen=True)
class DrivenBatch:
    """Recorded trajectories, all float32 tensors with the batch first and frames on axis 1.

    Attributes:
        frames: ``[n, context + length, frame_dim]``: the ground-truth trajectory (with its process noise), the
            positions and, with ``marker_noise`` set, the jittered rest-point marker.
        signal: driving signal ``[n, context + length, 2]``, aligned with the frames (``signal[:, t]`` acts over
            the step from frame ``t`` to frame ``t + 1``).
        velocity: ``[n, context + length, 2]`` true velocities (the hidden half of the state).
        mean: ``[n, context + length, frame_dim]`` the noise-free continuation of the true state at the last context
            frame: the conditional mean of the frames to generate given the full state and the rest point (equal to
            ``frames`` on the context part).
        context: number of leading context frames.
        anchor: ``[n, 2]`` each trajectory's rest point (zeros when ``anchor_std`` is 0).
    """

    frames: Tensor
    signal: Tensor
    velocity: Tensor
    mean: Tensor
    context: int
    anchor: Tensor | None = None

    @property
    def target(self) -> Tensor:
        """The frames to generate, ``[n, length, frame_dim]``."""
        return self.frames[:, self.context:]

    @property
    def past(self) -> Tensor:
        """The known context frames, ``[n, context, frame_dim]``."""
        return self.frames[:, : self.context]

    @property
    def target_signal(self) -> Tensor:
        """The signal over the frames to generate, ``[n, length, 2]``."""
        return self.signal[:, self.context:]


def _sample_rng(seed: int, key: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, key, index]))


def _stream_draws(seed: int, key: int, start: int, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normals ``[n, *shape]``, sample ``i`` from stream ``(seed, key, start + i)``."""
    if not n:
        return np.zeros((0, *shape))
    return np.stack([_sample_rng(seed, key, start + i).standard_normal(shape) for i in range(n)])


def driving_signal(n: int, steps: int, seed: int = 0, start: int = 0, rho: float = 0.8) -> np.ndarray:
    """Smooth unit-variance random signals ``[n, steps, 2]`` (float64): white noise through two one-pole filters.

    Both filters start at zero; a one-pole filter ``y_t = rho y_{t-1} + sqrt(1 - rho^2) x_t`` keeps unit variance
    for unit-variance input that is white, and the second pass (on the correlated output of the first) has the
    stationary variance ``(1 + rho^2) / (1 - rho^2)``, divided out here.
    """
    n, steps, seed, start = check_count(n), check_count(steps, "steps"), check_seed(seed), check_count(start, "start")
    white = _stream_draws(seed, _SIGNAL, start, n, (steps, 2))
    c = math.sqrt(1.0 - rho**2)
    first = np.zeros((n, 2))
    second = np.zeros((n, 2))
    out = np.empty((n, steps, 2))
    for t in range(steps):
        first = rho * first + c * white[:, t]
        second = rho * second + c * first
        out[:, t] = second
    return out / math.sqrt((1.0 + rho**2) / (1.0 - rho**2))


def simulate(system: DrivenSpring, signal: np.ndarray, p0: np.ndarray, v0: np.ndarray,
             noise: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Run the exact frame map from ``(p0, v0)`` (``[n, 2]`` each) under ``signal [n, T, 2]``.

    Args:
        noise: standard-normal draws ``[n, T, 2]`` scaled by ``system.noise`` and added to the velocity after each
            step; None simulates without process noise.

    Returns:
        ``(p, v)``, each ``[n, T, 2]``: the state at frames ``0 .. T-1``, frame 0 being ``(p0, v0)``; the signal at
        frame ``t`` moves the state from frame ``t`` to ``t + 1`` (the last signal value is not used).
    """
    a, b = system.discrete()
    n, steps = signal.shape[:2]
    p_out, v_out = np.empty((n, steps, 2)), np.empty((n, steps, 2))
    p, v = np.asarray(p0, dtype=np.float64).copy(), np.asarray(v0, dtype=np.float64).copy()
    for t in range(steps):
        p_out[:, t], v_out[:, t] = p, v
        p, v = a[0, 0] * p + a[0, 1] * v + b[0] * signal[:, t], a[1, 0] * p + a[1, 1] * v + b[1] * signal[:, t]
        if noise is not None and system.noise > 0:
            v = v + system.noise * noise[:, t]
    return p_out, v_out


def driven_batch(n: int, length: int, seed: int = 0, start: int = 0, context: int = 4,
                 system: DrivenSpring | None = None) -> DrivenBatch:
    """``n`` recorded trajectories of ``context + length`` frames (samples ``start .. start + n - 1`` of ``seed``).

    Args:
        n: number of trajectories.
        length: frames to generate after the context (>= 1).
        seed: non-negative int; equal ``(seed, start + i)`` give equal trajectories.
        start: index of the first sample (a training stream uses ``step * n``).
        context: known frames before the ones to generate (>= 0).
        system: the dynamics (default :class:`DrivenSpring`).

    Returns:
        A :class:`DrivenBatch`.
    """
    n, seed, start = check_count(n), check_seed(seed), check_count(start, "start")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an int >= 1 (frames to generate), got {length!r}")
    context = check_count(context, "context")
    system = DrivenSpring() if system is None else system
    if not isinstance(system, DrivenSpring):
        raise TypeError(f"system must be a DrivenSpring, got {type(system).__name__}")
    total = system.burn_in + context + length
    signal = driving_signal(n, total, seed, start, system.rho)
    noise = _stream_draws(seed, _PROCESS, start, n, (total, 2))
    zeros = np.zeros((n, 2))
    p, v = simulate(system, signal, zeros, zeros, noise)
    keep = slice(system.burn_in, total)
    p, v, signal = p[:, keep], v[:, keep], signal[:, keep]
    mean = p.copy()
    if context >= 1:  # the noise-free continuation from the true state at the last context frame
        cp, cv = simulate(system, signal[:, context - 1:], p[:, context - 1], v[:, context - 1])
        mean[:, context - 1:] = cp
    else:  # no context: the noise-free response to the whole signal history, burn-in included
        mean = simulate(system, driving_signal(n, total, seed, start, system.rho), zeros, zeros)[0][:, keep]
    anchor = np.zeros((n, 2))
    if system.anchor_std > 0:
        anchor = system.anchor_std * _stream_draws(seed, _ANCHOR, start, n, (2,))
        p, mean = p + anchor[:, None], mean + anchor[:, None]
    if system.marker_noise is not None:
        jitter = _stream_draws(seed, _MARKER, start, n, (total, 2))[:, keep]
        p = np.concatenate([p, anchor[:, None] + system.marker_noise * jitter], axis=-1)
        mean = np.concatenate([mean, np.broadcast_to(anchor[:, None], mean.shape)], axis=-1)

    def as_tensor(a: np.ndarray) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    return DrivenBatch(as_tensor(p), as_tensor(signal), as_tensor(v), as_tensor(mean), context, as_tensor(anchor))
