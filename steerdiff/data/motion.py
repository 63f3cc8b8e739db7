"""Articulated motion: skeletons of any topology, motions as joint rotations plus root motion, forward kinematics,
BVH reading and writing, and the per-frame feature vector the MotionDreamer tokeniser reads (Wang et al., ICLR 2025,
"MotionDreamer: One-to-Many Motion Synthesis with Localized Generative Masked Transformer", Sec. 3.1 and App. A;
docs/methods/motiondreamer.md "Motion data").

The interface other modules rely on:

* :class:`Skeleton` ``(names, parents, offsets, end_offsets=None, feet=())``: joint ``j`` hangs from
  ``parents[j] < j`` (``-1`` for the one root, joint 0) at ``offsets[j]`` (``[J, 3]``, in the parent's frame);
  ``end_offsets`` are the BVH "End Site" offsets of leaf joints (``[J, 3]``, zero rows for the others); ``feet``
  are the joints whose ground contacts enter the features.
* :class:`Motion` ``(skeleton, rotations, root_positions, fps)``: ``rotations [T, J, 6]`` are **local joint
  rotations in the 6-D continuous representation** (Zhou et al., CVPR 2019: the first two columns of the rotation
  matrix, concatenated, ``[R[:, 0], R[:, 1]]``), joint 0's being the global root orientation; ``root_positions
  [T, 3]`` in world coordinates, Y up. Tensors are float64 so that BVH round trips are exact to print precision.
* :func:`forward_kinematics` ``-> [..., T, J, 3]`` world joint positions (batched, differentiable, torch).
* :func:`write_bvh` / :func:`load_bvh`: the BVH format (HIERARCHY / ROOT / JOINT / End Site / OFFSET / CHANNELS
  with any order of ``Xrotation Yrotation Zrotation`` channels, then MOTION / Frames / Frame Time / rows).
* :func:`motion_features` ``-> [T, F]`` float32 and :func:`features_to_motion` (its inverse up to the start
  position), laid out by :class:`FeatureLayout`; :class:`FeatureStats` normalises; :func:`random_windows` crops.

Procedural skeletons and styles (biped, quadruped, snake) are in :mod:`steerdiff.data.motion_synth`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy.spatial.transform import Rotation
from torch import Tensor


@dataclass(frozen=True, eq=False)
class Skeleton:
    """A kinematic tree: names, parent indices (root first, ``parents[j] < j``) and rest offsets ``[J, 3]``.
    Compared by identity (its fields hold tensors); compare ``names`` and ``parents`` for topology."""

    names: tuple[str, ...]
    parents: tuple[int, ...]
    offsets: Tensor
    end_offsets: Tensor | None = None
    feet: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        names, parents = tuple(self.names), tuple(int(p) for p in self.parents)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "parents", parents)
        offsets = torch.as_tensor(self.offsets, dtype=torch.float64)
        if offsets.shape != (len(names), 3) or len(parents) != len(names) or not names:
            raise ValueError(f"offsets must be [J, 3] and parents length J with J = len(names) = {len(names)} > 0, "
                             f"got offsets {tuple(offsets.shape)} and {len(parents)} parents")
        if parents[0] != -1 or any(not 0 <= p < j for j, p in enumerate(parents) if j):
            raise ValueError(f"parents must be -1 for joint 0 and in [0, j) for joint j, got {parents}")
        object.__setattr__(self, "offsets", offsets)
        ends = torch.zeros_like(offsets) if self.end_offsets is None else torch.as_tensor(self.end_offsets,
                                                                                           dtype=torch.float64)
        if ends.shape != offsets.shape:
            raise ValueError(f"end_offsets must be [J, 3] like offsets, got {tuple(ends.shape)}")
        object.__setattr__(self, "end_offsets", ends)
        feet = tuple(int(f) for f in self.feet)
        if any(not 0 <= f < len(names) for f in feet):
            raise ValueError(f"feet must be joint indices in [0, {len(names)}), got {feet}")
        object.__setattr__(self, "feet", feet)

    @property
    def n_joints(self) -> int:
        return len(self.names)

    def children(self, j: int) -> list[int]:
        return [k for k, p in enumerate(self.parents) if p == j]

    def height(self) -> float:
        """The rest pose's vertical extent (the scale contact thresholds are relative to)."""
        y = rest_positions(self)[:, 1]
        return float(y.max() - y.min()) or 1.0


