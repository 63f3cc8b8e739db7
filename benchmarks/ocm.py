"""OCM learned covariances (Ou et al., ICLR 2025) vs fixed variances, DDIM and Analytic-DPM at few steps: the
head-accuracy, few-step, likelihood and digits checks of docs/methods/ocm.md ("Validation").

Parts (each writes its section of ``benchmarks/results/ocm/ocm.json``; ``ocm.md`` and ``ocm_steps.png`` there are
rebuilt from the JSON after every part):

* ``mixtures`` (head accuracy, few-step gates): on the three exact validation mixtures, SW1 (256 projections, 4000
  samples vs 4000 fresh true samples, mean over 3 sampler seeds) at K = 5, 10, 20 on the VP-linear grid for
  DDPM-beta-tilde, DDPM-beta, DDIM, Analytic-DDPM/DDIM, and OCM-DDPM/DDIM with the oracle covariance and with learned
  heads (``direct`` and ``hess``, 3000 iterations each; saved under ``runs/ocm_heads/`` (git-ignored) with the mixture's
  fingerprint and reused); head accuracy (relL1 per level) and gates (a)-(c).
* ``nelbo`` (likelihood gates): NELBO in nats/dim (4000 test points) for beta-tilde, beta, Analytic-DDPM, OCM with the
  oracle c, and the learned ``direct`` head with the 0.05 c_out^2 floor and with a raw clamp.
* ``digits`` (digits gate): feature FID (shipped classifier, ``n`` class-conditional samples against all 1797 digits) of
  the shipped digits UNet at K = 5, 10, 20 for every method, with the shipped OCM head (``digits_ocm``), plus the OCM
  step sweep for the headline: the fewest OCM steps whose FID matches DDIM at 20 steps.

Every row reports NFE; all methods of a cell share the grid, so they are compared at equal NFE (K).

    python benchmarks/ocm.py --part mixtures
    python benchmarks/ocm.py --part nelbo
    python benchmarks/ocm.py --part digits [--n 2000] [--seeds 0,1] [--sweep 5,7,10,14,20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

from steerdiff.app.protocols.ocm import (
    ANALYTIC,
    BASELINES,
    OCM,
    few_step_gates,
    head_accuracy,
    mixture_run,
    noise_floor,
    spec_mixture,
    train_mixture_head,
)
from steerdiff.core.sigmas import vp_linear
from steerdiff.covariance import AnalyticDPM, load_head, nelbo, save_head

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    ROOT,
    markdown_table,
    provenance,
    provenance_line,
    results_dir,
    write_json,
    write_text,
)

JSON_PATH = RESULTS / "ocm" / "ocm.json"
HEADS = ROOT / "runs" / "ocm_heads"  # trained mixture heads: model weights, kept out of the results
MIXTURES = ("gmm1d", "gmm2d", "gmm16d")
STEPS = (5, 10, 20)
SWEEP = (5, 7, 10, 14, 20)


def _load() -> dict:
    return json.loads(JSON_PATH.read_text()) if JSON_PATH.is_file() else {}


def _save(results: dict, part: str | None = None) -> dict:
    """Write ``results[part]`` (and its meta) into the JSON on disk, keeping the other parts (parts may run in
    parallel processes), then rebuild the markdown and the plot."""
    out = results_dir("ocm")
    if part is not None:
        merged = _load()
        merged[part] = results[part]
        merged.setdefault("meta", {})[part] = results["meta"][part]
        results = merged
    write_json(JSON_PATH, results)
    write_text(out / "ocm.md", markdown(results))
    plot(results)
    return results


def mixture_head(name: str, param: str):
    """The head-accuracy head of a mixture, trained once and stored with the mixture's fingerprint."""
    gmm = spec_mixture(name)
    path = HEADS / f"{name}_{param}"
    if (path / "config.json").is_file():
        return load_head(path, gmm), None
    res = train_mixture_head(gmm, param)
    save_head(res.head, path, denoiser=gmm, denoiser_name=f"validation mixture {name}")
    return res.head, {"train_wall_time_s": round(res.wall_time, 1), "loss_last": res.losses[-1]}


