"""Inverse problems: DPS vs DR (RED-diff) vs CR vs HR, checked against exact posteriors (docs/methods/inverse.md).

* G1 (bimodal 2-D, six y, 1000 chains) and G2 (random 8-D, seeds 0-5, 400 chains), 100 levels, lam 0.25, v 1,
  lr 0.25 (G1 also lr 0.1), DPS over s in {0.2, 0.6, 2.0}: posterior-mean error, mode TV, diversity, SW2; the pass
  rules of G1 / G2. G2 is also run on seeds 0-25 as a diagnostic, with each posterior's top component weight, and
  (``--only g2-readings``) under other readings of its problem text (``V.G2_READINGS``), none of which gives G2's
  first calibration numbers.
* Chi-square, a report for every method (none of them is calibrated to sigma_y): ``||y - A x||^2 / (m sigma_y^2)``
  of each method's samples for 100 measurements drawn from the prior (8-D mixture, m = 4), beside the exact
  posterior's own value (closed form, and from exact samples).
* The ring (``V.ring_table``; docs/methods/inverse.md, "Multimodal posteriors"): ``gmm2d`` through ``A = [1, 1]`` at
  ``y = 0``, 400 chains, 50 / 200 / 1000 levels, the API's defaults, and DR/CR/HR at the former fixed lr 0.1: mean
  ``|x|``, std along the line, posterior metrics, the share of chains the lag check flags.
* 8x8 digits (the digits protocol; our split has 1438 train / 359 test images): centre 4x4 inpainting and 2x
  average-pool super-resolution, sigma_y 0.05, the first ``--images`` test images, 8 chains, 100 levels, lam 0.25,
  v 1, lr 0.1, beta 0.2; DPS tuned over s in {0.3, 0.6, 1, 2} on 20 held-out test images (from index 200); three
  priors: (a), the shipped tiny MLP ``digits_mlp``; (b), the analytic surrogate (a 20-component mixture fit
  on train, whose exact posterior gives reference rows); and the shipped class-conditional UNet (null label), a
  stronger prior than (a) and (b). "HR-200" runs 200 levels, about DPS's wall time. PSNR / SSIM per chain
  against the clean image, diversity = mean over pixels of the std across chains. HR's re-used predicted noise is
  traced per level on 16 images (its rms is 1 for a calibrated denoiser), and the gain of its feedback loop,
  ``||I - dD/dx||_2``, is measured per prior at five levels (``--only jacobian``).
* Speed and memory: HR and DPS on the same batch (``--timing-images`` x 8 chains, 100 levels), repetitions
  interleaved, ratio of medians; peak memory = rise of the process's peak RSS (Linux VmHWM, reset through
  /proc/self/clear_refs after malloc_trim) over the run.

    OMP_NUM_THREADS=1 python benchmarks/inverse.py     # everything (CPU: ~20 min on a loaded 2-core box)
    python benchmarks/inverse.py --only gmm            # G1, G2, chi-square (~2 min)
    python benchmarks/inverse.py --only ring           # the bimodal ring at 50 / 200 / 1000 levels (~1 min)
    python benchmarks/inverse.py --only ring-sweep     # what moves DR/CR/HR there: levels, lr, beta, init... (~10 min)
    python benchmarks/inverse.py --only digits --priors gmm --images 30
    python benchmarks/inverse.py --only digits --priors mlp,model:runs/digits_mlp_2k/final --tag mlp_steps
    python benchmarks/inverse.py --only jacobian       # HR's noise feedback gain per prior (~1 min)
    python benchmarks/inverse.py --only g2-readings    # G2 under other readings of its text (~3 min)

Writes ``benchmarks/results/inverse/inverse.json`` and ``inverse.md`` (``inverse_<only>.*``, or
``inverse_<tag>.*``, for a partial run).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import steerdiff as sd
from steerdiff.app.protocols import inverse as V
from steerdiff.inverse import solve
from steerdiff.io import atomic_write_text, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir  # noqa: E402


# --- memory -----------------------------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_memory_mib(fn) -> float | None:
    """Rise of the peak RSS while ``fn()`` runs (MiB), or None where Linux's clear_refs is unavailable."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so reuse of cached blocks does not hide a rise
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        base = _status_kib("VmRSS")
    except (OSError, KeyError):
        fn()
        return None
    fn()
    return (_status_kib("VmHWM") - base) / 1024


