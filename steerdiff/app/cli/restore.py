"""``steerdiff restore``: solve an image inverse problem (posterior samples of x given y = A(x) + noise).

Solvers: DPS ("Diffusion Posterior Sampling for General Noisy Inverse Problems", Chung et al. 2023), DR (RED-diff,
Mardani et al. 2024), and CR and HR ("Hybrid Regularization Improves Diffusion-based Inverse Problem Solving", Dou et
al. 2025).

    steerdiff restore --model digits --task inpaint-center --method hr --input digits:test:0 --out out/
    steerdiff restore --model digits-gmm --task sr2 --method dps --input eight.png --out out/
    steerdiff restore --task sr2 --input low_res_4x4.npy --degraded --out out/

``--input`` is an 8x8 greyscale PNG (0..255), a ``.npy`` or ``.safetensors`` tensor in [-1, 1], or
``digits:<split>:<N>`` (image N of the digits split, so the command runs without a file). By default it is the clean
image and the measurement ``y = A(x) + noise_std * n`` is simulated (seeded); with ``--degraded`` it is the
measurement itself, in image form (the low-resolution image for ``sr2``; the image with its hole for inpainting).

``--task`` and ``--method`` offer the inverse-task and solver registries (``steerdiff.inverse.TASKS``,
``steerdiff.inverse.SOLVERS``), read when the command runs, so a plugin's ``register_task`` or ``register_solver``
entry is offered like the shipped ones (CONTRIBUTING.md, "Plugins").

Writes to ``--out``: ``restored.png`` (clean image if known, measurement, every chain, chain mean, chain std),
``samples.safetensors`` (``samples [K, 1, 8, 8]``, ``mean``, ``std``, ``y``, the chains' ``seeds``; the seeds and the
command's options as metadata) and ``metrics.json`` (costs, guarded chains, chi-square of the residual, and PSNR/SSIM
against the clean image when it is known).

Chain ``i`` is a function of its seed ``seed + i``: the chains run in chunks of ``--batch`` in order, and under
``torchrun`` (``torchrun --nproc_per_node=2 --no-python -- steerdiff restore ...``) the chunks are shared over the
processes and rank 0 writes one result identical to the one-process run (steerdiff/app/cli/_shard.py). DR, CR and HR
average their loss over the chunk (RED-diff's code form), so a chain depends on ``--batch`` through Adam's epsilon
as well as at float rounding; never on the number of processes.
"""

from __future__ import annotations

import click
import torch

from ...inverse import SOLVERS, TASKS, Inpaint, InverseResult, measure, psnr, solve, ssim, task_operator
from ...inverse.reference import digits_surrogate
from ._common import (
    FINITE,
    POSITIVE,
    SEED,
    RegistryChoice,
    check_class,
    check_out,
    device_option,
    dtype_name,
    dtype_option,
    finite_range,
    load_model,
    model_to_dtype,
    plot,
    prepare_out,
    progress_option,
    refuse_dtype,
    start_outputs,
    write_metrics,
    write_samples,
)
from ._inputs import read_image
from ._models import is_greyscale_image
from ._shard import begin, end, format_seeds, map_chunks, rank_device

SURROGATE = "digits-gmm"  # the analytic mixture surrogate of the digits, a --model name besides the networks
DEFAULT_BATCH = 64  # chains per chunk: the default 8 chains run as one batch, as a single solve call would
_NOT_OPTIONS = ("out", "progress", "device")  # options that do not change the chains


def _load_model(name: str, device: torch.device):
    """``(prior, dtype)``: the analytic mixture surrogate of the digits (float64) or a greyscale image denoiser."""
    if name == SURROGATE:
        return digits_surrogate(), torch.float64
    model = load_model(name, extra=[SURROGATE], device=device, shape_ok=is_greyscale_image)
    if not is_greyscale_image(model.sample_shape):
        raise click.BadParameter(f"{name} samples shape {tuple(model.sample_shape)}; restore takes a model of "
                                 "greyscale images [1, H, W]", param_hint="--model")
    return model.eval().requires_grad_(False), torch.float32


