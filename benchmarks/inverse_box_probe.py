"""Why DR / CR / HR end below the measurement alone on the shipped latent pipeline's ``box`` task
(docs/methods/inverse.md, "On images"): PSNR inside the 16x16 hole and on the observed pixels separately, the
measurement residual, and what each solver paints in the hole (the share of hole pixels that differ from the
background, and the colour of those pixels against the true object's).

Setup of ``inverse_images.py --parts shapes`` (8 canvas images, ``sigma_y = 0.05``, 31 levels, DR / CR / HR from the
encoder's latents of the zero-filled image), one chain per image. Probes: each solver at its defaults, DR without its
prior term (``lam = 0``), and ``--levels 100`` for the level count.

    OMP_NUM_THREADS=1 python benchmarks/inverse_box_probe.py                 # ~40 CPU s
    OMP_NUM_THREADS=1 python benchmarks/inverse_box_probe.py --levels 100    # ~90 CPU s

Writes ``benchmarks/results/inverse/box_probe[_<levels>].md``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.app.protocols import shapes_pipeline as sp
from steerdiff.pipelines import bind, through_decoder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_text  # noqa: E402

NOISE = 0.05
OBJECT = 0.3  # a pixel belongs to the object where some channel differs from the background by more than this
CONFIGS = {"dr": ("dr", {}), "cr": ("cr", {}), "hr": ("hr", {}), "dr lam=0 (no prior term)": ("dr", {"lam": 0.0}),
           "daps lr=0.01": ("daps", {"lr": 0.01}), "dps scale=3": ("dps", {"scale": 3.0})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", type=int, default=31)
    args = ap.parse_args()
    torch.manual_seed(0)
    pipe = sp.load_shipped()
    den, _ = bind(pipe, pipe.encode([""]))
    sigmas = pipe.default_sigmas(args.levels)[:-1]
    x = sp.data_images(sp.train_pairs(), 1, seed=0)
    pixel = sd.inverse.Inpaint.center((3, 32, 32), hole=16)
    op = through_decoder(pipe, pixel)
    y = sd.inverse.measure(pixel, x, NOISE, generator=1)
    init = op.init(y)
    hole = torch.zeros(1, 1, 32, 32, dtype=torch.bool)
    hole[..., 8:24, 8:24] = True
    bg = x[:, :, :2, :2].mean((2, 3), keepdim=True)  # the canvas background, per image

    def object_mask(im):
        return ((im - bg).abs().amax(1, keepdim=True) > OBJECT) & hole

    def colour(im):  # mean RGB of the object pixels in the hole [B, 3] (NaN where there are none)
        m = object_mask(im)
        return (im * m).sum((2, 3)) / m.sum((2, 3))

    def row(name: str, im: torch.Tensor, cpu: float) -> list:
        im = im.clamp(-1, 1)
        err = (im - x) ** 2
        h, o = hole.expand_as(err), ~hole.expand_as(err)
        db = [float(10 * torch.log10(4 / e)) for e in (err.mean(), err[h].mean(), err[o].mean())]
        res = float((pixel.forward(im) - y).pow(2).mean().sqrt())
        share = float(object_mask(im).float().sum() / (hole.sum() * im.shape[0]))
        ce = (colour(im) - colour(x)).norm(dim=1).nanmedian()
        return [name, *(f"{v:.2f}" for v in db), f"{res:.3f}", f"{share:.3f}", f"{float(ce):.3f}", f"{cpu:.1f}"]

    rows = []
    with torch.no_grad():
        rows.append(row("VAE reconstruction", pipe.decode(pipe.encode_images(x)), 0.0))
        rows.append(row("baseline (decoded init)", pipe.decode(init), 0.0))
    cond = torch.zeros(x.shape[0], dtype=torch.long)
    for name, (method, opts) in CONFIGS.items():
        kw = {"noise_std": NOISE, "chains": 1, "cond": cond, "generator": 0}
        kw |= ({"sigmas": sigmas[::5], "ode_steps": 5, "langevin_steps": 10} if method == "daps" else
               {"sigmas": sigmas})
        if method in ("dr", "cr", "hr"):
            kw["init"] = init
        t = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DR/CR/HR's lag warning
            res = sd.inverse.solve(den, op, y, method, **kw, **opts)
        with torch.no_grad():
            rows.append(row(name, pipe.decode(res.samples[:, 0].float()), time.process_time() - t))
        print(rows[-1], flush=True)
    meta = provenance()
    table = markdown_table(["run", "PSNR", "PSNR hole", "PSNR observed", "residual rms", "object share in hole",
                            "object colour error", "CPU s"], rows, "lrrrrrrr")
    truth = float(object_mask(x).float().sum() / (hole.sum() * x.shape[0]))
    text = (f"# The shapes pipeline's `box` task: where DR / CR / HR lose\n\n{provenance_line(meta)}\n\n"
            f"8 canvas images, one chain each, {args.levels} levels (DAPS {len(sigmas[::5])} x 5 ODE steps, 10 "
            f"Langevin steps per level), sigma_y = {NOISE}. `residual rms`: rms of `A(image) - y` (sigma_y is the "
            "floor). "
            f"`object share in hole`: the share of hole pixels some channel of which differs from the background by "
            f"more than {OBJECT} (the clean images: {truth:.3f}); `object colour error`: the median over images of the "
            "RGB distance between the mean colour of those pixels and the clean object's ([-1, 1] units; NaN where "
            f"none is painted).\n\n{table}\n")
    suffix = "" if args.levels == 31 else f"_{args.levels}"
    write_text(results_dir("inverse") / f"box_probe{suffix}.md", text)


if __name__ == "__main__":
    main()