# --- sections ---------------------------------------------------------------------------------------------------
def gmm_section() -> dict:
    out = {}
    g1 = V.run_suite(V.g1_problems(), V.g1_configs(0.25) | {k: v for k, v in V.g1_configs(0.1).items()
                                                             if not k.startswith("dps")})
    out["g1"] = {"table": g1, "criteria": V.g1_criteria(g1, 0.25), "criteria_lr0.1": V.g1_criteria(g1, 0.1)}
    problems = [V.g2_problem(s) for s in range(6)]
    g2 = V.run_suite(problems, V.g2_configs() | {"dps s=0.6": ("dps", {"scale": 0.6}), "cr": ("cr", {"lr": 0.25})})
    out["g2"] = {"table": g2, "criteria": V.g2_criteria(g2),
                 "top_posterior_weight": [float(p.posterior.weights.max()) for p in problems]}
    many = [V.g2_problem(s) for s in range(26)]
    g2x = V.run_suite(many, V.g2_configs())
    out["g2_seeds_0_25"] = {"mean": {k: v["mean"] for k, v in g2x.items()}, "criteria": V.g2_criteria(g2x),
                            "top_posterior_weight": [float(p.posterior.weights.max()) for p in many],
                            "hr_over_dr_mean_err": [h["mean_err"] / d["mean_err"] for h, d in
                                                    zip(g2x["hr"]["per_problem"], g2x["dr"]["per_problem"],
                                                        strict=True)]}
    wide = [V.g2_problem(s, x_star="wide") for s in range(6)]
    g2w = V.run_suite(wide, V.g2_configs())
    out["g2_wide_x_star"] = {"mean": {k: v["mean"] for k, v in g2w.items()}, "criteria": V.g2_criteria(g2w),
                             "top_posterior_weight": [float(p.posterior.weights.max()) for p in wide]}
    prob, _ = V.chi2_problem()
    configs = V.CHI2_CONFIGS | {f"dps s={s:g}": ("dps", {"scale": s}) for s in (0.1, 0.3, 0.6, 2.0)}
    out["chi2"] = {"report": V.chi2_report(prob, configs, chains=4)}
    return out


RING_STEPS = (50, 200, 1000)


def ring_section() -> dict:
    """The ring at the API's defaults, and DR/CR/HR at lr 0.1 (the fixed default before it followed the prior)."""
    fixed = {f"{m} lr=0.1": (m, {"lr": 0.1}) for m in ("dr", "cr", "hr")}
    return {"defaults": V.ring_table(RING_STEPS), "lr0.1": V.ring_table(RING_STEPS, configs=fixed)}


def _ring_rotated(problem: V.Problem) -> V.Problem:
    """The same ring problem rotated by 45 degrees, so that ``A = [0, sqrt 2]`` measures one coordinate (Adam's
    per-coordinate step makes DR/CR/HR depend on the basis; the exact posterior is the rotated one)."""
    from steerdiff.inverse import Matrix
    from steerdiff.models import GaussianMixture

    c = math.sqrt(0.5)
    rot = torch.tensor([[c, -c], [c, c]], dtype=torch.float64)
    p = problem.prior
    prior = GaussianMixture(p.weights, p.means @ rot.T, rot @ p.covs @ rot.T)
    return V.Problem("ring rotated", prior, Matrix(problem.operator.A @ rot.T), problem.y, problem.noise_std,
                     problem.chains)


