"""Reading an image or tensor given on the command line (``restore --input``, ``sample --init``).

A SPEC is an 8-bit PNG (0..255 mapped to [-1, 1]; greyscale, or RGB for 3-channel models), a ``.npy`` array or a
``.safetensors`` file with one tensor (or one named ``image``) in model units, or ``digits:<split>:<N>`` (image N
of that split of the 8x8 digits, so a command runs without a file).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click
import numpy as np
import torch

# An image model's data are in [-1, 1]; a start past twice that is no image of its data (0..255 pixels, most often),
# and the sampler would return it almost unchanged as a sample. Values just past 1 (a restored image) are allowed.
INIT_LIMIT = 2.0
SPEC_HELP = "PNG, .npy/.safetensors tensor in [-1, 1], or digits:<split>:<N>"


def _digits(spec: str, hint: str) -> torch.Tensor:
    from ...data.digits import load_digits

    parts = spec.split(":")
    if len(parts) != 3 or not parts[2].isdigit():
        raise click.BadParameter("use digits:<split>:<N>, e.g. digits:test:0", param_hint=hint)
    try:
        images, _ = load_digits(parts[1])
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint=hint) from err
    n = int(parts[2])
    if n >= len(images):
        raise click.BadParameter(f"the {parts[1]} split has {len(images)} images; got N={n}", param_hint=hint)
    return images[n, 0].double()


def read_array(spec: str, hint: str, channels: int = 1) -> torch.Tensor:
    """The SPEC as a finite float64 tensor (a PNG as ``[H, W]``, or ``[3, H, W]`` with ``channels=3``)."""
    if spec.startswith("digits:"):
        return _digits(spec, hint)
    path = Path(spec)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "no such file"
        raise click.BadParameter(f"{spec}: {what} (or use digits:<split>:<N>)", param_hint=hint)
    suffix = path.suffix.lower()
    if suffix == ".png":
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as im:
                arr = np.asarray(im.convert("RGB" if channels == 3 else "L"), dtype=np.float64) / 127.5 - 1
        except (UnidentifiedImageError, OSError) as err:
            raise click.BadParameter(f"{spec}: not a readable PNG image ({err})", param_hint=hint) from err
        if arr.ndim == 3:
            arr = arr.transpose(2, 0, 1)  # HWC -> CHW
    elif suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:  # EOFError: an empty file (click would print only "Aborted!")
            raise click.BadParameter(f"{spec}: not a plain numeric .npy array ({err})", param_hint=hint) from err
    elif suffix == ".safetensors":
        from ...io import CheckpointError, load_tensors

        try:
            tensors = load_tensors(path)
        except CheckpointError as err:
            raise click.BadParameter(str(err), param_hint=hint) from err
        if len(tensors) != 1 and "image" not in tensors:
            raise click.BadParameter(f"{spec}: expected one tensor or one named 'image', got {sorted(tensors)}",
                                     param_hint=hint)
        arr = (tensors["image"] if "image" in tensors else next(iter(tensors.values()))).double().numpy()
    else:
        raise click.BadParameter(f"{spec}: use a .png, .npy or .safetensors file", param_hint=hint)
    try:
        out = torch.as_tensor(np.asarray(arr, dtype=np.float64))
    except (TypeError, ValueError) as err:
        raise click.BadParameter(f"{spec}: not a numeric array ({err})", param_hint=hint) from err
    if not torch.isfinite(out).all():
        raise click.BadParameter(f"{spec}: holds non-finite values", param_hint=hint)
    return out


def read_image(spec: str, hint: str = "--input") -> torch.Tensor:
    """One greyscale image as a float64 ``[H, W]`` tensor in [-1, 1] (leading axes of size 1 dropped)."""
    img = read_array(spec, hint)
    while img.ndim > 2 and img.shape[0] == 1:
        img = img[0]
    if img.ndim != 2:
        raise click.BadParameter(f"{spec}: expected one finite greyscale image [H, W], got shape "
                                 f"{tuple(img.shape)}", param_hint=hint)
    return img


def read_start(spec: str, shape: Sequence[int], n: int, hint: str = "--init") -> torch.Tensor:
    """A starting sample for ``n`` rows, ``[n, *shape]`` float64: one sample of ``shape`` (repeated) or ``n``."""
    shape = tuple(int(s) for s in shape)
    x = read_array(spec, hint, channels=3 if len(shape) == 3 and shape[0] == 3 else 1)
    if len(shape) == 3 and x.numel() and x.abs().max() > INIT_LIMIT:
        raise click.BadParameter(f"{spec}: images are in [-1, 1], this one reaches {x.abs().max().item():.4g} (an "
                                 "8-bit array? map 0..255 to [-1, 1] with x / 127.5 - 1)", param_hint=hint)
    if tuple(x.shape) == (n, *shape):
        return x
    one = x
    while one.ndim > len(shape) and one.shape[0] == 1:
        one = one[0]
    if tuple(one.shape) == shape[-one.ndim:] and one.numel() == int(np.prod(shape)):
        return one.reshape(shape).expand(n, *shape).clone()
    raise click.BadParameter(f"{spec}: the model's samples have shape {shape}; got {tuple(x.shape)} (give one "
                             f"sample of shape {shape}, or {n} of them as [{n}, {', '.join(map(str, shape))}])",
                             param_hint=hint)
