"""Guidance at high scales on a shipped image model: CFG vs CFG-rescale vs APG (docs/methods/guidance.md, A1-A5).

For every guidance scale ``w`` in {1, 3, 5, 7.5, 10, 15} and every method, ``n`` class-conditional images are drawn
with EDM Euler (32 steps, karras(0.002, 80); ``--sampler heun`` as a diagnostic), classes spread evenly, the same
noise (seeds) for every method:

* ``cfg``: ``CFG(w)``;
* ``cfg_rescale``: ``CFGRescale(w, phi=0.7, space="D")``;
* ``apg``: ``APG(w, eta=0, momentum=-0.5, r_rms=r*)``, ``r*`` picked from ``--r-rms-grid`` at ``w = 7.5`` by the
  lowest FID on a separate seed (``--select-seed``);
* ``apg_eta0``: ablation, the projection only (``eta=0``, no clamp, no momentum);
* ``apg_r``: ablation, the clamp only (``eta=1``, ``r_rms=r*``, no momentum).

``w = 1`` is the conditional model for every method (one run, shared). Statistics: ``clip``, the share of raw
values outside [-1, 1]; ``range``, the mean per-image max - min on images clamped to [0, 1]; for RGB models ``dS``,
the mean HSV saturation minus the data's; ``clip>1.1`` (an addition to the protocol), the share of raw values
outside [-1.1, 1.1]: digits' background sits exactly at -1, so ``clip`` also counts tiny undershoots there; FID /
precision / recall (k = 3) in the shipped classifier's features against held-out real images; class accuracy of
the requested label. The pass criteria A1-A5 (docs/methods/guidance.md, "Image test (A1-A5)") are evaluated where
they apply (grayscale digits: no ``dS``, so A1 uses ``clip`` and A5 is skipped). A1 here compares raw ``clip``;
the amended form on the docs page ("Findings and amendments") compares the ``clip`` added over ``w = 1``.

Speed: APG's and CFG-rescale's wall time over CFG's for the same sampling run (same batch, scale, steps),
repetitions interleaved in one process, ratio of medians.

    python benchmarks/guidance.py --model digits --n 1000          # the protocol's run
    python benchmarks/guidance.py --model digits --n 300           # quick
    python benchmarks/guidance.py --model shapes                   # when a class-conditional shapes model ships

Writes ``benchmarks/results/guidance/guidance_<model>[_<tag>].json``, ``.md`` and ``.png`` (saturation / clip and
FID vs scale); ``--timing-only`` writes ``guidance_<model>_timing.json`` and ``.md`` there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.eval.quality import sample_classes
from steerdiff.guidance import CFG, build_guider
from steerdiff.metrics.images import class_accuracy, classifier_features, feature_scores
from steerdiff.metrics.saturation import clip_fraction, saturation_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

METHODS = ("cfg", "cfg_rescale", "apg", "apg_eta0", "apg_r")
SHAPES_COLOURS = 4  # shapes model: class k = shape * 4 + colour (an assumption until the model ships)


VARIANTS = {  # method -> (registered guider, options); "r_rms" is filled in with the selected value
    "cfg": ("cfg", {}),
    "cfg_rescale": ("cfg_rescale", {"phi": 0.7, "space": "D"}),
    "apg": ("apg", {"eta": 0.0, "momentum": -0.5, "r_rms": None}),
    "apg_eta0": ("apg", {"eta": 0.0, "momentum": 0.0}),
    "apg_r": ("apg", {"eta": 1.0, "momentum": 0.0, "r_rms": None}),
}


def make_guider(method: str, w: float, r_rms: float | None):
    if method not in VARIANTS:
        raise ValueError(f"unknown method {method!r}")
    name, options = VARIANTS[method]
    return build_guider(name, w, **{k: (r_rms if k == "r_rms" else v) for k, v in options.items()})


# --- models and data --------------------------------------------------------------------------------------------
def load_setup(name: str, n_real: int, weights: str | None = None) -> dict | None:
    """Model, classifier, real images and the label layout; None (with a message) if the model is not shipped.
    ``weights``: a saved model (name or directory) to use instead of the shipped ``name`` model."""
    shipped = sd.models.shipped_models()
    if name == "digits":
        from steerdiff.data.digits import load_digits

        for need in ("digits", "digits_classifier"):
            if need not in shipped:
                print(f"skipping: '{need}' is not shipped in steerdiff/assets (run scripts/make_assets.py)")
                return None
        real, _ = load_digits("test")
        model = sd.models.load(weights or "digits").eval()
        return {"model": model, "classifier": sd.models.load("digits_classifier").eval(),
                "real": real, "num_classes": 10, "heads": 1}
    if name == "shapes":
        if "shapes" not in shipped or "shapes_classifier" not in shipped:
            print("skipping: no class-conditional 'shapes' model (and 'shapes_classifier') is shipped yet; "
                  f"shipped models: {shipped}. The image test needs a 16-class model trained on the 'full' split.")
            return None
        from steerdiff.data.shapes import generate

        model = sd.models.load(weights or "shapes").eval()
        real, _ = generate(n_real, split="full", part="test", seed=12345)
        num_classes = tuple(getattr(model, "num_classes", ()))
        if num_classes not in ((16,), (4, 4)):
            print(f"skipping: the shapes model has num_classes={num_classes}; expected (16,) or (4, 4)")
            return None
        return {"model": model, "classifier": sd.models.load("shapes_classifier").eval(), "real": real,
                "num_classes": 16, "heads": 2, "slots": len(num_classes)}
    raise SystemExit(f"--model must be digits or shapes, got {name!r}")


def labels_for(setup: dict, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(condition passed to the model, labels the classifier is scored on)."""
    k = torch.arange(n) % setup["num_classes"]
    if setup["heads"] == 1:
        return k, k
    both = torch.stack([k // SHAPES_COLOURS, k % SHAPES_COLOURS], 1)
    return (both if setup.get("slots") == 2 else k), both


# --- one configuration ------------------------------------------------------------------------------------------
def evaluate(setup: dict, guider, n: int, steps: int, seed: int, real_f: torch.Tensor) -> dict:
    cond, scored = labels_for(setup, n)
    start = time.perf_counter()
    raw, nfe = sample_classes(setup["model"], cond, tuple(setup["real"].shape[1:]), steps=steps,
                              method=setup.get("sampler", "euler"), seed=seed, guidance=guider)
    wall = time.perf_counter() - start
    images = raw.clamp(-1, 1)
    gen_f = classifier_features(setup["classifier"], images)
    out = {"nfe": nfe, "wall_s": round(wall, 2), **saturation_report(raw, setup["real"]),
           "clip_fraction_1.1": clip_fraction(raw, value_range=(-1.1, 1.1)), **feature_scores(real_f, gen_f),
           "accuracy": class_accuracy(setup["classifier"], images, scored)}
    return out


def select_r_rms(setup, grid, n, steps, seed, real_f) -> tuple[float, dict]:
    scores = {}
    for r in grid:
        scores[r] = evaluate(setup, make_guider("apg", 7.5, r), n, steps, seed, real_f)["fid"]
        print(f"  r_rms={r:g}: FID {scores[r]:.4f} (w=7.5, seed {seed})", flush=True)
    return min(scores, key=scores.get), {str(k): v for k, v in scores.items()}


def time_ratios(setup, w: float, r_rms: float, batch: int, steps: int, repeats: int) -> dict:
    """Wall time of one sampling run with each guider / CFG's, interleaved, medians."""
    cond, _ = labels_for(setup, batch)
    noise = sd.randn((batch, *setup["real"].shape[1:]), seeds=0)
    sig = sd.sigmas.karras(steps, 0.002, 80.0)
    guiders = {"cfg": CFG(w), "cfg_rescale": make_guider("cfg_rescale", w, r_rms), "apg": make_guider("apg", w, r_rms)}
    times = {k: [] for k in guiders}
    with torch.no_grad():
        sd.sample(setup["model"], noise, sig, method="euler", cond=cond, guidance=CFG(w))  # warm-up
        for rep in range(repeats):
            order = list(guiders)[rep % 3 :] + list(guiders)[: rep % 3]  # rotate so drift hits all alike
            for name in order:
                t = time.perf_counter()
                sd.sample(setup["model"], noise, sig, method="euler", cond=cond, guidance=guiders[name])
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"batch": batch, "steps": steps, "scale": w, "repeats": repeats, "median_s": med,
            "apg_over_cfg": med["apg"] / med["cfg"], "cfg_rescale_over_cfg": med["cfg_rescale"] / med["cfg"]}


# --- criteria, table, plot --------------------------------------------------------------------------------------
def criteria(rows: dict, rgb: bool) -> dict:
    """A1-A5 of docs/methods/guidance.md where they apply (values and pass/fail)."""
    def get(m, w, key):
        return rows[m][str(w)][key]

    out = {}
    a1 = []
    for w in (10.0, 15.0):
        ok = get("apg", w, "clip_fraction") <= 0.5 * get("cfg", w, "clip_fraction")
        if rgb:
            ok = ok and abs(get("apg", w, "saturation_offset")) <= 0.5 * abs(get("cfg", w, "saturation_offset"))
        a1.append(ok)
    out["A1_apg_halves_clip" + ("_and_dS" if rgb else "") + "_at_w10_15"] = all(a1)
    # Added to the protocol: the same with clip measured outside [-1.1, 1.1] (digits' data sit on -1; docstring).
    out["A1b_apg_halves_clip>1.1_at_w10_15"] = all(
        get("apg", w, "clip_fraction_1.1") <= 0.5 * get("cfg", w, "clip_fraction_1.1") for w in (10.0, 15.0)
    )
    out["A2_fid_apg_lt_cfg_w>=7.5_and_le_1.1x_at_w3"] = all(
        get("apg", w, "fid") < get("cfg", w, "fid") for w in (7.5, 10.0, 15.0)
    ) and get("apg", 3.0, "fid") <= 1.1 * get("cfg", 3.0, "fid")
    out["A3_recall_apg_ge_cfg_w>=7.5"] = all(
        get("apg", w, "recall") >= get("cfg", w, "recall") for w in (7.5, 10.0, 15.0)
    )
    out["A4_accuracy_apg_ge_cfg_minus_0.03"] = all(
        get("apg", w, "accuracy") >= get("cfg", w, "accuracy") - 0.03 for w in rows["cfg"]
    )
    if rgb and "apg_eta0" in rows:
        out["A5_eta0_cuts_dS_by_30pct_at_w15"] = (
            abs(get("apg_eta0", 15.0, "saturation_offset")) <= 0.7 * abs(get("cfg", 15.0, "saturation_offset"))
        )
    return out


def markdown(result: dict) -> str:
    """The table and notes of a ``guidance_<model>.json`` (title and provenance line included)."""
    rgb = result["rgb"]
    cols = ["method", "w", "clip", "clip>1.1", "range"] + (["dS"] if rgb else [])
    cols += ["FID", "precision", "recall", "accuracy", "NFE"]
    rows = []
    for m, by_w in result["rows"].items():
        for w, r in by_w.items():
            cells = [m, w, f"{r['clip_fraction']:.4f}", f"{r['clip_fraction_1.1']:.4f}", f"{r['range']:.3f}"]
            cells += [f"{r['saturation_offset']:+.3f}"] if rgb else []
            cells += [f"{r['fid']:.3f}", f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['accuracy']:.3f}",
                      f"{r['nfe']:g}"]
            rows.append(cells)
    t = result["timing"]
    ref = result["reference"]
    lines = [
        f"# Guidance benchmark: {result['model']}", "", provenance_line(result.get("meta", result)), "",
        markdown_table(cols, rows),
        "",
        f"Real images ({result['n_real']}): per-image range {ref['data_range']:.3f}"
        + (f", saturation {ref['data_saturation']:.3f}" if rgb else "") + ".",
        f"APG r_rms = {result['r_rms']:g} (picked at w = 7.5 on seed {result['select_seed']}; FIDs "
        + ", ".join(f"{k}: {v:.3f}" for k, v in result["r_rms_selection"].items()) + ").",
        f"Wall time, one Euler run of {t['batch']} images x {t['steps']} steps at w = {t['scale']:g}, "
        f"{t['repeats']} interleaved repeats: APG / CFG = {t['apg_over_cfg']:.3f}, "
        f"CFG-rescale / CFG = {t['cfg_rescale_over_cfg']:.3f}.",
        "",
        "Criteria (A1-A5, docs/methods/guidance.md): "
        + ", ".join(f"{k}: {'pass' if v else 'FAIL'}" for k, v in result["criteria"].items()),
    ]
    return "\n".join(lines) + "\n"