def ring_sweep_section(seeds: tuple[int, ...] = (0, 1, 2)) -> dict:
    """What moves DR/CR/HR on the ring (means over ``seeds``): level count x lr, HR's beta, sigma_x0, a random start
    on the measured line, the Karras level schedule, the rotated basis; and G1 (six y, 500 chains) at 100 and 1000
    levels, where more levels hurt."""
    from steerdiff.inverse import exact_posterior, posterior_metrics

    ring = V.ring_problem()

    def run(problem, method, **kw):
        post = exact_posterior(problem.prior, problem.operator, problem.y, problem.noise_std)[0]
        rows = []
        for seed in seeds:
            res = solve(problem.prior, problem.operator, problem.y, method, noise_std=problem.noise_std,
                        chains=problem.chains, generator=1000 * seed, **kw)
            x = res.samples[0]
            if problem.name == "ring rotated":  # report in the original frame
                c = math.sqrt(0.5)
                x = x @ torch.tensor([[c, -c], [c, c]], dtype=torch.float64)
            rows.append(V.ring_stats(x) | posterior_metrics(res.samples[0], post, seed=seed))
        return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}

    out = {}
    for method in ("dr", "cr", "hr"):
        for steps in (50, 100, 200, 1000):
            for lr in (0.1, 0.25, 0.5, 1.0):
                out[f"{method} steps={steps} lr={lr:g}"] = run(ring, method, steps=steps, lr=lr)
        print(f"  ring sweep {method}: levels x lr done", flush=True)
    for steps in (100, 1000):
        for beta in (0.0, 0.05, 0.2, 0.5, 1.0):
            out[f"hr steps={steps} lr=0.5 beta={beta:g}"] = run(ring, "hr", steps=steps, lr=0.5, beta=beta)
    for sx in (0.01, 0.1):
        out[f"hr steps=100 lr=0.1 sigma_x0={sx:g}"] = run(ring, "hr", steps=100, lr=0.1, sigma_x0=sx)
    g = torch.Generator().manual_seed(5)
    start = 2.12 * torch.randn(ring.chains, 1, generator=g, dtype=torch.float64) * torch.tensor([[1.0, -1.0]],
                                                                                               dtype=torch.float64)
    for method in ("dr", "cr", "hr"):
        out[f"{method} steps=100 lr=0.1 init=random on the line"] = run(ring, method, steps=100, lr=0.1, init=start)
        out[f"{method} karras(100, 0.01, 80) lr=0.1"] = run(ring, method, lr=0.1,
                                                           sigmas=sd.sigmas.karras(100, 0.01, 80.0)[:-1])
        for steps in (50, 100):
            out[f"{method} rotated steps={steps} lr=0.1"] = run(_ring_rotated(ring), method, steps=steps, lr=0.1)
    print("  ring sweep: beta, sigma_x0, init, schedule, basis done", flush=True)
    g1 = {}
    for steps in (100, 1000):
        for lr in (0.1, 0.25, 0.5):
            table = V.run_suite(V.g1_problems(chains=500), {m: (m, {"lr": lr, "steps": steps})
                                                             for m in ("dr", "cr", "hr")})
            for m, t in table.items():
                g1[f"{m} steps={steps} lr={lr:g}"] = {k: t["mean"][k] for k in V.METRICS}
    return {"ring": out, "g1": g1, "seeds": list(seeds)}


def timing(prior, op, x, y, dps_scale: float, reps: int) -> dict:
    runs = {"hr": ("hr", dict(V.DIGITS_VARIATIONAL)), "dps": ("dps", {"scale": dps_scale})}
    times = {k: [] for k in runs}
    mem = {}
    for rep in range(reps):
        for label, (method, options) in runs.items():
            def go(label=label, method=method, options=options, rep=rep):
                t = time.perf_counter()
                solve(prior, op, y.to(x.dtype), method, noise_std=V.DIGITS_NOISE_STD, chains=8, generator=rep,
                      **options)
                times[label].append(time.perf_counter() - t)
            if rep == 0:
                mem[label] = peak_memory_mib(go)
            else:
                go()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"rows": x.shape[0] * 8, "reps": reps, "median_s": med, "all_s": times, "peak_mib": mem,
            "time_ratio_hr_dps": med["hr"] / med["dps"],
            "memory_ratio_hr_dps": (mem["hr"] / mem["dps"]) if mem.get("hr") and mem.get("dps") else None}


