"""Procedural motion capture, offline: three skeleton topologies (a 19-joint biped, a 19-joint quadruped with a tail,
a 12-segment snake) and gaits for each, with seeded variation (docs/methods/motiondreamer.md "Motion data").

MotionDreamer (Wang et al., ICLR 2025, Sec. 4) trains on one motion-capture sequence of any topology; these
generators stand in for the Mixamo / Truebones clips of the paper so that everything runs offline. A style is a
function of a seeded numpy stream and a frame count returning per-joint intrinsic ``YXZ`` Euler angles (radians) and
root positions; :func:`generate_motion` turns it into a :class:`~steerdiff.data.motion.Motion`. Each sequence varies
inside itself (slowly drifting speed, amplitude and heading, and for ``biped_wave`` waving bouts), so that a single
reference holds several local patterns, as a real clip does.

Registries: ``SKELETONS`` (``biped``, ``quadruped``, ``snake``) and ``STYLES`` (``biped_walk``, ``biped_wave``,
``quadruped_trot``, ``quadruped_walk``, ``snake_slither``, ``snake_sidewind``); ``REFERENCE_STYLE`` names the
single-instance reference motion of each skeleton.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..io.plugins import Registry
from ._rng import check_count, check_seed, stream
from .motion import Motion, Skeleton, euler_to_rot6d

SKELETONS: Registry[Callable[[], Skeleton]] = Registry("skeleton", argument="skeleton")


@dataclass(frozen=True)
class StyleSpec:
    skeleton: str
    make: Callable[[np.random.Generator, int, float], tuple[np.ndarray, np.ndarray]]


STYLES: Registry[StyleSpec] = Registry("motion style", argument="style")
REFERENCE_STYLE = {"biped": "biped_walk", "quadruped": "quadruped_trot", "snake": "snake_slither"}


def _skeleton(rows: list[tuple[str, int, tuple[float, float, float]]], ends: dict[str, tuple[float, float, float]],
              feet: tuple[str, ...]) -> Skeleton:
    names = tuple(r[0] for r in rows)
    end = np.zeros((len(rows), 3))
    for name, off in ends.items():
        end[names.index(name)] = off
    return Skeleton(names, tuple(r[1] for r in rows), torch.tensor([r[2] for r in rows], dtype=torch.float64),
                    torch.from_numpy(end), tuple(names.index(f) for f in feet))


@SKELETONS.register("biped")
def biped() -> Skeleton:
    """A 19-joint humanoid, Y up, facing +Z, hips 0.95 above the toes' tips."""
    rows = [("Hips", -1, (0, 0, 0)), ("Spine", 0, (0, 0.1, 0)), ("Chest", 1, (0, 0.2, 0)), ("Neck", 2, (0, 0.2, 0)),
            ("Head", 3, (0, 0.1, 0))]
    for side, s in (("L", 1.0), ("R", -1.0)):
        rows += [(f"{side}Shoulder", 2, (0.18 * s, 0.15, 0)), (f"{side}Elbow", len(rows), (0, -0.28, 0)),
                 (f"{side}Wrist", len(rows) + 1, (0, -0.25, 0))]
    for side, s in (("L", 1.0), ("R", -1.0)):
        rows += [(f"{side}Hip", 0, (0.1 * s, -0.05, 0)), (f"{side}Knee", len(rows), (0, -0.42, 0)),
                 (f"{side}Ankle", len(rows) + 1, (0, -0.42, 0)), (f"{side}Toe", len(rows) + 2, (0, -0.06, 0.12))]
    ends = {"Head": (0, 0.15, 0), "LWrist": (0, -0.08, 0), "RWrist": (0, -0.08, 0), "LToe": (0, 0, 0.05),
            "RToe": (0, 0, 0.05)}
    return _skeleton(rows, ends, ("LAnkle", "LToe", "RAnkle", "RToe"))


