"""Which sampler at 5, 10, 20 NFE? FID-digits of the samplers practitioners use on the shipped digits models.

    python benchmarks/few_step.py --part edm   [--n 2000] [--seed 0] [--threads 1]
    python benchmarks/few_step.py --part flow  [--n 2000] [--seed 0]
    python benchmarks/few_step.py --part edm --seed 1 --nfes 5,10 --rows dpmpp_2m,unipc,ocm-ddim --tag seed1
    python benchmarks/few_step.py --part report

Rows (each at NFE 5, 10, 20, and at 100 NFE as its own converged reference):

* on the shipped EDM ``digits`` UNet, Karras et al. 2022's schedule ``karras(0.002, 80, rho 7)``: DDIM (eta 0),
  Heun (Karras et al. 2022, Algorithm 1; NFE ``2 steps - 1``: the step count whose NFE is nearest below the target,
  the NFE actually used is in each cell), DPM-Solver++ 2M (Lu et al. 2022, DPM-Solver++, Algorithm 2) and UniPC
  (Zhao et al. 2023, UniPC, bh2 order 2, the registered defaults);
* the OCM baseline pair on the VP-linear grid of ``benchmarks/ocm.py`` (Ou et al., ICLR 2025, "Improving Diffusion
  Models' Data-Corruption Resistance..." digits gate; ``steerdiff.app.recipes.ocm_digits.digits_samples``): DDIM and
  OCM-DDIM with the shipped ``digits_ocm`` head (both clip D to [-1, 1] and use the official last-step clip of one
  grey level, as the demo's few-step section);
* the shipped rectified-flow ``digits_flow`` model (``configs/digits_flow.json``) from ``sigma = inf`` with Euler and
  DPM-Solver++ 2M on the uniform flow grid ``sd.sigmas.flow(steps, grid="flux")`` (t = 1, 1 - 1/steps, ..., 1/steps,
  0). The scheduler grid of SD3 (``grid="scheduler"``: t down to 0.001, then 0) spends its last NFE on t < 0.001
  and makes DPM-Solver++ 2M unstable at few steps (its step-size ratio is huge there), so it is not used here.

A sampler is only run if it is registered in ``sd.core.SAMPLERS`` when the script runs. Every row samples the same
``n`` class-conditional digits (class ``i % 10``, noise row ``i`` from seed ``seed * 10**6 + i``); FID-digits is the
Frechet distance of the shipped classifier's features against all 1,797 digits (as ``benchmarks/ocm.py``).
A tagged run (``--tag``, with ``--rows`` / ``--nfes`` / ``--seed``) is stored beside the main parts and reported as a
seed check of the main table's cells. Writes ``benchmarks/results/few_step/few_step.{json,md}`` and ``few_step.png``
(FID vs NFE, log x).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

import steerdiff as sd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

NFES = (5, 10, 20)
REFERENCE_NFE = 100
OUT = results_dir("few_step")
JSON_PATH = OUT / "few_step.json"
# row key -> (label, model, sampler, grid)
ROWS = {
    "ddim": ("DDIM", "digits", "ddim", "karras"),
    "heun": ("Heun", "digits", "heun", "karras"),
    "dpmpp_2m": ("DPM-Solver++ 2M", "digits", "dpmpp_2m", "karras"),
    "unipc": ("UniPC (bh2, order 2)", "digits", "unipc", "karras"),
    "ddim_vp": ("DDIM (OCM's VP-linear grid)", "digits", "ddim", "vp_linear"),
    "ocm-ddim": ("OCM-DDIM (VP-linear grid)", "digits", "ocm-ddim", "vp_linear"),
    "flow_euler": ("flow model + Euler", "digits_flow", "euler", "flow"),
    "flow_dpmpp_2m": ("flow model + DPM-Solver++ 2M", "digits_flow", "dpmpp_2m", "flow"),
}
PARTS = {"edm": [k for k, r in ROWS.items() if r[1] == "digits"],
         "flow": [k for k, r in ROWS.items() if r[1] == "digits_flow"]}


def steps_for(sampler: str, nfe: int) -> int:
    """The step count whose NFE is closest to ``nfe`` without exceeding it (NFE from the sampler's registry)."""
    best = 1
    for k in range(1, nfe + 1):
        if sd.core.nfe_of(sampler, k) <= nfe:
            best = k
    return best


def _samples(model, sampler: str, grid: str, steps: int, n: int, seed: int, head=None) -> tuple[torch.Tensor, float]:
    labels = torch.arange(n) % 10
    if grid == "vp_linear":
        from steerdiff.app.recipes.ocm_digits import digits_samples

        images, nfe, _ = digits_samples(model, sampler, steps, covariance=head, n=n, seed=seed, clip_pixel=1.0)
        return images, nfe
    sig = sd.sigmas.karras(steps, 0.002, 80.0) if grid == "karras" else sd.sigmas.flow(steps, grid="flux")
    out, nfe = [], 0.0
    for start in range(0, n, 500):
        lab = labels[start : start + 500]
        noise = sd.core.randn((lab.shape[0], *model.sample_shape), seeds=seed * 10**6 + start)
        with torch.no_grad():
            x, stats = sd.sample(model, noise, sig, method=sampler, cond=lab, return_stats=True)
        out.append(x)
        nfe = stats.nfe
    return torch.cat(out), nfe


def run_part(part: str, n: int, seed: int, rows: list[str] | None = None, nfes: tuple[int, ...] | None = None) -> dict:
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import class_accuracy, classifier_features, frechet_distance

    clf = sd.models.load("digits_classifier")
    f_all = classifier_features(clf, load_digits("all")[0])
    labels = torch.arange(n) % 10
    model = sd.models.load("digits" if part == "edm" else "digits_flow")
    head = None
    if part == "edm":
        from steerdiff.covariance import load_head_for

        head = load_head_for("digits", model)
    cells = {}
    for key in rows or PARTS[part]:
        label, _, sampler, grid = ROWS[key]
        if sampler not in sd.core.SAMPLERS:
            print(f"skip {key}: sampler {sampler!r} is not registered", flush=True)
            continue
        for target in nfes or (*NFES, REFERENCE_NFE):
            steps = steps_for(sampler, target)
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                images, nfe = _samples(model, sampler, grid, steps, n, seed, head)
            images = images.clamp(-1, 1)
            cells[f"{key}/{target}"] = {
                "row": key, "label": label, "sampler": sampler, "grid": grid, "target_nfe": target, "steps": steps,
                "nfe": nfe, "fid": frechet_distance(f_all, classifier_features(clf, images)),
                "accuracy": class_accuracy(clf, images, labels), "wall_s": round(time.perf_counter() - start, 1)}
            print(key, target, json.dumps({k: cells[f"{key}/{target}"][k] for k in ("steps", "nfe", "fid")}),
                  flush=True)
    return {"n": n, "seed": seed, "reference": "all 1797 digits (classifier features)", "cells": cells}


def _load() -> dict:
    return json.loads(JSON_PATH.read_text()) if JSON_PATH.is_file() else {}


def summary(res: dict) -> dict:
    """Per row: FID at 10 NFE over its own 100-NFE FID; the best row at each NFE; whether OCM-DDIM wins."""
    cells = {k: v for part in ("edm", "flow") for k, v in res.get(part, {}).get("cells", {}).items()}
    rows = [k for k in ROWS if f"{k}/10" in cells and f"{k}/{REFERENCE_NFE}" in cells]
    ratio = {k: cells[f"{k}/10"]["fid"] / cells[f"{k}/{REFERENCE_NFE}"]["fid"] for k in rows}
    best = {str(t): min((k for k in ROWS if f"{k}/{t}" in cells), key=lambda k: cells[f"{k}/{t}"]["fid"])
            for t in NFES if any(f"{k}/{t}" in cells for k in ROWS)}
    best10 = best.get("10")
    edm = [k for k in ROWS if ROWS[k][1] == "digits"]
    best_edm = {str(t): min((k for k in edm if f"{k}/{t}" in cells), key=lambda k: cells[f"{k}/{t}"]["fid"])
                for t in NFES if any(f"{k}/{t}" in cells for k in edm)}
    return {"fid10_over_own_fid100": ratio, "best_at_nfe": best, "best_on_the_edm_model_at_nfe": best_edm,
            "best_at_10_within_10pct_of_own_100": None if best10 is None else ratio.get(best10, 99) <= 1.10,
            "ocm_ddim_best_at_nfe": {t: b == "ocm-ddim" for t, b in best.items()}}


def markdown(res: dict) -> str:
    cells = {k: v for part in ("edm", "flow") for k, v in res.get(part, {}).get("cells", {}).items()}
    lines = ["# Few-step frontier on digits: which sampler at 5, 10, 20 NFE?", ""]
    for part in ("edm", "flow"):
        if part in res:
            lines.append(f"- `{part}`: n = {res[part]['n']}, seed {res[part]['seed']}; "
                         f"{provenance_line(res[part]['meta'])}")
    lines += ["", "FID-digits against all 1,797 digits (lower is better); each cell `FID (NFE used)`. Last column: "
              "FID at 10 NFE over the same row's FID at 100 NFE (the issue's goal: <= 1.10 for our best sampler).", ""]
    table = []
    for key, (label, model, _, grid) in ROWS.items():
        if f"{key}/10" not in cells:
            continue
        row = [label, model, grid]
        for t in (*NFES, REFERENCE_NFE):
            c = cells.get(f"{key}/{t}")
            row.append("" if c is None else f"{c['fid']:.4f} ({c['nfe']:g})")
        ref = cells.get(f"{key}/{REFERENCE_NFE}")
        row.append("" if ref is None else f"{cells[f'{key}/10']['fid'] / ref['fid']:.2f}")
        table.append(row)
    lines += [markdown_table(["sampler", "model", "grid", *(f"NFE {t}" for t in NFES), f"NFE {REFERENCE_NFE}",
                              "FID10 / FID100"], table), ""]
    s = res.get("summary", {})
    if s:
        lines += [f"- best sampler at each NFE: {s['best_at_nfe']}",
                  f"- best at 10 NFE within 10% of its own 100-NFE FID: {s['best_at_10_within_10pct_of_own_100']}",
                  f"- OCM-DDIM best at NFE: {s['ocm_ddim_best_at_nfe']}",
                  f"- best on the EDM digits model at each NFE: {s['best_on_the_edm_model_at_nfe']}", ""]
    checks = [(tag, c) for tag, part in res.items() if ":" in tag for c in part["cells"].values()]
    if checks:
        lines += ["## Seed check", "", "The same cells with other noise seeds (same n). Within one seed every sampler "
                  "starts from the same noise rows, so a ranking at one seed is a paired comparison; the shift between "
                  "seeds is FID's sampling noise at this n.", ""]
        table = []
        for tag, c in checks:
            main = cells.get(f"{c['row']}/{c['target_nfe']}")
            if main is not None:
                table.append([c["label"], c["target_nfe"], f"{main['fid']:.4f}", f"{c['fid']:.4f}", res[tag]["seed"]])
        lines += [markdown_table(["sampler", "NFE", "FID (main table)", "FID (this seed)", "seed"], table), ""]
    return "\n".join(lines)


def plot(res: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cells = {k: v for part in ("edm", "flow") for k, v in res.get(part, {}).get("cells", {}).items()}
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key, (label, model, _, _) in ROWS.items():
        pts = sorted((c["nfe"], c["fid"]) for c in cells.values() if c["row"] == key)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o" if model == "digits_flow" else "--.", ms=4,
                    label=f"{label} ({model})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("NFE")
    ax.set_ylabel("FID-digits (lower is better)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(OUT / "few_step.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("edm", "flow", "report"), required=True)
    ap.add_argument("--n", type=int, default=2000, help="samples per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default=None, help=f"comma-separated subset of the part's rows {list(ROWS)}")
    ap.add_argument("--nfes", default=None, help="comma-separated target NFEs (default 5,10,20,100)")
    ap.add_argument("--tag", default=None, help="store as a seed check '<part>:<tag>' instead of the main part")
    args = ap.parse_args()
    if args.n < 10:
        raise SystemExit(f"--n must be >= 10 (one sample per class at least), got {args.n}")
    rows = args.rows.split(",") if args.rows else None
    if args.part != "report" and rows and not set(rows) <= set(PARTS[args.part]):
        raise SystemExit(f"--rows: part {args.part!r} has rows {PARTS[args.part]}, got {rows}")
    if (rows or args.nfes) and not args.tag:
        raise SystemExit("--rows / --nfes make a partial run: give it a --tag (it is then reported as a seed check)")
    torch.set_num_threads(args.threads)
    res = _load()
    if args.part != "report":
        key = args.part if args.tag is None else f"{args.part}:{args.tag}"
        nfes = tuple(int(t) for t in args.nfes.split(",")) if args.nfes else None
        start = time.perf_counter()
        part = run_part(args.part, args.n, args.seed, rows, nfes)
        part["meta"] = {"wall_time_s": round(time.perf_counter() - start, 1), **provenance()}
        res = {**_load(), key: part}  # the other part may have been written meanwhile
    res["summary"] = summary(res)
    write_json(JSON_PATH, res)
    write_text(OUT / "few_step.md", markdown(res) + "\n")
    plot(res)
    print(markdown(res))


if __name__ == "__main__":
    main()