def digits_section(priors: list[str], n: int, timing_n: int, reps: int, tune_n: int = 20) -> dict:
    out = {}
    for kind in priors:
        prior = V.digits_prior(kind)
        dtype = torch.float64 if kind == "gmm" else torch.float32
        for task in V.DIGITS_TASKS:
            t0 = time.perf_counter()
            op, x, y = V.digits_problem(task, n, dtype=dtype)
            rows = V.digits_references(prior, op, x, y)
            _, xt, yt = V.digits_problem(task, tune_n, offset=200, dtype=dtype)
            tune = {s: V.digits_run(prior, op, xt, yt, "dps", scale=s) for s in V.DIGITS_DPS_GRID}
            best = max(tune, key=lambda s: tune[s]["psnr"])
            rows["dr"] = V.digits_run(prior, op, x, y, "dr")
            rows["hr"] = V.digits_run(prior, op, x, y, "hr")
            rows["dps"] = V.digits_run(prior, op, x, y, "dps", scale=best) | {"scale": best}
            rows["hr-200"] = V.digits_run(prior, op, x, y, "hr", steps=200)
            rows["hr_eps_rms"] = V.predicted_noise_rms(prior, op, y[:16], **V.DIGITS_VARIATIONAL)
            _, xs, ys = V.digits_problem(task, timing_n, dtype=dtype)
            rows["timing"] = timing(prior, op, xs, ys, best, reps)
            rows["dps_tuning"] = {f"{s:g}": r["psnr"] for s, r in tune.items()}
            out[f"{kind}/{task}"] = {"rows": rows, "criteria": V.digits_criteria(rows, task),
                                     "seconds": time.perf_counter() - t0}
            print(f"  digits {kind}/{task}: {time.perf_counter() - t0:.0f}s", flush=True)
    return out


def g2_readings_section(seeds: int = 6) -> dict:
    """G2 under each reading of its text in ``V.G2_READINGS`` (seeds 0..seeds-1, 400 chains): which one gives G2's
    first calibration numbers (``V.G2_CALIBRATION``)?"""
    out = {}
    for name, overrides in V.G2_READINGS.items():
        problems = [V.g2_problem(s, **overrides) for s in range(seeds)]
        table = V.run_suite(problems, V.g2_configs())
        out[name] = {"overrides": overrides, "mean": {k: v["mean"] for k, v in table.items()},
                     "criteria": V.g2_criteria(table),
                     "top_posterior_weight": [float(p.posterior.weights.max()) for p in problems]}
        print(f"  g2 reading {name!r}: " + ", ".join(f"{k} {v['mean']['mean_err']:.3f}/{v['mean']['tv']:.3f}"
                                                     for k, v in table.items()), flush=True)
    return out


JACOBIAN_SIGMAS = (1.2, 0.7, 0.5, 0.2, 0.05)


def jacobian_section(priors: list[str], n: int = 8) -> dict:
    """HR's noise feedback per prior (``V.noise_feedback_gain``) on the first ``n`` test images at a few levels."""
    x = V.digits_problem("inpaint-center", n, dtype=torch.float64)[1]
    out = {}
    for kind in priors:
        prior = V.digits_prior(kind)
        out[kind] = [V.noise_feedback_gain(prior, x, s) for s in JACOBIAN_SIGMAS]
        print(f"  jacobian {kind}: done", flush=True)
    return out


# --- report ---------------------------------------------------------------------------------------------------
def _fmt(v, nd=3):
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _criteria_md(crit: dict) -> str:
    return markdown_table(["rule", "value", "bound", ""],
                          [(k, _fmt(v), _fmt(b), "PASS" if ok else "FAIL") for k, (v, b, ok) in crit.items()], "lrrl")


