"""Demo section: inverse problems on 8x8 digits: DPS vs DR (RED-diff) vs CR vs HR on centre inpainting and 2x
super-resolution (docs/methods/inverse.md, "The digits protocol"; the full comparison with exact-posterior references is
``benchmarks/inverse.py``).

The prior is the shipped UNet with the null label; measurements ``y = A x + 0.05 noise`` of the first test images;
every solver visits the same noise levels (equal NFE); DPS additionally back-propagates through the network once
per level (VJP).
"""

from __future__ import annotations

import torch

from ..registry import section
from ..report import Column, Figure, SectionResult, Variant

TASKS = {"inpaint-center": "centre 4x4 inpainting", "sr2": "2x super-resolution"}
METHODS = {"dps": "DPS", "dr": "DR (RED-diff)", "cr": "CR", "hr": "HR"}
# DPS step sizes picked by benchmarks/inverse.py on 20 held-out test images (best PSNR over 0.3, 0.6, 1, 2); the
# published defaults (0.5 inpainting, 0.3 super-resolution) do worse on this model.
DPS_SCALE = {"inpaint-center": 0.6, "sr2": 2.0}
CONFIGS = {True: {"images": 2, "chains": 4, "levels": 12},
           False: {"images": 16, "chains": 8, "levels": 100}}
SHOW = 4  # images (rows) and chains (columns) shown per grid
SCALE = 5  # pixels per image pixel in the grids


@section("inverse", "Inverse problems: DPS vs DR vs CR vs HR on digits inpainting and super-resolution",
         requires=("steerdiff.inverse",), order=30)
