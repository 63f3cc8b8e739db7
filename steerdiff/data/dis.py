"""Dichotomous image segmentation data (docs/methods/diffdis.md, "Data"): a procedural set with thin structures,
and a loader for DIS5K-style image/mask folders.

DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity")
is trained and measured on DIS5K (Qin et al., ECCV 2022): high-resolution photographs whose masks hold wires,
lattices, holes and hair. Nothing is downloaded here, so :func:`generate` draws a small stand-in with the same
difficulties, and :func:`load_folder` reads real DIS5K-layout folders for users who have them.

Interface (what ``steerdiff/segment`` builds on):

* :func:`generate` ``(n, size=64, seed=0, part="train") -> DISBatch(image, mask, edge)``:
  ``image`` ``[n, 3, H, W]`` float32 in ``[-1, 1]``; ``mask`` ``[n, 1, H, W]`` float32 in ``{0, 1}`` (exactly the
  pixels painted as foreground); ``edge`` ``[n, 1, H, W]`` float32 in ``{0, 1}`` = :func:`mask_edges` of ``mask``.
  ``size`` is 64 or 128 (any multiple of 16 in ``[32, 512]`` works). ``part`` "train" and "test" draw from
  disjoint random streams of the same seed. Prefix-stable: the first ``m`` samples do not depend on ``n``.
* :func:`mask_edges` ``(mask, width=1)``: the boundary band ``dilate(mask) - erode(mask)`` with a
  ``(2 width + 1)``-square structuring element: ``width`` px on each side of the boundary (2 px in all for
  the default), 0 at the image border unless the mask boundary is there.
* :func:`load_folder` ``(root, size=None) -> DISBatch``: ``root/im/*.{jpg,jpeg,png}`` and ``root/gt/*.png`` with the
  same stems (DIS5K's layout); masks binarised at 0.5 (of 255), images mapped to ``[-1, 1]``.

How an image is drawn (all geometry in units of the image side, widths in pixels so that thin stays thin):

* **Clutter.** A base colour (never the object's), a low-frequency stripe texture (amplitude 0.08) and six
  soft-edged elliptical blobs (edge ramps of 1.5-4 px) alpha-blended over it. Colours come from one palette
  of six, shared with the foreground, and three blobs always take the foreground's colour: a colour
  threshold cannot give the mask; shape, sharpness and thinness must.
* **Object** (hard-edged, pixel in when its centre is): an elliptical body with 0-3 round holes, a lattice
  with probability 1/2 (a rotated rectangle of period-4-to-9-px grid bars 1-2 px wide), and 1-6 strands. A
  strand is straight (a *wire*: 1.2-2.2 px wide, long) or wavy (*hair*: 1.2-1.6 px, shorter, starting on the
  body); its centre line is ``v = a (sin(2 pi f u + phi) - sin phi)`` in a frame rotated by the strand's
  angle, and a pixel is in when ``|v - c(u)| / sqrt(1 + c'(u)^2) < width / 2`` (first-order distance to the
  curve) with ``0 <= u <= length``.
* **Colour.** The object is the foreground colour times a linear shading in ``[0.85, 1.15]``; every pixel then
  gets N(0, 0.03^2) noise, is clipped to ``[0, 1]`` and mapped by ``2 v - 1``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ._rng import check_count, check_seed, stream

PARTS = ("train", "test")
PALETTE = (
    (0.82, 0.30, 0.28),
    (0.30, 0.68, 0.34),
    (0.28, 0.40, 0.82),
    (0.85, 0.75, 0.28),
    (0.62, 0.36, 0.72),
    (0.90, 0.90, 0.88),
)
N_BLOBS = 6
N_FG_BLOBS = 3  # blobs that always share the object's colour
N_HOLES = 3
N_STRANDS = 6
NOISE_STD = 0.03
IMAGE_EXTS = (".jpg", ".jpeg", ".png")

# Per-sample uniforms, in this order (the block size fixes prefix stability; never reorder).
_BG = 1 + 4 + 7 * N_BLOBS  # base colour, stripe (freq, angle, phase, unused), blobs
_FG = 2 + 5 + 1 + 4 * N_HOLES + 8 + 1 + 9 * N_STRANDS  # colour, shading; body; n holes, holes; lattice; strands
_N_UNIFORMS = _BG + _FG


class DISBatch(NamedTuple):
    """Images ``[n, 3, H, W]`` in [-1, 1], binary masks ``[n, 1, H, W]`` and edge maps ``[n, 1, H, W]``."""

    image: Tensor
    mask: Tensor
    edge: Tensor


def mask_edges(mask: Tensor, width: int = 1) -> Tensor:
    """The boundary band of a binary mask: ``dilate(mask) - erode(mask)``, square element of side ``2 width + 1``.

    Args:
        mask: ``[..., H, W]`` with values in {0, 1} (anything > 0.5 counts as foreground).
        width: pixels on each side of the boundary (the band is ``2 width`` px across a straight edge).

    Returns:
        ``[..., H, W]`` float in {0, 1}, same dtype as ``mask`` (float32 for integer or bool input).
    """
    if not isinstance(mask, Tensor) or mask.ndim < 2:
        raise ValueError(f"mask must be a tensor [..., H, W], got {type(mask).__name__}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be an int >= 1, got {width!r}")
    dtype = mask.dtype if mask.is_floating_point() else torch.float32
    m = (mask > 0.5).to(torch.float32)
    shape = m.shape
    m = m.reshape(-1, 1, *shape[-2:])
    k = 2 * width + 1
    # Replicate padding: the image border is not a boundary (the object may run off the canvas).
    padded = F.pad(m, (width,) * 4, mode="replicate")
    dil = F.max_pool2d(padded, k, stride=1)
    ero = -F.max_pool2d(-padded, k, stride=1)
    return (dil - ero).reshape(shape).to(dtype)


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size % 16 or not 32 <= size <= 512:
        raise ValueError(f"size must be a multiple of 16 in [32, 512] (64 or 128 as shipped), got {size!r}")
    return size


def _ellipse(px: Tensor, py: Tensor, cx: Tensor, cy: Tensor, rx: Tensor, ry: Tensor, ang: Tensor) -> Tensor:
    """Normalised radius (1 on the boundary) of rotated ellipses; params ``[n]``, pixels ``[H, W]`` -> ``[n, H, W]``."""
    c, s = torch.cos(ang)[:, None, None], torch.sin(ang)[:, None, None]
    dx, dy = px - cx[:, None, None], py - cy[:, None, None]
    u, v = c * dx + s * dy, -s * dx + c * dy
    return torch.sqrt((u / rx[:, None, None]) ** 2 + (v / ry[:, None, None]) ** 2)


def _render(p: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Image (in [0, 1], before noise) and mask from the per-sample uniforms ``p`` ``[n, _N_UNIFORMS]`` (float64)."""
    px_size = 1.0 / size
    coords = (torch.arange(size, dtype=p.dtype) + 0.5) / size
    py, px = torch.meshgrid(coords, coords, indexing="ij")
    palette = torch.tensor(PALETTE, dtype=p.dtype)
    cols = iter(range(p.shape[1]))

    def take(k: int = 1) -> Tensor:
        i = next(cols)
        for _ in range(k - 1):
            next(cols)
        return p[:, i : i + k].squeeze(1) if k == 1 else p[:, i : i + k]

    def pick(u: Tensor, k: int) -> Tensor:
        return (u * k).long().clamp(max=k - 1)

    # --- clutter ---
    fg_col = pick(p[:, _BG], len(PALETTE))  # object colour, read ahead: the clutter is built around it
    # The base differs from the object's colour (else the object would vanish); blobs then reuse that colour.
    base = palette[(fg_col + 1 + pick(take(), len(PALETTE) - 1)) % len(PALETTE)]  # [n, 3]
    freq, sang, sphase, _ = take(4).unbind(1)
    freq = 1.5 + 4.5 * freq  # periods per image side: low frequency, unlike the object's bars
    sang = math.pi * sang
    proj = torch.cos(sang)[:, None, None] * px + torch.sin(sang)[:, None, None] * py
    stripes = 0.08 * torch.sin(2 * math.pi * (freq[:, None, None] * proj + sphase[:, None, None]))
    img = base[:, :, None, None] + stripes[:, None]
    for b in range(N_BLOBS):
        cx, cy, rx, ry, ang, col, soft = take(7).unbind(1)
        r = _ellipse(px, py, cx, cy, 0.10 + 0.30 * rx, 0.10 + 0.30 * ry, math.pi * ang)
        soft = (1.5 + 2.5 * soft) * px_size  # edge ramp width in image units: blurred, never a sharp edge
        alpha = torch.sigmoid((1 - r) * (0.10 + 0.30 * torch.minimum(rx, ry))[:, None, None] / soft[:, None, None])
        colour = palette[fg_col] if b < N_FG_BLOBS else palette[pick(col, len(PALETTE))]
        img = img * (1 - alpha[:, None]) + colour[:, :, None, None] * alpha[:, None]

    # --- object ---
    take()  # fg colour (already read)
    shade_ang = 2 * math.pi * take()
    bcx, bcy, brx, bry, bang = take(5).unbind(1)
    bcx, bcy = 0.3 + 0.4 * bcx, 0.3 + 0.4 * bcy
    brx, bry = 0.10 + 0.14 * brx, 0.10 + 0.14 * bry
    mask = _ellipse(px, py, bcx, bcy, brx, bry, math.pi * bang) < 1
    n_holes = pick(take(), N_HOLES + 1)  # 0..3 holes
    for h in range(N_HOLES):
        hu, hv, hr, _ = take(4).unbind(1)
        rad = (1.5 + 3.0 * hr) * px_size  # 1.5-4.5 px: a hole is a fine structure too
        dist = torch.sqrt((px - (bcx + 0.5 * brx * (2 * hu - 1))[:, None, None]) ** 2
                          + (py - (bcy + 0.5 * bry * (2 * hv - 1))[:, None, None]) ** 2)
        mask = mask & ~((dist < rad[:, None, None]) & (h < n_holes)[:, None, None])
    lon, lcx, lcy, lhx, lhy, lang, lper, lwid = take(8).unbind(1)
    c, s = torch.cos(math.pi * lang)[:, None, None], torch.sin(math.pi * lang)[:, None, None]
    dx, dy = px - (0.2 + 0.6 * lcx)[:, None, None], py - (0.2 + 0.6 * lcy)[:, None, None]
    u, v = c * dx + s * dy, -s * dx + c * dy
    inside = (u.abs() < (0.12 + 0.15 * lhx)[:, None, None]) & (v.abs() < (0.12 + 0.15 * lhy)[:, None, None])
    period = ((4 + 5 * lper) * px_size)[:, None, None]
    bar = ((1.0 + 1.0 * lwid) * px_size)[:, None, None]
    on_bar = (torch.remainder(u, period) < bar) | (torch.remainder(v, period) < bar)
    mask = mask | (inside & on_bar & (lon < 0.5)[:, None, None])
    n_strands = 1 + pick(take(), N_STRANDS)
    for k in range(N_STRANDS):
        kind, t0, ang, length, amp, fr, ph, wid, _ = take(9).unbind(1)
        wire = kind < 0.4
        # A hair starts on the body's boundary; a wire anywhere in the middle of the canvas.
        bx = bcx + brx * torch.cos(2 * math.pi * t0)
        by = bcy + bry * torch.sin(2 * math.pi * t0)
        ox = torch.where(wire, 0.15 + 0.7 * t0, bx)
        oy = torch.where(wire, 0.15 + 0.7 * fr, by)
        theta = torch.where(wire, math.pi * ang, 2 * math.pi * t0 + (ang - 0.5))  # hair points outwards
        length = torch.where(wire, 0.5 + 0.5 * length, 0.15 + 0.3 * length)
        amp = torch.where(wire, torch.zeros_like(amp), (1.0 + 4.0 * amp) * px_size)
        cycles = (0.5 + 2.5 * fr) / length  # 0.5-3 waves along the strand
        width = torch.where(wire, 1.2 + 1.0 * wid, 1.2 + 0.4 * wid) * px_size
        c, s = torch.cos(theta)[:, None, None], torch.sin(theta)[:, None, None]
        dx, dy = px - ox[:, None, None], py - oy[:, None, None]
        u, v = c * dx + s * dy, -s * dx + c * dy
        w_arg = 2 * math.pi * cycles[:, None, None] * u + 2 * math.pi * ph[:, None, None]
        a = amp[:, None, None]
        curve = a * (torch.sin(w_arg) - torch.sin(2 * math.pi * ph)[:, None, None])
        slope = a * 2 * math.pi * cycles[:, None, None] * torch.cos(w_arg)
        near = (v - curve).abs() / torch.sqrt(1 + slope**2) < width[:, None, None] / 2
        along = (u >= 0) & (u <= length[:, None, None])
        mask = mask | (near & along & (k < n_strands)[:, None, None])

    if next(cols, None) is not None:  # the block layout (_N_UNIFORMS) and the reads above must agree
        raise RuntimeError("dis._render read fewer uniforms than _N_UNIFORMS")
    grad = torch.cos(shade_ang)[:, None, None] * (px - 0.5) + torch.sin(shade_ang)[:, None, None] * (py - 0.5)
    shade = 1 + 0.15 * grad.clamp(-1, 1) * 2 / math.sqrt(2)
    obj = palette[fg_col][:, :, None, None] * shade[:, None]
    m = mask[:, None].to(p.dtype)
    return img * (1 - m) + obj * m, m


