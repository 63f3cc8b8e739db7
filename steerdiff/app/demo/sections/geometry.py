"""Demo section: local geometry descriptors of the shipped digits generators ("What Secrets Do Your Manifolds Hold?",
Humayun et al., ICLR 2025; docs/methods/geometry.md "Definitions" and "Validation"; the full claims are
``benchmarks/geometry.py``).

Rows: samples of ``digits_geometry`` from in-distribution latents ``z`` and from out-of-distribution latents
``2.5 z``, and samples of the memorising model ``digits_geometry_mem`` split into memorised (within 0.3 x the median
nearest-neighbour distance of a duplicated training image) and not memorised. Every row uses the same map: the
deterministic DDIM sampler ``z -> x0`` with exact float64 Jacobians (quick mode: fewer latents, steps and vertices).
"""

from __future__ import annotations

import time

import torch

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

CONFIGS = {
    True: {"n": 4, "n_mem": 6, "steps": 10, "vertices": 24},
    False: {"n": 32, "n_mem": 48, "steps": 20, "vertices": 128},
}
OOD_SCALE = 2.5


def _load(name: str):
    from ....models.io import load

    try:
        return load(name).eval()
    except (FileNotFoundError, OSError) as err:
        raise SectionUnavailable(f"the shipped model {name} is missing ({err}); run scripts/make_geometry_assets.py")\
            from None


@section("geometry", "Local geometry: scaling psi, rank nu and complexity delta of samples",
         requires=("steerdiff.geometry",), order=90)
