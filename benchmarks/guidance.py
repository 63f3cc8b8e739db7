"""Guidance at high scales on a shipped image model: CFG vs CFG-rescale vs APG (docs/methods/guidance.md, A1-A5).

For every guidance scale ``w`` in {1, 3, 5, 7.5, 10, 15} and every method, ``n`` class-conditional images are drawn
with EDM Euler (32 steps, karras(0.002, 80); ``--sampler heun`` as a diagnostic), classes spread evenly, the same
noise (seeds) for every method:

* ``cfg``: ``CFG(w)``;
* ``cfg_rescale``: ``CFGRescale(w, phi=0.7, space="D")``;
* ``apg``: ``APG(w, eta=0, momentum=-0.5, r_rms=r*)``, ``r*`` picked from ``--r-rms-grid`` at ``w = 7.5`` on a
  separate seed (``--select-seed``) by the amended rule (docs/methods/guidance.md, "Findings and amendments"): the
  lowest FID, where candidates within the FID's own noise band count as tied and the tie goes to the lower
  ``|dS| + clip``. The band is the spread ``|FID(A) - FID(B)|`` of two independent real sets A, B of the selection's
  size and class counts, scored against the same real reference in the same run (digits: two disjoint draws from the
  train split; shapes: two further generator seeds; see ``real_pair``);
* ``apg_eta0``: ablation, the projection only (``eta=0``, no clamp, no momentum);
* ``apg_r``: ablation, the clamp only (``eta=1``, ``r_rms=r*``, no momentum).

``w = 1`` is the conditional model for every method (one run, shared). Statistics: ``clip``, the share of raw
values outside [-1, 1]; ``range``, the mean per-image max - min on images clamped to [0, 1]; for RGB models ``dS``,
the mean HSV saturation minus the data's; ``clip>1.1`` (an addition to the protocol), the share of raw values
outside [-1.1, 1.1]: digits' background sits exactly at -1, so ``clip`` also counts tiny undershoots there; FID /
precision / recall (k = 3) in the shipped classifier's features against held-out real images; class accuracy of
the requested label. The pass criteria A1-A5 (docs/methods/guidance.md, "Image test (A1-A5)") are evaluated where
they apply (grayscale digits: no ``dS``, so A1 uses ``clip`` and A5 is skipped). A1 is the amended form (docs page,
"Findings and amendments"): ``clip_APG - clip_1 <= 0.5 (clip_CFG - clip_1)``, with ``clip_1`` the conditional model
at ``w = 1`` on the same seeds; the table reports the raw ``clip`` beside the added ``clip - clip_1``, and the spec
text's raw form is kept in the JSON as a report (``A1_raw_clip_report``), not a criterion.

Speed: APG's and CFG-rescale's wall time over CFG's for the same sampling run (same batch, scale, steps),
repetitions interleaved in one process, ratio of medians.

    python benchmarks/guidance.py --model digits --n 1000 --n-select 300 --threads 1   # the protocol's run
    python benchmarks/guidance.py --model digits --n 300                               # quick
    python benchmarks/guidance.py --model shapes --n 1000 --n-select 1000 --n-real 1000 --threads 1

``--reuse-rows JSON`` re-runs only the ``r_rms`` selection and its noise band, and takes the rows and wall times of
a saved run with the same settings when the pick agrees with its ``r_rms`` (Euler rows do not depend on the
selection rule); the shapes table was remade this way.

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
from steerdiff.app.protocols.quality import sample_classes
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
        return {"name": "digits", "model": model, "classifier": sd.models.load("digits_classifier").eval(),
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
        return {"name": "shapes", "model": model, "classifier": sd.models.load("shapes_classifier").eval(),
                "real": real, "num_classes": 16, "heads": 2, "slots": len(num_classes)}
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


REAL_BAND_SEEDS = (20000, 30000)  # shapes: seed bases of the noise band's two real sets (the reference is 12345)


def real_pair(setup: dict, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent real image sets of ``n`` images each, independent of the reference ``setup["real"]``, with
    the class counts of the ``n`` generated images they stand for (``labels_for``: classes spread evenly).

    The class counts matter: the classifier's features separate classes widely, so a set drawn at random carries
    the noise of its multinomial class counts, which the evenly spread generated sets do not have (on digits at
    n = 300, random draws from the train split give FID 0.4 to 3.7 against the test split, class-matched draws
    0.19 to 0.24). digits: disjoint draws per class from the train split (the reference is the test split);
    shapes: each (shape, colour) pair drawn from its own generator seed of the ``full`` split.
    """
    _, scored = labels_for(setup, n)
    if setup["name"] == "digits":
        from steerdiff.data.digits import load_digits

        pool, pool_labels = load_digits("train")
        gen = torch.Generator().manual_seed(seed)
        picks: tuple[list, list] = ([], [])
        for k in range(setup["num_classes"]):
            want = int((scored == k).sum())
            idx = (pool_labels == k).nonzero()[:, 0]
            if 2 * want > idx.numel():
                raise SystemExit(f"the noise band needs two disjoint sets of {want} digits '{k}' (--n-select={n}); "
                                 f"the train split has {idx.numel()}: use a smaller --n-select")
            idx = idx[torch.randperm(idx.numel(), generator=gen)]
            picks[0].append(idx[:want])
            picks[1].append(idx[want : 2 * want])
        return pool[torch.cat(picks[0])], pool[torch.cat(picks[1])]
    from steerdiff.data.shapes import generate

    combos = sorted({tuple(r) for r in scored.tolist()})
    sets = []
    for base in REAL_BAND_SEEDS:
        parts = [generate(int((scored == torch.tensor(c)).all(1).sum()), combos=[c], seed=base + i)[0]
                 for i, c in enumerate(combos)]
        sets.append(torch.cat(parts))
    return sets[0], sets[1]


