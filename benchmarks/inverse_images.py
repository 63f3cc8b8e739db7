"""Every inverse solver on images at equal NFE (docs/methods/inverse.md, "On images"): the shipped digits model and
the shipped latent shapes pipeline through its VAE decoder. PSNR, SSIM, a feature distance (LPIPS-free: the shipped
classifier's penultimate features) and the chain spread.

Parts (``--parts``, comma-separated):

* ``digits``: the shipped class-conditional digits UNet (``digits``, null label) as the prior; tasks
  ``inpaint-center`` (a centred 4x4 box), ``inpaint-random`` (50 % of the pixels kept) and ``sr2`` (2x2 average
  pooling); ``sigma_y = 0.05`` in model units ([-1, 1] images; 0.025 on a [0, 1] scale); the first ``--n`` test
  images, ``--chains`` independent chains per measurement (MCGDiff: one population of that many particles);
  ``--nfe`` denoiser calls per chain for every solver (DAPS: ``nfe / 5`` levels x 5 ODE steps); every solver at
  its library defaults (no tuning on these images).
* ``shapes``: the shipped latent pipeline (``steerdiff/assets/shapes_pipeline``, unconditional: the empty prompt)
  through ``steerdiff.pipelines.through_decoder``; clean images are ``--shape-per-pair`` (1) data images of each
  of the 8 training (shape, colour) pairs on the 32x32 canvas, tasks ``box`` (a centred 16x16 hole) and ``sr4``
  (4x4 average pooling, 192 measurements for 256 latent entries), ``sigma_y = 0.05`` in pixel units; 31 levels
  of the pipeline's schedule, 31 NFE (DAPS 7 levels x 5 ODE steps, 35 NFE). DDNM, PiGDM, DDRM, DiffPIR and
  MCGDiff refuse the decoded operator (their messages are listed); DPS and DAPS take a step chosen on held-out
  images (other seeds) from a small grid (DAPS with 10 Langevin steps per level, each a decoder pass and its
  gradient); DR / CR / HR start from the VAE encoder's latents of the pixel pseudo-inverse.
* ``sweep``: step sizes without a sweep table: each solver's automatic default beside a small grid of its
  knob on the digits ``--sweep-tasks`` (``inpaint-center``), on held-out test images (from index 200).

Metrics per solver and task (means over images and chains): PSNR ``10 log10(4 / MSE)`` and SSIM (3x3 windows) of
each chain against the clean image; ``feat`` the Euclidean distance between the shipped classifier's penultimate
features (``digits_classifier``; ``shapes_classifier`` on the canvas' 12x12 centre) of a chain and of the clean
image; ``acc`` the share of chains that classifier labels as the clean image's class (digit, or shape and colour);
``spread`` the per-pixel std across the chains of one measurement, averaged over pixels and measurements
(``steerdiff.inverse.metrics.chain_diversity``). ``baseline`` is the measurement alone (``pinv``; through the
decoder: the encoder's latents of it, decoded).

    OMP_NUM_THREADS=1 python benchmarks/inverse_images.py                 # all parts, ~12 CPU-min
    python benchmarks/inverse_images.py --parts digits --n 8 --chains 4   # a quick look

Writes ``benchmarks/results/inverse/images_<part>.{json,md}`` per part and ``images.md``, all parts' latest results
(the parts may run as separate processes: ``--parts digits & --parts shapes & --parts sweep``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.app.protocols import inverse as V
from steerdiff.inverse.metrics import chain_diversity, psnr, ssim
from steerdiff.metrics.images import classifier_features

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

SOLVERS = ("dps", "dr", "cr", "hr", "ddnm", "pigdm", "ddrm", "diffpir", "daps", "mcgdiff")
DIGIT_TASKS = ("inpaint-center", "inpaint-random", "sr2")
NOISE = 0.05
LATENT_LANGEVIN = 10
# Step-size knobs around each solver's automatic default (``None``: the default itself), for ``--parts sweep``.
SWEEP = {"dps": ("scale", (None, "config", 0.1, 0.3, 1.0, 3.0)),
         "hr": ("lr", (None, 0.03, 0.3)),
         "pigdm": ("scale", (None, 0.5, 2.0)),
         "diffpir": ("lam", (None, 1.0, 3.0, 50.0)),
         "daps": ("lr_scale", (None, 0.03, 0.3)),
         "ddrm": ("eta", (None, 0.5, 1.0)),
         "ddnm": ("eta", (None, 0.5, 1.0))}


def scores(samples: torch.Tensor, clean: torch.Tensor, feats, labels: torch.Tensor) -> dict:
    """PSNR, SSIM, feature distance, classifier agreement and chain spread of ``samples [M, K, *shape]`` against
    ``clean [M, *shape]``; ``feats(images) -> (features, predicted labels)``."""
    m, k = samples.shape[:2]
    flat = samples.flatten(0, 1).float().clamp(-1, 1)
    ref = clean[:, None].expand_as(samples).flatten(0, 1).float()
    f_s, pred = feats(flat)
    f_c, _ = feats(clean.float())
    dist = (f_s - f_c.repeat_interleave(k, 0)).norm(dim=1)
    lab = labels.repeat_interleave(k, 0)
    agree = (pred == lab).reshape(pred.shape[0], -1).all(1)
    return {"psnr": float(psnr(flat, ref).mean()), "ssim": float(ssim(flat, ref).mean()),
            "feat": float(dist.mean()), "acc": float(agree.double().mean()),
            "spread": float(chain_diversity(samples.float().clamp(-1, 1)).mean())}


def solve_timed(*args, **kwargs) -> tuple[sd.inverse.InverseResult, float]:
    t = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lag / noise-feedback warnings: the table shows the outcome
        res = sd.inverse.solve(*args, **kwargs)
    return res, time.process_time() - t


# --------------------------------------------------------------------------------------------------- digits
def digits_features():
    clf = sd.models.load("digits_classifier").eval().requires_grad_(False)

    def feats(images):
        return classifier_features(clf, images), clf.predict(images)

    return feats


def digits_labels(n: int, offset: int = 0) -> torch.Tensor:
    from steerdiff.data.digits import load_digits

    return load_digits("test")[1][offset:offset + n]


def digits_solve(prior, op, y, method: str, nfe: int, chains: int, seed: int = 0, **options):
    steps = nfe // 5 if method == "daps" else nfe
    return solve_timed(prior, op, y, method, noise_std=NOISE, chains=chains, steps=steps, generator=seed, **options)


# every solver at its defaults (DPS: its step rule), and DPS at the DPS configs' published step of the task
DIGIT_CONFIGS = {**{m: (m, {}) for m in SOLVERS}, "dps scale=config": ("dps", {"scale": "config"})}


def selected(args, name: str) -> bool:
    """Whether ``--solvers`` (comma-separated method names; empty: all) selects the row ``name``."""
    return not args.solvers or name.split()[0] in args.solvers.split(",")


def previous(args, part: str) -> dict:
    """The part's last results, kept for the rows a ``--solvers`` run does not recompute."""
    path = results_dir("inverse") / f"images_{part}.json"
    if not args.solvers or not path.exists():
        return {}
    import json

    return json.loads(path.read_text())["result"]