def run(ctx) -> SectionResult:
    """Descriptors of in- vs out-of-distribution samples and of memorised vs other samples, with their images."""
    import json

    from ....core import randn, sigmas
    from ....geometry import local_descriptors
    from ....train.recipes import REPO_CONFIGS
    from ...protocols.geometry import memorised
    from ...recipes.geometry import duplicated_digits

    cfg = CONFIGS[ctx.quick]
    model, mem_model = _load("digits_geometry"), _load("digits_geometry_mem")
    grid = sigmas.karras(cfg["steps"], 0.002, 40.0)
    opts = {"sigmas": grid, "n_vertices": cfg["vertices"], "seed": ctx.seed, "batch_size": 16}
    bar = ctx.bar(3, "geometry")

    def measure(m, z):
        start = time.perf_counter()
        d = local_descriptors(m, z, **opts)
        return d, time.perf_counter() - start

    z = randn((cfg["n"], 1, 8, 8), seeds=ctx.seed, dtype=torch.float64)
    d_in, t_in = measure(model, z)
    bar.update(1)
    d_ood, t_ood = measure(model, OOD_SCALE * randn((cfg["n"], 1, 8, 8), seeds=ctx.seed + 10_000, dtype=torch.float64))
    bar.update(1)
    d_mem, t_mem = measure(mem_model, randn((cfg["n_mem"], 1, 8, 8), seeds=ctx.seed + 20_000, dtype=torch.float64))
    bar.update(1)
    recipe = json.loads((REPO_CONFIGS / "geometry_digits_mem.json").read_text()) \
        if (REPO_CONFIGS / "geometry_digits_mem.json").is_file() else {"data": {}}
    data = duplicated_digits(**{k: v for k, v in recipe["data"].items() if k != "name"})
    is_mem, _, threshold = memorised(d_mem.outputs, data.duplicated, data.unique)

    rows = [("in-distribution z", "digits_geometry", d_in, None, t_in),
            (f"out of distribution {OOD_SCALE:g} z", "digits_geometry", d_ood, None, t_ood),
            ("memorising model: memorised", "digits_geometry_mem", d_mem, is_mem, t_mem),
            ("memorising model: not memorised", "digits_geometry_mem", d_mem, ~is_mem, t_mem)]
    variants = []
    for i, (name, method, d, mask, wall) in enumerate(rows):
        keep = torch.ones(d.psi.shape[0], dtype=torch.bool) if mask is None else mask
        count = int(keep.sum())

        def mean(t, keep=keep, count=count):
            return float(t[keep].double().mean()) if count else None

        values = {"nfe": cfg["steps"], "wall_s": wall, "samples": count, "psi": mean(d.psi), "nu": mean(d.nu),
                  "nu_rel": mean(d.nu_rel), "nu_abs": mean(d.nu_abs), "delta": mean(d.delta),
                  "s1": mean(d.singular_values[:, 0])}
        image = ctx.grid(d.outputs[keep][:16].float().clamp(-1, 1), f"row{i}.png", nrow=8) if count else None
        variants.append(Variant(name, method, values, image,
                                f"{name}: {count} samples" + (f", mean psi {values['psi']:.1f}" if count else "")))
    v_in, v_ood, v_mem, v_not = (v.values for v in variants)
    findings = [f"Out-of-distribution latents ({OOD_SCALE:g} z) have mean psi {v_ood['psi']:.1f} vs "
                f"{v_in['psi']:.1f} and mean delta {v_ood['delta']:.1f} vs {v_in['delta']:.1f} in distribution.",
                f"{v_mem['samples']} of {d_mem.psi.shape[0]} samples of the memorising model lie within "
                f"{threshold:.2f} (L2) of a duplicated training image."]
    if v_mem["samples"] and v_not["samples"]:
        findings.append(f"Memorised samples: mean psi {v_mem['psi']:.1f} vs {v_not['psi']:.1f} (lower: the map "
                        f"contracts onto the memorised image), nu_rel {v_mem['nu_rel']:.1f} vs {v_not['nu_rel']:.1f}, "
                        f"top singular value {v_mem['s1']:.2f} vs {v_not['s1']:.2f}.")
    return SectionResult(
        "geometry", "",
        about=("A deterministic sampler built from a ReLU denoiser is a continuous piecewise-linear map from latent "
               "noise to images. Its Jacobian at a latent gives the local scaling psi (log volume change) and rank "
               "nu; delta counts the ReLU units whose sign changes in a small neighbourhood of the latent (how "
               "many region boundaries lie nearby)."),
        legend=("psi: sum of the log singular values of dG/dz over the counted ones (higher: the map expands there); "
                "nu: rank at the matrix_rank tolerance, nu_rel: singular values above 1e-2 s1, nu_abs: above 1e-2 "
                "(never compare nu across conventions); delta: units whose pre-activation sign changes over the "
                "vertices z +- r u (r = 0.05); s1: top singular value. NFE: denoiser calls of the map per sample; "
                "the Jacobians add backward passes, not denoiser calls."),
        columns=[Column("samples", "samples", "d"), Column("nfe", "NFE", "g"), Column("wall_s", "wall s", ".2f"),
                 Column("psi", "psi", ".1f"), Column("nu", "nu", ".1f"), Column("nu_rel", "nu_rel", ".1f"),
                 Column("nu_abs", "nu_abs", ".1f"), Column("delta", "delta", ".1f"), Column("s1", "s1", ".2f")],
        variants=variants, findings=findings,
        figures=[Figure(_plot(ctx, d_in, d_ood, d_mem, is_mem), "psi against delta per sample: in-distribution, "
                        "out-of-distribution and the memorising model's memorised samples.")],
        config={"models": "digits_geometry, digits_geometry_mem (3 x 256 ReLU MLPs, configs/geometry_digits*.json)",
                "map": f"DDIM eta 0, {cfg['steps']} steps, karras(0.002, 40, rho 7), x_T = 40 z",
                "latents": f"{cfg['n']} per distribution row, {cfg['n_mem']} for the memorising model",
                "delta": f"r = 0.05, {cfg['vertices']} vertices + z", "jacobian": "exact, float64",
                "seeds": f"{ctx.seed}.., {ctx.seed + 10_000}.. (x {OOD_SCALE:g}), {ctx.seed + 20_000}.."},
    )


def _plot(ctx, d_in, d_ood, d_mem, is_mem) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.scatter(d_in.psi, d_in.delta, s=12, label="z")
    ax.scatter(d_ood.psi, d_ood.delta, s=12, label=f"{OOD_SCALE:g} z")
    ax.scatter(d_mem.psi[is_mem], d_mem.delta[is_mem], s=12, marker="x", label="memorised (mem. model)")
    ax.scatter(d_mem.psi[~is_mem], d_mem.delta[~is_mem], s=12, marker="+", label="not memorised (mem. model)")
    ax.set_xlabel("psi (local scaling)")
    ax.set_ylabel("delta (local complexity)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return ctx.plot(fig, "psi_delta.png")
