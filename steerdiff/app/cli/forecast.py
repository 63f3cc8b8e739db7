"""``steerdiff forecast``: ensemble forecasts of a Dynamical Diffusion model (Guo et al., ICLR 2025;
docs/methods/dydiff.md "API" and "The validation protocol").

    steerdiff forecast --model advection_dydiff --context ctx.npy --members 8 --out out/
    steerdiff forecast --model advection_baseline --context test:16 --out out/
    steerdiff forecast --model runs/advection_dydiff/final --context ctx.safetensors --method ddim --steps 50

``--context`` is a ``.npy`` or ``.safetensors`` tensor ``[n_context, *frame]`` or ``[B, n_context, *frame]`` (a
safetensors file holds one tensor, or one named ``context``), or ``test:K``: the first ``K`` sequences of the fixed
advection test set (``K`` in ``1..128``), whose true futures are then scored. Writes ``forecast.safetensors``
(``forecast``: ``[B, members, S_f, *frame]``; ``context``), ``forecast.png`` (fan charts of the first case: members'
bands along the field per lead time beside the oracle mean, or mean / spread images for a 2-D field) and
``metrics.json`` (NFE, wall time; with ``test:K`` the ensemble-mean MSE, fair CRPS, persistence and oracle MSE). Heun
(the default) is an extension beyond the paper's deterministic DDIM (``--method ddim``). A context outside the range
of the training data (:data:`steerdiff.data.advection.TRAINING_RANGE`), fewer steps than the sampler needs
(:data:`MIN_STEPS`) and ``--members 1`` with ``test:K`` (``crps: null``: the fair CRPS needs two members) are warned
about on stderr and listed in ``metrics.json``'s ``warnings``.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np
import torch

from ... import core
from ...data import advection
from ...io import CheckpointError, load_tensors, save_tensors
from ...metrics.forecast import crps_fair, ensemble_mse
from ...temporal.dydiff import forecast, load_forecaster
from ._common import (
    POSITIVE,
    SEED,
    check_out,
    check_sigma_in_range,
    check_sigmas,
    device_option,
    dtype_name,
    dtype_option,
    model_to_dtype,
    plot,
    prepare_out,
    progress_option,
    start_outputs,
    write_metrics,
)

METHODS = [name for name, spec in core.SAMPLERS.items() if not spec.required]

# The fewest steps at which a sampler's forecasts are as good as they get, per method: the ensemble-mean MSE on the
# first 64 test sequences (8 members) within 10% of its value at 24 steps, for both shipped forecasters (measured with
# steerdiff.temporal.forecast; the table in docs/bad_inputs_sweep.md, "forecast"). Below it the MSE rises fast:
# heun at 2 steps gives an MSE of 1.3e3 (the converged value is 0.77), at 4 steps 1.7.
MIN_STEPS = {"heun": 6, "ddim": 5, "euler": 5, "ddpm": 6, "dpmpp_2m": 4, "dpmpp_2m_sde": 10, "dpmpp_3m_sde": 14,
             "euler_ancestral": 6, "lms": 5, "unipc": 4}


def check_context_range(context: torch.Tensor, model) -> str | None:
    """A warning when ``--context`` leaves the range of the data the advection forecasters were trained on
    (:data:`steerdiff.data.advection.TRAINING_RANGE`); None inside it, or for a model of another frame shape (whose
    training range the checkpoint does not record)."""
    frame = tuple(model.sample_shape[1:])
    dims = len(frame)
    if dims not in (1, 2) or frame != advection.spec_for(dims).frame_shape:
        return None
    lo, hi = advection.TRAINING_RANGE[dims]
    cmin, cmax = float(context.min()), float(context.max())
    if lo <= cmin and cmax <= hi:
        return None
    return (f"--context: its values span [{cmin:.4g}, {cmax:.4g}], outside [{lo:g}, {hi:g}], the range of the "
            f"advection data the forecasters were trained on (steerdiff.data.advection.TRAINING_RANGE): the forecast "
            "extrapolates and is not to be trusted (rescale the context to the training data's units)")


def read_context(spec: str, model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(context [B, n_context, *frame], truth [B, S_f, *frame] or None)`` from ``--context``."""
    frame = tuple(model.sample_shape[1:])
    want = f"[{model.n_context}, {', '.join(map(str, frame))}] or [B, {model.n_context}, {', '.join(map(str, frame))}]"
    if spec.startswith("test:"):
        try:
            k = int(spec[5:])
        except ValueError:
            k = 0
        if not 1 <= k <= advection.TEST_SIZE:  # the test set holds TEST_SIZE sequences: more is not clamped
            raise click.BadParameter(f"{spec}: use test:K with K in 1..{advection.TEST_SIZE} (the advection test "
                                     f"set's {advection.TEST_SIZE} sequences)", param_hint="--context")
        dims = len(frame)
        if dims not in (1, 2) or frame != advection.spec_for(dims).frame_shape or model.frames != 10:
            raise click.BadParameter(f"test:K is the advection test set; this model's frames {frame} do not fit it",
                                     param_hint="--context")
        seqs = advection.test_set(dims, n=k)
        return seqs[:, : model.n_context], seqs[:, model.n_context :]
    path = Path(spec)
    if not path.is_file():
        raise click.BadParameter(f"{spec}: no such file (or use test:K)", param_hint="--context")
    if path.suffix.lower() == ".npy":
        try:
            arr = torch.as_tensor(np.load(path, allow_pickle=False))
        except (ValueError, OSError, EOFError, TypeError) as err:  # TypeError: strings; EOFError: an empty file
            raise click.BadParameter(f"{spec}: not a plain numeric .npy array ({err})", param_hint="--context") from err
    elif path.suffix.lower() == ".safetensors":
        try:
            tensors = load_tensors(path)
        except CheckpointError as err:
            raise click.BadParameter(str(err), param_hint="--context") from err
        if len(tensors) != 1 and "context" not in tensors:
            raise click.BadParameter(f"{spec}: expected one tensor or one named 'context', got {sorted(tensors)}",
                                     param_hint="--context")
        arr = tensors["context"] if "context" in tensors else next(iter(tensors.values()))
    else:
        raise click.BadParameter(f"{spec}: use a .npy or .safetensors file, or test:K", param_hint="--context")
    if not arr.is_floating_point() and arr.dtype not in (torch.int32, torch.int64):
        raise click.BadParameter(f"{spec}: not a numeric tensor", param_hint="--context")
    arr = arr.float()
    if arr.ndim == len(frame) + 1:
        arr = arr[None]
    if arr.ndim != len(frame) + 2 or tuple(arr.shape[1:]) != (model.n_context, *frame):
        raise click.BadParameter(f"{spec}: context must have shape {want}, got {list(arr.shape)}",
                                 param_hint="--context")
    if arr.shape[0] == 0:
        raise click.BadParameter(f"{spec}: holds no case (shape {list(arr.shape)}); give at least one context",
                                 param_hint="--context")
    if not torch.isfinite(arr).all():
        raise click.BadParameter(f"{spec}: holds non-finite values", param_hint="--context")
    return arr, None


