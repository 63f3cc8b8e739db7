"""Where the image test's clip fraction comes from on a shipped model: the share of raw sample values with |x|
above 1 (``clip`` of docs/methods/guidance.md, "Image test (A1-A5)") and above a few looser thresholds, unguided
and with CFG / APG at one scale.

On 8x8 digits the background sits exactly at -1, so values a few thousandths below it count as clipped; this table
shows how much of ``clip`` is that undershoot (a diagnostic beside ``benchmarks/guidance.py``, not a criterion), and
which share of the values near -1 fall below it. That share is set by the sign of the model's error at a background
pixel, not by its size: about half for a symmetric error however small (0.41 measured for the shipped digits
model), so the ``clip`` of unguided samples would stay near half the background share for a more accurate
model whose error at the background is still symmetric and nonzero.

A second table denoises the real test images in one step at small noise levels. The exact denoiser E[x0 | x] is an
average of data in [-1, 1], so its ``clip`` is exactly 0 at every sigma; and on digits, whose pixels take 17 levels
0.125 apart, the noise it leaves tends to 0 as sigma falls below that spacing. ``noise left`` is the rms of
``D - x0`` over sigma: 1 for a network that passes its input through.

    python benchmarks/guidance_clip_breakdown.py --model digits --n 300 --scale 10 --r-rms 0.05 --threads 1

Writes ``benchmarks/results/guidance_clip_breakdown/guidance_clip_<model>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from steerdiff.app.protocols.quality import sample_classes
from steerdiff.core.denoiser import null_cond_like
from steerdiff.guidance import APG, CFG
from steerdiff.metrics.saturation import clip_fraction

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402
from guidance import labels_for, load_setup  # noqa: E402

THRESHOLDS = (1.0, 1.001, 1.005, 1.01, 1.02, 1.05, 1.1)
FLOOR_BAND = 0.05
ONE_STEP_SIGMAS = (0.002, 0.01, 0.05)


def clip_row(raw: torch.Tensor) -> dict[str, float]:
    """Share of ``|x|`` above each threshold, and the sign split near the floor: ``near -1`` is the share of values
    within ``FLOOR_BAND`` of -1, ``below | near`` the share of those that lie below -1 (about 0.5 when the model's
    error at a background pixel is symmetric, whatever its size)."""
    row = {f"{t:g}": clip_fraction(raw, value_range=(-t, t)) for t in THRESHOLDS}
    near = (raw + 1).abs() < FLOOR_BAND
    row["near -1"] = float(near.float().mean())
    row["below | near"] = float((raw[near] < -1).float().mean()) if near.any() else float("nan")
    return row


def one_step_rows(model: torch.nn.Module, real: torch.Tensor, null: torch.Tensor,
                  seed: int) -> dict[str, dict[str, float]]:
    """One denoising step of the real images under the null condition ``null`` at each of ``ONE_STEP_SIGMAS``: the
    clip row of the noisy input and of ``D(x0 + sigma eps, sigma)``, each with ``noise left`` = rms(. - x0) / sigma."""
    gen = torch.Generator().manual_seed(seed)
    rows = {}
    for sigma in ONE_STEP_SIGMAS:
        noisy = real + sigma * torch.randn(real.shape, generator=gen)
        denoised = model(noisy, torch.full((real.shape[0],), sigma), null)
        for name, x in (("input", noisy), ("D(input)", denoised)):
            left = float((x - real).pow(2).mean().sqrt()) / sigma
            rows[f"sigma {sigma:g}: {name}"] = clip_row(x) | {"noise left": left}
    return rows


def markdown(result: dict) -> str:
    """The two tables of a ``guidance_clip_<model>.json``."""
    over = [f"> {t:g}" for t in THRESHOLDS]

    def shares(r):
        return [f"{r[f'{t:g}']:.4f}" for t in THRESHOLDS]

    samples = [(name, *shares(r), f"{r['near -1']:.4f}", f"{r['below | near']:.3f}", f"{r['nfe']:g}")
               for name, r in result["rows"].items()]
    one_step = [(name, *shares(r), f"{r['noise left']:.3f}") for name, r in result["one_step"].items()]
    return "\n".join([
        f"# Share of raw values with |x| above a threshold: {result['model']}", "",
        provenance_line(result.get("meta", result)), "",
        markdown_table(["samples", *over, f"within {FLOOR_BAND:g} of -1", "of those, below -1", "NFE"], samples), "",
        "One unconditional denoising step of the same real images (exact denoiser: clip 0 at every sigma, noise left "
        "tends to 0 as sigma falls)", "",
        markdown_table(["input", *over, "noise left"], one_step)]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="digits", choices=("digits", "shapes"))
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--r-rms", type=float, default=0.05, help="APG r_rms (guidance.py's pick on digits: 0.05)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    setup = load_setup(args.model, 16)
    if setup is None:
        sys.exit(0)
    cond, _ = labels_for(setup, args.n)
    guiders = {"unguided (w = 1)": None, f"cfg w = {args.scale:g}": CFG(args.scale),
               f"apg w = {args.scale:g}": APG(args.scale, eta=0.0, momentum=-0.5, r_rms=args.r_rms)}
    rows = {}
    with torch.no_grad():
        for name, guider in guiders.items():
            raw, nfe = sample_classes(setup["model"], cond, tuple(setup["real"].shape[1:]), steps=args.steps,
                                      method="euler", seed=args.seed, guidance=guider)
            rows[name] = clip_row(raw) | {"nfe": nfe}
            print(name, rows[name], flush=True)
        real = setup["real"][: args.n]
        one_step = one_step_rows(setup["model"], real, null_cond_like(cond[: real.shape[0]]), args.seed)
    rows = {"data (test split)": clip_row(setup["real"][: args.n]) | {"nfe": 0}} | rows
    result = {"model": args.model, "n": args.n, "rows": rows, "one_step": one_step, "meta": provenance()}
    stem = results_dir("guidance_clip_breakdown") / f"guidance_clip_{args.model}"
    write_json(stem.with_suffix(".json"), result)
    text = markdown(result)
    write_text(stem.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