def generate(n: int, size: int = 64, seed: int = 0, part: str = "train") -> DISBatch:
    """Draw ``n`` procedural dichotomous-segmentation samples (see the module docstring for the recipe).

    Args:
        n: number of samples.
        size: image side in pixels (64 or 128 as used by DiffDIS here; any multiple of 16 in [32, 512]).
        seed: non-negative int; the same ``(seed, part, size)`` gives the same samples, prefix-stable in ``n``.
        part: "train" or "test"; the two draw from disjoint random streams.

    Returns:
        :class:`DISBatch` of float32 tensors: image ``[n, 3, size, size]`` in [-1, 1], mask and edge
        ``[n, 1, size, size]`` in {0, 1}.
    """
    n = check_count(n)
    size = _check_size(size)
    seed = check_seed(seed)
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    key = 2 * PARTS.index(part)
    params = torch.from_numpy(stream(seed, key).random((n, _N_UNIFORMS)))
    noise = torch.from_numpy(stream(seed, key + 1).standard_normal((n, 3, size, size), dtype=np.float32))
    chunks_img, chunks_mask = [], []
    for start in range(0, max(n, 1), 256):  # bounded memory: [256, H, W] float64 work arrays
        img, m = _render(params[start : start + 256], size)
        chunks_img.append(img.float())
        chunks_mask.append(m.float())
    img, mask = torch.cat(chunks_img), torch.cat(chunks_mask)
    image = ((img + NOISE_STD * noise).clamp(0, 1) * 2 - 1).contiguous()
    return DISBatch(image, mask, mask_edges(mask))


