"""CoInD versus vanilla composition: the learned 2-D test (C1-C3) and the coloured-shapes test (P1-P4) of
docs/methods/coind.md, on the ``band`` split (8 of 16 (shape, colour) combos seen in training).

Parts (each writes its own JSON into ``benchmarks/results/coind/``; ``report`` combines them into ``coind.json`` +
``coind.md`` there; ``--part attributes`` writes ``coind_attributes[_<tag>].json`` and ``.md``):

    python benchmarks/coind.py --part 2d --seeds 0,1,2             # C1-C3, "small" recipe (3 seeds)
    python benchmarks/coind.py --part 2d --seeds 0 --recipe full   # the "full" recipe (slower)
    python benchmarks/coind.py --part shapes --model shapes_band   # vanilla (lambda = 0) model
    python benchmarks/coind.py --part shapes --model shapes_coind  # CoInD (lambda = 1) model
    steerdiff train configs/shapes_coind_lambda0.3.json            # CoInD at lambda = 0.3 (same recipe otherwise)
    python benchmarks/coind.py --part shapes --model runs/shapes_coind_lambda0.3/final --tag shapes_coind_lambda0.3
    # pairs trained from configs (not shipped), each CoInD result naming its vanilla result:
    python benchmarks/coind.py --part shapes --model VANILLA_RUN --tag PAIR_vanilla --compare-to none
    python benchmarks/coind.py --part shapes --model COIND_RUN --tag PAIR_coind --compare-to PAIR_vanilla
    #   PAIR = long: a longer-trained pair, runs/long_shapes_{band_vanilla,coind}/final
    #     (configs/shapes_{band_vanilla,coind}_long.json)
    #   PAIR = nonuniform: every pair has some support, runs/shapes_nonuniform_{vanilla,coind}/final
    #     (configs/shapes_nonuniform_{vanilla,coind}.json)
    #   PAIR = dit: the protocol's backbone, a two-slot in-context DiT, runs/shapes_dit_band_{vanilla,coind}/final
    #     (configs/shapes_dit_band_{vanilla,coind}.json)
    #   PAIR = dit16k: both DiTs continued to 16000 steps (a copy of each run, resumed: the cosine schedule restarts
    #     at its 16000-step value): steerdiff train configs/shapes_dit_band_<kind>.json --resume --set steps=16000
    #     --out DIR
    python benchmarks/coind.py --part attributes --ws 3.5 --n 40 \
        --model shapes_band,shapes_coind,runs/long_shapes_band_vanilla/final,runs/long_shapes_coind/final
    python benchmarks/coind.py --part attributes --ws 3.5 --n 20 --model shapes_band,shapes_coind \
        --shape-weights 1,2,4 --tag shape_weight
    python benchmarks/coind.py --part report

The committed shapes results ran with ``--n 40 --n-val 16``; each JSON records its exact command (``meta``), and
``benchmarks/results/README.md`` lists them.

Shapes protocol: for each model and each ``w`` in ``--ws``, Euler ``--steps`` steps on karras(0.002, 80),
``--n`` samples per query on the test seed and ``--n-val`` on a validation seed:

* AND (composed marginals, ``Compose("shape=s & colour=c", w)``) on the 8 held-out and the 8 seen combos;
* joint CFG (``mode="joint"``) on the same combos;
* NOT: ``"2*shape=s & !colour={s, s+1}"`` (weights +2w, -w, -w; the colours seen with ``s``) for each shape;
* diversity: ``"shape=s"``, entropy (bits) of the predicted colour, averaged over shapes;
* ``jsd_code`` / ``jsd`` (docs/methods/coind.md, "Metrics") on real held-out and seen images; FID in the shipped
  classifier's features of the held-out AND samples against real held-out images.

``w`` is chosen per model and rule (AND, joint, NOT) by conformity on the validation seed (ties: smaller ``w``);
P1-P4 compare test-seed numbers at the chosen ``w``. NFE per sample is reported for every query (Euler: steps x
rows per evaluation of the stacked batch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.data.shapes import COLOURS, SHAPES, generate, split_combos
from steerdiff.guidance import Compose, load_composable
from steerdiff.guidance.compose_expr import normalize_attributes
from steerdiff.metrics.composition import composition_divergence, conformity, label_entropy
from steerdiff.metrics.images import classifier_features, frechet_distance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

ATTRS = {"shape": list(SHAPES), "colour": list(COLOURS)}
TITLE = "# CoInD benchmark (docs/methods/coind.md: C1-C3, P1-P4)"


# ------------------------------------------------------------------------------------------------- 2-D (C1-C3)
def run_2d(seeds: list[int], recipe: str, n: int) -> dict:
    from steerdiff.app.protocols.coind import criteria, evaluate_2d, train_2d

    out = {"recipe": recipe, "n": n, "sampler": "euler 64 steps, karras(0.002, 80)", "seeds": {}}
    for seed in seeds:
        row = {}
        for lam in (0.0, 1.0):
            model, secs = train_2d(lam, seed, ROOT / "runs" / "coind2d" / f"{recipe}_lam{lam:g}_s{seed}", recipe)
            row[f"lambda={lam:g}"] = {**evaluate_2d(model, n=n, seed=1000 + seed), "train_s": round(secs, 1)}
        row["criteria"] = criteria(row["lambda=0"], row["lambda=1"])
        out["seeds"][str(seed)] = row
        print(f"seed {seed}: {json.dumps(row)}", flush=True)
    out["pass"] = {c: all(r["criteria"][c] for r in out["seeds"].values()) for c in ("C1", "C2", "C3")}
    return out


# ------------------------------------------------------------------------------------------------- shapes (P1-P4)
@torch.no_grad()
def draw(model, guider: Compose, n: int, seed: int, steps: int) -> tuple[torch.Tensor, float]:
    noise = torch.randn(n, 3, 12, 12, generator=torch.Generator().manual_seed(seed))
    x, stats = sd.sample(model, noise, sd.sigmas.karras(steps, 0.002, 80.0), method="euler", cond=guider.cond(n),
                         guidance=guider, return_stats=True)
    return x.clamp(-1, 1), float(stats.nfe)


def requested_pairs(kind: str) -> list[tuple[int, int]] | None:
    """The ``(shape, colour)`` combos an AND / joint query kind asks for (held-out or seen on ``band``), else None."""
    if kind not in ("and_held", "and_seen", "joint_held", "joint_seen"):
        return None
    return split_combos("band", "test" if kind.endswith("held") else "train")


def query_set(kind: str, shape_weight: float = 1.0) -> list[tuple[str, str]]:
    """``(name, expression)`` of each query of a kind; ``shape_weight`` scales the shape term of AND queries
    (a diagnostic; the protocol uses 1)."""
    pairs = requested_pairs(kind)
    if pairs is not None:
        prefix = "" if shape_weight == 1 else f"{shape_weight:g}*"
        return [(f"{SHAPES[s]}&{COLOURS[c]}", f"{prefix}shape={SHAPES[s]} & colour={COLOURS[c]}") for s, c in pairs]
    if kind == "not":
        return [(f"{SHAPES[s]}&!{{{COLOURS[s]},{COLOURS[(s + 1) % 4]}}}",
                 f"2*shape={SHAPES[s]} & !colour={{{COLOURS[s]},{COLOURS[(s + 1) % 4]}}}") for s in range(4)]
    if kind == "shape_only":
        return [(SHAPES[s], f"shape={SHAPES[s]}") for s in range(4)]
    raise ValueError(kind)


def eval_kind(model, clf, kind: str, w: float, n: int, seed: int, steps: int, keep: bool = False,
              shape_weight: float = 1.0) -> dict:
    mode = "joint" if kind.startswith("joint") else "and"
    per, images, nfe, t0 = {}, [], 0.0, time.perf_counter()
    pairs = requested_pairs(kind)
    for q, (name, expr) in enumerate(query_set(kind, shape_weight)):
        guider = Compose(expr, w, ATTRS, mode=mode)
        x, nfe = draw(model, guider, n, seed * 100 + q, steps)
        pred = clf.predict(x)
        per[name] = {"cs": conformity(pred, guider.terms)}
        if pairs is not None:  # which of the two requested attributes the samples carry
            per[name]["shape_acc"] = float((pred[:, 0] == pairs[q][0]).float().mean())
            per[name]["colour_acc"] = float((pred[:, 1] == pairs[q][1]).float().mean())
        if kind == "shape_only":
            per[name]["colour_entropy_bits"] = label_entropy(pred[:, 1], len(COLOURS))
        if keep:
            images.append(x)
    out = {"cs": sum(v["cs"] for v in per.values()) / len(per), "nfe": nfe, "per_query": per,
           "wall_s": round(time.perf_counter() - t0, 1)}
    if pairs is not None:
        for key in ("shape_acc", "colour_acc"):
            out[key] = sum(v[key] for v in per.values()) / len(per)
    if kind == "shape_only":
        out["diversity_bits"] = sum(v["colour_entropy_bits"] for v in per.values()) / len(per)
    if keep:
        out["_images"] = torch.cat(images)
    return out


def _composable(name: str):
    model = load_composable(name)
    if getattr(model, "attributes", None) is None:  # a training run's checkpoint: the shapes slots, with nulls
        model.attributes, model.has_null = normalize_attributes({"shape": SHAPES, "colour": COLOURS}), True
    return model


def run_shapes(name: str, ws: list[float], n: int, n_val: int, steps: int, seed: int, n_real: int) -> dict:
    model = _composable(name)
    clf = sd.models.load("shapes_classifier").eval()
    kinds = ("and_held", "and_seen", "joint_held", "joint_seen", "not", "shape_only")
    out = {"model": name, "ws": ws, "n": n, "n_val": n_val, "steps": steps, "seed": seed,
           "sampler": f"euler {steps} steps, karras(0.002, 80)", "val": {}, "test": {}}
    real_held, _ = generate(n_real, "band", "test", seed=777)
    real_seen, _ = generate(n_real, "band", "train", seed=778)
    t0 = time.perf_counter()
    out["jsd_held"] = composition_divergence(model, real_held, [4, 4], torch.Generator().manual_seed(5))
    out["jsd_seen"] = composition_divergence(model, real_seen, [4, 4], torch.Generator().manual_seed(6))
    out["jsd_nfe_per_image"] = 5 * (16 + 8)
    out["jsd_wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"[{name}] jsd held {out['jsd_held']} seen {out['jsd_seen']}", flush=True)
    real_f = classifier_features(clf, real_held)
    for w in ws:
        key = str(w)
        if n_val > 0:
            out["val"][key] = {k: eval_kind(model, clf, k, w, n_val, seed + 1, steps)["cs"]
                               for k in ("and_held", "joint_held", "not")}
        res = {}
        for k in kinds:
            r = eval_kind(model, clf, k, w, n, seed, steps, keep=(k == "and_held"))
            if k == "and_held":
                r["fid_feat"] = frechet_distance(real_f, classifier_features(clf, r.pop("_images")))
            res[k] = r
        out["test"][key] = res
        print(f"[{name}] w={w}: " + ", ".join(f"{k} cs={v['cs']:.3f} (nfe {v['nfe']:g})" for k, v in res.items())
              + (f"; val {out['val'].get(key)}" if n_val else ""), flush=True)
    out["choice"] = {}
    for rule, kind in (("and", "and_held"), ("joint", "joint_held"), ("not", "not")):
        src = out["val"] if n_val > 0 else {k: {kk: v["cs"] for kk, v in r.items()} for k, r in out["test"].items()}
        out["choice"][rule] = max(ws, key=lambda w: (src[str(w)][kind], -w))
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def shapes_criteria(van: dict, co: dict) -> dict:
    def at(res, rule, kind):
        return res["test"][str(res["choice"][rule])][kind]["cs"]

    p1 = (at(co, "and", "and_held"), at(van, "and", "and_held"))
    p2 = (co["jsd_held"]["jsd_code"], van["jsd_held"]["jsd_code"])
    p3 = (at(co, "and", "and_seen"), at(van, "and", "and_seen"))
    p4 = (at(co, "not", "not"), at(van, "not", "not"))
    return {
        "P1": {"pass": p1[0] >= p1[1] + 0.15, "coind": p1[0], "vanilla": p1[1], "rule": "CS_AND held-out >= +0.15"},
        "P2": {"pass": p2[0] <= 0.8 * p2[1], "coind": p2[0], "vanilla": p2[1], "rule": "jsd_code held-out <= 0.8x"},
        "P3": {"pass": p3[0] >= p3[1] - 0.05, "coind": p3[0], "vanilla": p3[1], "rule": "CS_AND seen >= -0.05"},
        "P4": {"pass": p4[0] >= p4[1], "coind": p4[0], "vanilla": p4[1], "rule": "CS_NOT >= vanilla"},
    }


# ------------------------------------------------------------------------------------------------- report
def _run_line(res: dict) -> list[str]:
    return [f"Run: {provenance_line(res['meta'])}", ""] if "meta" in res else []


def _2d_rows(d2: dict):
    for seed, row in d2["seeds"].items():
        for m in ("lambda=0", "lambda=1"):
            cases = [*row[m]["held_out"].items(), ("seen (+,-) w=1", row[m]["seen_pm_w1"])]
            for w, s in cases:
                yield (seed, m, w, f"{s['median_dist']:.3f}", f"{s['within_0.3']:.3f}", f"{s['within_0.5']:.3f}",
                       tuple(s["mean"]), s["nfe"])
        l_ci = f"{row['lambda=0']['l_ci']:.4g} / {row['lambda=1']['l_ci']:.4g}"
        yield seed, "L_CI (lambda=0 / 1)", "", l_ci, *[""] * 4


def _shapes_rows(r: dict):
    for w, t in r["test"].items():
        yield (w, *(f"{t[k]['cs']:.3f}" for k in ("and_held", "and_seen", "joint_held", "joint_seen", "not")),
               f"{t['shape_only']['diversity_bits']:.3f}", f"{t['and_held']['fid_feat']:.3f}",
               " / ".join(f"{t[k]['nfe']:g}" for k in ("and_held", "joint_held", "not", "shape_only")))


def markdown(res: dict) -> str:
    lines = [TITLE, ""]
    if "meta" in res:  # the report's own run; each part's run is under its heading
        lines += [f"Report: {provenance_line(res['meta'])}", ""]
    d2 = res.get("2d")
    if d2:
        lines += [f"## 2-D learned test (C1-C3), recipe `{d2['recipe']}`, {d2['n']} samples, {d2['sampler']}", "",
                  *_run_line(d2),
                  markdown_table(["seed", "model", "w", "median dist to (1,1)", "within 0.3", "within 0.5", "mean",
                                  "NFE"], _2d_rows(d2)),
                  "", "Criteria per seed: " + "; ".join(f"seed {s}: {r['criteria']}" for s, r in d2["seeds"].items()),
                  f"All seeds: {d2['pass']}", ""]
    models = res.get("shapes", {})
    if models:
        lines += ["## Coloured shapes, band split (P1-P4)", ""]
        for name, r in models.items():
            lines += [f"### `{name}`: {r['sampler']}, n = {r['n']} per query (validation n = {r['n_val']})", "",
                      *_run_line(r),
                      f"jsd_code / jsd on real held-out images: {r['jsd_held']['jsd_code']:.4f} / "
                      f"{r['jsd_held']['jsd']:.4f}; seen: {r['jsd_seen']['jsd_code']:.4f} / "
                      f"{r['jsd_seen']['jsd']:.4f} (NFE {r['jsd_nfe_per_image']} per image). "
                      f"Chosen w ({'validation seed' if r['n_val'] else 'test seed: no validation run'}): "
                      f"{r['choice']}. FID_feat is from {8 * r['n']} samples in 64-d features (unreliable below "
                      "~1000).", "",
                      markdown_table(["w", "CS AND held", "CS AND seen", "CS joint held", "CS joint seen", "CS NOT",
                                      "colour entropy (bits)", "FID_feat AND held",
                                      "NFE AND / joint / NOT / shape-only"], _shapes_rows(r)), ""]
        for name, crit in res.get("criteria", {}).items():
            coind, vanilla = name.split(" vs ")
            rows = [(c, v["rule"], f"{v['coind']:.4f}", f"{v['vanilla']:.4f}", v["pass"]) for c, v in crit.items()]
            lines += [f"Criteria, `{coind}` against `{vanilla}` (test seed, each at its chosen w):", "",
                      markdown_table(["criterion", "rule", "CoInD", "vanilla", "pass"], rows), ""]
    return "\n".join(lines) + "\n"


def attributes_markdown(res: dict) -> str:
    """The ``--part attributes`` table from its JSON."""
    rows = [(f"`{r['model']}`", f"{r['shape_weight']:g}", f"{r['shape_acc']:.3f}", f"{r['colour_acc']:.3f}",
             f"{r['cs']:.3f}") for r in res["rows"]]
    return "\n".join([
        "# CoInD: which attribute a composed sample follows", "", provenance_line(res["meta"]), "",
        f"Held-out AND queries at w = {res['w']:g}, n = {res['n']} per query: share of samples with the requested "
        "shape / colour / both", "",
        markdown_table(["model", "shape weight", "shape", "colour", "both (CS)"], rows)]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("2d", "shapes", "attributes", "report"), required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--recipe", default="small", choices=("small", "full"))
    ap.add_argument("--n2d", type=int, default=1000)
    ap.add_argument("--model", default="shapes_coind", help="shipped model name or checkpoint directory")
    ap.add_argument("--ws", default="2,3.5,7.5")
    ap.add_argument("--n", type=int, default=20, help="samples per query (test seed)")
    ap.add_argument("--n-val", type=int, default=8, help="samples per query (validation seed); 0 = no selection")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-real", type=int, default=100, help="real images for jsd and FID")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default=None, help="result name coind_shapes_<tag>.json (default: the model's name)")
    ap.add_argument("--shape-weights", default="1",
                    help="attributes part: weights of the shape term to try (diagnostic; the protocol uses 1)")
    ap.add_argument("--compare-to", default="shapes_band",
                    help="tag of the vanilla result the report checks P1-P4 against ('none' for a vanilla model)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = results_dir("coind")
    if args.part == "2d":
        res = {**run_2d([int(s) for s in args.seeds.split(",")], args.recipe, args.n2d), "meta": provenance()}
        write_json(out / f"coind_2d_{args.recipe}.json", res)
        print(markdown({"2d": res}))
    elif args.part == "attributes":
        res = {"w": float(args.ws.split(",")[0]), "n": args.n, "steps": args.steps, "rows": [], "meta": provenance()}
        clf = sd.models.load("shapes_classifier").eval()
        for name in args.model.split(","):
            model = _composable(name)
            for k in [float(v) for v in args.shape_weights.split(",")]:
                r = eval_kind(model, clf, "and_held", res["w"], args.n, args.seed, args.steps, shape_weight=k)
                res["rows"].append({"model": name, "shape_weight": k} |
                                   {key: r[key] for key in ("shape_acc", "colour_acc", "cs", "nfe")})
                print(f"{name} shape weight {k:g}: shape {r['shape_acc']:.3f}, colour {r['colour_acc']:.3f}, "
                      f"both {r['cs']:.3f}", flush=True)
        stem = "coind_attributes" + (f"_{args.tag}" if args.tag else "")
        write_json(out / f"{stem}.json", res)
        text = attributes_markdown(res)
        write_text(out / f"{stem}.md", text)
        print(text)
    elif args.part == "shapes":
        ws = [float(w) for w in args.ws.split(",")]
        res = {**run_shapes(args.model, ws, args.n, args.n_val, args.steps, args.seed, args.n_real),
               "meta": provenance()}
        tag = args.tag or (Path(args.model).name if Path(args.model).exists() else args.model)
        res["compare_to"] = None if args.compare_to in ("none", tag) else args.compare_to
        write_json(out / f"coind_shapes_{tag}.json", res)
        print(markdown({"shapes": {tag: res}}))
    else:
        res = {}
        for recipe in ("small", "full"):
            p = out / f"coind_2d_{recipe}.json"
            if p.is_file():
                res["2d" if recipe == "small" else "2d_full"] = json.loads(p.read_text())
        # the vanilla model, the shipped CoInD model, then any other CoInD variant run with --tag (sorted)
        files = sorted(out.glob("coind_shapes_*.json"), key=lambda p: (p.stem != "coind_shapes_shapes_band",
                                                                        p.stem != "coind_shapes_shapes_coind",
                                                                        p.stem))
        shapes = {p.stem.removeprefix("coind_shapes_"): json.loads(p.read_text()) for p in files}
        if shapes:
            res["shapes"] = shapes
        # each CoInD result against the vanilla result it names (older files: shapes_band, itself excepted)
        pairs = {name: r.get("compare_to", None if name == "shapes_band" else "shapes_band")
                 for name, r in shapes.items()}
        res["criteria"] = {f"{name} vs {van}": shapes_criteria(shapes[van], shapes[name])
                           for name, van in pairs.items() if van is not None and van in shapes}
        res["meta"] = provenance()
        text = markdown(res)
        if "2d_full" in res:
            text += markdown({"2d": res["2d_full"]}).replace(TITLE + "\n", "")
        write_json(out / "coind.json", res)
        write_text(out / "coind.md", text)
        print(text)


if __name__ == "__main__":
    main()
