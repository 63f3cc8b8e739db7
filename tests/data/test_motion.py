"""Procedural motion, forward kinematics, BVH I/O and motion features (steerdiff.data.motion, motion_synth)."""

import math

import numpy as np
import pytest
import torch

from steerdiff.data.motion import (
    FeatureLayout,
    FeatureStats,
    Motion,
    Skeleton,
    euler_to_rot6d,
    features_to_motion,
    forward_kinematics,
    load_bvh,
    matrix_to_rot6d,
    motion_features,
    random_windows,
    rest_positions,
    rot6d_to_matrix,
    sliding_windows,
    write_bvh,
)
from steerdiff.data.motion_synth import REFERENCE_STYLE, SKELETONS, STYLES, generate_motion, skeleton


def _rx(a):
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=torch.float64)


def _ry(a):
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=torch.float64)


def _rz(a):
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=torch.float64)


def test_euler_convention_is_intrinsic_product_in_listed_order():
    a, b, c = 0.3, -0.7, 1.1
    got = rot6d_to_matrix(euler_to_rot6d(np.array([a, b, c]), "ZXY"))
    torch.testing.assert_close(got, _rz(a) @ _rx(b) @ _ry(c))
    r = torch.linalg.qr(torch.randn(5, 3, 3, dtype=torch.float64)).Q
    r = r * torch.linalg.det(r)[:, None, None]  # proper rotations
    torch.testing.assert_close(rot6d_to_matrix(matrix_to_rot6d(r)), r)


def test_fk_rest_pose_is_cumulative_offsets_and_a_rotated_chain():
    sk = skeleton("snake")
    torch.testing.assert_close(rest_positions(sk)[:, 2], -0.12 * torch.arange(12, dtype=torch.float64))
    # a two-joint arm: root turned 90 degrees about Z sends the child's +X offset to +Y
    arm = Skeleton(("a", "b", "c"), (-1, 0, 1), [[0, 0, 0], [1, 0, 0], [0, 2, 0]])
    rot = torch.stack([matrix_to_rot6d(_rz(math.pi / 2)), matrix_to_rot6d(_rx(math.pi / 2)),
                       matrix_to_rot6d(torch.eye(3, dtype=torch.float64))])[None]
    pos = forward_kinematics(arm, rot, torch.tensor([[1.0, 0, 0]], dtype=torch.float64))[0]
    # b = root + Rz(90) [1,0,0] = (1, 1, 0); c = b + Rz(90) Rx(90) [0,2,0] = b + Rz(90) [0,0,2] = (1, 1, 2)
    torch.testing.assert_close(pos, torch.tensor([[1.0, 0, 0], [1, 1, 0], [1, 1, 2]], dtype=torch.float64))


def test_bvh_parser_on_a_hand_written_file(tmp_path):
    text = """HIERARCHY
ROOT hip
{
  OFFSET 0 0 0
  CHANNELS 6 Xposition Yposition Zposition Zrotation Xrotation Yrotation
  JOINT knee
  {
    OFFSET 0 -1 0
    CHANNELS 3 Xrotation Yrotation Zrotation
    End Site
    {
      OFFSET 0 -1 0
    }
  }
}
MOTION
Frames: 2
Frame Time: 0.04
1 2 3 0 0 0 0 0 0
0 1 0 90 0 0 90 0 0
"""
    (tmp_path / "two.bvh").write_text(text)
    m = load_bvh(tmp_path / "two.bvh")
    assert m.skeleton.names == ("hip", "knee") and m.skeleton.parents == (-1, 0) and m.fps == 25.0
    torch.testing.assert_close(m.skeleton.end_offsets[1], torch.tensor([0, -1.0, 0], dtype=torch.float64))
    p = m.positions()
    torch.testing.assert_close(p[0], torch.tensor([[1.0, 2, 3], [1, 1, 3]], dtype=torch.float64))
    # frame 1: root Rz(90) maps the knee's (0, -1, 0) offset to (1, 0, 0)
    torch.testing.assert_close(p[1], torch.tensor([[0.0, 1, 0], [1, 1, 0]], dtype=torch.float64))
    assert torch.allclose(rot6d_to_matrix(m.rotations[1, 1]), _rx(math.pi / 2))


