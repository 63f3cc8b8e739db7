"""Demo section: dichotomous segmentation by DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image
Segmentation via Probing Diffusion Capacity"; docs/methods/diffdis.md): the shipped ``diffdis`` segmenter on
procedural test images with thin structures, in one step and, as the ablation, in 10 steps of the same model.

The three-seed comparison with the multi-step diffusion segmenter and the from-scratch network is
``benchmarks/diffdis.py``.
"""

from __future__ import annotations

import time

import torch

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

CONFIGS = {True: {"images": 4}, False: {"images": 64}}
STEPS = {"DiffDIS, one step": 1, "Same model, 10 steps": 10}


@section("segment", "Segmentation: DiffDIS in one step, mask and edges together", requires=("steerdiff.segment",),
         order=90)
def run(ctx) -> SectionResult:
    """The shipped segmenter on procedural test images: image, mask and edge map per row; DIS5K scores."""
    from ....data import dis
    from ....metrics.segmentation import band_fmeasure_curve, dis_metrics, fmeasure_curve
    from ....viz import image_grid
    from ...recipes.diffdis import load_shipped

    cfg = CONFIGS[ctx.quick]
    try:
        seg = load_shipped()
    except (FileNotFoundError, OSError, ValueError) as err:
        raise SectionUnavailable(f"the shipped DiffDIS segmenter cannot be loaded ({err})") from err
    test = dis.generate(cfg["images"], 64, seed=ctx.seed, part="test")
    bar = ctx.bar(len(STEPS), "segment")
    variants, curves = [], {}
    for label, steps in STEPS.items():
        start = time.perf_counter()
        mask, edge = seg.segment(test.image, steps=steps, seed=ctx.seed * 10**6)
        wall = time.perf_counter() - start
        scores = dis_metrics(mask.double(), test.mask, with_hce=False)
        curves[label] = (fmeasure_curve(mask.double(), test.mask).mean(0), band_fmeasure_curve(mask.double(),
                                                                                                test.mask).mean(0))
        values = {"nfe": steps, "wall_s": wall, "maxF": scores["maxF"], "MAE": scores["MAE"],
                  "bandF": scores["bandF"], "S": scores["S"]}
        # Rows: image, predicted mask, predicted edges, true mask (each image's column).
        rows = [test.image, mask * 2 - 1, (edge if edge is not None else torch.zeros_like(mask)) * 2 - 1,
                test.mask * 2 - 1]
        grid = torch.cat([r.expand(-1, 3, -1, -1) for r in rows])
        full, rel = ctx.path(f"segment_{steps}step.png")
        image_grid(grid, full, nrow=cfg["images"] if ctx.quick else 8, scale=2)
        variants.append(Variant(label, "diffdis", values, rel,
                                f"{label}: rows are the images, the predicted masks, the predicted edge maps and the "
                                "true masks"))
        bar.update(1)
    one, many = variants[0].values, variants[1].values
    findings = [
        f"One step: max F {one['maxF']:.3f}, MAE {one['MAE']:.3f}, edge-band F {one['bandF']:.3f} on "
        f"{cfg['images']} test images; 10 steps of the same model: max F {many['maxF']:.3f}, MAE {many['MAE']:.3f} "
        f"at 10x the denoiser evaluations.",
    ]
    return SectionResult(
        "segment", "",
        about=("DiffDIS fine-tunes a latent diffusion prior into a segmenter: the image latent is concatenated to the "
               "noisy mask latent, one denoiser evaluation at a fixed noise level predicts the mask latent, and an "
               "edge map is predicted in the same batch (task embeddings, cross-task attention). Here the prior and "
               "the data are small and procedural (wires, lattices, holes and hair over same-colour clutter)."),
        legend=("max F: best F-measure (beta^2 = 0.3) over thresholds; MAE: mean absolute error of the probability "
                "map; edge-band F: max F counted within 2 px of the true boundary (thin structures); S: structure "
                "measure. Higher is better except MAE. NFE: denoiser evaluations per image."),
        columns=[Column("nfe", "NFE", "d"), Column("wall_s", "wall s", ".2f"),
                 Column("maxF", "max F", ".3f", "higher"), Column("MAE", "MAE", ".3f", "lower"),
                 Column("bandF", "edge-band F", ".3f", "higher"), Column("S", "S", ".3f", "higher")],
        variants=variants, findings=findings,
        figures=[Figure(_plot(ctx, curves), "F-measure (beta^2 = 0.3, mean over the images) against the threshold on "
                        "the probability map: whole image (left) and within 2 px of the true boundary (right).")],
        config={"model": "steerdiff/assets/diffdis", "test images": f"{cfg['images']} (procedural, 64x64, seed "
                f"{ctx.seed}, test part)", "noise seeds": f"from {ctx.seed * 10**6}"},
    )


def _plot(ctx, curves: dict) -> str:
    """F-measure against the threshold, whole image and edge band, one line per variant."""
    from ....viz import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for label, (whole, band) in curves.items():
        t = torch.linspace(0, 1, whole.numel())
        axes[0].plot(t.numpy(), whole.float().cpu().numpy(), label=label)
        axes[1].plot(t.numpy(), band.float().cpu().numpy(), label=label)
    for ax, title in zip(axes, ("F-measure", "edge-band F-measure"), strict=True):
        ax.set_xlabel("threshold")
        ax.set_title(title)
        ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return ctx.plot(fig, "segment_fcurve.png")
