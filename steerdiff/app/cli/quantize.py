"""``steerdiff quantize``: post-training 4-bit quantization of a model with SVDQuant or a baseline.

SVDQuant is "SVDQuant: Absorbing Outliers by Low-Rank Components for 4-Bit Diffusion Models" (Li, Lin, Zhang et al.
2025): smoothing, a 16-bit low-rank branch and a 4-bit residual.

    steerdiff quantize --model digits --method svdquant --out DIR
    steerdiff sample --model DIR

``--method`` offers every registered quantizer (:data:`steerdiff.quant.QUANTIZERS`), read when this module is
imported: one registered by a plugin module imported before it appears too. Calibration uses the model's own
sampling trajectories, as SVDQuant's reference calibration does. W4A4 methods run
simulated on CPU (no CPU kernel exists for 4-bit x 4-bit products); w4a16 and w8a8 use PyTorch's real low-bit CPU
kernels. Writes ``DIR/config.json`` + ``DIR/model.safetensors`` (packed 4-bit codes, scales, low-rank factors,
smoothing factors) and ``DIR/quantization.json`` (per-layer calibration errors, sizes, bits per weight).
"""

from __future__ import annotations

from pathlib import Path

import click
import torch

from ...quant.calibrate import SEARCH_MODES
from ...quant.quantizers import FORMATS
from ...quant.registry import QUANTIZERS
from ._common import (
    check_out,
    device_option,
    dtype_name,
    dtype_option,
    load_model,
    move_aside,
    progress_option,
    refuse_given,
)
from ._models import QUANTIZABLE

# read by the quantizers that list them in .options
_METHOD_OPTIONS = ("fmt", "rank", "num_grids", "num_iters", "search")


def _check_applies(ctx: click.Context, method: str) -> None:
    """Refuse an option the chosen quantizer would ignore: those not in its ``options``, and ``--num-samples`` for
    one that is not ``calibrated`` (w4a16 / w8a8: weight-only or data-free)."""
    spec = QUANTIZERS.get(method)
    read = [o for o in _METHOD_OPTIONS if o in spec.options] + (["num_samples"] if spec.calibrated else [])
    flags = ", ".join("--" + o.replace("_", "-") for o in read) or "none of these options"
    ignored = tuple(o for o in (*_METHOD_OPTIONS, "num_samples") if o not in read)
    refuse_given(ctx, ignored, f"--method {method} does not read it (it takes {flags})")


@click.command("quantize")
@click.option("--model", "model_name", default="digits", show_default=True,
              help="A shipped model (digits, shapes) or a model directory.")
@click.option("--method", type=click.Choice(QUANTIZERS.names()), default="svdquant", show_default=True,
              help="A registered quantizer (steerdiff.quant.QUANTIZERS; a plugin's appear when it is imported first).")
@click.option("--fmt", type=click.Choice(FORMATS), default="int4", show_default=True,
              help="4-bit format of the W4A4 methods (INT4 g64 or NVFP4 g16).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Low-rank branch rank (default 32, capped at a quarter of each layer's smaller side).")
@click.option("--num-samples", type=click.IntRange(min=1), default=128, show_default=True,
              help="Calibration denoiser calls drawn from the model's own trajectories.")
@click.option("--num-grids", type=click.IntRange(min=2), default=20, show_default=True,
              help="Smoothing grid (20 -> 39 candidates; 10 = the fast preset).")
@click.option("--num-iters", type=click.IntRange(min=1), default=100, show_default=True,
              help="Low-rank refinement iterations (early stop).")
@click.option("--search", type=click.Choice(SEARCH_MODES), default="auto", show_default=True,
              help="Smoothing search: auto (per layer group: hybrid when the group's weight is at least 320 wide on "
                   "both sides and it has more than 512 calibration rows, exact otherwise; the mode each group got is "
                   "in quantization.json's calibration list), exact (every candidate of the grid on every row, the "
                   "official search), fast "
                   "(candidates scored on 512 calibration rows over a coarse-to-fine grid; refinement on every row) "
                   "fastest (the refinement on the 512 rows too), rescore (fastest, with the 3 best candidates "
                   "scored again on every row) or sampled (the whole grid on the 512 rows, the 3 best scored again on "
                   "every row, refinement on every row: the exact result whenever the exact pick is among those 3) or "
                   "hybrid (sampled, with the refinement scored on the 512 rows and its 2 best on every row).")
