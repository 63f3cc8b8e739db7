"""The ``steerdiff`` command line (click): sample, and later train, bench and demo."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import click
import torch

from . import core, metrics
from .models.gmm import BUILTIN_MIXTURES, builtin_mixture


def write_json_atomic(obj: dict, path: Path) -> None:
    """Write JSON to a temporary file beside ``path`` and move it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _prepare_out(out: str) -> Path:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK):
        raise click.BadParameter(f"{out} is not writable", param_hint="--out")
    return path


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="steerdiff")
def main() -> None:
    """Steer diffusion models at sampling time."""


@main.command("sample")
@click.option("--model", "model_name", default="gmm2d", show_default=True,
              help=f"Model to sample: a built-in mixture ({', '.join(sorted(BUILTIN_MIXTURES))}).")
@click.option("--method", type=click.Choice(sorted(core.SAMPLERS)), default="heun", show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=50, show_default=True, help="Sampling steps.")
@click.option("--n", "n", type=click.IntRange(min=2), default=2000, show_default=True, help="Number of samples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sample i uses seed + i.")
@click.option("--sigma-min", type=float, default=0.002, show_default=True)
@click.option("--sigma-max", type=float, default=80.0, show_default=True)
@click.option("--rho", type=float, default=7.0, show_default=True, help="Karras schedule exponent.")
@click.option("--eta", type=click.FloatRange(0, 1), default=None, help="DDIM stochasticity (ddim only).")
@click.option("--out", default="out", show_default=True, help="Output directory.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def sample_cmd(model_name, method, steps, n, seed, sigma_min, sigma_max, rho, eta, out, progress) -> None:
    """Draw samples and write a plot (samples.png) and metrics (metrics.json) to --out."""
    if model_name not in BUILTIN_MIXTURES:
        raise click.BadParameter(
            f"unknown model {model_name!r}; available: {', '.join(sorted(BUILTIN_MIXTURES))}", param_hint="--model"
        )
    if eta is not None and method != "ddim":
        raise click.BadParameter("--eta applies to --method ddim only", param_hint="--eta")
    out_dir = _prepare_out(out)
    mixture = builtin_mixture(model_name)
    sigmas = core.sigmas.karras(steps, sigma_min, sigma_max, rho)
    noise = core.randn((n, mixture.dim), seeds=seed, dtype=torch.float64)
    samples, stats = core.sample(
        mixture, noise, sigmas, method=method, generator=seed + 10**9, eta=eta, progress=progress,
        return_stats=True,
    )
    # Reference: exact samples from a seed disjoint from the sampler's.
    g = torch.Generator().manual_seed(seed + 2 * 10**9)
    exact, exact2 = mixture.sample(n, generator=g), mixture.sample(n, generator=g)
    result = {
        "model": model_name,
        "method": method,
        "steps": steps,
        "n": n,
        "seed": seed,
        "schedule": {"kind": "karras", "sigma_min": sigma_min, "sigma_max": sigma_max, "rho": rho},
        "nfe": stats.nfe,
        "wall_time_s": stats.wall_time,
        "sliced_w2_to_exact": metrics.sliced_wasserstein(samples, exact),
        "sliced_w2_exact_vs_exact": metrics.sliced_wasserstein(exact2, exact),
        "mmd_rbf_to_exact": metrics.mmd_rbf(samples, exact),
        "mode_weight_error": metrics.mode_weight_error(samples, mixture),
        "mode_weight_error_exact": metrics.mode_weight_error(exact, mixture),
    }
    write_json_atomic(result, out_dir / "metrics.json")
    try:
        from .viz import scatter

        title = f"{model_name}: {method}, {steps} steps, NFE {stats.nfe:g}, SW2 {result['sliced_w2_to_exact']:.3f}"
        scatter(samples, out_dir / "samples.png", reference=exact, title=title)
    except ImportError as err:
        click.echo(f"warning: {err}; skipped samples.png", err=True)
    for key in ("nfe", "wall_time_s", "sliced_w2_to_exact", "sliced_w2_exact_vs_exact", "mode_weight_error"):
        click.echo(f"{key:>26}: {result[key]:.4g}")
    click.echo(f"wrote {out_dir / 'metrics.json'}")


if __name__ == "__main__":  # pragma: no cover
    main()