def _gmm_md(g: dict) -> list[str]:
    lines = []
    for name in ("g1", "g2"):
        rows = [(label, f"{m['mean_err']:.3f}", f"{m['tv']:.3f}", f"{m['diversity']:.2f}",
                 f"{m['diversity_median']:.2f}", f"{m['sw2']:.3f}", f"{m['nfe']:.0f}", f"{m['nfe_vjp']:.0f}",
                 f"{m['wall_time_s']:.2f}") for label, m in ((k, t["mean"]) for k, t in g[name]["table"].items())]
        lines += [f"## {name.upper()}", "",
                  markdown_table(["run", "mean-err", "TV", "diversity (mean)", "diversity (median)", "SW2", "NFE",
                                  "VJP", "wall s"], rows, "l" + "r" * 8),
                  "", _criteria_md(g[name]["criteria"]), ""]
    lines += [f"G1 at lr 0.1: {sum(ok for *_, ok in g['g1']['criteria_lr0.1'].values())} of "
              f"{len(g['g1']['criteria_lr0.1'])} rules pass.", "",
              "G2 top posterior component weight per seed: "
              + ", ".join(f"{w:.2f}" for w in g["g2"]["top_posterior_weight"]), "",
              "G2 over seeds 0-25: " + ", ".join(f"{k} mean-err {v['mean_err']:.3f} TV {v['tv']:.3f}" for k, v in
                                                 g["g2_seeds_0_25"]["mean"].items())
              + f"; HR/DR mean-err per seed median {np.median(g['g2_seeds_0_25']['hr_over_dr_mean_err']):.2f}", ""]
    if "g2_wide_x_star" in g:
        lines += ["G2 diagnostic, not G2 as described: seeds 0-5 with `x* ~ N(0, 4 I)` instead of the prior: "
                  + ", ".join(f"{k} mean-err {v['mean_err']:.3f} TV {v['tv']:.3f}" for k, v in
                              g["g2_wide_x_star"]["mean"].items())
                  + "; rules: " + ", ".join(f"{k} {'PASS' if ok else 'FAIL'}" for k, (_, _, ok) in
                                            g["g2_wide_x_star"]["criteria"].items()), ""]
    rep = g["chi2"]["report"]
    rows = [(k, f"{rep[k]:.4g}", "1" if k.startswith("exact") else f"{rep['ratio'][k]:.3g}")
            for k in rep if k != "ratio"]
    return lines + ["## Chi-square of the measurement residual: a report, not a gate", "",
                    "DR, CR and HR never read sigma_y and DPS only through its step (docs/methods/inverse.md, "
                    "\"Findings and amendments\"). `exact` is the posterior's own value in closed form on these 100 "
                    "measurements, `exact samples` the same from exact posterior samples; below 1 over-fits the "
                    "noisy data, above 1 under-fits it.", "",
                    markdown_table(["samples", "chi2 / dof", "/ exact"], rows, "lrr"), ""]


def _ring_sweep_md(sweep: dict) -> list[str]:
    rows = [(k, f"{r['abs_x']:.2f}", f"{r['std_line']:.2f}", f"{r['mean_err']:.3f}", f"{r['tv']:.3f}",
             f"{r['diversity']:.2f}", f"{r['sw2']:.3f}") for k, r in sweep["ring"].items()]
    g1 = [(k, *(f"{r[m]:.3f}" for m in V.METRICS)) for k, r in sweep["g1"].items()]
    return ["## What moves DR/CR/HR on the ring (diagnostic)", "",
            f"Means over seeds {sweep['seeds']}, 400 chains each; exact posterior: mean abs(x) 3.00, std along the "
            "line 2.91.", "",
            markdown_table(["run", "mean abs(x)", "std along line", "mean-err", "TV", "diversity", "SW2"], rows,
                           "l" + "r" * 6), "",
            "G1 (six y, 500 chains) at 100 and 1000 levels:", "",
            markdown_table(["run", *V.METRICS], g1, "l" + "r" * len(V.METRICS)), ""]