def part_mixtures(seeds: tuple[int, ...], params: tuple[str, ...] = ("direct", "hess"), names=MIXTURES,
                  previous: dict | None = None) -> dict:
    """``names`` other than all three update those mixtures' entries of ``previous`` (same seeds and params)."""
    out = {"seeds": list(seeds), "n": 4000, "grid": "VP-linear N=1000", "floors": {}, "cells": {}, "heads": {}}
    if previous is not None and tuple(names) != MIXTURES:
        assert previous["seeds"] == list(seeds), "updating needs the same seeds"
        out = {**previous, "floors": dict(previous["floors"]), "cells": dict(previous["cells"]),
               "heads": dict(previous["heads"])}
    for name in names:
        gmm = spec_mixture(name)
        out["floors"][name] = noise_floor(gmm, seeds=seeds)
        heads = {}
        for param in params:
            heads[param], info = mixture_head(name, param)
            out["heads"][f"{name}/{param}"] = {"accuracy": head_accuracy(gmm, heads[param]), "train": info}
        for k in STEPS:
            analytic = AnalyticDPM.fit(gmm, gmm, vp_linear(k)[:-1], n=4000, seed=k)
            cell = {}
            for m in BASELINES + ANALYTIC:
                cell[m] = mixture_run(gmm, m, k, analytic=analytic, seeds=seeds)
            for label, cov in (("oracle", gmm), *heads.items()):
                for m in OCM:
                    cell[f"{m}/{label}"] = mixture_run(gmm, m, k, covariance=cov, seeds=seeds)
            out["cells"][f"{name}/K{k}"] = cell
            print(name, k, {m: round(r["sw1"], 3) for m, r in cell.items()}, flush=True)
    for label, tol in (("oracle", 0.0), *((p, 0.005) for p in params)):
        cells = {key: {**{m: c[m]["sw1"] for m in BASELINES}, **{m: c[f"{m}/{label}"]["sw1"] for m in OCM}}
                 for key, c in out["cells"].items()}
        out[f"gates_{label}"] = few_step_gates(cells, tol=tol)
    return out


def part_nelbo(names=MIXTURES, previous: dict | None = None) -> dict:
    out = {"n": 4000, "floor_frac": 0.05, "cells": {}}
    if previous is not None and tuple(names) != MIXTURES:
        out = {**previous, "cells": dict(previous["cells"])}
    for name in names:
        gmm = spec_mixture(name)
        head, _ = mixture_head(name, "direct")
        x0 = gmm.sample(4000, generator=torch.Generator().manual_seed(77))
        out[f"nll/{name}"] = float(-gmm.log_prob(x0).mean()) / gmm.dim
        for k in STEPS:
            sig = vp_linear(k)
            analytic = AnalyticDPM.fit(gmm, gmm, sig[:-1], n=4000, seed=k)
            row = {}
            for label, cov, floor in (("beta-tilde", "zero", 0.0), ("beta", "beta", 0.0), ("analytic", analytic, 0.0),
                                      ("ocm/oracle", gmm, 0.0), ("ocm/direct+floor", head, 0.05),
                                      ("ocm/direct raw", head, 0.0)):
                r = nelbo(gmm, x0, sig, cov, seed=k, floor_frac=floor)
                row[label] = {"nelbo": r.mean, "stderr": r.stderr, "nfe": r.nfe}
            out["cells"][f"{name}/K{k}"] = row
            print(name, k, {m: round(v["nelbo"], 3) for m, v in row.items()}, flush=True)
    return out


