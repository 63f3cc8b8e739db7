"""NAMM (docs/methods/namm.md): plain model vs NAMM model, and inpainting in mirror space vs data space.

* ``circle``: N1 (unit circle): mean constraint distance, sliced W2 (256 projections), MMD of 4000 samples against
  4000 fresh points; the NAMM row decodes mirror samples with ``f``; "raw mirror" is ``l`` of undecoded samples.
* ``digits``: N2 (brightness-normalised digits, ``l = |Σx - 20|``): the same rows plus FID-digits (shipped
  classifier, ``2x - 1``) against the test split; class-balanced labels, no guidance; the UNet pair of
  ``configs/digits_namm.json``.
  The plain model is the like-for-like baseline: same architecture, budget and seed, trained on ``x`` instead of
  ``g(x)`` (the shipped ``digits`` model is trained on un-normalised pixels, so its samples are not comparable).
* ``inpaint``: centre 4x4 hole, ``σ_y = 0.05`` (in ``x`` units), the first ``--images`` test images x ``--chains``
  chains, HR (β 0.2, λ 0.25, lr 0.1, 100 levels) and DPS (s 0.5) in data space with the plain model and in mirror space
  (operator ``A ∘ f``, result decoded by ``f``) with the MDM: constraint distance, PSNR (on ``2x - 1``, peak 2), NFE.

    python benchmarks/namm.py [--only circle,digits,inpaint] [--n 4000] [--images 50]

Writes ``benchmarks/results/namm/namm.json`` and ``namm.md`` (``namm_<only>.*``, or ``namm_<tag>.*``, for a partial
run). Needs the recipe runs
under ``runs/`` (``python -m steerdiff.app.recipes.namm <recipe>``, or ``scripts/make_assets.py --only ...``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from steerdiff.app.protocols.namm import compare, load_run
from steerdiff.constrain.distances import TotalBrightness, brightness_digits, brightness_to_classifier
from steerdiff.inverse import solve
from steerdiff.inverse.metrics import psnr
from steerdiff.inverse.operators import Inpaint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

RECIPES = {"circle": "circle_namm", "digits": "digits_namm"}


def inpaint_section(recipe: str, images: int, chains: int, maps: str | None = None) -> dict:
    from steerdiff.io import read_json
    from steerdiff.train.recipes import resolve_config

    out = Path(read_json(resolve_config(recipe))["out_dir"])
    namm, md, plain = load_run(out, maps)
    x, labels = brightness_digits("test")
    x, labels = x[:images], labels[:images]
    dist = TotalBrightness(20.0)
    op = Inpaint.center((1, 8, 8))
    g = torch.Generator().manual_seed(0)
    y = op.forward(x) + 0.05 * torch.randn(images, op.m, generator=g)
    rows = {}
    runs = [("data-space HR", plain, "hr", {}), ("mirror-space HR", md, "hr", {}),
            ("data-space DPS", plain, "dps", {"scale": 0.5}), ("mirror-space DPS", md, "dps", {"scale": 0.5})]
    for name, model, method, opts in runs:
        start = time.perf_counter()
        if model is md:
            res = md.solve(op, y, method, noise_std=0.05, chains=chains, cond=labels, generator=0, **opts)
        else:
            res = solve(plain, op, y, method, noise_std=0.05, chains=chains, cond=labels, generator=0, **opts)
        s = res.samples.reshape(images * chains, 1, 8, 8)
        ok = torch.isfinite(s.flatten(1)).all(1)
        truth = x.repeat_interleave(chains, 0)
        d = dist(s[ok])
        rows[name] = {"nfe": res.nfe, "nfe_vjp": res.nfe_vjp, "constraint_mean": float(d.mean()),
                      "constraint_median": float(d.median()),
                      "psnr": float(psnr(brightness_to_classifier(s[ok]), brightness_to_classifier(truth[ok])).mean()),
                      "nonfinite_chains": int((~ok).sum()), "wall_time_s": round(time.perf_counter() - start, 2)}
        print(f"inpaint {recipe} {name}: {json.dumps(rows[name])}", flush=True)
    return {"recipe": recipe, "images": images, "chains": chains, "operator": repr(op), "noise_std": 0.05,
            "labels": "true class of each test image", "rows": rows}


def _f(v, nd=4):
    return "-" if v is None else (f"{v:.{nd}g}" if isinstance(v, float) else str(v))


def markdown(res: dict) -> str:
    lines = ["# NAMM benchmark (docs/methods/namm.md)", "", provenance_line(res.get("meta", res)), ""]
    for key in ("circle", "digits"):
        if key not in res:
            continue
        r = res[key]
        rows = [(name, *(_f(row[k]) for k in ("nfe", "constraint_mean", "constraint_median", "sliced_w2", "mmd")),
                 _f(row.get("fid_digits"))) for name, row in r["rows"].items()]
        h = r["heldout"]
        lines += [f"## {key} ({r['recipe']}, n={r['n']}, {r['sampler']}, reference: {r['reference']})", "",
                  markdown_table(["model", "NFE", "mean l", "median l", "sliced W2", "MMD", "FID-digits"], rows),
                  "", f"plain / NAMM mean l: **{r['ratio_constraint_plain_over_namm']:.2f}x**; NAMM / plain SW2: "
                  f"{r['ratio_sw2_namm_over_plain']:.2f}"
                  + (f"; NAMM / plain FID-digits: {r['ratio_fid_namm_over_plain']:.2f}"
                     if "ratio_fid_namm_over_plain" in r else "")
                  + f". Held-out cycle error {h['cycle_error']:.4g}, l(f(g(x) + {h['sigma']:g} z)) "
                  f"{h['constraint_perturbed']:.4g}.", ""]
    if "inpaint" in res:
        r = res["inpaint"]
        rows = [(name, *(_f(row[k]) for k in ("nfe", "nfe_vjp", "constraint_mean", "constraint_median", "psnr")),
                 row["nonfinite_chains"], _f(row["wall_time_s"])) for name, row in r["rows"].items()]
        lines += [f"## Inpainting ({r['recipe']}, {r['operator']}, sigma_y {r['noise_std']}, {r['images']} test images"
                  f" x {r['chains']} chains)", "",
                  markdown_table(["method", "NFE", "VJP", "mean l", "median l", "PSNR (dB)", "non-finite",
                                  "wall (s)"], rows), ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="circle,digits,inpaint")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--n-digits", type=int, default=2000)
    ap.add_argument("--images", type=int, default=50)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--inpaint-recipe", default="digits_namm")
    ap.add_argument("--maps", default=None, help="maps subdirectory of the runs (default: maps_ft if present)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    only = args.only.split(",")
    res = {"meta": provenance(argv, script=__file__)}
    for key in ("circle", "digits"):
        if key in only:
            res[key] = compare(RECIPES[key], n=args.n if key == "circle" else args.n_digits, maps=args.maps)
            print(f"{key}: {json.dumps(res[key]['rows'])}", flush=True)
    if "inpaint" in only:
        res["inpaint"] = inpaint_section(args.inpaint_recipe, args.images, args.chains, args.maps)
    full = set(only) == {"circle", "digits", "inpaint"}
    out, stem = results_dir("namm"), "namm" if full and not args.tag else f"namm_{args.tag or '_'.join(only)}"
    write_json(out / f"{stem}.json", res)
    text = markdown(res)
    write_text(out / f"{stem}.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