@dataclass
class Motion:
    """Local joint rotations ``[T, J, 6]`` (6-D continuous), world root positions ``[T, 3]``, frames per second."""

    skeleton: Skeleton
    rotations: Tensor
    root_positions: Tensor
    fps: float = 30.0

    def __post_init__(self) -> None:
        self.rotations = torch.as_tensor(self.rotations, dtype=torch.float64)
        self.root_positions = torch.as_tensor(self.root_positions, dtype=torch.float64)
        t = self.rotations.shape[0] if self.rotations.dim() == 3 else -1
        if self.rotations.shape != (t, self.skeleton.n_joints, 6) or t < 1:
            raise ValueError(f"rotations must be [T, J, 6] with J = {self.skeleton.n_joints}, "
                             f"got {tuple(self.rotations.shape)}")
        if self.root_positions.shape != (t, 3):
            raise ValueError(f"root_positions must be [T, 3] with T = {t}, got {tuple(self.root_positions.shape)}")
        if not self.fps > 0:
            raise ValueError(f"fps must be positive, got {self.fps!r}")

    @property
    def n_frames(self) -> int:
        return self.rotations.shape[0]

    def positions(self) -> Tensor:
        """World joint positions ``[T, J, 3]`` (:func:`forward_kinematics`)."""
        return forward_kinematics(self.skeleton, self.rotations, self.root_positions)


# ---- rotations ---------------------------------------------------------------------------------------------------

def matrix_to_rot6d(matrix: Tensor) -> Tensor:
    """``[..., 3, 3] -> [..., 6]``: the first two columns (Zhou et al. 2019, the 6-D continuous representation)."""
    return torch.cat([matrix[..., :, 0], matrix[..., :, 1]], dim=-1)


def rot6d_to_matrix(rot6d: Tensor) -> Tensor:
    """``[..., 6] -> [..., 3, 3]`` by Gram-Schmidt on the two columns; exact inverse of :func:`matrix_to_rot6d` on
    rotation matrices, and a projection to the nearest-in-this-sense rotation for any other 6-vector."""
    a1, a2 = rot6d[..., :3], rot6d[..., 3:]
    b1 = a1 / a1.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    a2 = a2 - (b1 * a2).sum(-1, keepdim=True) * b1
    b2 = a2 / a2.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    return torch.stack([b1, b2, torch.cross(b1, b2, dim=-1)], dim=-1)


def euler_to_rot6d(angles: Tensor | np.ndarray, order: str, degrees: bool = False) -> Tensor:
    """Intrinsic Euler angles ``[..., 3]`` in ``order`` (e.g. ``"ZXY"``: ``R = Rz(a0) Rx(a1) Ry(a2)``, BVH's
    convention) to 6-D rotations ``[..., 6]`` float64."""
    a = np.asarray(angles, dtype=np.float64)
    mats = Rotation.from_euler(order.upper(), a.reshape(-1, 3), degrees=degrees).as_matrix()
    return matrix_to_rot6d(torch.from_numpy(mats.reshape(*a.shape[:-1], 3, 3)))


def rot6d_to_euler(rot6d: Tensor, order: str, degrees: bool = False) -> np.ndarray:
    """Inverse of :func:`euler_to_rot6d`: intrinsic Euler angles ``[..., 3]`` in ``order`` (float64 numpy)."""
    mats = rot6d_to_matrix(torch.as_tensor(rot6d, dtype=torch.float64)).detach().cpu().numpy()
    eul = Rotation.from_matrix(mats.reshape(-1, 3, 3)).as_euler(order.upper(), degrees=degrees)
    return eul.reshape(*mats.shape[:-2], 3)


# ---- kinematics --------------------------------------------------------------------------------------------------