def part_digits(n: int, seeds: tuple[int, ...], sweep: tuple[int, ...] = SWEEP, analytic_too: bool = True,
                clip_pixel: float | None = None, only: tuple[str, ...] | None = None) -> dict:
    """Digits FID per method and K. ``clip_pixel``: the official last-step variance clip for every method;
    methods outside ``only`` are copied from the unclipped run (same n and seeds) in ``ocm.json``: use this only
    for methods the clip leaves unchanged (DDIM, DDPM-beta-tilde: their last-step variance is 0 or below the bound,
    tested in tests/covariance/test_digits.py)."""
    from steerdiff.app.recipes.ocm_digits import digits_grid_sigmas, digits_samples, last_step_var_max
    from steerdiff.covariance import load_head_for
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import classifier_features, frechet_distance
    from steerdiff.models.io import load

    den, clf = load("digits"), load("digits_classifier")
    head = load_head_for("digits", den)
    x_all, _ = load_digits("all")
    x_tr, y_tr = load_digits("train")
    x_te, _ = load_digits("test")
    f_all = classifier_features(clf, x_all)
    analytic = (AnalyticDPM.fit(den, x_tr, digits_grid_sigmas(STEPS), n=x_tr.shape[0], labels=y_tr, c_max=1.0)
                if analytic_too else None)
    out = {"n": n, "seeds": list(seeds), "reference": "all 1797 digits", "grid": "VP-linear N=1000",
           "fid_train_vs_test": frechet_distance(classifier_features(clf, x_te), classifier_features(clf, x_tr)),
           "sweep": list(sweep), "clip_pixel": clip_pixel, "last_step_var_max": last_step_var_max(clip_pixel),
           "cells": {}}
    methods = BASELINES + (ANALYTIC if analytic_too else ()) + OCM
    copies = []
    for k in sorted(set(sweep) | set(STEPS)):
        for m in methods if k in STEPS else OCM:
            if only is not None and m not in only:
                copies.append(f"{m}/K{k}")
                continue
            fids, start = [], time.perf_counter()
            for seed in seeds:
                images, nfe, clamped = digits_samples(den, m, k, covariance=head, analytic=analytic, n=n, seed=seed,
                                                      clip_pixel=clip_pixel)
                fids.append(frechet_distance(f_all, classifier_features(clf, images)))
            out["cells"][f"{m}/K{k}"] = {"method": m, "steps": k, "nfe": nfe, "fid": sum(fids) / len(fids),
                                         "fid_seeds": fids, "clamped": clamped,
                                         "wall_s": round(time.perf_counter() - start, 1)}
            print(m, k, round(sum(fids) / len(fids), 4), flush=True)
    if copies:  # from the unclipped run, which may still be running in another process: wait for it
        for _ in range(240):
            reuse = _load().get("digits")
            if reuse and all(c in reuse["cells"] for c in copies):
                break
            time.sleep(30)
        assert reuse["n"] == n and reuse["seeds"] == list(seeds), "reuse needs the same n and seeds"
        for c in copies:
            out["cells"][c] = {**reuse["cells"][c], "copied_from_unclipped": True}
    target = out["cells"]["ddim/K20"]["fid"]
    for m in OCM:
        ok = [k for k in sorted(set(sweep) | set(STEPS)) if out["cells"][f"{m}/K{k}"]["fid"] <= target]
        out[f"steps_to_match_ddim20/{m}"] = min(ok) if ok else None
    cells = out["cells"]
    out["gate_k5"] = {
        "ocm-ddpm <= 0.9 x beta-tilde": cells["ocm-ddpm/K5"]["fid"] <= 0.9 * cells["ddpm-beta-tilde/K5"]["fid"],
        "ocm-ddim <= 1.05 x ddim": cells["ocm-ddim/K5"]["fid"] <= 1.05 * cells["ddim/K5"]["fid"]}
    return out


def part_headline(n: int, seeds: tuple[int, ...], ks: tuple[int, ...], clip_pixel: float | None) -> dict:
    """README headline: DDIM at 20 steps against OCM-DDIM / OCM-DDPM at ``ks`` steps (FID per seed, more samples)."""
    from steerdiff.app.recipes.ocm_digits import digits_samples
    from steerdiff.covariance import load_head_for
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import classifier_features, frechet_distance
    from steerdiff.models.io import load

    den, clf = load("digits"), load("digits_classifier")
    head = load_head_for("digits", den)
    f_all = classifier_features(clf, load_digits("all")[0])
    out = {"n": n, "seeds": list(seeds), "clip_pixel": clip_pixel, "cells": {}}
    runs = [("ddim", 20)] + [(m, k) for k in ks for m in OCM]
    for m, k in runs:
        fids = []
        for seed in seeds:
            images, nfe, _ = digits_samples(den, m, k, covariance=head, n=n, seed=seed, clip_pixel=clip_pixel)
            fids.append(frechet_distance(f_all, classifier_features(clf, images)))
        out["cells"][f"{m}/K{k}"] = {"method": m, "steps": k, "nfe": nfe, "fid": sum(fids) / len(fids),
                                     "fid_seeds": fids}
        print(m, k, [round(f, 4) for f in fids], flush=True)
    target = out["cells"]["ddim/K20"]
    for m in OCM:
        ok = [k for k in ks if out["cells"][f"{m}/K{k}"]["fid"] <= target["fid"]]
        out[f"steps_to_match_ddim20/{m}"] = min(ok) if ok else None
        # Per seed (paired noise): at how many seeds is OCM at K no worse than DDIM at 20?
        for k in ks:
            wins = sum(a <= b for a, b in zip(out["cells"][f"{m}/K{k}"]["fid_seeds"], target["fid_seeds"], strict=True))
            out["cells"][f"{m}/K{k}"]["seeds_no_worse_than_ddim20"] = wins
    return out


