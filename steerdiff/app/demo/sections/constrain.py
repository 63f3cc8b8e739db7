"""Demo section: constrained generation with NAMM (neural approximate mirror maps; Feng, Baptista, Bouman, ICLR 2025;
docs/methods/namm.md, test N1) vs the plain model, on the shipped unit-circle pair ``circle_namm`` (the full
comparison, with the digits recipes and inpainting in mirror space, is ``benchmarks/namm.py``).

Both models are the same EDM MLP trained with the same budget, one on the data and one in the NAMM's mirror space;
both sample the same noise with the same sampler (equal NFE). The NAMM samples are the mirror samples decoded by the
learned inverse map ``f``; the undecoded mirror samples are shown as a diagnostic.
"""

from __future__ import annotations

import time

import torch

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

ASSET = "circle_namm"
SIGMA_MAX = 10.0  # the recipe's sampler: Heun on karras(0.002, 10)
CONFIGS = {True: {"n": 500, "steps": 16}, False: {"n": 4000, "steps": 32}}


@section("constrain", "Constraints: NAMM vs the plain model's constraint violation", requires=("steerdiff.constrain",),
         order=70)
def run(ctx) -> SectionResult:
    """Sample the plain and the mirror model; constraint distance and distance to fresh data."""
    from ....constrain.distances import unit_circle_data, unit_circle_distance
    from ....constrain.io import load_namm
    from ....constrain.mirror import MirrorDenoiser
    from ....core import randn, sample, sigmas
    from ....io import CheckpointError
    from ....metrics.distributions import mmd_rbf, sliced_wasserstein
    from ....models.io import ASSETS_DIR, load

    cfg = CONFIGS[ctx.quick]
    n, steps = cfg["n"], cfg["steps"]
    try:
        namm, mirror = load_namm(ASSET)
        plain = load(ASSETS_DIR / ASSET / "plain")
    except (CheckpointError, FileNotFoundError) as err:
        raise SectionUnavailable(f"the shipped NAMM pair {ASSET!r} cannot be loaded ({err})") from err
    if mirror is None:
        raise SectionUnavailable(f"the shipped NAMM {ASSET!r} has no mirror-space model")
    md = MirrorDenoiser(mirror.eval(), namm)
    plain.eval()
    grid = sigmas.karras(steps, 0.002, SIGMA_MAX)
    noise = randn((n, 2), seeds=ctx.seed)
    ref = unit_circle_data(n, seed=10**6 + ctx.seed)  # fresh data, disjoint from the training seed 0
    bar = ctx.bar(2, "constrain")
    with torch.no_grad():
        start = time.perf_counter()
        x_plain, stats = sample(plain, noise, grid, method="heun", return_stats=True)
        plain_wall, plain_nfe = time.perf_counter() - start, stats.nfe
        bar.update(1)
        start = time.perf_counter()
        x_namm, stats, x_mirror = md.sample(noise, grid, method="heun", return_stats=True, return_mirror=True)
        namm_wall, namm_nfe = time.perf_counter() - start, stats.nfe
        bar.update(1)
    rows = [("plain model", "plain", x_plain, plain_nfe, plain_wall),
            ("NAMM (mirror model, decoded by f)", "NAMM", x_namm, namm_nfe, namm_wall),
            ("NAMM mirror samples, not decoded", "NAMM (raw mirror)", x_mirror, namm_nfe, namm_wall)]
    variants, dist = [], {}
    for i, (name, method, x, nfe, wall) in enumerate(rows):
        d = unit_circle_distance(x.float())
        dist[method] = d
        values = {"nfe": nfe, "wall_s": wall, "constraint_mean": float(d.mean()),
                  "constraint_median": float(d.median()), "sw2": sliced_wasserstein(x, ref, n_projections=256,
                                                                                    seed=ctx.seed),
                  "mmd": mmd_rbf(x, ref)}
        image = _scatter(ctx, x, ref, f"{i}_{method.split()[0].lower()}.png", name)
        variants.append(Variant(name, method, values, image, f"{name}, NFE {nfe:g}"))
    p, q = variants[0].values, variants[1].values
    findings = [f"Mean constraint distance | |x| - 1 |: plain {p['constraint_mean']:.4f}, NAMM "
                f"{q['constraint_mean']:.4f} ({p['constraint_mean'] / q['constraint_mean']:.1f} x lower with NAMM) "
                f"at the same NFE {q['nfe']:g}.",
                f"Sliced W2 to fresh data: plain {p['sw2']:.4f}, NAMM {q['sw2']:.4f}."]
    return SectionResult(
        "constrain", "",
        about=("A constraint that every sample must satisfy (here: points on the unit circle, distance "
               "l(x) = | |x| - 1 |) is hard for a diffusion model to meet exactly. NAMM learns a mirror map g and its "
               "approximate inverse f, trains the diffusion model on g(x), and decodes its samples with f, so the "
               "samples land on the constraint set."),
        legend=("constraint mean / median: l(x) = | |x| - 1 | over the samples (lower is better, 0 on the circle); "
                "SW2: sliced Wasserstein-2 distance to fresh data points (lower is better); MMD: squared RBF "
                "maximum mean discrepancy to the same points (lower is better; can dip below 0, it is unbiased). "
                "Both models use the same sampler and NFE."),
        columns=[Column("nfe", "NFE", "g"), Column("wall_s", "wall s", ".2f"),
                 Column("constraint_mean", "constraint mean", ".4f", "lower"),
                 Column("constraint_median", "constraint median", ".4f", "lower"),
                 Column("sw2", "SW2", ".4f", "lower"), Column("mmd", "MMD", ".2e", "lower")],
        variants=variants, findings=findings,
        figures=[Figure(_histogram(ctx, dist), "Distribution of the constraint distance | |x| - 1 | per variant "
                        "(log scale).")],
        config={"models": f"shipped {ASSET}: plain and mirror EDM MLPs, NAMM maps g (ICNN) and f",
                "samples": n, "sampler": f"Heun, {steps} steps, karras(0.002, {SIGMA_MAX:g})",
                "reference": f"{n} fresh data points", "seeds": f"{ctx.seed}..{ctx.seed + n - 1}"},
    )


def _scatter(ctx, x, ref, name: str, title: str) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(3.4, 3.4))
    ax.scatter(ref[:, 0], ref[:, 1], s=2, c="0.75", label="data", rasterized=True)
    ax.scatter(x[:, 0].float(), x[:, 1].float(), s=2, c="tab:blue", alpha=0.6, label="samples", rasterized=True)
    ax.set_aspect("equal")
    ax.set_xlim(-1.6, 1.6)
    ax.set_ylim(-1.6, 1.6)
    ax.set_title(title, fontsize=8)
    ax.legend(loc="lower left", fontsize=7, markerscale=3)
    fig.tight_layout()
    return ctx.plot(fig, name)


def _histogram(ctx, dist: dict) -> str:
    import numpy as np

    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    bins = np.logspace(-6, 0.5, 50)
    for label, d in dist.items():
        ax.hist(d.clamp_min(1e-6).numpy(), bins=bins, histtype="step", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("| |x| - 1 |")
    ax.set_ylabel("samples")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return ctx.plot(fig, "constraint_histogram.png")