def _read(path: Path, mode: str) -> np.ndarray:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as e:  # Pillow comes with matplotlib (the plot extra), not with steerdiff itself
        raise ImportError("load_folder needs Pillow to read image files: pip install pillow") from e

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert(mode))
    except (OSError, UnidentifiedImageError) as e:
        raise ValueError(f"cannot read image file {path}: {e}") from e


def _stems(folder: Path, exts: tuple[str, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.suffix.lower() in exts:
            if f.stem in found:
                raise ValueError(f"two files with the stem {f.stem!r} in {folder}: {found[f.stem].name}, {f.name}")
            found[f.stem] = f
    return found


def load_folder(root: str | Path, size: int | None = None, limit: int | None = None) -> DISBatch:
    """Read a DIS5K-layout folder: ``root/im/<stem>.{jpg,jpeg,png}`` and ``root/gt/<stem>.png``.

    Masks are read as greyscale and binarised at 0.5 (``gt > 127``), as the DIS evaluation code does; images are
    RGB mapped to [-1, 1]. With ``size``, both are resized to ``size x size`` (bilinear for images; masks
    bilinear then re-binarised at 0.5); without it every pair must already share one size.

    Args:
        root: the folder holding ``im/`` and ``gt/``.
        size: optional side to resize to.
        limit: read only the first ``limit`` stems (sorted).

    Returns:
        :class:`DISBatch` in stem order (the stems are in :func:`folder_stems`).

    Raises:
        FileNotFoundError: ``root``, ``im/`` or ``gt/`` missing.
        ValueError: no pairs, stems present on one side only (names listed), a mask whose size differs from
            its image, unreadable files, or mixed sizes without ``size``.
    """
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"size must be None or a positive int, got {size!r}")
    stems = folder_stems(root)
    if limit is not None:
        stems = stems[: check_count(limit, "limit")]
    root = Path(root)
    ims, gts = _stems(root / "im", IMAGE_EXTS), _stems(root / "gt", (".png",))
    images, masks = [], []
    for stem in stems:
        im, gt = _read(ims[stem], "RGB"), _read(gts[stem], "L")
        if im.shape[:2] != gt.shape:
            raise ValueError(f"{stem}: image {ims[stem].name} is {im.shape[1]}x{im.shape[0]} but mask "
                             f"{gts[stem].name} is {gt.shape[1]}x{gt.shape[0]} (width x height)")
        x = torch.from_numpy(im.copy()).permute(2, 0, 1).float()[None] / 255.0
        m = torch.from_numpy(gt.copy()).float()[None, None] / 255.0
        if size is not None:
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
            m = F.interpolate(m, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        images.append(x)
        masks.append((m > 0.5).float())
    shapes = {tuple(x.shape[-2:]) for x in images}
    if len(shapes) > 1:
        raise ValueError(f"images in {root} have {len(shapes)} different sizes {sorted(shapes)[:4]}...; "
                         "pass size= to resize them to one")
    image = (torch.cat(images) * 2 - 1).clamp(-1, 1)
    mask = torch.cat(masks)
    return DISBatch(image, mask, mask_edges(mask))


def folder_stems(root: str | Path) -> list[str]:
    """The sorted stems of the image/mask pairs in a DIS5K-layout folder (same checks as :func:`load_folder`)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"root must be a folder holding im/ and gt/, {root} is not a folder")
    for sub in ("im", "gt"):
        if not (root / sub).is_dir():
            raise FileNotFoundError(f"root {root} has no {sub}/ folder (DIS5K layout: root/im/*.jpg, root/gt/*.png)")
    ims, gts = _stems(root / "im", IMAGE_EXTS), _stems(root / "gt", (".png",))
    only_im, only_gt = sorted(set(ims) - set(gts)), sorted(set(gts) - set(ims))
    if only_im or only_gt:
        raise ValueError(f"image and mask stems differ in {root}: images without a mask {only_im[:5]}"
                         f"{'...' if len(only_im) > 5 else ''}, masks without an image {only_gt[:5]}"
                         f"{'...' if len(only_gt) > 5 else ''}")
    if not ims:
        raise ValueError(f"no image/mask pairs in {root} (expected im/*.jpg|jpeg|png and gt/*.png)")
    return sorted(ims)