# -------------------------------------------------------------------------------------------------- reports


def _mixtures_markdown(mix: dict) -> list[str]:
    cols = list(next(iter(mix["cells"].values())).keys())
    rows = []
    for key, cell in mix["cells"].items():
        best = min(c["sw1"] for c in cell.values())
        rows.append((key, f"{next(iter(cell.values()))['nfe']:g}",
                     *(f"**{c['sw1']:.3f}**" if c["sw1"] == best else f"{c['sw1']:.3f}" for c in cell.values())))
    lines = [f"## SW1 on the validation mixtures (few-step gates; mean of seeds {mix['seeds']}, n = {mix['n']}, "
             "NFE = K)", "",
             "Noise floors (true vs true): " + ", ".join(f"{k} {v:.3f}" for k, v in mix["floors"].items()), "",
             markdown_table(["cell", "NFE", *cols], rows), ""]
    for label in ("oracle", "direct", "hess"):
        g = mix.get(f"gates_{label}")
        if g:
            b = "pass" if g["b"] else f"FAIL {g['b_failures']}"
            c = "pass" if g["c"] else f"FAIL {g['c_failures']}"
            lines.append(f"- gates ({label}): (a) geo-mean ratio {g['geo_mean_ratio']:.3f} -> "
                         f"{'pass' if g['a'] else 'FAIL'}; (b) {b}; (c) {c}")
    sigmas = [f"{r['sigma']:.3g}" for r in next(iter(mix["heads"].values()))["accuracy"]]
    heads = [(key, *(f"{r['rel_l1']:.3f}" for r in h["accuracy"])) for key, h in mix["heads"].items()]
    return lines + ["", "### Head accuracy: relL1 per sigma of the K = 10 grid", "",
                    markdown_table(["head", *sigmas], heads), ""]


def _nelbo_markdown(nel: dict) -> list[str]:
    cols = list(next(iter(nel["cells"].values())).keys())
    rows = [(key, f"{next(iter(row.values()))['nfe']:g}", f"{nel['nll/' + key.split('/')[0]]:.3f}",
             *(f"{v['nelbo']:.3f}" for v in row.values())) for key, row in nel["cells"].items()]
    return ["## NELBO in nats/dim (likelihood gates; DDPM family, 4000 test points, NFE = K)", "",
            markdown_table(["cell", "NFE", "true NLL", *cols], rows), ""]


def _headline_markdown(head: dict) -> list[str]:
    rows = [(c["method"], c["steps"], f"{c['fid']:.4f}", ", ".join(f"{f:.4f}" for f in c["fid_seeds"]))
            for c in head["cells"].values()]
    return [f"## Headline: OCM steps to match DDIM at 20 steps (digits, n = {head['n']}, seeds {head['seeds']}, "
            f"last-step clip {head['clip_pixel']})", "",
            markdown_table(["method", "K = NFE", "FID (mean)", "FID per seed"], rows), "",
            f"- OCM-DDIM: {head.get('steps_to_match_ddim20/ocm-ddim')} steps; OCM-DDPM: "
            f"{head.get('steps_to_match_ddim20/ocm-ddpm')} steps (None: no tried K matched)", ""]


def markdown(res: dict) -> str:
    lines = ["# OCM: learned diagonal covariances at few steps (checks of docs/methods/ocm.md, \"Validation\")", ""]
    if res.get("mixtures"):
        lines += _mixtures_markdown(res["mixtures"])
    if res.get("nelbo"):
        lines += _nelbo_markdown(res["nelbo"])
    for key in sorted(k for k in res if k.startswith("digits")):
        lines += _digits_markdown(res[key], key)
    if res.get("headline"):
        lines += _headline_markdown(res["headline"])
    meta = res.get("meta", {})
    if meta:
        lines += ["## Runs", "", *(f"- `{part}` ({m['wall_time_s']:g} s): {provenance_line(m)}" for part, m in
                                   meta.items()), ""]
    return "\n".join(lines)


