"""Procedural coloured shapes (docs/methods/coind.md, "The coloured-shapes data"), for the APG and CoInD image tests
(docs/methods/guidance.md, "Image test (A1-A5)"; docs/methods/coind.md, "The coloured-shapes test (P1-P4)").

An image is 3x12x12 in [-1, 1]: a uniform grey (0.5) background, one filled shape (square, disk, triangle
or plus sign) of side ``size`` in {5, 6, 7} px whose centre pixel is jittered by up to 2 px, painted in one
of four mid-saturation colours times a per-image brightness in U(0.9, 1.1), plus N(0, 0.02^2) noise on
every pixel. Labels are ``(shape, colour)``; size, centre and brightness are unlabelled nuisances.

Choices the data set's description leaves open (fixed here, and relied on by the tests):

* ``size`` is the side of the shape's bounding box. The box spans columns ``cx - size // 2`` to
  ``cx - size // 2 + size - 1`` (rows likewise), so for even sizes the centre pixel ``(cx, cy)`` is the
  lower-right one of the middle four. Shapes are hard-edged: a pixel is in when its centre is.
* Disk: pixel centres within ``size / 2`` of the box centre. Triangle: points up, apex row 1 or 2 px wide,
  base the full box width; row ``k`` (0 at the top) keeps offsets ``|u| <= (k + 1) / 2`` from the box's
  middle. Plus: 1-px bars through the centre pixel, across the whole box (an even box has no middle pixel
  row, and 2-px bars would make the size-6 plus bigger than the size-7 one). Areas in pixels for sizes
  5 / 6 / 7: square 25/36/49, disk 21/32/37, triangle 17/24/31, plus 9/11/13.
* The centre pixel is ``6 + j`` per axis, ``j`` uniform in {-2, ..., 2}: every size then fits on the canvas
  (at least 1 px to spare at the top/left, 0 px at the bottom/right).
* Brightness scales the shape's colour only; the background stays 0.5. Noise is added to every pixel,
  shape included; values are then clipped to [0, 1] and mapped by ``2v - 1``.
* ``nonuniform``: each training sample flips a fair coin: heads, a uniform band combo; tails, a uniform
  combo of all 16 (band combos then have probability 3/32 each, the others 1/32). Its test part, like
  ``full``'s, is all 16.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from ._rng import check_count, stream

SHAPES = ("square", "disk", "triangle", "plus")
COLOURS = ("red", "green", "blue", "yellow")
COLOUR_RGB = ((0.80, 0.35, 0.30), (0.35, 0.70, 0.35), (0.30, 0.40, 0.80), (0.80, 0.72, 0.30))
SPLITS = ("full", "band", "nonuniform")
PARTS = ("train", "test")
SIZES = (5, 6, 7)
CANVAS = 12
CENTRE = 6  # nominal centre pixel; with JITTER every box stays inside rows/columns 0..11
JITTER = 2
BACKGROUND = 0.5
NOISE_STD = 0.02
BRIGHTNESS = (0.9, 1.1)

# Stream keys of a seed (see _rng): per-sample label/nuisance uniforms, and per-sample pixel noise.
_PARAMS, _NOISE = 0, 1
_N_UNIFORMS = 6  # per sample: band-or-full coin, combo, size, cx, cy, brightness


def split_combos(split: str, part: str = "train") -> list[tuple[int, int]]:
    """The (shape, colour) index pairs of one part of one split, sorted.

    ``band`` train holds ``colour in {shape, shape + 1 mod 4}`` (8 combos; each shape and each colour twice)
    and ``band`` test the other 8. ``full`` has all 16 in both parts. ``nonuniform`` trains on a
    band-weighted mixture over all 16 (see the module docstring), so both its parts list all 16.

    Raises:
        ValueError: for an unknown split or part.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(map(repr, SPLITS))}; got {split!r}")
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(map(repr, PARTS))}; got {part!r}")
    every = [(s, c) for s in range(len(SHAPES)) for c in range(len(COLOURS))]
    if split != "band":
        return every
    in_band = [(s, c) for s, c in every if (c - s) % 4 in (0, 1)]
    return in_band if part == "train" else [sc for sc in every if sc not in in_band]