def forward_kinematics(skeleton: Skeleton, rotations: Tensor, root_positions: Tensor) -> Tensor:
    """World joint positions ``[..., T, J, 3]`` from local 6-D rotations ``[..., T, J, 6]`` and root positions
    ``[..., T, 3]``: ``G_j = G_parent R_j``, ``p_j = p_parent + G_parent offset_j`` (differentiable; dtype and device
    follow ``rotations``)."""
    mats = rot6d_to_matrix(rotations)
    offsets = skeleton.offsets.to(device=rotations.device, dtype=rotations.dtype)
    glob: list[Tensor] = []
    pos: list[Tensor] = []
    for j, p in enumerate(skeleton.parents):
        if p < 0:
            glob.append(mats[..., j, :, :])
            pos.append(root_positions.to(rotations.dtype))
        else:
            glob.append(glob[p] @ mats[..., j, :, :])
            pos.append(pos[p] + (glob[p] @ offsets[j].unsqueeze(-1)).squeeze(-1))
    return torch.stack(pos, dim=-2)


def rest_positions(skeleton: Skeleton) -> Tensor:
    """Joint positions ``[J, 3]`` of the rest pose (identity rotations, root at the origin)."""
    eye = matrix_to_rot6d(torch.eye(3, dtype=torch.float64)).expand(1, skeleton.n_joints, 6)
    return forward_kinematics(skeleton, eye, torch.zeros(1, 3, dtype=torch.float64))[0]


# ---- BVH ---------------------------------------------------------------------------------------------------------

_POS = ("Xposition", "Yposition", "Zposition")


def write_bvh(motion: Motion, path: str | Path, order: str = "ZXY", precision: int = 9) -> Path:
    """Write ``motion`` as a BVH file: the root with 6 channels (positions, then rotations in ``order``), every other
    joint with 3 rotation channels, an End Site under each leaf (its ``end_offsets`` row), angles in degrees."""
    order = order.upper()
    if sorted(order) != ["X", "Y", "Z"]:
        raise ValueError(f"order must be a permutation of 'XYZ', got {order!r}")
    sk = motion.skeleton
    rot_ch = " ".join(f"{a}rotation" for a in order)
    fmt = f"{{:.{precision}f}}"
    lines = ["HIERARCHY"]

    def emit(j: int, depth: int) -> None:
        ind = "  " * depth
        kind = "ROOT" if sk.parents[j] < 0 else "JOINT"
        lines.append(f"{ind}{kind} {sk.names[j]}")
        lines.append(f"{ind}{{")
        lines.append(f"{ind}  OFFSET " + " ".join(fmt.format(v) for v in sk.offsets[j].tolist()))
        lines.append(f"{ind}  CHANNELS {6 if kind == 'ROOT' else 3} "
                     + (" ".join(_POS) + " " if kind == "ROOT" else "") + rot_ch)
        kids = sk.children(j)
        for k in kids:
            emit(k, depth + 1)
        if not kids:
            lines.append(f"{ind}  End Site")
            lines.append(f"{ind}  {{")
            lines.append(f"{ind}    OFFSET " + " ".join(fmt.format(v) for v in sk.end_offsets[j].tolist()))
            lines.append(f"{ind}  }}")
        lines.append(f"{ind}}}")

    emit(0, 0)
    eul = rot6d_to_euler(motion.rotations, order, degrees=True)  # [T, J, 3]
    dfs = _dfs_order(sk)
    lines += ["MOTION", f"Frames: {motion.n_frames}", f"Frame Time: {1.0 / motion.fps:.9f}"]
    root = motion.root_positions.numpy()
    for t in range(motion.n_frames):
        vals = list(root[t]) + [v for j in dfs for v in eul[t, j]]
        lines.append(" ".join(fmt.format(v) for v in vals))
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def _dfs_order(sk: Skeleton) -> list[int]:
    out: list[int] = []

    def visit(j: int) -> None:
        out.append(j)
        for k in sk.children(j):
            visit(k)

    visit(0)
    return out