def fid_noise_band(setup: dict, n: int, seed: int, real_f: torch.Tensor) -> dict:
    """The FID's own noise at ``n`` images (amendment 2): FID of two independent real sets against the reference,
    and their spread ``|FID(A) - FID(B)|``; ``fid_a_vs_b`` (the two sets against each other) is reported too."""
    a, b = (classifier_features(setup["classifier"], r) for r in real_pair(setup, n, seed))
    fid_a, fid_b = feature_scores(real_f, a)["fid"], feature_scores(real_f, b)["fid"]
    return {"n": n, "fid_a": fid_a, "fid_b": fid_b, "band": abs(fid_a - fid_b),
            "fid_a_vs_b": feature_scores(a, b)["fid"]}


def pick_r_rms(candidates: dict[str, dict], band: float) -> tuple[str, list[str]]:
    """Amendment 2: the lowest FID, candidates within ``band`` of it tied, the tie to the lowest ``|dS| + clip``.

    Returns the pick and the tied candidates (keys of ``candidates``, each ``{"fid", "score", ...}``).
    """
    best = min(c["fid"] for c in candidates.values())
    tied = [r for r, c in candidates.items() if c["fid"] <= best + band]
    return min(tied, key=lambda r: (candidates[r]["score"], candidates[r]["fid"])), tied


def select_r_rms(setup, grid, n, steps, seed, real_f) -> tuple[float, dict]:
    """``r_rms`` at ``w = 7.5`` on the selection seed by :func:`pick_r_rms`, with the noise band of ``n`` images."""
    band = fid_noise_band(setup, n, seed, real_f)  # first: it checks that the real sets exist before sampling
    candidates = {}
    for r in grid:
        out = evaluate(setup, make_guider("apg", 7.5, r), n, steps, seed, real_f)
        ds = abs(out.get("saturation_offset", 0.0))
        candidates[f"{r:g}"] = {"r_rms": r, "fid": out["fid"], "abs_dS": ds if "saturation_offset" in out else None,
                                "clip": out["clip_fraction"], "score": ds + out["clip_fraction"]}
        print(f"  r_rms={r:g}: FID {out['fid']:.4f}, |dS| + clip {ds + out['clip_fraction']:.4f} (w=7.5, seed {seed})",
              flush=True)
    pick, tied = pick_r_rms(candidates, band["band"])
    print(f"  noise band {band['band']:.4f} (real sets: FID {band['fid_a']:.4f}, {band['fid_b']:.4f}); tied {tied}; "
          f"pick r_rms={pick}", flush=True)
    return candidates[pick]["r_rms"], {"rule": "amendment 2", "w": 7.5, "seed": seed, "n": n,
                                       "candidates": candidates, "noise_band": band, "tied": tied, "pick": pick}


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
def criteria(rows: dict, rgb: bool) -> tuple[dict, dict]:
    """A1-A5 of docs/methods/guidance.md where they apply (A1 amended), and the reports that are not criteria (the
    spec text's raw-clip A1): two ``{name: passed}`` dicts."""
    def get(m, w, key):
        return rows[m][str(w)][key]

    out = {}
    clip_1 = get("cfg", 1.0, "clip_fraction")  # the conditional model on the same seeds (amendment 1)
    a1, raw = [], []
    for w in (10.0, 15.0):
        ok = get("apg", w, "clip_fraction") - clip_1 <= 0.5 * (get("cfg", w, "clip_fraction") - clip_1)
        raw_ok = get("apg", w, "clip_fraction") <= 0.5 * get("cfg", w, "clip_fraction")
        if rgb:
            ds_ok = abs(get("apg", w, "saturation_offset")) <= 0.5 * abs(get("cfg", w, "saturation_offset"))
            ok, raw_ok = ok and ds_ok, raw_ok and ds_ok
        a1.append(ok)
        raw.append(raw_ok)
    out["A1_apg_halves_added_clip" + ("_and_dS" if rgb else "") + "_at_w10_15"] = all(a1)
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
    return out, {"A1_raw_clip_report": all(raw)}