def _ring_md(ring: dict) -> list[str]:
    rows = []
    for part in ("defaults", "lr0.1"):
        for label, r in ring[part].items():
            if part == "lr0.1" and label == "exact":
                continue
            rows.append((label, f"{r['abs_x']:.2f}", f"{r['std_line']:.2f}", f"{r['mean_err']:.3f}", f"{r['tv']:.3f}",
                         f"{r['diversity']:.2f}", f"{r['sw2']:.3f}", _fmt(r.get("lr")),
                         _fmt(r.get("flagged"), 2) if r.get("flagged") is not None else "-",
                         "yes" if r.get("warned") else "-"))
    return ["## The ring: a bimodal posterior (`V.ring_table`)", "",
            "`gmm2d` (8 modes on a ring of radius 3) through `A = [1, 1]` at `y = 0`, 400 chains: the exact posterior "
            "has two modes 3 from the pseudo-inverse start at the centre. `exact` is 400 exact posterior samples. "
            "Rows without `lr=` use the API's defaults (DR/CR/HR: `lr = 0.1 x scale / 0.5`, 0.42 here); `flagged`: "
            "share of chains whose lag exceeds 3 (warned above 5%).", "",
            markdown_table(["run", "mean abs(x)", "std along line", "mean-err", "TV", "diversity", "SW2", "lr",
                            "flagged", "warned"], rows, "l" + "r" * 9), ""]


def _digits_md(key: str, d: dict) -> list[str]:
    rows = d["rows"]
    table = []
    for label in ("baseline", "posterior_mean", "posterior_sample", "dr", "hr", "dps", "hr-200"):
        if label in rows:
            r = rows[label]
            table.append((f"dps s={r['scale']:g}" if label == "dps" else label, f"{r['psnr']:.2f}",
                          f"{r['ssim']:.3f}", f"{r['diversity']:.3f}", _fmt(r.get("nfe"), 0),
                          _fmt(r.get("nfe_vjp"), 0), _fmt(r.get("wall_time_s"), 1), r["nonfinite"]))
    t = rows["timing"]
    lines = [f"## Digits {key} ({rows['dr']['levels']} levels, 8 chains)", "",
             markdown_table(["run", "PSNR", "SSIM", "diversity", "NFE", "VJP", "wall s", "non-finite"], table,
                            "l" + "r" * 7),
             "", f"Timing ({t['rows']} rows, {t['reps']} interleaved reps): HR {t['median_s']['hr']:.2f}s, DPS "
             f"{t['median_s']['dps']:.2f}s, ratio HR/DPS {t['time_ratio_hr_dps']:.2f}; peak memory rise HR "
             f"{_fmt(t['peak_mib']['hr'], 1)} MiB, DPS {_fmt(t['peak_mib']['dps'], 1)} MiB. DPS tuning PSNR: "
             + ", ".join(f"s={s}: {p:.2f}" for s, p in rows["dps_tuning"].items()), ""]
    if "hr_eps_rms" in rows:
        e = rows["hr_eps_rms"]
        lines += [f"HR's re-used noise `eps_hat` (16 images x 2 chains; 1 for a calibrated denoiser): rms max "
                  f"{e['max']:.3g} at sigma {e['sigma_at_max']:.3g}, final {e['final']:.3g}.", ""]
    return lines + [_criteria_md(d["criteria"]), ""]


def _g2_readings_md(readings: dict) -> list[str]:
    rows = []
    for name, r in readings.items():
        m = r["mean"]
        rows.append((name, *(f"{m[k]['mean_err']:.3f} / {m[k]['tv']:.3f}" for k in ("dr", "hr", "dps s=2")),
                     f"{m['hr']['mean_err'] / m['dr']['mean_err']:.2f}", f"{m['hr']['tv'] / m['dr']['tv']:.2f}",
                     f"{statistics.median(r['top_posterior_weight']):.2f}"))
    return ["## G2 under readings of its text (seeds 0-5, 400 chains; mean-err / TV)", "",
            "G2's first (retired) calibration: " + ", ".join(f"{k} {e[0]:g}-{e[1]:g} / {t[0]:g}-{t[1]:g}"
                                                   for k, (e, t) in V.G2_CALIBRATION.items())
            + ". A reading reproduces it only if all three methods land in those ranges.", "",
            markdown_table(["reading", "DR", "HR", "DPS s=2", "HR/DR mean-err", "HR/DR TV",
                            "top posterior weight, median"], rows, "l" + "r" * 6), ""]


