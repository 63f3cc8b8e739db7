"""Sampler overhead: wall time of ``sd.sample`` over (NFE x one bare forward of the same network), one run.

For a small MLP (2-D data) and a small conv denoiser (1x8x8, digits-sized) at batch 64, and the shipped digits UNet
(``sd.models.load("digits")``, an EDMPrecond UNet) at batch 256, each registered sampler's run (those that need no
extra option, at their default options) is timed against a loop that calls the bare network NFE times on the same
batch with the same sigmas, with repetitions interleaved so that machine noise hits both alike. Reported: the median
over rounds of the paired ratio (each round times both back to back, alternating which goes first, so that load
drifting during the run cancels), beside the ratio of the medians. Target: <= 1.03.

    python benchmarks/sampler_overhead.py [--batch 64] [--steps 32] [--repeats 7] [--threads 2]
        [--digits-batch 256] [--digits-steps 16] [--digits-repeats 5] [--models mlp,conv,digits]

Prints a markdown table and writes ``benchmarks/results/sampler_overhead/sampler_overhead.json`` and ``.md`` (``--out``
moves both).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import steerdiff as sd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, markdown_table, provenance, provenance_line, write_json, write_text  # noqa: E402


class MLPDenoiser(nn.Module):
    """``D = c_skip x + c_out F(c_in x, log sigma)``, an MLP ``F`` (3 hidden layers)."""

    def __init__(self, dim: int = 2, width: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim + 1, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
            nn.Linear(width, width), nn.SiLU(), nn.Linear(width, dim),
        )

    def forward(self, x, sigma, cond=None):
        s = sigma[:, None]
        h = self.net(torch.cat([x / (1 + s**2).sqrt(), s.log() / 4], 1))
        return x / (1 + s**2) + h * s / (1 + s**2).sqrt()


class ConvDenoiser(nn.Module):
    """A 4-layer conv net on 1x8x8 images with the noise level as an extra input channel."""

    def __init__(self, channels: int = 64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(2, channels, 3, padding=1), nn.SiLU(), nn.Conv2d(channels, channels, 3, padding=1), nn.SiLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.SiLU(), nn.Conv2d(channels, 1, 3, padding=1),
        )

    def forward(self, x, sigma, cond=None):
        s = sigma[:, None, None, None]
        inp = torch.cat([x / (1 + s**2).sqrt(), (s.log() / 4).expand_as(x)], 1)
        return x / (1 + s**2) + self.net(inp) * s / (1 + s**2).sqrt()


def bare_loop(model: nn.Module, x: torch.Tensor, sigmas: list[float], nfe: int) -> None:
    """NFE plain forwards on the batch, cycling through the schedule's sigmas."""
    levels = [x.new_full((x.shape[0],), s) for s in sigmas[:-1]]
    with torch.no_grad():
        for i in range(nfe):
            model(x, levels[i % len(levels)])


def measure(model: nn.Module, shape: tuple, steps: int, repeats: int) -> list[dict]:
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    noise = sd.randn(shape, seeds=0)
    rows = []
    for method in [name for name, spec in sd.core.SAMPLERS.items() if not spec.required]:
        nfe = sd.core.nfe_of(method, steps)
        x = noise * 80.0
        sample_t, bare_t = [], []
        for r in range(repeats + 1):  # the first round warms up and is dropped
            # Both back to back, alternating which goes first, so that load drifting over the run hits the two alike.
            for which in ("sample", "bare") if r % 2 == 0 else ("bare", "sample"):
                t0 = time.perf_counter()
                if which == "sample":
                    sd.sample(model, noise, sigmas, method=method, generator=1)
                    sample_t.append(time.perf_counter() - t0)
                else:
                    bare_loop(model, x, sigmas.tolist(), nfe)
                    bare_t.append(time.perf_counter() - t0)
        s, b = statistics.median(sample_t[1:]), statistics.median(bare_t[1:])
        paired = statistics.median(a / c for a, c in zip(sample_t[1:], bare_t[1:], strict=True))
        rows.append({"method": method, "nfe": nfe, "sample_ms": 1e3 * s, "bare_ms": 1e3 * b, "ratio": paired,
                     "ratio_of_medians": s / b})
    return rows


def markdown(results: dict, note: str = "") -> str:
    """The table of a ``sampler_overhead.json``."""
    settings = results.get("settings", {})
    rows = [(name, settings.get(name, {}).get("batch", results["batch"]), settings.get(name, {}).get("steps",
             results["steps"]), r["method"], r["nfe"], f"{r['sample_ms']:.2f}", f"{r['bare_ms']:.2f}",
             f"{r['ratio']:.3f}", f"{r['ratio_of_medians']:.3f}" if "ratio_of_medians" in r else "-")
            for name, model_rows in results["models"].items() for r in model_rows]
    return "\n".join([
        "# Sampler overhead: `sd.sample` against NFE bare forwards of the same network", "",
        note or provenance_line(results.get("meta", results)), "",
        "Per model: batch and steps as listed, interleaved repeats (a warm-up round dropped; "
        f"{_repeats_note(results)}); ratio = median over rounds of the paired ratio (each round times both back to "
        "back, alternating which goes first); target <= 1.03.", "",
        markdown_table(["model", "batch", "steps", "method", "NFE", "sd.sample ms", "NFE x forward ms", "ratio",
                        "ratio of medians"], rows, "lrrlrrrrr")]) + "\n"


def _repeats_note(results: dict) -> str:
    settings = results.get("settings", {})
    if not settings:
        return f"{results['repeats']} repeats"
    return ", ".join(f"{name}: {cfg['repeats']}" for name, cfg in settings.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--digits-batch", type=int, default=256)
    ap.add_argument("--digits-steps", type=int, default=16, help="fewer steps: one digits forward is ~0.1 s")
    ap.add_argument("--digits-repeats", type=int, default=5)
    ap.add_argument("--models", default="mlp,conv,digits", help="comma-separated subset of mlp, conv, digits")
    ap.add_argument("--out", default=str(RESULTS / "sampler_overhead" / "sampler_overhead.json"),
                    help="JSON path; the markdown table goes beside it (.md)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    chosen = set(args.models.split(","))
    if not chosen <= {"mlp", "conv", "digits"}:
        ap.error(f"--models takes a comma-separated subset of mlp, conv, digits, got {args.models!r}")
    models = {}  # name -> (network, shape, steps, repeats)
    if "mlp" in chosen:
        models["mlp 2-D (3x256)"] = (MLPDenoiser(), (args.batch, 2), args.steps, args.repeats)
    if "conv" in chosen:
        models["conv 1x8x8 (4x64ch)"] = (ConvDenoiser(), (args.batch, 1, 8, 8), args.steps, args.repeats)
    if "digits" in chosen:
        models["digits UNet (shipped, EDMPrecond)"] = (sd.models.load("digits"), (args.digits_batch, 1, 8, 8),
                                                      args.digits_steps, args.digits_repeats)
    results = {"batch": args.batch, "steps": args.steps, "repeats": args.repeats, "threads": args.threads,
               "models": {}, "settings": {}}
    for name, (model, shape, steps, repeats) in models.items():
        model.eval()
        results["models"][name] = measure(model, shape, steps, repeats)
        results["settings"][name] = {"batch": shape[0], "steps": steps, "repeats": repeats}
        print(f"{name}: done", flush=True)
    results["meta"] = provenance()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, results)
    text = markdown(results)
    write_text(out.with_suffix(".md"), text)
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
