"""Demo section: 4-bit compression of the shipped digits UNet: SVDQuant vs naive W4A4 (RTN) and SmoothQuant, beside
the fp32 model (SVDQuant, Li et al., ICLR 2025; docs/methods/svdquant.md; the full comparison with ablations,
W4A16/W8A8 kernels and NVFP4 is ``benchmarks/svdquant.py``).

Every variant samples the same noise and labels with the same sampler (DDIM, equal NFE); the image error is
measured against the fp32 model's own samples, the quality against real digits, and the size is the bytes of the
saved safetensors file. W4A4 is simulated on CPU (no CPU kernel multiplies 4-bit by 4-bit), so its wall time says
nothing about a GPU kernel's speed.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import torch

from ..registry import section
from ..report import Column, Figure, SectionResult, Variant

RANK = 8  # low-rank branch of SVDQuant (the benchmark's digits setting; the UNet's layers are 32-128 wide)
# calibration: denoiser calls drawn from the fp32 model's own CFG sampling runs (docs/methods/svdquant.md,
# "Calibration data")
CONFIGS = {
    True: {"n": 8, "steps": 6, "calib_samples": 8, "calib_trajectories": 2, "calib_steps": 6,
           "num_grids": 2, "num_iters": 2},
    False: {"n": 200, "steps": 20, "calib_samples": 128, "calib_trajectories": 32, "calib_steps": 20,
            "num_grids": 10, "num_iters": 20},
}


def variants_of(cfg: dict) -> list[tuple[str, str, dict]]:
    """``(label, method, options)`` of the quantized variants."""
    search = {"num_grids": cfg["num_grids"]}
    return [("naive W4A4 (RTN)", "rtn", {}),
            ("SmoothQuant W4A4 (alpha 0.5)", "smoothquant", {"alpha": 0.5}),
            ("SmoothQuant W4A4 (alpha searched)", "smoothquant", {"alpha": None, **search}),
            (f"SVDQuant W4A4 (rank {RANK})", "svdquant", {"rank": RANK, "num_iters": cfg["num_iters"], **search})]


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.suffix == ".safetensors")


@section("quant", "Compression: SVDQuant vs RTN and SmoothQuant (W4A4)", requires=("steerdiff.quant",), order=60)
def run(ctx) -> SectionResult:
    """Quantize, sample, and compare images, quality and bytes with the fp32 model."""
    from .... import quant as sq
    from ....core import randn, sample, sigmas
    from ....data.digits import load_digits
    from ....metrics.images import classifier_features
    from ....models.io import load, save

    cfg = CONFIGS[ctx.quick]
    n, steps = cfg["n"], cfg["steps"]
    model = load("digits").eval().requires_grad_(False)
    clf = load("digits_classifier").eval()
    real_f = classifier_features(clf, load_digits("test")[0])
    noise = randn((n, *model.sample_shape), seeds=ctx.seed)
    labels = torch.arange(n) % 10
    grid = sigmas.karras(steps, 0.002, 80.0)
    plan = variants_of(cfg)
    bar = ctx.bar(len(plan) + 2, "quant")
    t = time.perf_counter()
    calib = sq.trajectory_calibration(model, num_samples=cfg["calib_samples"], n_trajectories=cfg["calib_trajectories"],
                                      steps=cfg["calib_steps"], seed=ctx.seed)
    calib_s = time.perf_counter() - t
    bar.update(1)

    def images(m):
        with torch.no_grad():
            start = time.perf_counter()
            out, stats = sample(m, noise, grid, method="ddim", cond=labels, return_stats=True)
        return out.clamp(-1, 1), stats.nfe, time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        ref, nfe, wall = images(model)
        fp32_bytes = _bytes(save(model, Path(tmp) / "fp32"))
        variants = [_variant(ctx, "fp32", "fp32 (reference)", "fp32", ref, ref, nfe, wall, None, fp32_bytes,
                             fp32_bytes, clf, real_f, labels)]
        bar.update(1)
        for i, (label, method, options) in enumerate(plan):
            start = time.perf_counter()
            q = sq.quantize(model, method, calib=calib, **options)
            quant_s = time.perf_counter() - start
            out, nfe, wall = images(q)
            size = _bytes(sq.save(q, Path(tmp) / f"q{i}"))
            variants.append(_variant(ctx, f"{i}_{method}", label, method, out, ref, nfe, wall, quant_s, size,
                                     fp32_bytes, clf, real_f, labels))
            bar.update(1)
    quantized = variants[1:]
    best = max(quantized, key=lambda v: v.values["psnr"])
    ratio = {v.name: v.values["mb"] / variants[0].values["mb"] for v in quantized}
    findings = [f"Closest to the fp32 images: {best.name} (PSNR {best.values['psnr']:.2f} dB); "
                + ", ".join(f"{v.name} {v.values['psnr']:.2f} dB" for v in quantized) + ".",
                "Saved size relative to fp32: " + ", ".join(f"{k} {r:.2f}" for k, r in ratio.items())
                + f" (fp32 {variants[0].values['mb']:.3f} MB).",
                f"Calibration, shared by the W4A4 methods and not in their quantize times, took {calib_s:.2f} s."]
    return SectionResult(
        "quant", "",
        about=("Post-training 4-bit quantization stores weights and runs activations in 4 bits (W4A4); outliers make "
               "naive rounding (RTN) lose most of the signal, and SmoothQuant moves activation outliers into the "
               "weights. SVDQuant additionally absorbs the outliers into a small 16-bit low-rank branch and quantizes "
               "only the residual."),
        legend=("PSNR (dB) between each variant's images and the fp32 model's images from the same noise (higher is "
                "closer); FID-digits against the real test digits (lower is better); accuracy: share classified as "
                "the requested digit (higher is better); MB: bytes of the saved safetensors file (smaller is "
                "better). All variants use the same sampler and NFE; W4A4 is simulated on CPU, so its wall time is "
                "not a speed claim."),
        columns=[Column("nfe", "NFE", "g"), Column("wall_s", "wall s", ".2f"), Column("quant_s", "quantize s", ".1f"),
                 Column("mb", "MB", ".3f", "lower"), Column("psnr", "PSNR vs fp32", ".2f", "higher"),
                 Column("fid", "FID-digits", ".3f", "lower"), Column("accuracy", "accuracy", ".3f", "higher")],
        variants=variants, findings=findings,
        figures=[Figure(_plot(ctx, variants), "PSNR against the fp32 images versus saved size; fp32 is the "
                        "reference at infinite PSNR (not drawn).")],
        config={"model": "digits (shipped UNet)", "samples": n, "sampler": f"DDIM, {steps} steps",
                "seeds": f"{ctx.seed}..{ctx.seed + n - 1}", "calibration": f"{cfg['calib_samples']} denoiser calls "
                f"from {cfg['calib_trajectories']} CFG(2) Heun-{cfg['calib_steps']} runs",
                "smoothing grid": f"{2 * cfg['num_grids'] - 1} candidates", "SVDQuant rank": RANK,
                "refinement iterations": cfg["num_iters"]},
    )


def _variant(ctx, stem, label, method, out, ref, nfe, wall, quant_s, size, fp32_size, clf, real_f, labels) -> Variant:
    from ....metrics.images import class_accuracy, classifier_features, frechet_distance

    mse = float(((out - ref) / 2).pow(2).mean())  # images in [0, 1]
    psnr = 10 * math.log10(1 / mse) if mse > 0 else None  # None: identical (the reference itself)
    values = {"nfe": nfe, "wall_s": wall, "quant_s": quant_s, "mb": size / 1e6, "psnr": psnr,
              "fid": frechet_distance(real_f, classifier_features(clf, out)),
              "accuracy": class_accuracy(clf, out, labels)}
    image = ctx.grid(out[:20], f"{stem}.png", nrow=10)
    return Variant(label, method if method != "fp32" else "none (fp32)", values, image,
                   f"{label}, NFE {nfe:g}, {size / fp32_size:.2f} x fp32 bytes")


def _plot(ctx, variants: list[Variant]) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for v in variants[1:]:
        ax.plot(v.values["mb"], v.values["psnr"], "o")
        ax.annotate(v.name, (v.values["mb"], v.values["psnr"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.margins(x=0.3, y=0.15)  # room for the labels
    ax.set_xlabel("saved size (MB)")
    ax.set_ylabel("PSNR vs fp32 images (dB)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return ctx.plot(fig, "psnr_vs_size.png")