@click.command("forecast")
@click.option("--model", "model_name", default="advection_dydiff", show_default=True,
              help="A shipped forecaster (advection_dydiff, advection_baseline) or a DyDiffDenoiser directory.")
@click.option("--context", "context_spec", required=True, metavar="FILE|test:K",
              help=".npy / .safetensors context [n_context, *frame] or [B, n_context, *frame], or test:K.")
@click.option("--members", type=click.IntRange(min=1), default=8, show_default=True, help="Ensemble members.")
@click.option("--steps", type=click.IntRange(min=1), default=12, show_default=True, help="Sampler steps.")
@click.option("--method", type=click.Choice(METHODS), default="heun", show_default=True,
              help="Sampler (ddim is the paper's; heun an extension).")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Member m of case b uses seed + b * members + m.")
@click.option("--sigma-min", type=POSITIVE, default=0.002, show_default=True)
@click.option("--sigma-max", type=POSITIVE, default=80.0, show_default=True)
@click.option("--rho", type=POSITIVE, default=7.0, show_default=True, help="Karras schedule exponent.")
@device_option
@dtype_option
@click.option("--out", default="out", show_default=True, help="Output directory.")
@progress_option
def forecast_cmd(model_name, context_spec, members, steps, method, seed, sigma_min, sigma_max, rho, device,
                 dtype, out, progress) -> None:
    """Forecast future frames; write forecast.safetensors, forecast.png and metrics.json to --out.

    ``--dtype``: the forecaster's network runs in it; the context, the sampler's state and the mixing with the
    context frames stay in float32 (as ``sample``'s state)."""
    check_sigmas(sigma_min, sigma_max)
    check_out(out)
    try:
        model = load_forecaster(model_name, device=device)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        raise click.BadParameter(f"{err} (shipped forecasters: advection_dydiff, advection_baseline)",
                                 param_hint="--model") from err
    model = model_to_dtype(model, dtype, "forecast", model_name)
    check_sigma_in_range(model, sigma_max, model_name, "--sigma-max")
    context, truth = read_context(context_spec, model)
    warned = []
    outside = check_context_range(context, model)
    if outside is not None:
        warned.append(outside)
    if steps < MIN_STEPS.get(method, 0):
        warned.append(f"--steps {steps}: below {MIN_STEPS[method]}, the fewest at which {method}'s forecasts "
                      "converge (the shipped forecasters' ensemble MSE is more than 10% above its 24-step value "
                      f"below it; heun at 2 steps: 1.3e3 for 0.77); use --steps {MIN_STEPS[method]} or more")
    if truth is not None and members < 2:
        warned.append("--members 1: no CRPS (the fair CRPS compares members with each other: it needs 2 or more); "
                      "metrics.json records crps as null")
    for line in warned:
        click.echo(f"warning: {line}", err=True)
    start = time.perf_counter()
    ens = forecast(model, context.to(device), members=members, steps=steps, method=method, seed=seed,
                   sigma_min=sigma_min, sigma_max=sigma_max, rho=rho, progress=progress).cpu()
    seconds = time.perf_counter() - start
    out_dir = start_outputs(prepare_out(out))  # the summary comes last: a failure in between leaves none
    save_tensors({"forecast": ens.contiguous(), "context": context.contiguous()}, out_dir / "forecast.safetensors")
    nfe = core.SAMPLERS.get(method).nfe(steps)
    result = {"model": model_name, "r": model.r, "n_context": model.n_context, "members": members, "steps": steps,
              "method": method, "cases": int(context.shape[0]), "nfe_per_member": nfe, "seconds": round(seconds, 3),
              "dtype": dtype_name(dtype)}
    frame = tuple(model.sample_shape[1:])
    oracle = None
    if len(frame) in (1, 2) and frame == advection.spec_for(len(frame)).frame_shape:
        spec = advection.spec_for(len(frame))
        oracle = advection.oracle_mean(context, ens.shape[2], spec)
        if truth is not None:
            result.update(mse=float(ensemble_mse(ens, truth)), persistence_mse=float(
                ((advection.persistence(context, ens.shape[2], spec) - truth) ** 2).mean()),
                oracle_mse=float(((oracle - truth) ** 2).mean()))
            # None, not absent, with one member: the fair CRPS needs two (the warning above says so)
            result["crps"] = float(crps_fair(ens, truth)) if members >= 2 else None
    png = out_dir / "forecast.png"
    title = f"{model_name} (r = {model.r:g}), case 0, {members} members"
    if len(frame) == 1:
        plot(lambda viz: viz.fan_chart(ens[0], png, None if truth is None else truth[0],
                                       None if oracle is None else oracle[0], title=title), png)
    elif len(frame) == 2:
        plot(lambda viz: viz.forecast_fields(ens[0], png, None if truth is None else truth[0], title=title), png)
    if warned:
        result["warnings"] = warned
    write_metrics(out_dir, result)
    shown = {k: result[k] for k in ("mse", "crps", "persistence_mse", "oracle_mse") if k in result}
    click.echo(f"forecast {list(ens.shape)} -> {out_dir}" + (f"  {shown}" if shown else ""))