@SKELETONS.register("quadruped")
def quadruped() -> Skeleton:
    """A 19-joint four-legged animal with a two-joint tail, Y up, facing +Z, pelvis 0.6 above the paws' tips."""
    rows = [("Pelvis", -1, (0, 0, 0)), ("Spine", 0, (0, 0, 0.3)), ("Chest", 1, (0, 0, 0.3)),
            ("Neck", 2, (0, 0.15, 0.15)), ("Head", 3, (0, 0.05, 0.15))]
    for leg, parent, s in (("FL", 2, 1.0), ("FR", 2, -1.0), ("HL", 0, 1.0), ("HR", 0, -1.0)):
        rows += [(f"{leg}Upper", parent, (0.12 * s, -0.05, 0)), (f"{leg}Lower", len(rows), (0, -0.25, 0)),
                 (f"{leg}Paw", len(rows) + 1, (0, -0.25, 0))]
    rows += [("Tail1", 0, (0, 0.05, -0.15)), ("Tail2", len(rows), (0, 0, -0.2))]
    ends = {"Head": (0, 0, 0.15), "Tail2": (0, 0, -0.2), **{f"{leg}Paw": (0, -0.05, 0.03)
                                                           for leg in ("FL", "FR", "HL", "HR")}}
    return _skeleton(rows, ends, ("FLPaw", "FRPaw", "HLPaw", "HRPaw"))


@SKELETONS.register("snake")
def snake() -> Skeleton:
    """A 12-segment chain along -Z from the head (the root), 0.12 per segment, no feet."""
    rows = [("Head", -1, (0, 0, 0))] + [(f"Seg{k}", k - 1, (0, 0, -0.12)) for k in range(1, 12)]
    return _skeleton(rows, {"Seg11": (0, 0, -0.1)}, ())


def skeleton(name: str) -> Skeleton:
    """The registered skeleton ``name`` (``biped``, ``quadruped``, ``snake``)."""
    return SKELETONS.get(name)()


# ---- smooth random modulations -----------------------------------------------------------------------------------

def _drift(rng: np.random.Generator, t: np.ndarray, depth: float,
           period: tuple[float, float] = (3.0, 7.0)) -> np.ndarray:
    """``1 + depth * (sum of two slow sines)``: a smooth random modulation around 1 (range about ``1 +- depth``)."""
    out = np.zeros_like(t)
    for _ in range(2):
        out += 0.5 * np.sin(2 * np.pi * t / rng.uniform(*period) + rng.uniform(0, 2 * np.pi))
    return 1.0 + depth * out


def _phase(freq: np.ndarray, fps: float, phase0: float) -> np.ndarray:
    return phase0 + 2 * np.pi * np.cumsum(freq) / fps


def _root_path(heading: np.ndarray, speed: np.ndarray, fps: float, height: np.ndarray,
               side: np.ndarray | None = None) -> np.ndarray:
    """Integrate a forward speed (units/s) along ``heading`` (yaw about Y; 0 faces +Z), plus an optional sideways
    speed, into root positions ``[T, 3]``."""
    fwd = np.stack([np.sin(heading), np.cos(heading)], 1)
    vel = speed[:, None] * fwd
    if side is not None:
        vel += side[:, None] * np.stack([np.cos(heading), -np.sin(heading)], 1)
    xz = np.cumsum(vel, 0) / fps
    xz -= xz[0]
    return np.stack([xz[:, 0], height, xz[:, 1]], 1)


# ---- styles: each returns (euler [T, J, 3] as (yaw Y, pitch X, roll Z) radians, root [T, 3]) ---------------------

def _style(name: str, skel: str):
    def deco(fn):
        STYLES.add(name, StyleSpec(skel, fn))
        return fn

    return deco


