"""Every registered guider beside CFG and APG at equal NFE across scales, on the shipped digits model, the shipped
shapes model and the shipped text-to-image pipeline (docs/methods/guidance.md; issue 37, "The table users need").

Guiders: ``cfg``, ``cfg_rescale`` (phi 0.7, D space), ``apg`` (eta 0, momentum -0.5, ``r_rms`` as picked by
``benchmarks/guidance.py``: digits 0.05, shapes 0.1, pipeline 0.05), ``cfg_zero_star``, ``tcfg``, ``mambo`` (registry
defaults), ``fdg`` (high band ``w``, low band ``1 + (w - 1) / 2``: equal weights would be CFG exactly), ``autoguidance``
(weak model ``digits_weak`` on digits, ``shapes_weak`` on shapes: the same UNet at 0.18x the parameters and fewer
training steps; not on the pipeline, which has no weak version) and, on the pipeline only (they perturb
attention layers, which the core models do not have), ``pag``, ``seg`` (layers ``mid``, defaults) and ``slg`` (the
UNet's ``mid`` block skipped, SD3's default window 0.01..0.2).

Equal-NFE rule (printed in the output): every guider runs the same sampler, steps, seeds and scales as CFG. The
NFE column counts network rows per image (CFG: 2 per evaluation, a doubled batch; the perturbation guiders: 3; a
guider outside its window or step: fewer); AutoGuidance's weak-model rows are counted apart (``weak NFE``, a network
of 0.18x the parameters on both core models). Where a guider costs more rows than CFG at the same steps (pag / seg /
slg), a row ``cfg @NFE`` runs CFG with ceil(steps x 3 / 2) steps: the same row budget spent on more steps.

Measures. digits / shapes (``benchmarks/guidance.py``'s ``evaluate``): FID, precision, recall (k = 3) in the shipped
classifier's features against held-out real images (FID-digits on digits), class accuracy (shapes: shape and colour
both right), ``clip`` = share of raw values outside [-1, 1] (digits' background sits at -1: ``clip>1.1`` too),
shapes' HSV saturation offset over the data, wall time. Pipeline (``steerdiff.app.protocols.shapes_pipeline``):
caption conformity by the shipped shapes classifier, shape / colour accuracy, saturation excess over the data
through the VAE, clipped share, wall time.

    python benchmarks/guiders.py                          # digits 500 x Heun 20, shapes 256, pipeline 8/caption
    python benchmarks/guiders.py --parts digits --n-digits 500 --steps 20 --scales 2,5,10
    python benchmarks/guiders.py --quick --out /tmp/g     # a smoke run (tests)
    python benchmarks/guiders.py --parts digits & python benchmarks/guiders.py --parts pipeline,shapes
    python benchmarks/guiders.py --combine benchmarks/results/guidance/guiders_{digits,pipeline_shapes}.json

Writes ``benchmarks/results/guidance/guiders.{json,md}`` (a subset of ``--parts``: ``guiders_<parts>.{json,md}``,
which ``--combine`` merges; ``--out`` another folder).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import guidance as gbench  # noqa: E402  (benchmarks/guidance.py: load_setup, evaluate)
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

from steerdiff.guidance import build_guider  # noqa: E402
from steerdiff.metrics.images import classifier_features  # noqa: E402

PARTS = ("digits", "shapes", "pipeline")
APG_R_RMS = {"digits": 0.05, "shapes": 0.1, "pipeline": 0.05}  # benchmarks/guidance.py's / shapes_pipeline's picks
OUTPUT_SPACE = ("cfg", "cfg_rescale", "apg", "cfg_zero_star", "tcfg", "fdg", "mambo")
PERTURBATION = ("pag", "seg", "slg")
GUIDERS = {"digits": (*OUTPUT_SPACE, "autoguidance"), "shapes": (*OUTPUT_SPACE, "autoguidance"),
           "pipeline": (*OUTPUT_SPACE, *PERTURBATION)}
WEAK = {"digits": "digits_weak", "shapes": "shapes_weak"}  # AutoGuidance's shipped weak models (scripts/make_assets.py)
EXTRA_ROWS = {"pag": 1, "seg": 1, "slg": 1}  # network rows per evaluation beyond CFG's two
RULE = ("Equal NFE: every guider runs CFG's sampler, steps, seeds and scales; NFE counts network rows per image "
        "(CFG 2 per evaluation, pag / seg / slg 3 inside their windows); AutoGuidance's weak-model rows are counted "
        "apart (weak NFE; the weak network has 0.18x the parameters). Guiders that cost more rows than CFG at the same "
        "steps are matched by a `cfg @NFE` row: CFG with ceil(1.5 x steps) steps, the same row budget.")


def options(name: str, part: str, w: float) -> dict:
    """The registered options of guider ``name`` in ``part`` (the rest are the registry's defaults)."""
    if name == "cfg_rescale":
        return {"phi": 0.7, "space": "D"}
    if name == "apg":
        return {"eta": 0.0, "momentum": -0.5, "r_rms": APG_R_RMS[part]}
    if name == "autoguidance":
        return {"weak": WEAK[part]}
    if name == "fdg":
        return {"low_scale": 1.0 + (w - 1.0) / 2}  # the paper's split (high w, low band half as far from 1)
    if name in ("pag", "seg", "slg"):
        return {"layers": "mid"}
    return {}


def _cost(r: dict, steps: int) -> str:
    weak = r.get("weak_nfe")
    return f"{r['nfe']:g}" + (f" + {weak:g} weak" if weak else "")


# --- digits and shapes: the class-conditional core models ----------------------------------------------------
def run_core(part: str, args) -> dict:
    n = args.n_digits if part == "digits" else args.n_shapes
    setup = gbench.load_setup(part, args.n_real)
    if setup is None:
        return {"skipped": f"the {part} model or its classifier is not shipped"}
    setup["sampler"] = "heun"
    real_f = classifier_features(setup["classifier"], setup["real"])
    rows = []

    def record(name: str, w: float, guider, steps: int) -> None:
        r = gbench.evaluate(setup, guider, n, steps, args.seed, real_f)
        weak = getattr(guider, "weak_evaluations", None)
        rows.append({"guider": name, "w": w, "steps": steps, "weak_nfe": weak, **r})
        print(f"{part} {name:14s} w={w:<5g} FID {r['fid']:.3f} P {r['precision']:.3f} R {r['recall']:.3f} "
              f"acc {r['accuracy']:.3f} clip {r['clip_fraction']:.4f} NFE {_cost(rows[-1], steps)} "
              f"({r['wall_s']:.0f} s)", flush=True)

    # AutoGuidance's rows run last (they load the weak model), then every row goes to its scale's place.
    chosen = [g for g in GUIDERS[part] if args.guiders is None or g in args.guiders]
    order = [(w, name) for name in chosen if name != "autoguidance" for w in args.scales]
    order = sorted(order, key=lambda wn: args.scales.index(wn[0]))
    order += [(w, "autoguidance") for w in args.scales if "autoguidance" in chosen]
    with torch.no_grad():
        record("plain", 1.0, None, args.steps)
        for w, name in order:
            record(name, w, build_guider(name, w, **options(name, part, w)), args.steps)
    rank = {name: i for i, name in enumerate(GUIDERS[part])}
    rows[1:] = sorted(rows[1:], key=lambda r: (args.scales.index(r["w"]), rank[r["guider"]]))
    return {"n": n, "steps": args.steps, "sampler": "heun, karras(0.002, 80, rho 7)", "seed": args.seed,
            "rgb": setup["real"].shape[1] == 3, "n_real": int(setup["real"].shape[0]), "rows": rows}


def core_markdown(part: str, res: dict) -> str:
    if "skipped" in res:
        return f"## {part}\n\nSkipped: {res['skipped']}.\n"
    rgb = res["rgb"]
    cols = ["guider", "w", "FID", "precision", "recall", "accuracy", "clip", "clip>1.1"] + (["dS"] if rgb else [])
    cols += ["NFE", "wall s"]
    rows = []
    for r in res["rows"]:
        cells = [r["guider"], f"{r['w']:g}", f"{r['fid']:.3f}", f"{r['precision']:.3f}", f"{r['recall']:.3f}",
                 f"{r['accuracy']:.3f}", f"{r['clip_fraction']:.4f}", f"{r['clip_fraction_1.1']:.4f}"]
        cells += [f"{r['saturation_offset']:+.3f}"] if rgb else []
        rows.append(cells + [_cost(r, res["steps"]), f"{r['wall_s']:.1f}"])
    fid = "FID-digits" if part == "digits" else "feature FID"
    accuracy = "class accuracy" if part == "digits" else "class conformity (shape and colour both right)"
    return (f"## {part}: {res['n']} images per row, {res['sampler']}, {res['steps']} steps, seeds {res['seed']}..\n\n"
            f"FID = {fid} against {res['n_real']} held-out real images; accuracy = {accuracy}; clip = share of raw "
            "values outside [-1, 1]" + ("; dS = HSV saturation minus the data's" if rgb else "") + ".\n\n"
            + markdown_table(cols, rows, align="lr" + "r" * (len(cols) - 2)) + "\n")


# --- the shipped pipeline ---------------------------------------------------------------------------------------
def run_pipeline(args) -> dict:
    from steerdiff.app.protocols import shapes_pipeline as sp

    try:
        pipe, judge = sp.load_shipped(), sp.load_judge()
    except FileNotFoundError as err:
        return {"skipped": str(err)}
    seen = sp.train_pairs()
    labels = sp.pair_labels(seen, args.pipe_n)
    reference = sp.reference_images(pipe, seen, args.pipe_n, seed=args.seed + 99)
    rows = []

    def record(name: str, w: float, guider, steps: int) -> None:
        start = time.perf_counter()
        try:
            images, nfe = sp.prompt_samples(pipe, seen, args.pipe_n, steps=steps, scale=w, guidance=guider,
                                            seed=args.seed)
        except (ValueError, TypeError, RuntimeError) as err:  # a perturbation the network does not allow
            rows.append({"guider": name, "w": w, "steps": steps, "error": f"{type(err).__name__}: {err}"})
            print(f"pipeline {name} w={w:g}: not run ({rows[-1]['error']})", flush=True)
            return
        rows.append({"guider": name, "w": w, "steps": steps, "nfe": nfe, "wall_s": time.perf_counter() - start,
                     **sp.image_scores(images, labels, judge, reference)})
        r = rows[-1]
        print(f"pipeline {name:14s} w={w:<5g} steps {steps} conformity {r['conformity']:.3f} excess "
              f"{r['saturation_excess']:+.4f} clipped {r['clipped']:.4f} NFE {nfe:g} ({r['wall_s']:.0f} s)",
              flush=True)

    matched = math.ceil(args.pipe_steps * 3 / 2)
    for w in args.pipe_scales:
        for name in [g for g in GUIDERS["pipeline"] if args.guiders is None or g in args.guiders]:
            try:
                guider = build_guider(name, w, **options(name, "pipeline", w))
            except (ValueError, TypeError) as err:
                rows.append({"guider": name, "w": w, "steps": args.pipe_steps, "error": f"{type(err).__name__}: {err}"})
                continue
            record(name, w, guider, args.pipe_steps)
        record("cfg @NFE", w, build_guider("cfg", w), matched)
    return {"n_per_caption": args.pipe_n, "captions": len(seen), "steps": args.pipe_steps, "matched_steps": matched,
            "sampler": "the pipeline's scheduler (Euler)", "seed": args.seed, "rows": rows}


def pipeline_markdown(res: dict) -> str:
    if "skipped" in res:
        return f"## pipeline\n\nSkipped: {res['skipped']}.\n"
    cols = ["guider", "w", "steps", "conformity", "shape acc", "colour acc", "saturation excess", "clipped", "NFE",
            "wall s"]
    rows = []
    for r in res["rows"]:
        if "error" in r:
            rows.append([r["guider"], f"{r['w']:g}", r["steps"], "not run: " + r["error"].split("\n")[0][:80]]
                        + [""] * (len(cols) - 4))
            continue
        rows.append([r["guider"], f"{r['w']:g}", r["steps"], f"{r['conformity']:.3f}", f"{r['shape_acc']:.3f}",
                     f"{r['colour_acc']:.3f}", f"{r['saturation_excess']:+.4f}", f"{r['clipped']:.4f}",
                     f"{r['nfe']:g}", f"{r['wall_s']:.1f}"])
    return (f"## pipeline: steerdiff/assets/shapes_pipeline, {res['n_per_caption']} images per seen caption "
            f"({res['captions']} captions), {res['sampler']}, {res['steps']} steps\n\n"
            "Conformity = the shipped shapes classifier finds the caption's shape and colour; saturation excess over "
            "data of the same captions through the VAE; clipped = share of pixels at the decoder's clamp. "
            f"`cfg @NFE` = CFG with {res['matched_steps']} steps (3 rows x {res['steps']} steps = 2 rows x "
            f"{res['matched_steps']}).\n\n" + markdown_table(cols, rows, align="lrr" + "r" * (len(cols) - 3)) + "\n")


# --- main -------------------------------------------------------------------------------------------------------
def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def part_markdown(part: str, res: dict) -> str:
    return pipeline_markdown(res) if part == "pipeline" else core_markdown(part, res)


def _merge_part(part: str, a: dict, b: dict) -> dict:
    """One part's rows from two runs with the same settings (split by ``--scales`` / ``--guiders``): the union of
    their rows, which may share only the plain row (the same seeds, so the same images); rows in scale order."""
    settings = [k for k in a if k not in ("rows", "matched_steps")]
    if "skipped" in a or "skipped" in b or any(a.get(k) != b.get(k) for k in settings):
        raise SystemExit(f"--combine: part {part!r} is in more than one file with different settings")
    have = {(r["guider"], r["w"]) for r in a["rows"]}
    rows = list(a["rows"])
    for r in b["rows"]:
        if (r["guider"], r["w"]) in have:
            if r["guider"] == "plain":
                continue
            raise SystemExit(f"--combine: part {part!r}: row {r['guider']} w={r['w']:g} is in more than one file")
        rows.append(r)
    rank = {name: i for i, name in enumerate(("plain", *GUIDERS[part], "cfg @NFE"))}
    rows.sort(key=lambda r: (r["guider"] != "plain", r["w"], rank.get(r["guider"], len(rank))))
    return {**a, "rows": rows}


def combine(paths: list[Path], out: Path) -> dict:
    """``guiders.{json,md}`` from per-part runs (``guiders_<parts>.json``, e.g. run side by side): every part with
    its runs' provenance lines. Runs of the same part with the same settings, split by ``--scales`` or
    ``--guiders``, are merged row by row (a row may come from one run only, the shared plain row excepted)."""
    import json

    results, runs, sources = {}, [], {}
    for path in paths:
        saved = json.loads(Path(path).read_text())
        runs.append({"file": Path(path).name, "meta": saved["meta"], "parts": list(saved["results"])})
        for part, res in saved["results"].items():
            results[part] = _merge_part(part, results[part], res) if part in results else res
            sources.setdefault(part, []).append(provenance_line(saved["meta"]))
    order = {p: i for i, p in enumerate(PARTS)}
    texts = [part_markdown(part, results[part]) + "".join(f"\nRun: {line}\n" for line in sources[part])
             for part in sorted(results, key=order.get)]
    write_json(out / "guiders.json", {"rule": RULE, "runs": runs, "results": results})
    write_text(out / "guiders.md", "\n".join(["# Every guider at equal NFE across scales\n",
                                              f"Combined from {', '.join(r['file'] for r in runs)}.", "", RULE, "",
                                              *texts]))
    return results


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {PARTS}")
    ap.add_argument("--n-digits", type=int, default=500, help="digits images per row")
    ap.add_argument("--n-shapes", type=int, default=256, help="shapes images per row")
    ap.add_argument("--n-real", type=int, default=1000, help="real shapes images (digits: the test split)")
    ap.add_argument("--steps", type=int, default=20, help="Heun steps (digits, shapes)")
    ap.add_argument("--scales", type=_floats, default=[2.0, 5.0, 10.0], help="guidance scales (digits, shapes)")
    ap.add_argument("--pipe-n", type=int, default=8, help="pipeline images per seen caption (8 captions)")
    ap.add_argument("--pipe-steps", type=int, default=20)
    ap.add_argument("--pipe-scales", type=_floats, default=[7.5, 15.0, 30.0])
    ap.add_argument("--guiders", type=lambda t: [g for g in t.split(",") if g], default=None,
                    help="comma-separated subset of the guiders to run (default all; the plain row always runs); "
                         "runs of one part split by --guiders or --scales are merged by --combine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 16 images, 3 steps, one scale, pipeline 1 image per caption (for tests)")
    ap.add_argument("--out", type=Path, default=None, help="folder of guiders.{json,md} (default: "
                                                           "benchmarks/results/guidance)")
    ap.add_argument("--combine", type=Path, nargs="+", default=None, metavar="JSON",
                    help="no sampling: merge per-part results (guiders_<parts>.json) into guiders.{json,md}")
    args = ap.parse_args(argv)
    if args.combine:
        out = args.out or results_dir("guidance")
        out.mkdir(parents=True, exist_ok=True)
        return combine(args.combine, out)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"--parts: unknown {unknown}; choose from {list(PARTS)}")
    known = {g for p in parts for g in GUIDERS[p]}
    if args.guiders is not None and sorted(set(args.guiders) - known):
        ap.error(f"--guiders: unknown {sorted(set(args.guiders) - known)}; choose from {sorted(known)}")
    if args.quick:
        args.n_digits = args.n_shapes = 16
        args.n_real = 64
        args.steps = args.pipe_steps = 3
        args.scales, args.pipe_scales = [3.0], [7.5]
        args.pipe_n = 1
    torch.set_num_threads(args.threads)
    meta = provenance(argv, script=__file__, packages=("diffusers",))
    t0 = time.perf_counter()
    results = {}
    texts = []
    for part in parts:
        results[part] = run_pipeline(args) if part == "pipeline" else run_core(part, args)
        texts.append(part_markdown(part, results[part]))
    out = args.out or results_dir("guidance")
    out.mkdir(parents=True, exist_ok=True)
    stem = "guiders" if parts == list(PARTS) else "guiders_" + "_".join(parts)
    doc = "\n".join(["# Every guider at equal NFE across scales\n", provenance_line(meta), "", RULE, "", *texts])
    saved_args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    write_json(out / f"{stem}.json", {"meta": meta, "rule": RULE, "quick": args.quick, "args": saved_args,
                                      "wall_time_s": round(time.perf_counter() - t0, 1), "results": results})
    write_text(out / f"{stem}.md", doc)
    print(doc)
    return results


if __name__ == "__main__":
    main()