def _measurement(op, img: torch.Tensor, degraded: bool, noise_std: float, seed: int):
    """``(y [1, m], clean image [1, *shape] or None)``."""
    shape = op.shape
    if not degraded:
        if tuple(img.shape) != tuple(shape[-2:]):
            raise click.BadParameter(f"a clean input must be {shape[-2]}x{shape[-1]} (the model's images), got "
                                     f"{tuple(img.shape)[0]}x{tuple(img.shape)[1]}", param_hint="--input")
        clean = img.reshape(1, *shape)
        return measure(op, clean, noise_std, generator=seed), clean
    if img.numel() == op.m:
        return img.reshape(1, -1), None
    if isinstance(op, Inpaint) and tuple(img.shape) == tuple(shape[-2:]):
        return op.forward(img.reshape(1, *shape)), None
    raise click.BadParameter(f"a degraded input for this task must have {op.m} pixels, got {tuple(img.shape)}",
                             param_hint="--input")


@click.command("restore")
@click.option("--model", "model_name", default="digits", show_default=True,
              help="digits (the shipped UNet prior), digits-gmm (the analytic mixture surrogate) or a model directory.")
@click.option("--task", type=RegistryChoice(TASKS), default="inpaint-center", show_default=True,
              help="The measurement operator (steerdiff.inverse.TASKS; a plugin's tasks too).")
@click.option("--method", type=RegistryChoice(SOLVERS), default="hr", show_default=True,
              help="The solver (steerdiff.inverse.SOLVERS; a plugin's solvers too).")
@click.option("--input", "input_", required=True,
              help="8x8 greyscale PNG, .npy/.safetensors tensor in [-1, 1], or digits:<split>:<N>.")
@click.option("--degraded", is_flag=True, help="The input is the measurement (image form), not the clean image.")
@click.option("--noise-std", type=finite_range(min=0), default=0.05, show_default=True,
              help="Gaussian measurement noise, model units ([-1, 1] images).")
@click.option("--chains", type=click.IntRange(min=1), default=8, show_default=True, help="Posterior samples.")
@click.option("--steps", type=click.IntRange(min=2), default=100, show_default=True, help="Noise levels.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Chain i uses seed + i; the noise uses seed.")
@click.option("--batch", type=click.IntRange(min=1), default=DEFAULT_BATCH, show_default=True,
              help="Chains per chunk: the unit of work that processes share under torchrun (a chain depends on its "
                   "seed and this chunk size, never on the number of processes).")
@click.option("--class", "class_", type=int, default=None,
              help="Condition of a class-conditional prior (default: null).")
@click.option("--scale", type=POSITIVE, default=None,
              help="DPS step size (default: DPS's step rule from the noise and the operator).")
@click.option("--lr", type=POSITIVE, default=None,
              help="DR/CR/HR Adam learning rate (default 0.1 x the prior's scale / 0.5: 0.1 for data in [-1, 1]).")
@click.option("--beta", type=FINITE, default=None, help="HR noise mixing (default 0.2).")
@device_option
@dtype_option
@click.option("--out", default="out", show_default=True, help="Output directory.")
@progress_option
@click.pass_context
def restore_cmd(ctx, model_name, task, method, input_, degraded, noise_std, chains, steps, seed, batch, class_, scale,
                lr, beta, device, dtype, out, progress) -> None:
    """Restore an image from a degraded measurement; write restored.png, samples.safetensors and metrics.json.

    ``--dtype``: the network runs in it; the chains, the measurement and the solver's arithmetic stay in float32
    (the solvers cast the state to the model's dtype for each call and its output back)."""
    dist, started = begin(ctx, "restore", device, ignore=("progress",))
    try:
        options = {k: v for k, v in ctx.params.items() if k not in _NOT_OPTIONS}
        _restore(dist, model_name, task, method, input_, degraded, noise_std, chains, steps, seed, batch, class_,
                 scale, lr, beta, rank_device(dist, device), out, progress and dist.is_main, options, dtype)
    finally:
        end(started)