def part_digits(args) -> tuple[dict, str]:
    prior, feats = V.digits_prior("unet"), digits_features()
    labels = digits_labels(args.n)
    out, lines = {}, []
    for task in DIGIT_TASKS:
        op, x, y = V.digits_problem(task, args.n)
        rows = {"clean": scores(x[:, None], x, feats, labels) | {"nfe": 0, "cpu_s": 0.0},
                "baseline": scores(op.pinv(y)[:, None], x, feats, labels) | {"nfe": 0, "cpu_s": 0.0}}
        rows |= {k: v for k, v in previous(args, "digits").get(task, {}).items() if k not in rows}
        for name, (method, opts) in DIGIT_CONFIGS.items():
            if not selected(args, name):
                continue
            res, cpu = digits_solve(prior, op, y, method, args.nfe, args.chains, **opts)
            rows[name] = scores(res.samples, x, feats, labels) | {"nfe": res.nfe, "vjp": res.nfe_vjp, "cpu_s": cpu}
            print(f"digits {task} {name}: {rows[name]}", flush=True)
        out[task] = {k: rows[k] for k in ("clean", "baseline", *DIGIT_CONFIGS) if k in rows}
    for task, rows in out.items():
        lines.append(f"### {task}\n\n" + image_table(rows) + "\n")
    head = (f"## Digits (shipped UNet `digits`, null label), {args.nfe} NFE, sigma_y = {NOISE}\n\n"
            f"The first {args.n} test images x {args.chains} chains; every solver at its defaults (`dps`: its step "
            "rule; `dps scale=config`: the DPS configs' step of the task, 0.5 inpainting, 0.3 super-resolution). "
            "`clean` is the "
            "clean image itself (its `acc` is the classifier's accuracy on these images), `baseline` the "
            "measurement's pseudo-inverse. Columns: PSNR (dB) / SSIM / feature distance (`digits_classifier` "
            "features, 0 is the clean image) / classifier agreement with the true digit / per-pixel chain "
            "spread / NFE (VJP) / CPU s.\n\n")
    return out, head + "\n".join(lines)


