"""Tests for steerdiff.data.shapes (docs/methods/coind.md, "The coloured-shapes data"): splits, determinism,
geometry, colours, noise."""

import itertools
import time

import pytest
import torch

from steerdiff.data import COLOURS, SHAPES, generate_shapes, render_shape, split_combos
from steerdiff.data.shapes import CANVAS, COLOUR_RGB, SIZES, shape_masks

ALL_COMBOS = [(s, c) for s in range(4) for c in range(4)]
CENTRES = range(4, 9)  # 6 +- 2
# Pixel areas for sizes 5 / 6 / 7, as documented in the module.
AREAS = {"square": (25, 36, 49), "disk": (21, 32, 37), "triangle": (17, 24, 31), "plus": (9, 11, 13)}


def mask(shape, size, cx, cy):
    return shape_masks(*(torch.tensor([v]) for v in (shape, size, cx, cy)))[0]


def to_unit(images):
    return (images + 1) / 2  # back to [0, 1]


# --- splits -------------------------------------------------------------------------------------------


def test_constants():
    assert SHAPES == ("square", "disk", "triangle", "plus")
    assert COLOURS == ("red", "green", "blue", "yellow")


def test_band_split():
    train, test = split_combos("band", "train"), split_combos("band", "test")
    assert len(train) == 8 and len(test) == 8
    assert sorted(train + test) == ALL_COMBOS
    assert all((c - s) % 4 in (0, 1) for s, c in train)
    for k in range(4):  # each shape and each colour seen twice in training
        assert sum(s == k for s, _ in train) == 2 and sum(c == k for _, c in train) == 2


@pytest.mark.parametrize("split", ["full", "nonuniform"])
@pytest.mark.parametrize("part", ["train", "test"])
def test_full_and_nonuniform_list_all(split, part):
    assert split_combos(split, part) == ALL_COMBOS


def test_bad_split_and_part_names():
    with pytest.raises(ValueError) as err:
        split_combos("cmnist", "train")
    assert all(name in str(err.value) for name in ("full", "band", "nonuniform"))
    with pytest.raises(ValueError) as err:
        generate_shapes(4, split="band", part="val")
    assert "train" in str(err.value) and "test" in str(err.value)


@pytest.mark.parametrize(("split", "part"), [("band", "train"), ("band", "test"), ("full", "train")])
def test_labels_follow_split(split, part):
    _, labels = generate_shapes(800, split=split, part=part, seed=1)
    seen = {tuple(p) for p in labels.tolist()}
    assert seen == set(split_combos(split, part))


def test_nonuniform_mixture():
    # Half the samples come from the 8 band combos, half from all 16: 3/4 land in the band.
    _, labels = generate_shapes(8000, split="nonuniform", seed=2)
    band = set(split_combos("band", "train"))
    in_band = torch.tensor([tuple(p) in band for p in labels.tolist()]).double().mean()
    assert abs(in_band - 0.75) < 0.03
    assert {tuple(p) for p in labels.tolist()} == set(ALL_COMBOS)
    _, test_labels = generate_shapes(8000, split="nonuniform", part="test", seed=2)
    in_band_test = torch.tensor([tuple(p) in band for p in test_labels.tolist()]).double().mean()
    assert abs(in_band_test - 0.5) < 0.03


def test_explicit_combos():
    combos = [(3, 0), (1, 2)]
    _, labels = generate_shapes(300, combos=combos, seed=0)
    assert {tuple(p) for p in labels.tolist()} == set(combos)
    for bad in ([], [(4, 0)], [(0, -1)], [(1, 2, 3)]):
        with pytest.raises(ValueError, match="combos"):
            generate_shapes(3, combos=bad)


# --- determinism -------------------------------------------------------------------------------------


def test_deterministic_and_seed_dependent():
    a, la = generate_shapes(64, split="band", seed=11)
    b, lb = generate_shapes(64, split="band", seed=11)
    c, _ = generate_shapes(64, split="band", seed=12)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("split", ["full", "band", "nonuniform"])
def test_prefix_stable(split):
    # Sample i must not depend on n.
    big = generate_shapes(500, split=split, seed=4, return_nuisance=True)
    small = generate_shapes(23, split=split, seed=4, return_nuisance=True)
    assert torch.equal(big[0][:23], small[0]) and torch.equal(big[1][:23], small[1])
    for key in small[2]:
        assert torch.equal(big[2][key][:23], small[2][key])


