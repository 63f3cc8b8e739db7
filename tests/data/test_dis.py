"""The procedural dichotomous-segmentation set and the DIS5K-layout folder loader (docs/methods/diffdis.md, "Data")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from steerdiff.data.dis import PALETTE, folder_stems, generate, load_folder, mask_edges


@pytest.fixture(scope="module")
def batch64():
    return generate(96, size=64, seed=3)


def test_shapes_ranges_and_edges(batch64):
    b = batch64
    assert b.image.shape == (96, 3, 64, 64) and b.mask.shape == b.edge.shape == (96, 1, 64, 64)
    assert b.image.dtype == b.mask.dtype == torch.float32
    assert b.image.min() >= -1 and b.image.max() <= 1
    assert set(b.mask.unique().tolist()) <= {0.0, 1.0} and set(b.edge.unique().tolist()) <= {0.0, 1.0}
    assert (b.mask.flatten(1).sum(1) > 0).all()
    assert torch.equal(b.edge, mask_edges(b.mask))
    big = generate(4, size=128, seed=3)
    assert big.image.shape == (4, 3, 128, 128)


def test_seeded_prefix_stable_and_parts_disjoint(batch64):
    again = generate(10, size=64, seed=3)
    for a, b in zip(again, batch64, strict=True):
        assert torch.equal(a, b[:10])
    other = generate(10, size=64, seed=4)
    test = generate(10, size=64, seed=3, part="test")
    assert not torch.equal(other.mask, again.mask) and not torch.equal(test.mask, again.mask)


def test_thin_structures_present(batch64):
    # Morphological opening with a 3x3 square removes every structure thinner than 3 px; such parts must exist
    # in nearly every image (wires, hair, lattice bars), and be a real share of the foreground.
    m = batch64.mask
    eroded = -F.max_pool2d(-F.pad(m, (1,) * 4, mode="replicate"), 3, stride=1)
    opened = F.max_pool2d(F.pad(eroded, (1,) * 4, value=0.0), 3, stride=1)
    thin = (m - opened).clamp(min=0).flatten(1).sum(1) / m.flatten(1).sum(1)
    assert (thin > 0).float().mean() > 0.9
    assert thin.mean() > 0.1


def test_object_colour_and_colour_does_not_give_mask(batch64):
    # Inside the mask every pixel is one palette colour times a shading in [0.85, 1.15] plus small noise; outside,
    # clutter shares that colour, so the best colour-distance rule must still miss the mask by a wide margin.
    img = (batch64.image + 1) / 2
    palette = torch.tensor(PALETTE)
    ious = []
    for i in range(img.shape[0]):
        inside = img[i][:, batch64.mask[i, 0] > 0].T  # [k, 3]
        med = inside.median(0).values
        ratio = med[None] / palette  # [6, 3]: constant across channels for the right colour
        spread = ratio.max(1).values - ratio.min(1).values
        j = int(spread.argmin())
        assert spread[j] < 0.12 and 0.8 < ratio[j].mean() < 1.2
        dist = (img[i] - palette[j][:, None, None] * ratio[j].mean()).norm(dim=0)
        truth = batch64.mask[i, 0] > 0
        best = max(((dist < t) & truth).sum() / ((dist < t) | truth).sum() for t in (0.05, 0.1, 0.15, 0.2, 0.3))
        ious.append(float(best))
    assert np.mean(ious) < 0.75


def test_mask_edges_hand_cases():
    m = torch.zeros(10, 10)
    m[2:8, 2:8] = 1
    e = mask_edges(m)
    expect = torch.zeros(10, 10)
    expect[1:9, 1:9] = 1
    expect[3:7, 3:7] = 0  # dilated 8x8 square minus eroded 4x4 square
    assert torch.equal(e, expect)
    assert mask_edges(torch.ones(1, 6, 6)).sum() == 0  # the image border is no boundary
    half = torch.zeros(6, 6)
    half[:, :3] = 1
    assert torch.equal(mask_edges(half, width=1).sum(0), torch.tensor([0, 0, 6, 6, 0, 0.0]))
    assert mask_edges(half.bool()).dtype == torch.float32
    with pytest.raises(ValueError, match="width"):
        mask_edges(half, width=0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="size"):
        generate(2, size=60)
    with pytest.raises(ValueError, match="part"):
        generate(2, part="val")
    with pytest.raises(ValueError, match="seed"):
        generate(2, seed=-1)
    assert generate(0).image.shape == (0, 3, 64, 64)


def _write(root, stems, size=(12, 10), ext=".png", gt_size=None):
    Image = pytest.importorskip("PIL.Image")  # Pillow comes with the plot/dev extras
    (root / "im").mkdir(parents=True, exist_ok=True)
    (root / "gt").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for s in stems:
        im = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        gt = (rng.random(gt_size[::-1] if gt_size else (size[1], size[0])) > 0.5).astype(np.uint8) * 255
        Image.fromarray(im).save(root / "im" / f"{s}{ext}")
        Image.fromarray(gt).save(root / "gt" / f"{s}.png")
        arrays[s] = (im, gt)
    return arrays


def test_load_folder_reads_what_was_written(tmp_path):
    arrays = _write(tmp_path, ["b", "a", "c"])
    assert folder_stems(tmp_path) == ["a", "b", "c"]
    out = load_folder(tmp_path)
    assert out.image.shape == (3, 3, 10, 12) and out.mask.shape == (3, 1, 10, 12)
    for k, s in enumerate(["a", "b", "c"]):
        im, gt = arrays[s]
        assert torch.allclose(out.image[k], torch.from_numpy(im).permute(2, 0, 1).float() / 255 * 2 - 1)
        assert torch.equal(out.mask[k, 0], torch.from_numpy(gt > 127).float())
    assert torch.equal(out.edge, mask_edges(out.mask))
    small = load_folder(tmp_path, size=8, limit=2)
    assert small.image.shape == (2, 3, 8, 8) and set(small.mask.unique().tolist()) <= {0.0, 1.0}


def test_load_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="root"):
        load_folder(tmp_path / "nope")
    (tmp_path / "im").mkdir()
    with pytest.raises(FileNotFoundError, match="gt/"):
        load_folder(tmp_path)
    (tmp_path / "gt").mkdir()
    with pytest.raises(ValueError, match="no image/mask pairs"):
        load_folder(tmp_path)
    _write(tmp_path, ["x", "y"], ext=".jpg")
    (tmp_path / "gt" / "y.png").unlink()
    with pytest.raises(ValueError, match=r"images without a mask \['y'\]"):
        load_folder(tmp_path)
    bad = tmp_path / "bad"
    _write(bad, ["p"], size=(12, 10), gt_size=(11, 10))
    with pytest.raises(ValueError, match="p: image p.png is 12x10 but mask p.png is 11x10"):
        load_folder(bad)
    mixed = tmp_path / "mixed"
    _write(mixed, ["m1"], size=(8, 8))
    _write(mixed, ["m2"], size=(9, 8))
    with pytest.raises(ValueError, match="pass size="):
        load_folder(mixed)
    assert load_folder(mixed, size=8).image.shape == (2, 3, 8, 8)
    broken = tmp_path / "broken"
    _write(broken, ["q"])
    (broken / "im" / "q.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot read image file"):
        load_folder(broken)