def _digits_markdown(dig: dict, key: str) -> list[str]:
    if not dig:
        return []
    ks = sorted({c["steps"] for c in dig["cells"].values()})
    clip = (f"last-step clip {dig['clip_pixel']:g} grey level (var <= {dig['last_step_var_max']:.4f})"
            if dig.get("clip_pixel") else "no last-step clip (the digits gate's protocol)")
    rows = []
    for m in BASELINES + ANALYTIC + OCM:
        vals = [f"{dig['cells'][f'{m}/K{k}']['fid']:.4f}" if f"{m}/K{k}" in dig["cells"] else "" for k in ks]
        if any(vals):
            rows.append((m, *vals))
    return [f"## Digits feature-FID, {clip} (`{key}`; digits gate; shipped UNet + shipped OCM head, n = {dig['n']}, "
            f"seeds {dig['seeds']}, vs {dig['reference']}; train-vs-test FID {dig['fid_train_vs_test']:.3f})", "",
            markdown_table(["method", *(f"K={k} (NFE {k})" for k in ks)], rows), "",
            f"- steps OCM-DDIM needs to match DDIM at 20 steps: {dig.get('steps_to_match_ddim20/ocm-ddim')}",
            f"- steps OCM-DDPM needs to match DDIM at 20 steps: {dig.get('steps_to_match_ddim20/ocm-ddpm')}",
            f"- gate at K = 5: {dig['gate_k5']}", ""]


def plot(res: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = []
    for key in sorted(k for k in res if k.startswith("digits")):
        panels.append((f"{key} (feature FID)", res[key]["cells"], "fid"))
    if "mixtures" in res:
        for name in MIXTURES:
            cells = {}
            for key, cell in res["mixtures"]["cells"].items():
                if key.startswith(name + "/"):
                    k = int(key.split("/K")[1])
                    for m, r in cell.items():
                        cells[f"{m}/K{k}"] = {"method": m, "steps": k, "sw1": r["sw1"]}
            panels.append((f"{name} (SW1)", cells, "sw1"))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, (title, cells, metric) in zip(axes[0], panels, strict=True):
        methods = sorted({c.get("method") for c in cells.values()})
        for m in methods:
            pts = sorted((c["steps"], c[metric]) for c in cells.values() if c.get("method") == m)
            style = "-o" if m.startswith("ocm") else "--."
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=m, ms=4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("steps K (= NFE)")
        ax.set_title(title)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(JSON_PATH.parent / "ocm_steps.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("mixtures", "nelbo", "digits", "headline", "report"), required=True)
    ap.add_argument("--n", type=int, default=2000, help="digits samples per method and step count")
    ap.add_argument("--seeds", default=None, help="comma-separated sampler seeds (mixtures: 0,1,2; digits: 0)")
    ap.add_argument("--sweep", default=",".join(map(str, SWEEP)), help="digits: OCM step counts for the headline")
    ap.add_argument("--params", default="direct,hess", help="mixtures: head parameterisations to train and run")
    ap.add_argument("--mixtures", default=",".join(MIXTURES), help="mixtures/nelbo: a subset updates those entries")
    ap.add_argument("--no-analytic", action="store_true", help="digits: skip Analytic-DPM (saves a third)")
    ap.add_argument("--clip-pixel", type=float, default=None, help="digits: official last-step clip (grey levels)")
    ap.add_argument("--only", default=None, help="digits with --clip-pixel: methods to run; others are copied "
                    "from the unclipped run (only for methods the clip cannot change: ddim, ddpm-beta-tilde)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", RuntimeWarning)  # clamp counts are recorded in the results instead
    results = _load()
    start, part = time.perf_counter(), None
    if args.part == "mixtures":
        part = "mixtures"
        results["mixtures"] = part_mixtures(tuple(int(s) for s in (args.seeds or "0,1,2").split(",")),
                                            tuple(args.params.split(",")), tuple(args.mixtures.split(",")),
                                            results.get("mixtures"))
    elif args.part == "nelbo":
        part = "nelbo"
        results["nelbo"] = part_nelbo(tuple(args.mixtures.split(",")), results.get("nelbo"))
    elif args.part == "digits":
        part = "digits" if args.clip_pixel is None else f"digits_clip{args.clip_pixel:g}"
        results[part] = part_digits(args.n, tuple(int(s) for s in (args.seeds or "0").split(",")),
                                   tuple(int(k) for k in args.sweep.split(",")), not args.no_analytic,
                                   args.clip_pixel, tuple(args.only.split(",")) if args.only else None)
    elif args.part == "headline":
        part = "headline"
        results["headline"] = part_headline(args.n, tuple(int(s) for s in (args.seeds or "0,1").split(",")),
                                            tuple(int(k) for k in args.sweep.split(",")), args.clip_pixel)
    if part is not None:
        results.setdefault("meta", {})[part] = {"wall_time_s": round(time.perf_counter() - start, 1), **provenance()}
    results = _save(results, part)
    print(markdown(results))


if __name__ == "__main__":
    main()