def image_table(rows: dict) -> str:
    body = []
    for name, r in rows.items():
        nfe = f"{r['nfe']:g}" + (f" ({r['vjp']:g})" if r.get("vjp") else "")
        body.append([name, f"{r['psnr']:.2f}", f"{r['ssim']:.3f}", f"{r['feat']:.3f}", f"{r['acc']:.2f}",
                     f"{r['spread']:.3f}", nfe, f"{r['cpu_s']:.1f}"])
    return markdown_table(["solver", "PSNR", "SSIM", "feat", "acc", "spread", "NFE (VJP)", "CPU s"], body,
                          align="lrrrrrrr")


# --------------------------------------------------------------------------------------------------- sweep
def part_sweep(args) -> tuple[dict, str]:
    """Each solver's automatic default beside its knob's grid on held-out digits (test images from 200)."""
    prior, feats = V.digits_prior("unet"), digits_features()
    n, offset = args.sweep_n, 200
    labels = digits_labels(n, offset)
    out, md = dict(previous(args, "sweep")), []  # with --solvers, the tasks of the last run stay
    for task in args.sweep_tasks.split(","):
        op, x, y = V.digits_problem(task, n, offset=offset)
        # rows of the last run (before the rule existed, `=auto` named the default)
        rows = {(k[:-5] + "=default" if k.endswith("=auto") and not k.startswith("dps ") else k): v
                for k, v in previous(args, "sweep").get(task, {}).items()}
        for method, (knob, grid) in SWEEP.items():
            if not selected(args, method):
                continue
            for value in grid:
                name = f"{method} {knob}=" + ("default" if value is None else value if isinstance(value, str)
                                              else f"{value:g}")
                opts = {} if value is None else {knob: value}
                res, cpu = digits_solve(prior, op, y, method, args.nfe, args.sweep_chains, **opts)
                rows[name] = scores(res.samples, x, feats, labels) | {"nfe": res.nfe, "vjp": res.nfe_vjp,
                                                                      "cpu_s": cpu}
                print(f"sweep {task} {name}: {rows[name]}", flush=True)
        out[task] = rows
    body = []
    for method, (knob, _) in SWEEP.items():
        cells = [method, knob]
        for rows in out.values():
            mine = {k: v for k, v in rows.items() if k.startswith(method + " ")}
            if f"{method} {knob}=default" not in mine:
                cells += ["-", "-"]
                continue
            auto = rows[f"{method} {knob}=default"]
            best = max(mine, key=lambda k: mine[k]["psnr"])
            cells += [f"{auto['psnr']:.2f} / {auto['feat']:.3f}",
                      f"{best.split('=')[1]}: {mine[best]['psnr']:.2f} / {mine[best]['feat']:.3f}"]
        body.append(cells)
    header = ["solver", "knob"] + [f"{t} {c}" for t in out for c in ("default", "best")]
    summary = markdown_table(header, body, align="l" * len(header))
    md.append(f"## Automatic step sizes against a grid (digits, held-out test images {offset}..{offset + n}, "
              f"{args.sweep_chains} chains, {args.nfe} NFE)\n\nCells: PSNR / feature distance; `best` is the grid "
              "value (or the default) with the highest PSNR, tuned on these very images (an upper bound); "
              "`default` is each solver's default (DPS: its step rule, `dps_auto_scales`), `dps scale=config` the DPS "
              f"configs' published step of the task (0.5 inpainting, 0.3 super-resolution).\n\n{summary}\n")
    for task, rows in out.items():
        md.append(f"### {task}, every grid value\n\n{image_table(rows)}\n")
    return out, "\n".join(md)


