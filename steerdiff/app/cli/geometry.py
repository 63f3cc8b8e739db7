"""``steerdiff geometry``: local descriptors (scaling psi, rank nu, complexity delta) of a model's samples ("What
Secrets Do Your Manifolds Hold?", Humayun et al., ICLR 2025; docs/methods/geometry.md
"Which map" and "Definitions").

    steerdiff geometry --model digits_geometry --n 32 --out out/
    steerdiff geometry --model digits_geometry_mem --n 64 --latent-scale 2.5 --out out_ood/
    steerdiff geometry --model digits_geometry --map denoiser --sigma 0.5 --n 16 --out out_d/
    steerdiff geometry --model digits --class 3 --n 8 --sketch-dim 32 --out out_sketch/

Latent ``i`` is ``latent_scale * randn(seed + i)``. The map is the deterministic sampler ``z -> x0`` (``--map
generator``, default: DDIM eta 0 on ``karras(--steps, --sigma-min, --sigma-max, --rho)``, ``x_T = sigma_max z``) or
the denoiser at one noise level (``--map denoiser --sigma S``), evaluated at ``S z`` or, with ``--at-samples``, at
``x0 + S z`` where ``x0`` is the sampler's sample of ``z``.
Exact float64 Jacobians unless ``--sketch-dim m``. Writes ``metrics.json`` (the map, dims, thresholds, summary
statistics and one row per sample), ``descriptors.safetensors`` (``psi``, ``nu``, ``nu_rel``, ``nu_abs``,
``effective_rank``, ``delta``, ``singular_values``, ``samples``, ``latents``) and ``geometry.png`` (the samples
ordered by psi, labelled with psi and delta, beside the histogram of psi).
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import torch

from ... import core
from ...io import save_tensors
from ._common import (
    POSITIVE,
    SEED,
    check_class,
    check_out,
    check_sigma_in_range,
    check_sigmas,
    device_option,
    dtype_refused,
    load_denoiser,
    prepare_out,
    progress_option,
    refuse_given,
    start_outputs,
    write_metrics,
)

METHODS = [name for name, spec in core.SAMPLERS.items() if not spec.required and not spec.stochastic(0.0)]


def _latents(model, n: int, seed: int, scale: float) -> torch.Tensor:
    shape = tuple(model.sample_shape) if hasattr(model, "sample_shape") else (model.dim,)
    return scale * core.randn((n, *shape), seeds=seed, dtype=torch.float64)


def _plot(path: Path, samples: torch.Tensor, psi: torch.Tensor, delta: torch.Tensor | None, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        click.echo(f"warning: {err}; skipped {path.name}", err=True)
        return False
    order = torch.argsort(psi)
    show = order[torch.linspace(0, len(order) - 1, min(len(order), 16)).round().long()]
    images = samples.ndim == 4 and samples.shape[1] in (1, 3)
    fig = plt.figure(figsize=(12, 3.4))
    grid = fig.add_gridspec(2, 10)
    for j, i in enumerate(show.tolist()):
        ax = fig.add_subplot(grid[j // 8, j % 8])
        if images:
            img = samples[i].clamp(-1, 1).permute(1, 2, 0).squeeze(-1).numpy()
            ax.imshow((img + 1) / 2, cmap="gray" if samples.shape[1] == 1 else None, vmin=0, vmax=1)
        else:
            ax.plot(samples[i].flatten().numpy())
        label = f"psi {float(psi[i]):.0f}" + ("" if delta is None else f"\ndelta {int(delta[i])}")
        ax.set_title(label, fontsize=7)
        ax.axis("off")
    ax = fig.add_subplot(grid[:, 8:])
    ax.hist(psi.numpy(), bins=min(30, max(5, len(psi) // 3)))
    ax.set(xlabel="psi", title="local scaling")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


@click.command("geometry")
@click.option("--model", "model_name", default="digits_geometry", show_default=True,
              help="A shipped denoiser (digits_geometry, digits_geometry_mem, digits, ...), a model directory or a "
                   "built-in mixture.")
@click.option("--n", type=click.IntRange(min=1), default=32, show_default=True, help="Number of latents.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Latent i uses seed + i.")
@click.option("--latent-scale", type=POSITIVE, default=1.0, show_default=True,
              help="Multiply the latents (2.5: out of distribution, the OOD claim of docs/methods/geometry.md, "
                   "'Validation').")
@click.option("--map", "map_kind", type=click.Choice(["generator", "denoiser"]), default="generator",
              show_default=True, help="z -> x0 through the sampler, or x -> D(x, sigma).")
@click.option("--sigma", type=POSITIVE, default=None, help="Noise level of --map denoiser.")
@click.option("--at-samples/--at-noise", default=False, show_default=True,
              help="--map denoiser: evaluate at x0 + sigma z (x0 = the sampler's sample of z) instead of sigma z.")
@click.option("--class", "class_", type=click.IntRange(min=0), default=None, help="Fixed class label.")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="Sampler steps.")
@click.option("--method", type=click.Choice(METHODS), default="ddim", show_default=True,
              help="Deterministic sampler of the generator map.")
@click.option("--sigma-min", type=POSITIVE, default=0.002, show_default=True)
@click.option("--sigma-max", type=POSITIVE, default=40.0, show_default=True)
@click.option("--rho", type=POSITIVE, default=7.0, show_default=True, help="Karras schedule exponent.")
@click.option("--radius", type=POSITIVE, default=0.05, show_default=True, help="delta's neighbourhood radius r.")
@click.option("--vertices", type=click.IntRange(min=2), default=None,
              help="delta's vertices (even; default 2k, at most 128).")
@click.option("--no-delta", is_flag=True, help="Skip delta (Jacobian descriptors only).")
@click.option("--rank-tol", type=POSITIVE, default=None,
              help="Relative rank tolerance (tau = rank_tol * s_1); default s_1 * max(D, k) * eps.")
@click.option("--sketch-dim", type=click.IntRange(min=1), default=None,
              help="Sketch J V with m random orthonormal directions instead of the exact Jacobian.")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True, help="Latents per chunk.")
@progress_option
@device_option
# Refused, not honoured: the descriptors are numerical ranks and log-volumes of Jacobians, computed with the network
# copied to float64 (steerdiff.geometry.local_descriptors); a half-precision network's Jacobian is rounded at 2^-8
# (bfloat16) or 2^-11 (float16) of its largest singular value, which the rank rule would count as rank.
@dtype_refused("geometry", "the descriptors are numerical ranks and log-volumes of Jacobians, computed in float64 "
                           "(a half-precision Jacobian's rounding, 2^-8 or 2^-11 of its largest singular value, "
                           "would count as rank)")
@click.option("--out", default="out", show_default=True, help="Output directory.")
@click.pass_context
def geometry_cmd(ctx, model_name, n, seed, latent_scale, map_kind, sigma, at_samples, class_, steps, method, sigma_min,
                 sigma_max, rho, radius, vertices, no_delta, rank_tol, sketch_dim, batch_size, progress, device,
                 out) -> None:
    """Local descriptors of a model's samples; write metrics.json, descriptors.safetensors and geometry.png."""
    from ...geometry import local_descriptors
    from ...geometry.maps import GeneratorMap

    check_sigmas(sigma_min, sigma_max)
    check_out(out)
    if map_kind == "denoiser" and sigma is None:
        raise click.BadParameter("--map denoiser needs --sigma (the fixed noise level)", param_hint="--sigma")
    if sigma is not None and map_kind != "denoiser":
        raise click.BadParameter("--sigma applies to --map denoiser only", param_hint="--sigma")
    if map_kind == "generator":
        refuse_given(ctx, ("at_samples",), "the generator map adds no noise level (--at-samples is --map denoiser's)")
    elif not at_samples:
        refuse_given(ctx, ("steps", "method", "sigma_min", "sigma_max", "rho"),
                     "--map denoiser --at-noise runs no sampler (give --at-samples to evaluate at its samples)")
    if no_delta:
        refuse_given(ctx, ("radius", "vertices"), "--no-delta skips delta")
    if vertices is not None and vertices % 2:
        raise click.BadParameter(f"must be even (z +- r u_j), got {vertices}", param_hint="--vertices")
    model, _ = load_denoiser(model_name, device=device)
    if hasattr(model, "eval"):
        model = model.eval()
    check_class(class_, getattr(model, "num_classes", ()), model_name)
    check_sigma_in_range(model, sigma_max, model_name, "--sigma-max")
    if sigma is not None:
        check_sigma_in_range(model, sigma, model_name, "--sigma")
    grid = core.sigmas.karras(steps, sigma_min, sigma_max, rho=rho)
    z = _latents(model, n, seed, latent_scale).to(device)
    k = z[0].numel()
    if sketch_dim is not None and sketch_dim > k:
        raise click.BadParameter(f"must be <= the latent dimension {k}", param_hint="--sketch-dim")
    if vertices is not None and vertices > 2 * k:
        raise click.BadParameter(f"must be <= 2k = {2 * k}", param_hint="--vertices")
    options = {"rank_tol": rank_tol, "delta_radius": None if no_delta else radius, "n_vertices": vertices,
               "sketch_dim": sketch_dim, "cond": class_, "batch_size": batch_size, "seed": seed,
               "progress": progress}
    start = time.perf_counter()
    if map_kind == "generator":
        d = local_descriptors(model, z, "generator", sigmas=grid, method=method, **options)
        samples = d.outputs
    else:
        x = z * sigma
        if at_samples:
            with torch.no_grad():
                x0 = GeneratorMap(model, sigmas=grid, method=method, cond=class_).to(torch.float64)(z)
            x = x0.detach() + x
        d = local_descriptors(model, x, "denoiser", sigma=sigma, **options)
        samples = d.outputs
    seconds = time.perf_counter() - start
    out_dir = start_outputs(prepare_out(out))  # the summary comes last: a failure in between leaves none
    tensors = {"psi": d.psi, "nu": d.nu, "nu_rel": d.nu_rel, "nu_abs": d.nu_abs, "effective_rank": d.effective_rank,
               "singular_values": d.singular_values, "samples": samples.float(), "latents": z.float().cpu()}
    if d.delta is not None:
        tensors["delta"] = d.delta
    save_tensors({k_: v.detach().cpu().contiguous() for k_, v in tensors.items()}, out_dir / "descriptors.safetensors")
    info = dict(d.info)
    info.pop("sigmas", None)
    result = {"model": model_name, "n": n, "seed": seed, "latent_scale": latent_scale, "class": class_,
              "seconds": round(seconds, 3), **d.summary(), "sigmas": grid.tolist() if map_kind == "generator" else None,
              "rows": d.rows()}
    result.update({k_: v for k_, v in info.items() if k_ not in result})
    title = (f"{model_name}: {map_kind} map" + (f" ({method}, {steps} steps)" if map_kind == "generator" else
                                                  f" at sigma {sigma:g}") + f", latent scale {latent_scale:g}")
    _plot(out_dir / "geometry.png", samples.detach().cpu().float(), d.psi.cpu(),
          None if d.delta is None else d.delta.cpu(), title)
    write_metrics(out_dir, result)
    delta = "" if d.delta is None else f", delta {float(d.delta.double().mean()):.1f}"
    click.echo(f"geometry of {n} samples -> {out_dir}: psi {float(d.psi.mean()):.2f} +- "
               f"{float(d.psi.std()) if n > 1 else 0.0:.2f}, nu {float(d.nu.double().mean()):.1f}, nu_rel "
               f"{float(d.nu_rel.double().mean()):.1f}{delta} ({seconds:.1f} s)")