@device_option
@dtype_option
@click.option("--out", required=True,
              help="Output directory: new, empty, or a checkpoint steerdiff wrote (replaced atomically).")
@click.option("--move-aside", "aside", is_flag=True,
              help="When --out is a directory steerdiff cannot prove it wrote (a user's folder, or a checkpoint of an "
                   "earlier version without the marker), rename it to OUT.old (OUT.old-2, ...) and write a new one; "
                   "nothing is deleted.")
@progress_option
@click.pass_context
def quantize_cmd(ctx, model_name, method, fmt, rank, num_samples, num_grids, num_iters, search, device, dtype, out,
                 aside, progress) -> None:
    """Quantize a model (SVDQuant W4A4 by default) and save it as a loadable checkpoint directory."""
    import json

    from ...io import add_to_checkpoint
    from ...quant import bits_per_weight, formula_bytes, quant_info, quantize, save, tensor_bytes

    _check_applies(ctx, method)
    check_out(out, checkpoint=True, move_aside=aside)  # a user's file or folder is never replaced by the output
    # A quantized checkpoint is refused from its config.json before anything is loaded.
    model = load_model(model_name, QUANTIZABLE, device=device).eval().requires_grad_(False)
    model = model.to(dtype)  # --dtype: calibrated in it; the quantized layers take and return it
    with torch.no_grad():
        try:
            qmodel = quantize(model, method, rank=rank, fmt=fmt, num_samples=num_samples, num_grids=num_grids,
                              num_iters=num_iters, search=search, progress=progress)
        except ValueError as err:
            raise click.UsageError(str(err)) from err
    moved = move_aside(Path(out)) if aside else None
    if moved is not None:
        click.echo(f"moved the existing {out} to {moved} (nothing deleted)")
    path = save(qmodel, out)
    info = quant_info(qmodel)
    sizes = tensor_bytes(path)
    fp32 = sum(p.numel() * 4 for p in model.state_dict().values())
    layers = {}
    for p, spec in info["layers"].items():
        key = f"{p}."  # state-dict keys of the quantized root module
        stored = sum(v for k, v in sizes.items() if k.startswith(key))
        n, cin, (kh, kw) = spec["out_channels"], spec["in_channels"], spec["kernel"]
        entry = {"bytes": stored, "fp32_bytes": 4 * (n * cin * kh * kw + n)}
        if spec["type"] == "SVDQLayer":
            entry |= {"formula_bytes": formula_bytes(spec), "bits_per_weight": bits_per_weight(spec),
                      "rank": spec["rank"]}
        layers[p] = entry
    summary = {"model": model_name, "method": method, "fmt": info["fmt"], "dtype": dtype_name(dtype),
               "calibration_seconds": info["seconds"],
               "total_bytes": sum(sizes.values()), "fp32_total_bytes": fp32,
               "quantized_layer_bytes": sum(e["bytes"] for e in layers.values()),
               "quantized_layer_fp32_bytes": sum(e["fp32_bytes"] for e in layers.values()),
               "layers": layers, "calibration": info["report"]}
    # Listed in the checkpoint's marker, so that a later quantize --out DIR may replace the directory again.
    add_to_checkpoint(path, "quantization.json", json.dumps(summary, indent=2, default=float) + "\n")
    ratio = summary["quantized_layer_bytes"] / summary["quantized_layer_fp32_bytes"]
    click.echo(f"quantized {len(layers)} layers with {method} ({info['fmt'] or 'real kernels'}) in "
               f"{info['seconds']:.1f} s; quantized layers {ratio:.3f} x fp32, whole model "
               f"{summary['total_bytes'] / fp32:.3f} x fp32")
    click.echo(f"wrote {path} (load with: steerdiff sample --model {path})")