def load_bvh(path: str | Path) -> Motion:
    """Read a BVH file into a :class:`Motion` (joints renumbered in file order, which is depth-first, so parents
    precede children). Rotation channels may come in any order per joint (``R = R_c1 R_c2 R_c3`` in listed order,
    degrees); the root's position channels give ``root_positions``; position channels of non-root joints are read
    and dropped (their OFFSET is used). End Sites become ``end_offsets`` of their joint.

    Raises:
        ValueError: a malformed file, naming the path and what was expected.
    """
    path = Path(path)
    tokens = re.findall(r"[{}]|[^\s{}]+", path.read_text())
    pos = 0

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"{path}: unexpected end of file (expected {expected or 'more tokens'})")
        tok = tokens[pos]
        pos += 1
        if expected is not None and tok.upper() != expected.upper():
            raise ValueError(f"{path}: expected {expected!r}, got {tok!r} (token {pos})")
        return tok

    names: list[str] = []
    parents: list[int] = []
    offsets: list[list[float]] = []
    ends: dict[int, list[float]] = {}
    channels: list[list[str]] = []

    def joint(parent: int) -> None:
        j = len(names)
        names.append(take())
        parents.append(parent)
        take("{")
        take("OFFSET")
        offsets.append([float(take()) for _ in range(3)])
        take("CHANNELS")
        channels.append([take() for _ in range(int(take()))])
        while True:
            tok = take()
            if tok.upper() == "JOINT":
                joint(j)
            elif tok.upper() == "END":
                take("Site")
                take("{")
                take("OFFSET")
                ends[j] = [float(take()) for _ in range(3)]
                take("}")
            elif tok == "}":
                return
            else:
                raise ValueError(f"{path}: expected JOINT, End Site or '}}' inside {names[j]!r}, got {tok!r}")

    take("HIERARCHY")
    take("ROOT")
    joint(-1)
    take("MOTION")
    take("Frames:")
    n_frames = int(take())
    take("Frame")
    take("Time:")
    frame_time = float(take())
    n_ch = sum(len(c) for c in channels)
    data = np.asarray([float(v) for v in tokens[pos:]], dtype=np.float64)
    if data.size != n_frames * n_ch:
        raise ValueError(f"{path}: MOTION holds {data.size} numbers, expected Frames x channels = "
                         f"{n_frames} x {n_ch}")
    data = data.reshape(n_frames, n_ch)
    J = len(names)
    rot6d = torch.empty(n_frames, J, 6, dtype=torch.float64)
    root = torch.zeros(n_frames, 3, dtype=torch.float64)
    col = 0
    for j, chans in enumerate(channels):
        rot_cols, rot_axes = [], ""
        for c in chans:
            low = c.lower()
            if low.endswith("rotation") and low[0] in "xyz":
                rot_cols.append(col)
                rot_axes += low[0].upper()
            elif low.endswith("position") and low[0] in "xyz":
                if parents[j] < 0:
                    root[:, "xyz".index(low[0])] = torch.from_numpy(data[:, col])
            else:
                raise ValueError(f"{path}: unknown channel {c!r} of joint {names[j]!r}")
            col += 1
        if rot_axes:
            rot6d[:, j] = euler_to_rot6d(data[:, rot_cols], rot_axes, degrees=True)
        else:
            rot6d[:, j] = matrix_to_rot6d(torch.eye(3, dtype=torch.float64))
    end_off = torch.zeros(J, 3, dtype=torch.float64)
    for j, off in ends.items():
        end_off[j] = torch.tensor(off, dtype=torch.float64)
    sk = Skeleton(tuple(names), tuple(parents), torch.tensor(offsets, dtype=torch.float64), end_off)
    fps = 1.0 / frame_time if frame_time > 0 else 30.0
    fps = float(round(fps)) if abs(fps - round(fps)) < 1e-4 else fps  # "0.033333333" means 30 fps
    return Motion(sk, rot6d, root, fps=fps)


# ---- features ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FeatureLayout:
    """Columns of the per-frame feature vector: ``[rot6d (J*6) | root height (1) | root xz velocity (2) |
    foot contacts (C)]``; velocities are world-frame displacement per frame (``v_0 = 0``)."""

    n_joints: int
    n_contacts: int

    @property
    def rotations(self) -> slice:
        return slice(0, 6 * self.n_joints)

    @property
    def root_height(self) -> int:
        return 6 * self.n_joints

    @property
    def root_velocity(self) -> slice:
        return slice(6 * self.n_joints + 1, 6 * self.n_joints + 3)

    @property
    def contacts(self) -> slice:
        return slice(6 * self.n_joints + 3, self.dim)

    @property
    def dim(self) -> int:
        return 6 * self.n_joints + 3 + self.n_contacts

    @classmethod
    def of(cls, skeleton: Skeleton) -> FeatureLayout:
        return cls(skeleton.n_joints, len(skeleton.feet))