def render(shape: int, colour: int, size: int, cx: int, cy: int, brightness: float, noise: Tensor) -> Tensor:
    """Render one image; a pure function of its arguments.

    Args:
        shape: index into ``SHAPES``.
        colour: index into ``COLOURS``.
        size: side of the bounding box; ``generate`` uses ``SIZES``, any size that fits is accepted.
        cx: column of the centre pixel; the box spans ``cx - size // 2`` .. ``cx - size // 2 + size - 1``.
        cy: row of the centre pixel, likewise.
        brightness: factor on the shape's colour (``generate`` draws it from U(0.9, 1.1)).
        noise: standard-normal draws ``[3, 12, 12]``, scaled by ``NOISE_STD`` here; zeros give a clean image.

    Returns:
        float32 ``[3, 12, 12]`` in [-1, 1], on the CPU.

    Raises:
        ValueError: for an index out of range, a box that leaves the canvas, or a wrong noise shape.
    """
    if not 0 <= shape < len(SHAPES):
        raise ValueError(f"shape must be an index in 0..{len(SHAPES) - 1} ({', '.join(SHAPES)}); got {shape}")
    if not 0 <= colour < len(COLOURS):
        raise ValueError(
            f"colour must be an index in 0..{len(COLOURS) - 1} ({', '.join(COLOURS)}); got {colour}"
        )
    lo_x, lo_y = cx - size // 2, cy - size // 2
    if size < 1 or min(lo_x, lo_y) < 0 or max(lo_x, lo_y) + size > CANVAS:
        raise ValueError(
            f"a size-{size} shape centred at (cx={cx}, cy={cy}) leaves the {CANVAS}x{CANVAS} canvas"
        )
    if tuple(noise.shape) != (3, CANVAS, CANVAS):
        raise ValueError(f"noise must have shape (3, {CANVAS}, {CANVAS}); got {tuple(noise.shape)}")
    ints = torch.tensor([[shape], [size], [cx], [cy]], dtype=torch.int64)
    mask = shape_masks(*ints)
    return _paint(
        mask,
        torch.tensor([colour], dtype=torch.int64),
        torch.tensor([brightness], dtype=torch.float32),
        noise.detach().to("cpu", torch.float32, copy=True)[None],  # a copy: _paint works in place
    )[0]