# --------------------------------------------------------------------------------------------------- shapes
def part_shapes(args) -> tuple[dict, str]:
    from steerdiff.app.protocols import shapes_pipeline as sp
    from steerdiff.data import shapes
    from steerdiff.pipelines import bind, through_decoder

    pipe, judge = sp.load_shipped(), sp.load_judge()
    den, _ = bind(pipe, pipe.encode([""]))
    sigmas = pipe.default_sigmas(31)[:-1]  # 31 levels (the schedule's 32 values without its final 0): 31 NFE
    steps, daps_levels = len(sigmas), len(sigmas[::5])
    pairs = sp.train_pairs()

    def feats(images):
        small = shapes.from_canvas(images.clamp(-1, 1))
        return classifier_features(judge, small), judge.predict(small)

    def problem(seed: int):
        x = sp.data_images(pairs, args.shape_per_pair, seed=seed)
        return x, sp.pair_labels(pairs, args.shape_per_pair)

    x, labels = problem(0)
    x_tune, _ = problem(500)
    ops = {"box": sd.inverse.Inpaint.center((3, 32, 32), hole=16), "sr4": sd.inverse.Downsample(4, (3, 32, 32))}
    recon = pipe.decode(pipe.encode_images(x))
    out, md = {}, []
    for task, pixel in ops.items():
        op = through_decoder(pipe, pixel)
        meas = sd.inverse.measure(pixel, x, NOISE, generator=1)
        meas_tune = sd.inverse.measure(pixel, x_tune, NOISE, generator=2)
        cond = torch.zeros(x.shape[0], dtype=torch.long)
        init = op.init(meas)
        rows = {"VAE reconstruction": scores(recon[:, None], x, feats, labels) | {"nfe": 0, "cpu_s": 0.0},
                "baseline": scores(pipe.decode(init)[:, None], x, feats, labels) | {"nfe": 0, "cpu_s": 0.0}}
        last = previous(args, "shapes").get(task, {})
        rows |= {k: v for k, v in last.get("rows", {}).items() if k not in rows}
        refused = {k: v for k, v in last.get("refused", {}).items() if not selected(args, k)}
        tuned = {k: v for k, v in last.get("tuned", {}).items() if not selected(args, k)}

        def run(method, y, init_, chains=args.shape_chains, op=op, cond=cond, **opts):
            kw = {"noise_std": NOISE, "chains": chains, "cond": cond, "generator": 0}
            if method == "daps":  # 10 Langevin steps per level (each a decoder pass and its gradient), not 100
                kw |= {"sigmas": sigmas[::5], "ode_steps": 5, "langevin_steps": LATENT_LANGEVIN}
            else:
                kw["sigmas"] = sigmas
            if method in ("dr", "cr", "hr"):
                kw["init"] = init_
            return solve_timed(den, op, y, method, **kw, **opts)

        def decoded(res):
            with torch.no_grad():
                flat = pipe.decode(res.samples.flatten(0, 1).float())
            return flat.reshape(res.samples.shape[0], res.samples.shape[1], *flat.shape[1:])

        for method, knob, grid in (("dps", "scale", (1.0, 3.0, 10.0)), ("daps", "lr", (3e-3, 1e-2, 3e-2))):
            if not selected(args, method):
                continue
            best = None
            for value in grid:
                res, _ = run(method, meas_tune, None, chains=1, **{knob: value})
                p = float(psnr(decoded(res).flatten(0, 1).clamp(-1, 1),
                               x_tune[:, None].expand(-1, res.samples.shape[1], -1, -1, -1).flatten(0, 1)).mean())
                print(f"shapes {task} tune {method} {knob}={value:g}: PSNR {p:.2f}", flush=True)
                if best is None or p > best[1]:
                    best = (value, p)
            tuned[method] = {knob: best[0]}
        for method, rule in [*((m, False) for m in SOLVERS), ("dps", True), ("daps", True)]:
            if not selected(args, method):
                continue
            if rule:  # the untuned step rules: DPS's (the decoded operator's Jacobian norm at the latent origin),
                # DAPS's (the local Jacobian norm at each level's x0h, per row)
                name = "dps scale=auto" if method == "dps" else "daps lr=auto"
                res, cpu = run(method, meas, init, **({"scale": "auto"} if method == "dps" else {}))
                rows[name] = scores(decoded(res), x, feats, labels) | {"nfe": res.nfe, "vjp": res.nfe_vjp,
                                                                       "cpu_s": cpu}
                print(f"shapes {task} {name}: {rows[name]}", flush=True)
                continue
            try:
                res, cpu = run(method, meas, init, **tuned.get(method, {}))
            except ValueError as err:
                refused[method] = str(err)
                print(f"shapes {task} {method}: refused: {err}", flush=True)
                continue
            name = method + "".join(f" {k}={v:g}" for k, v in tuned.get(method, {}).items())
            rows[name] = scores(decoded(res), x, feats, labels) | {"nfe": res.nfe, "vjp": res.nfe_vjp, "cpu_s": cpu}
            print(f"shapes {task} {name}: {rows[name]}", flush=True)
        out[task] = {"rows": rows, "refused": refused, "tuned": tuned}
        md.append(f"### {task}\n\n{image_table(rows)}\n")
    first = next(iter(out.values()))["refused"]
    reasons = "\n".join(f"- `{m}`: {msg}" for m, msg in first.items())
    head = (f"## The shipped latent shapes pipeline through its decoder, {steps} NFE (DAPS {5 * daps_levels}), "
            f"sigma_y = {NOISE} (pixel units)\n\n{8 * args.shape_per_pair} canvas images ({args.shape_per_pair} "
            f"per training pair), {args.shape_chains} chains each, the unconditional "
            "prompt. `feat` / `acc` use `shapes_classifier` (acc: shape and colour both right). `VAE "
            "reconstruction` is decode(encode(x)), the best the decoder draws; `baseline` the decoded encoder "
            "latents of the pixel pseudo-inverse (DR / CR / HR's start). DPS's `scale` and DAPS's `lr` are the best "
            "PSNR of their grids on other images (seed 500, one chain each; `dps scale=auto` and `daps lr=auto` are "
            f"the step rules, untuned); DAPS runs {daps_levels} levels x 5 ODE "
            "steps with "
            f"{LATENT_LANGEVIN} Langevin steps per level. Refused (the same on both tasks):\n\n"
            f"{reasons}\n\n")
    return out, head + "\n".join(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="digits,shapes,sweep")
    ap.add_argument("--n", type=int, default=12, help="digits test images")
    ap.add_argument("--chains", type=int, default=8, help="chains per digits measurement")
    ap.add_argument("--nfe", type=int, default=100, help="NFE per chain on digits")
    ap.add_argument("--sweep-n", type=int, default=8, help="held-out digits images of the sweep")
    ap.add_argument("--sweep-tasks", default="inpaint-center", help="digits tasks of the sweep (comma-separated)")
    ap.add_argument("--sweep-chains", type=int, default=4, help="chains per held-out digits measurement")
    ap.add_argument("--shape-per-pair", type=int, default=1, help="shapes images per training pair")
    ap.add_argument("--shape-chains", type=int, default=4, help="chains per shapes measurement")
    ap.add_argument("--solvers", default="", help="digits / sweep: recompute only these solvers (comma-separated), "
                    "keeping the other rows of the last run")
    args = ap.parse_args()
    torch.manual_seed(0)
    out = results_dir("inverse")
    for part in args.parts.split(","):
        fn = {"digits": part_digits, "shapes": part_shapes, "sweep": part_sweep}.get(part)
        if fn is None:
            raise SystemExit(f"unknown part {part!r}; choose from digits, shapes, sweep")
        meta, start = provenance(), time.process_time()
        result, text = fn(args)
        meta["cpu_s"] = time.process_time() - start
        write_json(out / f"images_{part}.json", {"meta": meta, "args": vars(args), "result": result})
        write_text(out / f"images_{part}.md", provenance_line(meta) + f" CPU {meta['cpu_s']:.0f} s.\n\n" + text)
        print(f"wrote {out / f'images_{part}.md'} (CPU {meta['cpu_s']:.0f} s)")
    # images.md: the parts' latest results, each with its own provenance line (parts may run as separate processes)
    files = [out / f"images_{p}.md" for p in ("digits", "shapes", "sweep")]
    texts = [f.read_text() for f in files if f.exists()]
    write_text(out / "images.md", "# Inverse solvers on images\n\n" + "\n".join(texts))


if __name__ == "__main__":
    main()