@_style("biped_walk", "biped")
def _biped_walk(rng: np.random.Generator, T: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(T) / fps
    e = np.zeros((T, 19, 3))
    pace = rng.uniform(0.85, 1.15) * _drift(rng, t, 0.35)  # cadence factor: strides per second ~ 0.9
    amp = rng.uniform(0.85, 1.15) * _drift(rng, t, 0.3) * np.sqrt(pace)
    ph = _phase(0.9 * pace, fps, rng.uniform(0, 2 * np.pi))
    heading = np.cumsum(0.5 * np.sin(2 * np.pi * t / rng.uniform(5, 9) + rng.uniform(0, 6))) / fps
    for side, (hip, knee, ankle, sh, el) in enumerate(((11, 12, 13, 5, 6), (15, 16, 17, 8, 9))):
        p = ph + np.pi * side
        e[:, hip, 1] = -0.45 * amp * np.sin(p)
        e[:, knee, 1] = 0.6 * amp * np.clip(np.sin(p - 1.3), 0, None) + 0.05
        e[:, ankle, 1] = -0.2 * amp * np.sin(p - 0.5)
        e[:, sh, 1] = 0.35 * amp * np.sin(p)
        e[:, sh, 2] = (0.12 if side == 0 else -0.12)
        e[:, el, 1] = -0.25 - 0.2 * amp * np.clip(np.sin(p), 0, None)
    e[:, 0, 0] = heading + 0.08 * amp * np.sin(ph)
    e[:, 1, 0] = -0.1 * amp * np.sin(ph)
    e[:, 2, 2] = 0.03 * amp * np.sin(2 * ph)
    e[:, 4, 1] = 0.05 * np.sin(2 * np.pi * t / 3.0)
    height = 0.95 - 0.025 * amp * np.cos(2 * ph) - 0.02 * amp
    return e, _root_path(heading, 1.3 * pace * amp, fps, height)


@_style("biped_wave", "biped")
def _biped_wave(rng: np.random.Generator, T: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(T) / fps
    e = np.zeros((T, 19, 3))
    # waving bouts: a smoothed square wave of random period switches the right arm between rest and waving
    bout = 0.5 + 0.5 * np.tanh(2 * np.sin(2 * np.pi * t / rng.uniform(3.0, 5.0) + rng.uniform(0, 6)))
    freq = rng.uniform(1.2, 1.8) * _drift(rng, t, 0.3)
    wave = np.sin(_phase(freq, fps, rng.uniform(0, 6)))
    amp = rng.uniform(0.8, 1.2) * _drift(rng, t, 0.3)
    e[:, 8, 2] = -(0.15 + 2.3 * bout)  # right shoulder raises sideways
    e[:, 9, 2] = -bout * (0.6 + 0.5 * amp * wave)  # elbow swings the forearm
    e[:, 10, 2] = -0.3 * bout * amp * wave
    e[:, 5, 2] = 0.15 + 0.05 * np.sin(2 * np.pi * t / 2.0)
    sway = np.sin(_phase(0.5 * freq / 2, fps, 0.0))
    e[:, 0, 2] = 0.04 * sway
    e[:, 1, 2] = -0.04 * sway + 0.05 * bout
    e[:, 4, 0] = 0.25 * bout * np.sin(2 * np.pi * t / 2.7)
    for knee, hip in ((12, 11), (16, 15)):
        e[:, knee, 1] = 0.08 + 0.06 * bout * (1 + wave) / 2
        e[:, hip, 1] = -0.04 - 0.03 * bout * (1 + wave) / 2
    height = 0.95 - 0.01 - 0.01 * bout * (1 + wave) / 2
    return e, _root_path(np.zeros(T), np.zeros(T), fps, height)


def _quad(rng: np.random.Generator, T: int, fps: float, offsets: tuple[float, ...], cadence: float,
          speed: float) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(T) / fps
    e = np.zeros((T, 19, 3))
    pace = rng.uniform(0.85, 1.15) * _drift(rng, t, 0.3)
    amp = rng.uniform(0.85, 1.15) * _drift(rng, t, 0.25)
    ph = _phase(cadence * pace, fps, rng.uniform(0, 2 * np.pi))
    heading = np.cumsum(0.4 * np.sin(2 * np.pi * t / rng.uniform(5, 9) + rng.uniform(0, 6))) / fps
    for leg, off in enumerate(offsets):  # FL, FR, HL, HR
        upper, lower, paw = 5 + 3 * leg, 6 + 3 * leg, 7 + 3 * leg
        p = ph + 2 * np.pi * off
        sign = 1.0 if leg < 2 else -1.0  # front knees bend back, hind hocks forward
        e[:, upper, 1] = -0.4 * amp * np.sin(p)
        e[:, lower, 1] = sign * 0.5 * amp * np.clip(np.sin(p - 1.2), 0, None)
        e[:, paw, 1] = -sign * 0.2 * amp * np.sin(p - 0.6)
    e[:, 0, 0] = heading
    e[:, 0, 1] = 0.03 * amp * np.sin(2 * ph)
    e[:, 3, 1] = -0.1 * amp * np.sin(2 * ph)
    e[:, 17, 0] = 0.4 * np.sin(2 * np.pi * t * rng.uniform(1.0, 1.6))
    e[:, 17, 1] = -0.3
    e[:, 18, 0] = 0.3 * np.sin(2 * np.pi * t * 1.3 - 1.0)
    height = 0.6 - 0.02 * amp * np.cos(2 * ph) - 0.02 * amp
    return e, _root_path(heading, speed * pace * amp, fps, height)


@_style("quadruped_trot", "quadruped")
def _quadruped_trot(rng: np.random.Generator, T: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    return _quad(rng, T, fps, (0.0, 0.5, 0.5, 0.0), cadence=1.6, speed=1.5)  # diagonal pairs


@_style("quadruped_walk", "quadruped")
def _quadruped_walk(rng: np.random.Generator, T: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    return _quad(rng, T, fps, (0.25, 0.75, 0.0, 0.5), cadence=0.9, speed=0.8)  # lateral four-beat sequence


def _snake(rng: np.random.Generator, T: int, fps: float, sidewind: bool) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(T) / fps
    e = np.zeros((T, 12, 3))
    freq = rng.uniform(0.7, 1.1) * _drift(rng, t, 0.35)
    amp = rng.uniform(0.8, 1.2) * _drift(rng, t, 0.3)
    ph = _phase(freq, fps, rng.uniform(0, 2 * np.pi))
    k = rng.uniform(0.5, 0.7)  # wave number per segment
    heading = np.cumsum(0.3 * np.sin(2 * np.pi * t / rng.uniform(6, 10) + rng.uniform(0, 6))) / fps
    for j in range(1, 12):
        e[:, j, 0] = 0.35 * amp * np.sin(ph - k * j) * (0.6 + 0.4 * j / 11)
        if sidewind:
            e[:, j, 1] = 0.06 * amp * np.sin(ph - k * j + np.pi / 2)
    e[:, 0, 0] = heading + 0.3 * amp * np.sin(ph + 0.5)
    height = 0.05 + (0.03 * amp * np.clip(np.sin(ph), 0, None) if sidewind else 0.0 * t)
    speed = 0.35 * freq * amp
    if sidewind:
        return e, _root_path(heading, 0.2 * speed, fps, height, side=speed)
    return e, _root_path(heading, speed, fps, height)


@_style("snake_slither", "snake")
def _snake_slither(rng: np.random.Generator, T: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    return _snake(rng, T, fps, sidewind=False)


@_style("snake_sidewind", "snake")
def _snake_sidewind(rng: np.random.Generator, T: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    return _snake(rng, T, fps, sidewind=True)


def generate_motion(style: str, frames: int = 240, fps: float = 30.0, seed: int = 0) -> Motion:
    """A procedural motion of ``style`` (see ``STYLES``), ``frames`` long at ``fps``, deterministic in ``seed``.

    Raises:
        ValueError: unknown ``style`` (the message lists them), ``frames < 2``, a negative ``seed``.
    """
    spec = STYLES.get(style)
    frames = check_count(frames, "frames")
    if frames < 2:
        raise ValueError(f"frames must be >= 2, got {frames}")
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps!r}")
    rng = stream(check_seed(seed), 1 + STYLES.names().index(style))
    euler, root = spec.make(rng, frames, float(fps))
    sk = skeleton(spec.skeleton)
    return Motion(sk, euler_to_rot6d(euler, "YXZ"), torch.from_numpy(root), float(fps))


def reference_motion(skeleton_name: str, frames: int = 240, fps: float = 30.0, seed: int = 0) -> Motion:
    """The single-instance reference motion of a skeleton (``REFERENCE_STYLE``)."""
    SKELETONS.get(skeleton_name)
    return generate_motion(REFERENCE_STYLE[skeleton_name], frames, fps, seed)