@pytest.mark.parametrize("name", sorted(REFERENCE_STYLE))
@pytest.mark.parametrize("order", ["ZXY", "XYZ"])
def test_bvh_round_trip_positions(tmp_path, name, order):
    m = generate_motion(REFERENCE_STYLE[name], frames=60, seed=3)
    path = write_bvh(m, tmp_path / f"{name}.bvh", order=order)
    assert f"CHANNELS 3 {' '.join(a + 'rotation' for a in order)}" in path.read_text()
    back = load_bvh(path)
    assert back.skeleton.names == m.skeleton.names and back.skeleton.parents == m.skeleton.parents
    assert back.fps == m.fps and back.n_frames == 60
    assert (back.positions() - m.positions()).abs().max() < 1e-5
    assert (back.skeleton.end_offsets - m.skeleton.end_offsets).abs().max() < 1e-9


def test_bvh_errors_name_the_problem(tmp_path):
    (tmp_path / "bad.bvh").write_text("HIERARCHY\nROOT a\n{\n OFFSET 0 0 0\n CHANNELS 1 Wrotation\n}\nMOTION\n"
                                       "Frames: 1\nFrame Time: 0.1\n0\n")
    with pytest.raises(ValueError, match="unknown channel"):
        load_bvh(tmp_path / "bad.bvh")
    (tmp_path / "short.bvh").write_text("HIERARCHY\nROOT a\n{\n OFFSET 0 0 0\n CHANNELS 1 Xrotation\n}\nMOTION\n"
                                         "Frames: 2\nFrame Time: 0.1\n0\n")
    with pytest.raises(ValueError, match="Frames x channels"):
        load_bvh(tmp_path / "short.bvh")


def test_styles_are_seeded_varied_and_plausible():
    assert set(SKELETONS.names()) == {"biped", "quadruped", "snake"}
    for style in STYLES.names():
        a, b = generate_motion(style, 90, seed=0), generate_motion(style, 90, seed=0)
        c = generate_motion(style, 90, seed=1)
        assert torch.equal(a.rotations, b.rotations) and torch.equal(a.root_positions, b.root_positions)
        assert not torch.allclose(a.rotations, c.rotations)
        p = a.positions()
        lowest = p[..., 1].min(dim=1).values  # per frame: something stays near the ground
        assert lowest.abs().max() < 0.1 * a.skeleton.height() + 0.05, style
        assert (a.rotations[1:] - a.rotations[:-1]).abs().max() < 0.3, style  # smooth at 30 fps
    with pytest.raises(ValueError, match="style must be one of"):
        generate_motion("moonwalk")


def test_features_round_trip_and_stats():
    m = generate_motion("biped_walk", 120, seed=2)
    f = motion_features(m)
    lay = FeatureLayout.of(m.skeleton)
    assert f.shape == (120, lay.dim) and f.dtype == torch.float32 and lay.contacts.stop - lay.contacts.start == 4
    assert set(f[:, lay.contacts].unique().tolist()) <= {0.0, 1.0}
    back = features_to_motion(f.double(), m.skeleton, m.fps, start_xz=(0.0, 0.0))
    assert (back.positions() - m.positions()).abs().max() < 1e-6
    stats = FeatureStats.fit(f)
    z = stats.normalize(f)
    torch.testing.assert_close(z.mean(0)[lay.rotations], torch.zeros(6 * 19), atol=1e-4, rtol=0)
    torch.testing.assert_close(stats.denormalize(z), f, atol=1e-5, rtol=0)
    again = FeatureStats.from_state_dict(stats.state_dict())
    torch.testing.assert_close(again.normalize(f), z)


def test_windows():
    f = torch.arange(20.0).reshape(10, 2)
    w = sliding_windows(f, 4, stride=2)
    assert w.shape == (4, 4, 2) and torch.equal(w[1], f[2:6])
    r = random_windows(f, 3, 50, torch.Generator().manual_seed(0))
    assert r.shape == (50, 3, 2) and torch.equal(r[:, 1:, 0] - r[:, :-1, 0], torch.full((50, 2), 2.0))
    with pytest.raises(ValueError, match="length"):
        random_windows(f, 11, 1)


def test_bad_skeleton_and_motion_shapes():
    with pytest.raises(ValueError, match="parents"):
        Skeleton(("a", "b"), (-1, 1), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="rotations"):
        Motion(skeleton("snake"), torch.zeros(5, 3, 6), torch.zeros(5, 3))


def test_fk_follows_the_rotations_dtype():
    m = generate_motion("snake_slither", 20, seed=0)
    p = forward_kinematics(m.skeleton, m.rotations.to(torch.bfloat16), m.root_positions)
    assert p.dtype == torch.bfloat16 and (p.double() - m.positions()).abs().max() < 0.05