def foot_contacts(motion: Motion, height: float = 0.04, speed: float = 0.01) -> Tensor:
    """Contact labels ``[T, C]`` (0/1) of ``skeleton.feet``: a foot touches when it is within ``height`` (times the
    skeleton height) of its lowest point in the motion and moves less than ``speed`` (times the skeleton height) per
    frame. A cheap heuristic, as in GANimator's contact labels."""
    feet = list(motion.skeleton.feet)
    if not feet:
        return torch.zeros(motion.n_frames, 0, dtype=torch.float64)
    scale = motion.skeleton.height()
    p = motion.positions()[:, feet]  # [T, C, 3]
    low = p[..., 1] - p[..., 1].min(dim=0).values
    v = torch.cat([torch.zeros_like(p[:1]), p[1:] - p[:-1]]).norm(dim=-1)
    return ((low < height * scale) & (v < speed * scale)).to(torch.float64)


def motion_features(motion: Motion) -> Tensor:
    """The model input ``[T, F]`` float32 (layout :class:`FeatureLayout`)."""
    T = motion.n_frames
    rp = motion.root_positions
    vel = torch.zeros(T, 2, dtype=torch.float64)
    vel[1:] = rp[1:, [0, 2]] - rp[:-1, [0, 2]]
    feats = [motion.rotations.reshape(T, -1), rp[:, 1:2], vel, foot_contacts(motion)]
    return torch.cat(feats, dim=1).float()


def features_to_motion(features: Tensor, skeleton: Skeleton, fps: float = 30.0,
                       start_xz: tuple[float, float] = (0.0, 0.0)) -> Motion:
    """Inverse of :func:`motion_features` (contacts dropped; 6-D rotations projected to rotations by Gram-Schmidt;
    the root's horizontal path integrated from ``start_xz``). ``features`` is ``[T, F]``."""
    lay = FeatureLayout.of(skeleton)
    if features.dim() != 2 or features.shape[1] != lay.dim:
        raise ValueError(f"features must be [T, {lay.dim}] for this skeleton, got {tuple(features.shape)}")
    f = features.detach().to("cpu", torch.float64)
    T = f.shape[0]
    rot = matrix_to_rot6d(rot6d_to_matrix(f[:, lay.rotations].reshape(T, -1, 6)))
    xz = torch.cumsum(f[:, lay.root_velocity], dim=0) + torch.tensor(start_xz, dtype=torch.float64)
    root = torch.stack([xz[:, 0], f[:, lay.root_height], xz[:, 1]], dim=1)
    return Motion(skeleton, rot, root, fps)


@dataclass
class FeatureStats:
    """Per-column mean and std of features (std floored at ``min_std``: contact and constant columns)."""

    mean: Tensor
    std: Tensor

    @classmethod
    def fit(cls, features: Tensor, min_std: float = 1e-2) -> FeatureStats:
        flat = features.reshape(-1, features.shape[-1]).float()
        return cls(flat.mean(0), flat.std(0, unbiased=False).clamp_min(min_std))

    def normalize(self, features: Tensor) -> Tensor:
        return (features - self.mean.to(features)) / self.std.to(features)

    def denormalize(self, z: Tensor) -> Tensor:
        return z * self.std.to(z) + self.mean.to(z)

    def state_dict(self) -> dict[str, Tensor]:
        return {"mean": self.mean.float().contiguous(), "std": self.std.float().contiguous()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Tensor]) -> FeatureStats:
        return cls(state["mean"], state["std"])


def random_windows(features: Tensor, length: int, n: int, generator: torch.Generator | None = None) -> Tensor:
    """``n`` random crops ``[n, length, F]`` of ``features [T, F]`` (start uniform on ``[0, T - length]``)."""
    T = features.shape[0]
    if not 0 < length <= T:
        raise ValueError(f"length must be in [1, T = {T}], got {length}")
    starts = torch.randint(0, T - length + 1, (n,), generator=generator)
    idx = starts[:, None] + torch.arange(length)[None]
    return features[idx.to(features.device)]


def sliding_windows(features: Tensor, length: int, stride: int = 1) -> Tensor:
    """All windows ``[N, length, F]`` of ``features [..., T, F]`` (leading dims folded into N) at ``stride``."""
    if features.shape[-2] < length:
        raise ValueError(f"length must be <= T = {features.shape[-2]}, got {length}")
    w = features.unfold(-2, length, stride)  # [..., N, F, length]
    return w.transpose(-1, -2).reshape(-1, length, features.shape[-1])