def test_output_types_and_ranges():
    images, labels, nuisance = generate_shapes(1000, seed=5, return_nuisance=True)
    assert images.shape == (1000, 3, CANVAS, CANVAS) and images.dtype == torch.float32
    assert labels.shape == (1000, 2) and labels.dtype == torch.int64
    assert images.min() >= -1 and images.max() <= 1
    assert set(nuisance["size"].tolist()) == set(SIZES)
    assert nuisance["centre"].shape == (1000, 2)
    assert set(nuisance["centre"].flatten().tolist()) == set(CENTRES)
    b = nuisance["brightness"]
    assert b.dtype == torch.float32 and b.min() >= 0.9 and b.max() <= 1.1 and b.max() - b.min() > 0.15
    assert generate_shapes(0)[0].shape == (0, 3, CANVAS, CANVAS)


@pytest.mark.parametrize("bad", [{"n": -1}, {"n": 2.0}, {"n": 2, "seed": -3}, {"n": 2, "seed": "a"}])
def test_bad_count_or_seed(bad):
    with pytest.raises(ValueError):
        generate_shapes(**bad)


# --- geometry ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", range(4))
def test_inside_canvas_for_every_size_and_jitter(shape):
    # A cut-off shape would lose pixels: every position must give the full area, inside the box.
    for k, size in enumerate(SIZES):
        for cx, cy in itertools.product(CENTRES, CENTRES):
            m = mask(shape, size, cx, cy)
            assert int(m.sum()) == AREAS[SHAPES[shape]][k]
            rows, cols = m.nonzero(as_tuple=True)
            assert rows.min() >= cy - size // 2 and rows.max() <= cy - size // 2 + size - 1
            assert cols.min() >= cx - size // 2 and cols.max() <= cx - size // 2 + size - 1
            assert rows.min() >= 0 and cols.min() >= 0 and rows.max() < CANVAS and cols.max() < CANVAS


def test_areas_grow_with_size_and_shapes_differ():
    for name in SHAPES:
        assert list(AREAS[name]) == sorted(set(AREAS[name]))  # strictly increasing with size
    for k, size in enumerate(SIZES):
        areas = [int(mask(s, size, 6, 6).sum()) for s in range(4)]
        assert areas == [AREAS[name][k] for name in SHAPES]
        assert areas[3] < areas[2] < areas[1] < areas[0]  # plus < triangle < disk < square


def test_shape_details():
    # Square fills its box; the disk drops the corners; the triangle points up; the plus crosses the centre.
    disk, tri, plus = mask(1, 7, 6, 6), mask(2, 7, 6, 6), mask(3, 7, 6, 6)
    assert not disk[3, 3] and disk[6, 6] and disk[3, 6] and disk[6, 3]
    assert tri[3].sum() == 1 and tri[9].sum() == 7 and tri[3, 6]
    assert plus[6].sum() == 7 and plus[:, 6].sum() == 7 and plus.sum() == 13


def test_render_rejects_shapes_leaving_canvas():
    noise = torch.zeros(3, CANVAS, CANVAS)
    for cx, cy in [(2, 6), (6, 9), (-1, 0)]:
        with pytest.raises(ValueError, match="canvas"):
            render_shape(0, 0, 7, cx, cy, 1.0, noise)
    with pytest.raises(ValueError, match="noise"):
        render_shape(0, 0, 5, 6, 6, 1.0, torch.zeros(3, 8, 8))
    with pytest.raises(ValueError, match="shape"):
        render_shape(4, 0, 5, 6, 6, 1.0, noise)
    with pytest.raises(ValueError, match="colour"):
        render_shape(0, 4, 5, 6, 6, 1.0, noise)


# --- colours and noise -------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "colour"), ALL_COMBOS)
def test_clean_render_exact_colours(shape, colour):
    img = to_unit(render_shape(shape, colour, 6, 5, 7, 1.0, torch.zeros(3, CANVAS, CANVAS)))
    m = mask(shape, 6, 5, 7)
    expected = torch.tensor(COLOUR_RGB[colour])
    assert torch.allclose(img[:, m], expected[:, None].expand(3, int(m.sum())), atol=1e-6)
    assert torch.allclose(img[:, ~m], torch.tensor(0.5), atol=1e-6)