def generate(
    n: int,
    split: str = "full",
    part: str = "train",
    seed: int = 0,
    combos: list[tuple[int, int]] | None = None,
    return_nuisance: bool = False,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Draw ``n`` images of one part of one split.

    Sample ``i`` depends only on ``(seed, i)`` and the combos it may take, never on ``n``. The train and test
    parts of one seed share their nuisances (and, where the combo lists agree, their images).

    Args:
        n: number of images.
        split: ``"full"``, ``"band"`` or ``"nonuniform"``.
        part: ``"train"`` or ``"test"`` (see ``split_combos``).
        seed: non-negative int.
        combos: an explicit list of (shape, colour) pairs to draw from uniformly; overrides ``split`` and
            ``part``, so any composition can be generated or held out.
        return_nuisance: also return ``{"size": int64 [n], "centre": int64 [n, 2] as (cx, cy),
            "brightness": float32 [n]}``.

    Returns:
        ``(images, labels)`` or ``(images, labels, nuisance)``: images float32 ``[n, 3, 12, 12]`` in
        [-1, 1], labels int64 ``[n, 2]`` as (shape, colour).

    Raises:
        ValueError: for a bad ``n``, ``seed``, split, part or combo list.
    """
    n = check_count(n)
    pool = np.array(split_combos(split, part), dtype=np.int64)  # validates the names even when overridden
    if combos is not None:
        pool = _check_combos(combos)
    u = stream(seed, _PARAMS).random((n, _N_UNIFORMS))
    noise = stream(seed, _NOISE).standard_normal((n, 3, CANVAS, CANVAS), dtype=np.float32)

    pick = pool[_index(u[:, 1], len(pool))]
    if combos is None and split == "nonuniform" and part == "train":
        band = np.array(split_combos("band", "train"), dtype=np.int64)
        heads = u[:, 0] < 0.5
        pick = np.where(heads[:, None], band[_index(u[:, 1], len(band))], pick)
    size_idx = _index(u[:, 2], len(SIZES))
    cx = CENTRE - JITTER + _index(u[:, 3], 2 * JITTER + 1)
    cy = CENTRE - JITTER + _index(u[:, 4], 2 * JITTER + 1)
    low, high = BRIGHTNESS
    brightness = (low + (high - low) * u[:, 5]).astype(np.float32)

    t = torch.from_numpy
    labels = t(np.ascontiguousarray(pick))
    # A table lookup per image: the geometry of shape_masks (as in render) without re-rasterising it.
    mask = _mask_table()[labels[:, 0], t(size_idx), t(cy), t(cx)]
    images = _paint(mask, labels[:, 1], t(brightness), t(noise))
    if not return_nuisance:
        return images, labels
    size = np.array(SIZES, dtype=np.int64)[size_idx]
    nuisance = {"size": t(size), "centre": t(np.stack([cx, cy], axis=1)), "brightness": t(brightness)}
    return images, labels, nuisance


def shape_masks(shape: Tensor, size: Tensor, cx: Tensor, cy: Tensor) -> Tensor:
    """Boolean masks ``[B, 12, 12]`` from int64 ``[B]`` shape indices, sizes and centre pixels.

    Rasterised on one coordinate grid for the whole batch (no per-pixel loops); the geometry is in the
    module docstring. Does not check that the boxes fit the canvas (parts outside are cut off).
    """
    rows = torch.arange(CANVAS).view(1, CANVAS, 1)
    cols = torch.arange(CANVAS).view(1, 1, CANVAS)
    s, cx, cy = size.view(-1, 1, 1), cx.view(-1, 1, 1), cy.view(-1, 1, 1)
    k_row = rows - (cy - s // 2)  # row offset inside the box, 0 at the top
    k_col = cols - (cx - s // 2)
    in_box = (k_row >= 0) & (k_row < s) & (k_col >= 0) & (k_col < s)
    # Offsets from the box's geometric centre: halves for even sizes, exact in float32, so no ties wobble.
    half = (s.float() - 1) / 2
    u, v = k_col.float() - half, k_row.float() - half
    disk = u.square() + v.square() <= (s.float() / 2).square()
    triangle = u.abs() <= (k_row.float() + 1) / 2
    plus = (rows == cy) | (cols == cx)
    square = torch.ones_like(disk)
    by_shape = torch.stack(torch.broadcast_tensors(square, disk, triangle, plus), dim=1)  # [B, 4, 12, 12]
    picked = by_shape.gather(1, shape.view(-1, 1, 1, 1).expand(-1, 1, CANVAS, CANVAS))[:, 0]
    return in_box & picked


@functools.lru_cache(maxsize=1)
def _mask_table() -> Tensor:
    """Masks ``[4, 3, 12, 12, 12, 12]`` indexed by (shape, size index, cy, cx), for every centre pixel.

    Centres whose box leaves the canvas get cut-off masks; ``generate`` never draws them.
    """
    grid = torch.cartesian_prod(
        torch.arange(len(SHAPES)), torch.tensor(SIZES), torch.arange(CANVAS), torch.arange(CANVAS)
    )
    masks = shape_masks(grid[:, 0], grid[:, 1], grid[:, 3], grid[:, 2])
    return masks.view(len(SHAPES), len(SIZES), CANVAS, CANVAS, CANVAS, CANVAS)


def _paint(mask: Tensor, colour: Tensor, brightness: Tensor, noise: Tensor) -> Tensor:
    """Images from masks ``[B, 12, 12]``, colours and brightness ``[B]``, unit noise ``[B, 3, 12, 12]``.

    Works in place on ``noise`` (float32, owned by the caller for this purpose): at 100k images every
    full-size temporary costs as much as the arithmetic.
    """
    rgb = torch.tensor(COLOUR_RGB, dtype=torch.float32)[colour] * brightness[:, None]  # [B, 3]
    clean = torch.where(mask[:, None], rgb[:, :, None, None], torch.tensor(BACKGROUND))
    # v = clip(clean + NOISE_STD * noise, 0, 1) mapped by 2v - 1, done in [-1, 1] units directly.
    out = noise.mul_(2.0 * NOISE_STD).add_(clean.mul_(2.0).sub_(1.0))
    return out.clamp_(-1.0, 1.0)


def _index(u: np.ndarray, k: int) -> np.ndarray:
    """Map uniforms in [0, 1) to indices 0..k-1 (the minimum guards rounding at the top edge)."""
    return np.minimum((u * k).astype(np.int64), k - 1)


def _check_combos(combos: list[tuple[int, int]]) -> np.ndarray:
    pool = np.asarray(combos, dtype=np.int64) if len(combos) else np.empty((0, 2), np.int64)
    if pool.ndim != 2 or pool.shape[1] != 2 or len(pool) == 0:
        raise ValueError(f"combos must be a non-empty list of (shape, colour) pairs; got {combos!r}")
    bad = (pool < 0).any(1) | (pool[:, 0] >= len(SHAPES)) | (pool[:, 1] >= len(COLOURS))
    if bad.any():
        raise ValueError(
            f"combos hold indices out of range (shape 0..{len(SHAPES) - 1}, colour 0..{len(COLOURS) - 1}): "
            f"{[tuple(p) for p in pool[bad].tolist()]}"
        )
    return pool


# ------------------------------------------------------------------------------------- the text-to-image canvas
def caption(shape: int, colour: int) -> str:
    """The caption of one (shape, colour) pair in the shipped text-to-image pipeline's data, e.g.
    ``caption(1, 0) == "a red disk on a grey background"``."""
    if not (isinstance(shape, int) and 0 <= shape < len(SHAPES)):
        raise ValueError(f"shape must be an index in 0..{len(SHAPES) - 1}, got {shape!r}")
    if not (isinstance(colour, int) and 0 <= colour < len(COLOURS)):
        raise ValueError(f"colour must be an index in 0..{len(COLOURS) - 1}, got {colour!r}")
    return f"a {COLOURS[colour]} {SHAPES[shape]} on a grey background"


def _canvas_pad(resolution: int, scale: int) -> int:
    inner = CANVAS * scale
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ValueError(f"scale must be a positive integer, got {scale!r}")
    if resolution < inner or (resolution - inner) % 2:
        raise ValueError(f"resolution must be >= {inner} (12 x scale) and differ from it by an even number; "
                         f"got {resolution}")
    return (resolution - inner) // 2


def to_canvas(images: Tensor, resolution: int = 32, scale: int = 2,
              generator: torch.Generator | None = None) -> Tensor:
    """Shapes images ``[n, 3, 12, 12]`` enlarged ``scale`` x by pixel repetition (hard edges stay hard) and centred on
    a ``resolution``-pixel grey canvas whose border pixels get the generator's own pixel noise (N(0, 0.02^2) around
    0.5, drawn as one ``[n, 3, R, R]`` normal tensor from ``generator``): the shipped text-to-image pipeline's
    training images (docs/methods/pipelines.md, "The shipped pipeline: recipe")."""
    if not isinstance(images, Tensor) or images.ndim != 4 or tuple(images.shape[1:]) != (3, CANVAS, CANVAS):
        raise ValueError(f"images must be shapes images [n, 3, {CANVAS}, {CANVAS}], got "
                         f"{getattr(images, 'shape', type(images).__name__)}")
    pad = _canvas_pad(resolution, scale)
    inner = CANVAS * scale
    big = images.repeat_interleave(scale, dim=2).repeat_interleave(scale, dim=3)
    noise = torch.randn(len(images), 3, resolution, resolution, generator=generator)
    canvas = (2.0 * BACKGROUND - 1.0 + 2.0 * NOISE_STD * noise).clamp_(-1.0, 1.0).to(images.dtype)
    canvas[:, :, pad:pad + inner, pad:pad + inner] = big
    return canvas


def from_canvas(images: Tensor, scale: int = 2) -> Tensor:
    """The inverse of :func:`to_canvas` for a classifier of 12x12 shapes: the centre ``12 scale`` pixels averaged
    over ``scale x scale`` blocks, ``[n, 3, 12, 12]`` (exact on a canvas made by :func:`to_canvas`)."""
    if not isinstance(images, Tensor) or images.ndim != 4 or images.shape[1] != 3 or \
            images.shape[2] != images.shape[3]:
        raise ValueError(f"images must be square RGB images [n, 3, R, R], got "
                         f"{getattr(images, 'shape', type(images).__name__)}")
    pad = _canvas_pad(int(images.shape[-1]), scale)
    inner = CANVAS * scale
    crop = images[:, :, pad:pad + inner, pad:pad + inner]
    return torch.nn.functional.avg_pool2d(crop, scale)