def timing_markdown(timing: dict) -> str:
    """The table of a ``--timing-only`` run."""
    med = timing["median_s"]
    rows = [(name, f"{med[name]:.3f}", f"{med[name] / med['cfg']:.3f}") for name in med]
    return "\n".join([
        "# Guidance wall time (one Euler run per guider, interleaved repeats, medians)", "",
        provenance_line(timing.get("meta", timing)), "",
        f"{timing['batch']} images x {timing['steps']} steps at w = {timing['scale']:g}, {timing['repeats']} repeats, "
        f"APG r_rms = {timing['r_rms']:g}.", "",
        markdown_table(["guider", "median s", "/ CFG"], rows, align="lrr")]) + "\n"


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    rgb = result["rgb"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    sat_key, sat_label = ("saturation_offset", "saturation offset dS") if rgb else ("clip_fraction", "clip fraction")
    for m, by_w in result["rows"].items():
        ws = [float(w) for w in by_w]
        axes[0].plot(ws, [r[sat_key] for r in by_w.values()], "o-", label=m)
        axes[1].plot(ws, [r["range"] for r in by_w.values()], "o-", label=m)
        axes[2].plot(ws, [r["fid"] for r in by_w.values()], "o-", label=m)
    axes[1].axhline(result["reference"]["data_range"], color="k", ls="--", lw=1, label="data")
    if rgb:
        axes[0].axhline(0.0, color="k", ls="--", lw=1)
    for ax, title in zip(axes, [sat_label, "per-image range", "FID (classifier features)"], strict=True):
        ax.set_xlabel("guidance scale w (D_u + w (D_c - D_u))")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    sampler = result.get("sampler", "euler").split(",")[0].capitalize()
    fig.suptitle(f"{result['model']}: n = {result['n']} per point, {sampler} {result['steps']} steps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="digits", choices=["digits", "shapes"])
    ap.add_argument("--weights", default=None,
                    help="a saved model (name or directory) in place of the shipped --model one (same data, "
                         "classifier and protocol; use with --tag)")
    ap.add_argument("--n", type=int, default=1000, help="images per (method, scale)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--scales", default="1,3,5,7.5,10,15")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--select-seed", type=int, default=100000)
    ap.add_argument("--r-rms-grid", default="0.02,0.05,0.1")
    ap.add_argument("--n-select", type=int, default=None, help="images for the r_rms selection (default --n)")
    ap.add_argument("--n-real", type=int, default=1000, help="real images (shapes only; digits uses its test split)")
    ap.add_argument("--timing-batch", type=int, default=256)
    ap.add_argument("--timing-repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sampler", choices=("euler", "heun"), default="euler",
                    help="euler: the protocol's; heun (NFE 2 x steps - 1 per row) is a diagnostic of Euler's own bias")
    ap.add_argument("--tag", default="", help="suffix of the result files: guidance_<model>[_<tag>].json/.md/.png")
    ap.add_argument("--timing-only", type=float, default=None, metavar="R_RMS",
                    help="only the wall-time ratios at w = 7.5 with this APG r_rms (no sampling sweep); writes "
                         "guidance_<model>_timing.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.timing_only is not None:
        setup = load_setup(args.model, 16, args.weights)
        if setup is None:
            sys.exit(0)
        timing = time_ratios(setup, 7.5, args.timing_only, args.timing_batch, args.steps, args.timing_repeats)
        timing |= {"r_rms": args.timing_only, "meta": provenance()}
        stem = results_dir("guidance") / f"guidance_{args.model}_timing"
        write_json(stem.with_suffix(".json"), timing)
        write_text(stem.with_suffix(".md"), timing_markdown(timing))
        print(json.dumps(timing, indent=1))
        return
    scales = [float(s) for s in args.scales.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    if "cfg" not in methods or "apg" not in methods:
        raise SystemExit("--methods must include cfg and apg (the criteria compare them)")
    if not {3.0, 7.5, 10.0, 15.0} <= set(scales):
        raise SystemExit("--scales must include 3, 7.5, 10 and 15 (the criteria use them)")
    setup = load_setup(args.model, args.n_real, args.weights)
    if setup is None:
        sys.exit(0)
    setup["sampler"] = args.sampler
    t0 = time.perf_counter()
    real_f = classifier_features(setup["classifier"], setup["real"])
    rgb = setup["real"].shape[1] == 3
    print(f"{args.model}: {args.n} images per point, {args.sampler} {args.steps} steps; selecting r_rms ...",
          flush=True)
    grid = [float(r) for r in args.r_rms_grid.split(",")]
    r_star, selection = select_r_rms(setup, grid, args.n_select or args.n, args.steps, args.select_seed, real_f)

    rows: dict[str, dict[str, dict]] = {m: {} for m in methods}
    with torch.no_grad():
        for w in scales:
            shared = None
            for m in methods:
                if w == 1.0 and shared is not None:
                    rows[m][str(w)] = shared  # w = 1 is D_c for every guider: one run
                    continue
                r = evaluate(setup, make_guider(m, w, r_star), args.n, args.steps, args.seed, real_f)
                rows[m][str(w)] = r
                shared = r if w == 1.0 else None
                sat = f" dS {r['saturation_offset']:+.3f}" if rgb else ""
                print(f"  {m:12s} w={w:<5g} clip {r['clip_fraction']:.4f} range {r['range']:.3f}{sat} "
                      f"FID {r['fid']:.3f} P {r['precision']:.3f} R {r['recall']:.3f} acc {r['accuracy']:.3f} "
                      f"({r['wall_s']:.0f} s)", flush=True)
    timing = time_ratios(setup, 7.5, r_star, args.timing_batch, args.steps, args.timing_repeats)
    reference = saturation_report(setup["real"], setup["real"])
    result = {
        "model": args.model, "n": args.n, "steps": args.steps, "sampler": f"{args.sampler}, karras(0.002, 80, rho 7)",
        "seed": args.seed, "select_seed": args.select_seed, "r_rms": r_star, "r_rms_selection": selection,
        "rgb": rgb, "n_real": int(setup["real"].shape[0]),
        "reference": {k: v for k, v in reference.items() if k.startswith("data") or k == "clip_fraction"},
        "rows": rows, "timing": timing, "criteria": criteria(rows, rgb),
        "wall_time_s": round(time.perf_counter() - t0, 1), "meta": provenance(),
    }
    stem = results_dir("guidance") / (f"guidance_{args.model}" + (f"_{args.tag}" if args.tag else ""))
    write_json(stem.with_suffix(".json"), result)
    table = markdown(result)
    write_text(stem.with_suffix(".md"), table)
    plot(result, stem.with_suffix(".png"))
    print(table)


if __name__ == "__main__":
    main()