def _jacobian_md(jacobian: dict) -> list[str]:
    rows = [(kind, f"{r['sigma']:g}", f"{min(r['min_eig']):+.3f} / {statistics.mean(r['min_eig']):+.3f}",
             f"{max(r['gain']):.3f} / {statistics.mean(r['gain']):.3f}",
             f"{max(r['loop_gain']):.3f} / {statistics.mean(r['loop_gain']):.3f}")
            for kind, levels in jacobian.items() for r in levels]
    return ["## HR's noise feedback: `d eps_hat / d eps = I - dD/dx` (`V.noise_feedback_gain`)", "",
            "At `x = x0 + sigma n` for the first 8 test images. An exact denoiser has `dD/dx = Cov[x0|x]/sigma^2`"
            " (symmetric PSD): min eig >= 0. HR's recursion expands where the loop gain `sqrt(1 - beta) "
            "||I - dD/dx||_2` (beta 0.2) exceeds 1; an exact denoiser does that too where `Cov[x0|x] > 2 sigma^2`"
            " (between modes: the `gmm` rows), a network also through negative eigenvalues.", "",
            markdown_table(["prior", "sigma", "min eig sym(dD/dx), min / mean", "gain max / mean",
                            "loop gain max / mean"], rows, "lrrrr"), ""]


def markdown(res: dict) -> str:
    lines = ["# Inverse problems: DPS, DR (RED-diff), CR, HR (docs/methods/inverse.md)", "",
             provenance_line(res["meta"]), ""]
    if "gmm" in res:
        lines += _gmm_md(res["gmm"])
    if "ring" in res:
        lines += _ring_md(res["ring"])
    if "ring_sweep" in res:
        lines += _ring_sweep_md(res["ring_sweep"])
    for key, d in res.get("digits", {}).items():
        lines += _digits_md(key, d)
    if "g2_readings" in res:
        lines += _g2_readings_md(res["g2_readings"])
    if "jacobian" in res:
        lines += _jacobian_md(res["jacobian"])
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=["gmm", "ring", "ring-sweep", "g2-readings", "digits", "jacobian"],
                   default=None, help="one part; ring-sweep (a diagnostic, ~10 min) runs only when asked")
    p.add_argument("--priors", default="gmm,mlp,unet",
                   help="digits priors: gmm (analytic surrogate, prior (b)), mlp (prior (a), shipped digits_mlp), "
                        "unet (shipped), model:<name or directory> (any saved unconditional digits denoiser)")
    p.add_argument("--images", type=int, default=100)
    p.add_argument("--timing-images", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tag", default=None, help="results file stem suffix (default: the --only part)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    res = {"meta": provenance(argv, script=__file__)}
    start = time.perf_counter()
    if args.only in (None, "gmm"):
        res["gmm"] = gmm_section()
        print(f"gmm section: {time.perf_counter() - start:.0f}s", flush=True)
    if args.only in (None, "ring"):
        res["ring"] = ring_section()
        print(f"ring section: {time.perf_counter() - start:.0f}s", flush=True)
    if args.only == "ring-sweep":
        res["ring_sweep"] = ring_sweep_section()
    if args.only in (None, "g2-readings"):
        res["g2_readings"] = g2_readings_section()
    if args.only in (None, "digits"):
        res["digits"] = digits_section(args.priors.split(","), args.images, args.timing_images, args.reps)
    if args.only in (None, "jacobian"):
        res["jacobian"] = jacobian_section(args.priors.split(","))
    res["meta"]["seconds"] = time.perf_counter() - start
    suffix = args.tag or args.only
    stem = "inverse" if suffix is None else f"inverse_{suffix}"
    out = results_dir("inverse")
    write_json(out / f"{stem}.json", res)
    md = markdown(res)
    atomic_write_text(out / f"{stem}.md", md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