def markdown(result: dict) -> str:
    """The table and notes of a ``guidance_<model>.json`` (title and provenance line included)."""
    rgb = result["rgb"]
    clip_1 = result["rows"]["cfg"]["1.0"]["clip_fraction"]
    cols = ["method", "w", "clip", "clip - clip_1", "clip>1.1", "range"] + (["dS"] if rgb else [])
    cols += ["FID", "precision", "recall", "accuracy", "NFE"]
    rows = []
    for m, by_w in result["rows"].items():
        for w, r in by_w.items():
            cells = [m, w, f"{r['clip_fraction']:.4f}", f"{r['clip_fraction'] - clip_1:+.4f}",
                     f"{r['clip_fraction_1.1']:.4f}", f"{r['range']:.3f}"]
            cells += [f"{r['saturation_offset']:+.3f}"] if rgb else []
            cells += [f"{r['fid']:.3f}", f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['accuracy']:.3f}",
                      f"{r['nfe']:g}"]
            rows.append(cells)
    t = result["timing"]
    ref = result["reference"]
    sel = result["r_rms_selection"]
    band = sel["noise_band"]
    sel_rows = [(r, f"{c['fid']:.4f}", "-" if c["abs_dS"] is None else f"{c['abs_dS']:.4f}", f"{c['clip']:.4f}",
                 f"{c['score']:.4f}", "yes" if r in sel["tied"] else "no", "**pick**" if r == sel["pick"] else "")
                for r, c in sel["candidates"].items()]
    a1_rows = []
    for w in ("10.0", "15.0"):
        apg, cfg = result["rows"]["apg"][w], result["rows"]["cfg"][w]
        cells = [w, f"{apg['clip_fraction']:.4f}", f"{cfg['clip_fraction']:.4f}",
                 f"{apg['clip_fraction'] - clip_1:+.4f}", f"{cfg['clip_fraction'] - clip_1:+.4f}"]
        if rgb:
            cells += [f"{apg['saturation_offset']:+.4f}", f"{cfg['saturation_offset']:+.4f}"]
        a1_rows.append(cells)
    a1_cols = ["w", "clip APG", "clip CFG", "APG - clip_1", "CFG - clip_1"] + (["dS APG", "dS CFG"] if rgb else [])
    lines = [
        f"# Guidance benchmark: {result['model']}", "", provenance_line(result.get("meta", result)), "",
        markdown_table(cols, rows),
        "",
        f"Real images ({result['n_real']}): per-image range {ref['data_range']:.3f}"
        + (f", saturation {ref['data_saturation']:.3f}" if rgb else "") + f". clip_1 = {clip_1:.4f} (w = 1).",
        "",
        f"APG r_rms = {result['r_rms']:g}, picked at w = 7.5 on seed {result['select_seed']} ({sel['n']} images) by "
        "amendment 2: lowest FID; candidates within the noise band of the lowest count as tied; the tie goes to the "
        f"lowest |dS| + clip. Noise band {band['band']:.4f} = |FID(A) - FID(B)| of two independent real sets of "
        f"{band['n']} images against the same reference (FID {band['fid_a']:.4f} and {band['fid_b']:.4f}; "
        f"A against B: {band['fid_a_vs_b']:.4f}).",
        "",
        markdown_table(["r_rms", "FID", "abs(dS)", "clip", "abs(dS) + clip", "tied", ""], sel_rows),
        "",
        "A1 (amendment 1): clip_APG - clip_1 <= 0.5 (clip_CFG - clip_1)" + (" and |dS_APG| <= 0.5 |dS_CFG|" if rgb
                                                                             else "") + " at w = 10 and 15.",
        "",
        markdown_table(a1_cols, a1_rows),
        "",
        *([f"Rows and wall time taken from the earlier run in `{result['rows_from']['file']}` (same settings and "
           "the same r_rms; Euler rows do not depend on the selection rule), which was: "
           f"{provenance_line(result['rows_from'].get('meta') or {})}. The selection above is this run's.", ""]
          if result.get("rows_from") else []),
        f"Wall time, one Euler run of {t['batch']} images x {t['steps']} steps at w = {t['scale']:g}, "
        f"{t['repeats']} interleaved repeats: APG / CFG = {t['apg_over_cfg']:.3f}, "
        f"CFG-rescale / CFG = {t['cfg_rescale_over_cfg']:.3f}.",
        "",
        "Criteria (A1-A5, docs/methods/guidance.md; A1 amended): "
        + ", ".join(f"{k}: {'pass' if v else 'FAIL'}" for k, v in result["criteria"].items()),
        "",
        "Reported, not criteria: "
        + ", ".join(f"{k}: {'pass' if v else 'FAIL'}" for k, v in result.get("reports", {}).items()),
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


def load_saved_rows(path: str, args, scales: list[float], methods: list[str]) -> dict:
    """The saved result ``path`` for ``--reuse-rows``, after checking that its settings are this run's."""
    saved = json.loads(Path(path).read_text())
    want = {"model": args.model, "n": args.n, "steps": args.steps, "seed": args.seed}
    got = {k: saved.get(k) for k in want}
    if got != want or not saved.get("sampler", "").startswith(args.sampler):
        raise SystemExit(f"--reuse-rows {path}: saved settings {got} (sampler {saved.get('sampler')!r}) are not this "
                         f"run's {want} ({args.sampler})")
    missing = [(m, w) for m in methods for w in scales if str(w) not in saved["rows"].get(m, {})]
    if missing:
        raise SystemExit(f"--reuse-rows {path}: no saved rows for {missing}")
    return saved


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
    ap.add_argument("--reuse-rows", default=None, metavar="JSON",
                    help="a saved guidance_<model>.json made with the same settings: the r_rms selection (with its "
                         "noise band) is re-run, and when it picks the saved r_rms the saved rows and timing are taken "
                         "instead of re-sampling (they do not depend on the selection rule); otherwise all is re-run")
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
    saved = load_saved_rows(args.reuse_rows, args, scales, methods) if args.reuse_rows else None
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
    rows_from = None
    if saved is not None and saved["r_rms"] == r_star:
        rows = {m: saved["rows"][m] for m in methods}
        # A saved file whose rows were themselves reused names the run that made them.
        origin = saved.get("rows_from") or {"file": args.reuse_rows, "meta": saved.get("meta") or {
            k: saved[k] for k in ("command", "torch", "machine", "threads", "wall_time_s") if k in saved}}
        rows_from = {**origin, "timing": saved["timing"]}
        print(f"r_rms = {r_star:g} as in {args.reuse_rows}: its rows and timing are reused", flush=True)
    elif saved is not None:
        print(f"r_rms = {r_star:g}, not the saved {saved['r_rms']:g}: every row is re-run", flush=True)
    with torch.no_grad():
        for w in scales if rows_from is None else ():
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
    if rows_from is None:
        timing = time_ratios(setup, 7.5, r_star, args.timing_batch, args.steps, args.timing_repeats)
    else:
        timing = rows_from.pop("timing")
    reference = saturation_report(setup["real"], setup["real"])
    passed, reports = criteria(rows, rgb)
    result = {
        "model": args.model, "n": args.n, "steps": args.steps, "sampler": f"{args.sampler}, karras(0.002, 80, rho 7)",
        "seed": args.seed, "select_seed": args.select_seed, "r_rms": r_star, "r_rms_selection": selection,
        "rgb": rgb, "n_real": int(setup["real"].shape[0]),
        "reference": {k: v for k, v in reference.items() if k.startswith("data") or k == "clip_fraction"},
        "rows": rows, "timing": timing, "criteria": passed, "reports": reports, "rows_from": rows_from,
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
