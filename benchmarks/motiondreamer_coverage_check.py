"""Can any sampler *beat* baseline (a) on coverage? (issue 42; docs/methods/motiondreamer.md, "Can any sampler beat
the copying baseline (a) on coverage? (checked on the shipped models)").

Baseline (a) is MotionDreamer's transformer with full attention and absolute positions on a tokeniser trained without
codebook regularisation. Trained at the shipped recipe's budget (tokeniser 500 steps, generator 2000, seed 0, beat
flags as the recipe) it is scored here beside the shipped MotionDreamer model of the same skeleton, on the same
reference, with the metric unchanged (``steerdiff.metrics.motion.coverage``: GANimator Sec. 6.1, 30-frame windows,
threshold 0.25 RMS in reference standard deviations). Per sampler and setting (``--count`` motions, sampling seed 0):

* coverage as the benchmark computes it (windows of all the motions pooled) and per motion (the mean of each
  motion's own coverage: the other reading of GANimator's definition);
* the reference windows' nearest-generated-window distances (the quantity the threshold is applied to): median,
  99th percentile and maximum, and how many windows lie above the threshold;
* whether the tokens are the reference's tokens (exact copy: share of positions equal, rows equal in full);
* SIFID with the shipped feature extractor (``motion_features_<skeleton>``).

Rows ``recon`` are the tokenisers' decodings of the reference's own tokens: what a sampler that copies the tokens
exactly produces, the best any token sampler on that tokeniser can do window by window only if no other token string
decodes closer.

    OMP_NUM_THREADS=1 python benchmarks/motiondreamer_coverage_check.py --skeletons quadruped

Writes ``benchmarks/results/motiondreamer/coverage_check.{md,json}`` (one section per skeleton; runs with other
``--skeletons`` merge into the same files).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from steerdiff.app.recipes.motion_features import load_motion_feature_encoder
from steerdiff.app.recipes.motiondreamer import GEN_STEPS, asset_name
from steerdiff.data.motion import FeatureStats, motion_features
from steerdiff.data.motion_synth import reference_motion
from steerdiff.metrics.motion import _nn_dist, _windows, coverage, sifid
from steerdiff.models.io import ASSETS_DIR
from steerdiff.motion.apps import decode_batch
from steerdiff.motion.dreamer import MotionDreamer, fit
from steerdiff.motion.generator import GeneratorConfig, generate
from steerdiff.train.motion_vq import MotionVQConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

THRESHOLD = 0.25  # the metric's default (not changed here)
WINDOW = 30

# (name, token temperature, choice temperature, rounds); rounds None = one token per round
SETTINGS = [("T=1 (default)", 1.0, 1.0, 12), ("T=0.7", 0.7, 1.0, 12), ("T=1 greedy", 1.0, 0.0, 12),
            ("T=1.5 greedy, 1 token/round", 1.5, 0.0, None), ("T=3", 3.0, 1.0, 12), ("T=5", 5.0, 1.0, 12)]


def window_distances(ref, motions, stats) -> torch.Tensor:
    """The distance of each reference window to its nearest window among ``motions`` (what ``coverage`` thresholds;
    the same private helpers, so the numbers are the metric's own)."""
    bank = torch.cat([_windows(stats.normalize(m.double()), WINDOW) for m in motions])
    return _nn_dist(_windows(stats.normalize(ref.double()), WINDOW), bank)


def score(ref, feats, tokens, ref_tokens, stats, enc) -> dict:
    motions = list(feats)
    d = window_distances(ref, motions, stats)
    same = tokens == ref_tokens[None]
    return {"coverage": coverage(ref, motions, stats=stats),
            "coverage_per_motion": sum(coverage(ref, m, stats=stats) for m in motions) / len(motions),
            "dist_median": float(d.median()), "dist_p99": float(d.quantile(0.99)), "dist_max": float(d.max()),
            "windows_above": int((d > THRESHOLD).sum()), "windows": int(d.numel()),
            "uncovered": (d > THRESHOLD).nonzero().flatten().tolist()[:8],
            "token_match": float(same.double().mean()), "rows_exact_copy": int(same.all(1).sum()),
            "sifid": sifid(enc, ref, motions)}


def train_baseline_a(ref, skel: str, cache: Path | None) -> tuple[MotionDreamer, float]:
    """Baseline (a) at the shipped recipe's budget (``cache``: a folder to load it from / save it to)."""
    if cache is not None and (cache / "motiondreamer.json").is_file():
        md = MotionDreamer.load(cache)
        md.meta["loaded_from_cache"] = True
        return md, md.meta.get("train_cpu_s", float("nan"))
    c0 = time.process_time()
    vq = MotionVQConfig(reg_weight=0.0, seed=0)
    gen = GeneratorConfig(steps=GEN_STEPS, window=None, absolute=True, seed=0)
    md = fit(ref, skel, vq=vq, gen=gen)
    cpu = time.process_time() - c0
    md.meta["train_cpu_s"] = cpu
    if cache is not None:
        md.save(cache)
    return md, cpu


def run(skel: str, count: int, cache_root: Path | None) -> dict:
    c_all = time.process_time()
    ref = motion_features(reference_motion(skel, frames=240, seed=0))
    stats = FeatureStats.fit(ref)
    enc = load_motion_feature_encoder(skel)
    shipped = MotionDreamer.load(ASSETS_DIR / asset_name(skel))
    base, base_cpu = train_baseline_a(ref, skel, None if cache_root is None else cache_root / f"baseline_a_{skel}")
    out = {"skeleton": skel, "baseline_a_train_cpu_s": base_cpu,
           "baseline_a_cached": bool(base.meta.get("loaded_from_cache")),
           "baseline_a_final_loss": base.meta.get("generator_log", {}).get("final_loss"), "rows": []}
    print(f"[{skel}] baseline (a) trained: {base_cpu:.0f} CPU s", flush=True)
    # frame 0 is special in the features (root velocity 0, contacts from no previous frame): how far it lies from
    # every other reference frame, and how far each tokeniser's decoding of the reference's tokens puts it
    z = stats.normalize(ref.double())
    out["frame0_nearest_other_frame"] = float((z[0] - z[1:]).pow(2).mean(-1).sqrt().min())
    n_tok = shipped.reference_tokens.shape[0]
    for name, md in (("baseline (a)", base), ("motiondreamer (shipped)", shipped)):
        ref_tok = md.reference_tokens
        rec = decode_batch(md.tokenizer, ref_tok[None])[:, : ref.shape[0]]
        row = {"method": name, "setting": "recon (reference tokens decoded)", "nfe": 0,
               **score(ref, rec, ref_tok[None], ref_tok, stats, enc),
               "frame_error": (stats.normalize(rec[0].double()) - z).pow(2).mean(-1).sqrt()[:3].tolist()}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        for label, temp, choice, rounds in SETTINGS:
            steps = n_tok if rounds is None else rounds
            c0 = time.process_time()
            tok = generate(md.generator, n_tok, count, steps=steps, seed=0, temperature=temp,
                           choice_temperature=choice)
            feats = decode_batch(md.tokenizer, tok)[:, : ref.shape[0]]
            row = {"method": name, "setting": label, "nfe": steps, **score(ref, feats, tok, ref_tok, stats, enc),
                   "cpu_s": time.process_time() - c0}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    out["cpu_s"] = time.process_time() - c_all
    return out


def render(results: dict) -> str:
    lines = ["# Coverage against the copying baseline (a) (issue 42)", "",
             "Coverage at the metric's threshold 0.25 (30-frame windows); pooled over the motions (as the benchmark) "
             "and per motion; distances: each reference window to its nearest generated window (RMS, reference "
             "std); token match: share of token positions equal to the reference's tokens (its own tokeniser).", ""]
    for skel, res in results["skeletons"].items():
        lines += [f"## {skel}", "",
                  f"Baseline (a) trained {res['baseline_a_train_cpu_s']:.0f} CPU s"
                  + (" (in an earlier run of this script, loaded here from `--cache`)" if res["baseline_a_cached"]
                     else "")
                  + f", final masked-token loss {res['baseline_a_final_loss']:.2g}; {res['count']} motions per row, "
                  f"sampling seed 0; {res['cpu_s']:.0f} CPU s in all. `{res['command']}`", "",
                  f"Reference frame 0 lies {res['frame0_nearest_other_frame']:.3f} (RMS) from its nearest other "
                  "reference frame; the tokenisers' decodings of the reference's tokens miss frames 0-2 by "
                  + "; ".join(f"{r['method']} {', '.join(f'{e:.3f}' for e in r['frame_error'])}"
                              for r in res["rows"] if "frame_error" in r) + ".", ""]
        rows = [[r["method"], r["setting"], r["nfe"], f"{r['coverage']:.3f}", f"{r['coverage_per_motion']:.3f}",
                 f"{r['dist_median']:.3f}", f"{r['dist_p99']:.3f}", f"{r['dist_max']:.3f}",
                 f"{r['windows_above']} / {r['windows']}", ", ".join(map(str, r["uncovered"][:3])) or "-",
                 f"{r['token_match']:.3f}",
                 f"{r['rows_exact_copy']}", f"{r['sifid']:.3g}"] for r in res["rows"]]
        lines += [markdown_table(["method", "setting", "NFE", "coverage", "coverage per motion", "dist median",
                                  "dist p99", "dist max", "windows > 0.25", "first uncovered", "token match",
                                  "exact-copy rows", "SIFID"], rows), ""]
    lines.append(provenance_line(results["provenance"]))
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skeletons", default="quadruped")
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--cache", default=None, help="folder to keep the trained baseline (a) models in")
    args = p.parse_args(argv)
    path = results_dir("motiondreamer") / "coverage_check.json"
    results = json.loads(path.read_text()) if path.is_file() else {"skeletons": {}}
    for skel in args.skeletons.split(","):
        res = run(skel, args.count, Path(args.cache) if args.cache else None)
        res["count"] = args.count
        res["command"] = f"OMP_NUM_THREADS=1 python benchmarks/motiondreamer_coverage_check.py --skeletons {skel}"
        results["skeletons"][skel] = res
    results["provenance"] = provenance()
    write_json(path, results)
    write_text(path.with_suffix(".md"), render(results))
    print(render(results))


if __name__ == "__main__":
    main()
