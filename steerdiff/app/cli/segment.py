"""``steerdiff segment``: dichotomous segmentation masks and edge maps by DiffDIS in one step (Yu et al., ICLR 2025,
"High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity"; docs/methods/diffdis.md).

    steerdiff segment photo.png other.jpg --out masks/
    steerdiff segment --procedural 8 --out demo_masks/          # procedural test images, scored against their masks
    steerdiff segment --procedural 8 --steps 10 --out ms/        # the multi-step ablation (same model)
    steerdiff segment --procedural 8 --decoder light --out fast/ # the light mask decoder instead of the VAE's
    steerdiff segment --procedural 8 --encoder light --decoder light --out fastest/  # and the light image encoder

Each image is read as RGB, resized to ``--size`` (the shipped model is trained at 64x64; any multiple of 4 works),
segmented (``--steps 1``: DiffDIS's one-step inference; noise of seed ``--seed + i`` for image ``i``), and the mask
and edge probabilities are resized back and written as ``<stem>_mask.png`` and ``<stem>_edge.png`` (0-255;
``--no-edges``: the masks alone, the same ones, without decoding the edge latents). ``--decoder`` picks the mask
decoder by name from ``steerdiff.segment.MASK_DECODERS`` (``vae``: DiffDIS's, the default; ``light``: the small
convolutional decoder shipped beside the model, about a tenth of the VAE decoder's time: docs/methods/diffdis.md,
"The light mask decoder"); it decodes the edge maps too. ``--encoder`` likewise picks the image encoder from
``steerdiff.segment.IMAGE_ENCODERS`` (``vae``, the default; ``light``: a few convolutions distilled from the VAE
encoder, shipped beside the model: docs/methods/diffdis.md, "The light image encoder").
``metrics.json`` (written last) holds the settings, CPU seconds per image and, with ``--procedural``, the DIS5K
scores against the exact masks (``steerdiff.metrics.segmentation.dis_metrics``).
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np
import torch
import torch.nn.functional as F

from ...segment.decoders import MASK_DECODERS
from ...segment.encoders import IMAGE_ENCODERS
from ._common import SEED, prepare_out, start_outputs, write_metrics
from ._models import ModelKind, register_model_kind

SEGMENTER_FORMAT = "steerdiff.segment.diffdis/1"  # config.json "format" of a segmenter (segment/segmenter.py FORMAT)


def _read_rgb(path: str) -> torch.Tensor:
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        raise click.BadParameter(f"{path}: no such file", param_hint="IMAGES")
    try:
        with Image.open(p) as im:
            arr = np.asarray(im.convert("RGB"), dtype=np.float32) / 127.5 - 1
    except (UnidentifiedImageError, OSError) as err:
        raise click.BadParameter(f"{path}: not a readable image ({err})", param_hint="IMAGES") from err
    return torch.from_numpy(arr).permute(2, 0, 1)


def _write_png(x: torch.Tensor, path: Path) -> None:
    from PIL import Image

    Image.fromarray((x.clamp(0, 1) * 255).round().to(torch.uint8).numpy()).save(path)



def _detect_segmenter(_directory: Path, config: dict | None) -> ModelKind | None:
    return ModelKind("segmenter") if isinstance(config, dict) and config.get("format") == SEGMENTER_FORMAT else None


# a DiffDIS segmenter folder: the sampling commands refuse it by name and point here
register_model_kind(
    "segmenter", detect=_detect_segmenter,
    describe=lambda name, _kind: f"{name} is a DiffDIS segmentation model (image -> mask), not a sampler of "
                                 f"images; segment images with steerdiff segment --model {name} IMAGE...")


@click.command("segment")
@click.argument("images", nargs=-1)
@click.option("--out", required=True, help="Output directory (masks, edges, metrics.json).")
@click.option("--procedural", type=click.IntRange(1, 4096), default=None,
              help="Segment N procedural test images (steerdiff.data.dis, test part) instead of files, and score them.")
@click.option("--model", "model_dir", default=None,
              help="A segmenter directory (default: the shipped steerdiff/assets/diffdis).")
@click.option("--steps", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="Denoising steps (1 = DiffDIS; more = the multi-step ablation over the same model).")
@click.option("--size", type=click.IntRange(16, 1024), default=64, show_default=True,
              help="Side the images are resized to (a multiple of 4).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Noise seed of the first image.")
@click.option("--edges/--no-edges", default=True, show_default=True,
              help="Write the edge maps too (--no-edges: masks only, without decoding the edge latents: the same "
                   "masks in about half the time).")
@click.option("--decoder", type=click.Choice(MASK_DECODERS.names()), default="vae", show_default=True,
              help="Mask decoder: " + "; ".join(f"{n}: {e.summary}" for n, e in MASK_DECODERS.items()) + ".")
@click.option("--encoder", type=click.Choice(IMAGE_ENCODERS.names()), default="vae", show_default=True,
              help="Image encoder: " + "; ".join(f"{n}: {e.summary}" for n, e in IMAGE_ENCODERS.items()) + ".")
def segment_cmd(images: tuple[str, ...], out: str, procedural: int | None, model_dir: str | None, steps: int,
                size: int, seed: int, edges: bool, decoder: str, encoder: str) -> None:
    """Segment IMAGES (PNG/JPEG files) with the shipped DiffDIS model: a mask and an edge map each."""
    from ...segment import load_segmenter
    from ..recipes.diffdis import load_shipped

    if size % 4:
        raise click.BadParameter(f"{size} is not a multiple of 4 (the VAE downsamples by 4)", param_hint="--size")
    if bool(images) == (procedural is not None):
        raise click.UsageError("give IMAGES or --procedural N (exactly one of them)")
    out_dir = start_outputs(prepare_out(out))
    from ...io import CheckpointError

    try:
        seg = (load_segmenter(model_dir, decoder=decoder, encoder=encoder) if model_dir
               else load_shipped(decoder, encoder))
    except (FileNotFoundError, CheckpointError) as err:
        raise click.ClickException(str(err)) from err
    truth = None
    if procedural is not None:
        from ...data import dis

        batch = dis.generate(procedural, size, seed=0, part="test")
        inputs = list(batch.image)
        names = [f"procedural_{i:04d}" for i in range(procedural)]
        truth = batch.mask
        for i, name in enumerate(names):
            _write_png((batch.image[i].permute(1, 2, 0) + 1) / 2, out_dir / f"{name}_image.png")
    else:
        inputs = [_read_rgb(p) for p in images]
        names = [Path(p).stem for p in images]
    t0 = time.process_time()
    masks, edge_maps = [], []
    for i, img in enumerate(inputs):
        h, w = img.shape[-2:]
        x = F.interpolate(img[None], size=(size, size), mode="bilinear", align_corners=False) if (h, w) != (
            size, size) else img[None]
        m, e = seg.segment(x, steps=steps, seed=seed + i, edges=edges)
        if (h, w) != (size, size):
            m = F.interpolate(m, size=(h, w), mode="bilinear", align_corners=False)
            e = F.interpolate(e, size=(h, w), mode="bilinear", align_corners=False) if e is not None else None
        masks.append(m[0, 0])
        _write_png(m[0, 0], out_dir / f"{names[i]}_mask.png")
        if e is not None:
            edge_maps.append(e[0, 0])
            _write_png(e[0, 0], out_dir / f"{names[i]}_edge.png")
    cpu = (time.process_time() - t0) / len(inputs)
    result = {"images": names, "steps": steps, "size": size, "seed": seed, "cpu_s_per_image": cpu,
              "model": model_dir or "steerdiff/assets/diffdis", "decoder": decoder, "encoder": encoder,
              "edge_task": seg.edge,
              "edges_written": bool(edge_maps)}
    if truth is not None:
        from ...metrics.segmentation import dis_metrics

        result["scores"] = dis_metrics(torch.stack(masks)[:, None].double(), truth)
    write_metrics(out_dir, result)
    click.echo(f"wrote {len(names)} masks{' and edge maps' if edge_maps else ''} to {out_dir} "
               f"({cpu:.3f} CPU s per image)")
    if truth is not None:
        s = result["scores"]
        click.echo(f"maxF {s['maxF']:.4f}  MAE {s['MAE']:.4f}  bandF {s['bandF']:.4f}")