def _solve_chunks(dist, model, op, y, method, noise_std, chains, steps, seed, batch, cond, progress,
                  options) -> InverseResult:
    """``solve`` on this rank's chunks of the chains (chain ``i`` from seed ``seed + i``), gathered in chain order:
    one :class:`InverseResult` of all chains, costs per chain, the longest rank's wall time."""
    first: dict = {}

    def one(c: slice):
        k = c.stop - c.start
        try:
            res = solve(model, op, y, method, noise_std=noise_std, chains=k, steps=steps, cond=cond,
                        generator=list(range(seed + c.start, seed + c.stop)), progress=progress and chains <= batch,
                        **options)
        except ValueError as err:
            raise click.UsageError(str(err)) from err
        first.setdefault("res", res)
        return {"samples": res.samples[0], "dead_at": res.dead_at[0]}, {"nfe": res.nfe * k, "vjp": res.nfe_vjp * k}

    out, per_rank = map_chunks(dist, chains, batch, one, ("nfe", "vjp"), progress=progress)
    if not dist.is_main:
        return None
    res = first["res"]  # rank 0 holds the first chunk: options, levels and noise level are those of every chunk
    return InverseResult(samples=out["samples"][None], method=res.method, options=res.options, sigmas=res.sigmas,
                         nfe=sum(r["nfe"] for r in per_rank) / chains, nfe_vjp=sum(r["vjp"] for r in per_rank) / chains,
                         wall_time=max(r["wall_time_s"] for r in per_rank), dead_at=out["dead_at"][None],
                         noise_std=res.noise_std)


def _restore(dist, model_name, task, method, input_, degraded, noise_std, chains, steps, seed, batch, class_, scale,
             lr, beta, device, out, progress, command_options, model_dtype=torch.float32) -> None:
    """Every rank solves its chunks of the chains; rank 0 measures and writes."""
    check_out(out)
    options = {k: v for k, v in (("scale", scale), ("lr", lr), ("beta", beta)) if v is not None}
    img = read_image(input_)
    model, dtype = _load_model(model_name, device)  # dtype: the chains' (float64 for the surrogate, else float32)
    if model_name == SURROGATE:
        refuse_dtype(model_dtype, "restore", f"{SURROGATE} is an analytic mixture, an exact prior evaluated in float64")
    else:
        model = model_to_dtype(model, model_dtype, "restore", model_name)
    op = task_operator(task, model.sample_shape)
    y, clean = _measurement(op, img, degraded, noise_std, seed)
    cond = None
    if class_ is not None:
        check_class(class_, getattr(model, "num_classes", ()), model_name)
        cond = torch.tensor([class_], device=device)
    out_dir = prepare_out(out) if dist.is_main else None
    res = _solve_chunks(dist, model, op, y.to(device, dtype), method, noise_std, chains, steps, seed, batch, cond,
                        progress, options)
    if res is None:  # not rank 0: it solved its chunks, rank 0 writes
        return
    res.samples, y = res.samples.detach().cpu(), y.cpu()
    samples = res.samples[0]
    metrics = {"model": model_name, "task": task, "input": input_, "degraded": degraded,
               "dtype": dtype_name(model_dtype)} | res.summary()
    if noise_std > 0:
        metrics["chi2_per_chain"] = res.chi2(op, y.to(dtype))[0].tolist()
    if clean is not None:
        c = clean.to(samples.dtype)
        metrics["psnr_chains"] = psnr(samples, c.expand_as(samples)).tolist()
        metrics["ssim_chains"] = ssim(samples, c.expand_as(samples)).tolist()
        metrics["psnr_mean"] = float(psnr(res.mean(), c)[0])
        metrics["ssim_mean"] = float(ssim(res.mean(), c)[0])
    metrics |= {"seeds": format_seeds(range(seed, seed + chains)), "batch": batch}
    start_outputs(out_dir)  # the summary comes last: a failure in between leaves none
    write_samples(out_dir, {"samples": samples, "mean": res.mean()[0], "std": res.std()[0], "y": y[0],
                            "seeds": torch.arange(seed, seed + chains, dtype=torch.int64)},
                  {"command": "restore", "seeds": format_seeds(range(seed, seed + chains)),
                   "options": command_options})
    shown = ([clean[0]] if clean is not None else []) + [op.pinv(y.to(dtype))[0]] + list(samples.nan_to_num(0.0))
    shown += [res.mean()[0], res.std()[0] * 2 - 1]
    png = out_dir / "restored.png"
    plot(lambda viz: viz.image_grid(torch.stack(shown).float(), png, nrow=len(shown)), png)
    write_metrics(out_dir, metrics)
    if res.n_nonfinite:
        click.echo(f"warning: {res.n_nonfinite} of {chains} chains turned non-finite (kept as NaN in the outputs)")
    for key in ("psnr_mean", "ssim_mean", "nfe", "nfe_vjp", "wall_time_s"):
        if key in metrics:
            click.echo(f"{key:>12}: {metrics[key]:.4g}")
    click.echo(f"wrote {out_dir / 'restored.png'}, samples.safetensors and metrics.json "
               f"({'clean, ' if clean is not None else ''}measurement, {chains} chains, mean, std)")