@pytest.mark.parametrize("colour", range(4))
def test_generated_colours_per_combo(colour):
    rgb = torch.tensor(COLOUR_RGB[colour])
    for shape in range(4):
        images, labels, nu = generate_shapes(24, combos=[(shape, colour)], seed=shape, return_nuisance=True)
        assert (labels == torch.tensor([shape, colour])).all()
        rows = zip(to_unit(images), nu["size"], nu["centre"], nu["brightness"], strict=True)
        for img, size, (cx, cy), b in rows:
            fg = img[:, mask(shape, int(size), int(cx), int(cy))].mean(dim=1)
            # The mean foreground colour is the nominal colour times this image's brightness, up to pixel noise,
            # and so lies within the brightness jitter band around the nominal colour.
            assert torch.allclose(fg, rgb * b, atol=0.025), (fg, rgb * b)
            assert ((fg > rgb * 0.9 - 0.025) & (fg < rgb * 1.1 + 0.025)).all()


def test_background_statistics():
    images, labels, nu = generate_shapes(2000, seed=9, return_nuisance=True)
    masks = shape_masks(labels[:, 0], nu["size"], nu["centre"][:, 0], nu["centre"][:, 1])
    background = images.permute(1, 0, 2, 3)[:, ~masks]  # [3, pixels], in [-1, 1] units
    assert abs(background.mean().item()) < 0.002  # grey 0.5 maps to 0
    assert abs(background.std().item() - 0.04) < 0.002  # N(0, 0.02^2) doubles under 2v - 1


def test_render_is_pure_and_matches_generate():
    images, labels, nu = generate_shapes(200, split="band", seed=3, return_nuisance=True)
    noise = torch.randn(3, CANVAS, CANVAS, generator=torch.Generator().manual_seed(0))
    kept = noise.clone()
    for i in range(len(images)):
        shape, colour = labels[i].tolist()
        cx, cy = nu["centre"][i].tolist()
        args = (shape, colour, int(nu["size"][i]), cx, cy, float(nu["brightness"][i]))
        clean = render_shape(*args, torch.zeros(3, CANVAS, CANVAS))
        # Generated = clean + noise of std 0.04 ([-1, 1] units); a pixel with the wrong mask value is off by
        # at least 0.26 in some channel (green at brightness 0.9 vs grey is the closest call).
        assert (images[i] - clean).abs().max() < 0.2
        assert torch.equal(render_shape(*args, noise), render_shape(*args, noise))
    assert torch.equal(noise, kept)  # the caller's noise is not modified


def test_fast_enough():
    generate_shapes(10, seed=0)  # warm the mask table
    start = time.perf_counter()
    images, _ = generate_shapes(10_000, seed=1)
    # Vectorised rasterisation takes well under a second; per-pixel Python loops would take minutes.
    assert time.perf_counter() - start < 10.0 and images.shape[0] == 10_000


def test_canvas_round_trip_and_border():
    from steerdiff.data.shapes import from_canvas, to_canvas

    images, _ = generate_shapes(5, split="full", seed=3)
    canvas = to_canvas(images, 32, 2, generator=torch.Generator().manual_seed(0))
    assert canvas.shape == (5, 3, 32, 32)
    assert torch.equal(from_canvas(canvas, 2), images)
    border = torch.cat([canvas[:, :, :4].flatten(), canvas[:, :, -4:].flatten()])
    assert abs(float(border.mean())) < 0.01 and 0.02 < float(border.std()) < 0.06  # grey 0.5 +- 0.02 in [-1, 1]
    assert torch.equal(canvas[:, :, 4:6, 4:6], images[:, :, :1, :1].expand(-1, -1, 2, 2))  # 2x pixel repetition
    with pytest.raises(ValueError, match="resolution"):
        to_canvas(images, 31)
    with pytest.raises(ValueError, match="images"):
        to_canvas(torch.zeros(1, 3, 8, 8))
    with pytest.raises(ValueError, match="square RGB"):
        from_canvas(torch.zeros(1, 1, 32, 32))


def test_caption_names_the_pair():
    from steerdiff.data.shapes import caption

    assert caption(1, 0) == "a red disk on a grey background"
    with pytest.raises(ValueError, match="colour"):
        caption(0, 4)