def run(ctx) -> SectionResult:
    """Every solver on every task; PSNR / SSIM against the clean image, diversity across chains."""
    from ....inverse import solve
    from ...protocols import inverse as V

    cfg = CONFIGS[ctx.quick]
    n, chains, levels = cfg["images"], cfg["chains"], cfg["levels"]
    prior = V.digits_prior("unet")
    # The first torch.optim.Adam imports torch._dynamo (seconds): do it here, not inside the first timed solver.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    bar = ctx.bar(len(TASKS) * (len(METHODS) + 1), "inverse")
    variants, figures = [], []
    for task, task_label in TASKS.items():
        op, x, y = V.digits_problem(task, n, seed=ctx.seed)
        pinv = op.pinv(y)
        figures.append(Figure(ctx.grid(x[:SHOW], f"{task}_clean.png", nrow=1, scale=SCALE),
                              f"{task_label}: clean images", "reference", task))
        scores = V.image_scores(pinv[:, None], x)
        variants.append(Variant(f"measurement only, {task_label}", "pseudo-inverse",
                                _values(task, scores, 0, 0, None, None),
                                ctx.grid(pinv[:SHOW], f"{task}_pinv.png", nrow=1, scale=SCALE),
                                f"{task_label}: measurement only (pseudo-inverse)"))
        bar.update(1)
        for method, label in METHODS.items():
            # the protocol's settings, given explicitly (the API's default lr follows the prior's scale; 0.1 here)
            options = {"scale": DPS_SCALE[task]} if method == "dps" else dict(V.DIGITS_VARIATIONAL)
            res = solve(prior, op, y, method, noise_std=V.DIGITS_NOISE_STD, chains=chains, steps=levels,
                        generator=ctx.seed, **options)
            scores = V.image_scores(res.samples, x)
            shown = res.samples[:SHOW, :SHOW].flatten(0, 1)
            variants.append(Variant(f"{label}, {task_label}", label,
                                    _values(task, scores, res.nfe, res.nfe_vjp, res.wall_time, res.n_nonfinite),
                                    ctx.grid(shown, f"{task}_{method}.png", nrow=min(SHOW, chains), scale=SCALE),
                                    f"{task_label}: {label}, NFE {res.nfe:g} + {res.nfe_vjp:g} VJP"))
            bar.update(1)
    findings = []
    for task, task_label in TASKS.items():
        rows = {v.method: v.values for v in variants if v.values["task"] == task}
        solvers = {m: r for m, r in rows.items() if m != "pseudo-inverse"}
        best = max(solvers, key=lambda m: solvers[m]["psnr"])
        hr, dps = rows["HR"], rows["DPS"]
        findings.append(f"{task_label}: best PSNR {best} ({solvers[best]['psnr']:.2f} dB, measurement only "
                        f"{rows['pseudo-inverse']['psnr']:.2f} dB); HR took {hr['wall_s']:.2f} s, DPS "
                        f"{dps['wall_s']:.2f} s at the same NFE.")
    figures.insert(0, Figure(_plot(ctx, variants), "PSNR (left) and SSIM (right) per solver and task; the dashed "
                             "line is the measurement alone (pseudo-inverse)."))
    return SectionResult(
        "inverse", "",
        about=("Inverse problems recover an image from an incomplete, noisy measurement y = A x + noise using the "
               "diffusion model as the prior: here the centre 4x4 pixels of an 8x8 digit are hidden, or the digit is "
               "average-pooled to 4x4. DPS steers the sampler with the gradient of the measurement error through the "
               "network; DR (RED-diff), CR and HR instead optimise the image directly with the denoiser as a "
               "regulariser, needing no backpropagation through the network."),
        legend=("PSNR (dB) and SSIM against the clean image, averaged over images and chains (higher is better); "
                "diversity: mean per-pixel standard deviation across the chains of one measurement (posterior "
                "spread: higher is more varied, 0 for a deterministic answer). All solvers use the same NFE; VJP "
                "counts the extra backward passes (DPS only). In the grids, rows are images and columns are chains."),
        columns=[Column("task", "task", ""), Column("nfe", "NFE", ".0f"), Column("vjp", "VJP", ".0f"),
                 Column("wall_s", "wall s", ".2f"), Column("psnr", "PSNR", ".2f", "higher"),
                 Column("ssim", "SSIM", ".3f", "higher"), Column("diversity", "diversity", ".3f"),
                 Column("nonfinite", "diverged chains", "d")],
        variants=variants, findings=findings, figures=figures, group_by="task",
        config={"prior": "digits (shipped UNet, null label)", "images": n, "chains per image": chains,
                "noise levels": f"{levels} (vp_linear_levels)", "measurement noise std": V.DIGITS_NOISE_STD,
                "DR/CR/HR": "lam 0.25, v 1, lr 0.1, HR beta 0.2",
                "DPS scale": ", ".join(f"{t} {s:g}" for t, s in DPS_SCALE.items()),
                "seeds": f"chains from seed {ctx.seed}"},
    )


def _values(task: str, scores: dict, nfe, vjp, wall, nonfinite) -> dict:
    return {"task": task, "nfe": nfe, "vjp": vjp, "wall_s": wall, "psnr": scores["psnr"], "ssim": scores["ssim"],
            "diversity": scores["diversity"], "nonfinite": nonfinite}


def _plot(ctx, variants: list[Variant]) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    labels = list(METHODS.values())
    width = 0.8 / len(TASKS)
    for k, (task, task_label) in enumerate(TASKS.items()):
        rows = {v.method: v.values for v in variants if v.values["task"] == task}
        for ax, key in zip(axes, ("psnr", "ssim"), strict=True):
            pos = [i + (k - (len(TASKS) - 1) / 2) * width for i in range(len(labels))]
            bars = ax.bar(pos, [rows[m][key] for m in labels], width, label=task_label)
            ax.axhline(rows["pseudo-inverse"][key], color=bars.patches[0].get_facecolor(), ls="--", lw=1)
    for ax, key in zip(axes, ("psnr", "ssim"), strict=True):  # zoom on the differences
        low = min(v.values[key] for v in variants)
        high = max(v.values[key] for v in variants)
        ax.set_ylim(low - 0.15 * (high - low), high + 0.1 * (high - low))
    for ax, title in zip(axes, ("PSNR (dB, higher is better)", "SSIM (higher is better)"), strict=True):
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return ctx.plot(fig, "psnr_ssim.png")
