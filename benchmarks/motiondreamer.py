"""MotionDreamer vs its baselines and ablations on one procedural reference motion per skeleton
(``docs/methods/motiondreamer.md``, "Benchmark").

Per skeleton (biped, quadruped, snake) and seed, on the reference motion of ``steerdiff.data.motion_synth``:

* ``motiondreamer``: tokeniser with codebook distribution regularisation + generator with local attention;
* ``full_noreg`` (baseline (a)): tokeniser without regularisation + the same transformer with full attention and an
  absolute position code;
* ``local_noreg``: local attention alone; ``full_reg``: regularisation alone;
* ``sinmdm`` (baseline (b)): a narrow-receptive-field 1-D conv denoiser trained with the EDM loss on random crops,
  sampled with Heun (``steerdiff.motion.sinmdm``).

Every transformer is trained with the same recipe (per-token beat condition, dropped with probability 0.1) and
sampled unconditionally. Each method generates ``--count`` motions of the reference's length; metrics
(``steerdiff.metrics.motion``, on the reference's normalised features): coverage, global and local diversity, SIFID
(fidelity, from a feature extractor trained per skeleton on motions of all its styles, independent of the methods) and
intra-diversity. Also per MotionDreamer run: the tokeniser's codebook usage and perplexity, and the beat-hit rate of
CFG-guided generation on random beat sequences vs unguided. Mean +- std over seeds.

    OMP_NUM_THREADS=1 python benchmarks/motiondreamer.py [--seeds 0,1,2] [--skeletons biped,quadruped,snake] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from steerdiff.data.motion import FeatureStats, motion_features
from steerdiff.data.motion_synth import STYLES, generate_motion, reference_motion, skeleton
from steerdiff.metrics.motion import (
    coverage,
    global_diversity,
    intra_diversity,
    local_diversity,
    sifid,
    train_feature_encoder,
)
from steerdiff.motion.apps import beat_alignment, kinematic_beats
from steerdiff.motion.dreamer import fit
from steerdiff.motion.generator import GeneratorConfig
from steerdiff.motion.sinmdm import SinMDMConfig, sample_sinmdm, train_sinmdm
from steerdiff.train.motion_vq import MotionVQConfig, train_motion_vq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

VARIANTS = {  # name: (codebook regularisation, local attention)
    "motiondreamer": (True, True),
    "full_noreg": (False, False),
    "local_noreg": (False, True),
    "full_reg": (True, False),
}
METRICS = ("coverage", "global_div", "local_div", "sifid", "intra_div")


def _styles_of(skel: str) -> list[str]:
    return [s for s in STYLES.names() if STYLES.get(s).skeleton == skel]


def evaluate(ref: Tensor, gens: list, stats: FeatureStats, enc, threshold: float = 0.5) -> dict:
    return {"coverage": coverage(ref, gens, threshold=threshold, stats=stats),
            "global_div": global_diversity(ref, gens, stats=stats),
            "local_div": local_diversity(ref, gens, stats=stats), "sifid": sifid(enc, ref, gens),
            "intra_div": sum(intra_diversity(enc, g) for g in gens) / len(gens)}


def run_skeleton(skel: str, seeds: list[int], args) -> dict:
    ref = motion_features(reference_motion(skel, frames=args.frames))
    stats = FeatureStats.fit(ref)
    extra = [motion_features(generate_motion(s, frames=args.frames, seed=k)) for s in _styles_of(skel) for k in (1, 2)]
    c0 = time.process_time()
    enc, _ = train_feature_encoder([ref, *extra], steps=args.enc_steps, seed=0)
    out = {"feature_encoder_cpu_s": time.process_time() - c0, "runs": {}}
    print(f"[{skel}] feature encoder {out['feature_encoder_cpu_s']:.0f} CPU s", flush=True)
    for seed in seeds:
        tokenizers = {}  # one tokeniser per (regularisation, seed), shared by the variants that use it
        for reg in (True, False):
            c0 = time.process_time()
            vq = MotionVQConfig(steps=args.vq_steps, reg_weight=0.1 if reg else 0.0, seed=seed)
            res = train_motion_vq(ref, vq)
            tokenizers[reg] = (vq, res.model, res.log, time.process_time() - c0)
        for name, (reg, local) in VARIANTS.items():
            vq, tok, tok_log, tok_cpu = tokenizers[reg]
            c0 = time.process_time() - tok_cpu  # the variant's cost includes its tokeniser's training
            gen = GeneratorConfig(steps=args.gen_steps, window=args.window if local else None, absolute=not local,
                                  seed=seed)
            md = fit(ref, skel, vq=vq, gen=gen, tokenizer=tok, tokenizer_log=tok_log)
            feats = md.sample(args.count, ref.shape[0], steps=args.sample_steps, seed=1000 * seed)
            row = evaluate(ref, list(feats), stats, enc, args.coverage_threshold)
            row["cpu_s"] = time.process_time() - c0
            row["codebook_usage"] = md.meta["tokenizer_log"].get("usage")
            row["perplexity"] = md.meta["tokenizer_log"].get("perplexity")
            if name == "motiondreamer":
                row.update(beat_test(md, ref, seed, args))
            out["runs"].setdefault(name, []).append(row)
            print(f"[{skel}] seed {seed} {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()
                                                               if isinstance(v, float)), flush=True)
        c0 = time.process_time()
        model, _ = train_sinmdm(stats.normalize(ref), replace(SinMDMConfig(), steps=args.sinmdm_steps, seed=seed))
        feats = stats.denormalize(sample_sinmdm(model, ref.shape[0], args.count, steps=18, seed=1000 * seed))
        row = evaluate(ref, list(feats), stats, enc, args.coverage_threshold)
        row["cpu_s"] = time.process_time() - c0
        out["runs"].setdefault("sinmdm", []).append(row)
        print(f"[{skel}] seed {seed} sinmdm: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    return out


def beat_test(md, ref: Tensor, seed: int, args) -> dict:
    """Beat-hit rate (kinematic beats within 2 frames of the requested ones) with CFG (w = 2) vs unguided, on beat
    sequences drawn at the reference's own beat rate (random phase per motion)."""
    norm = md.tokenizer.normalize
    ref_beats = kinematic_beats(norm(ref))
    gap = max(int(ref.shape[0] / max(len(ref_beats), 1)), 6)
    g = torch.Generator().manual_seed(seed)
    hit_cfg, hit_free = [], []
    for i in range(args.count):
        beats = list(range(int(torch.randint(0, gap, (1,), generator=g)), ref.shape[0], gap))
        guided = md.sample(1, ref.shape[0], steps=args.sample_steps, seed=5000 + i, beats=beats, guidance_scale=2.0)[0]
        free = md.sample(1, ref.shape[0], steps=args.sample_steps, seed=5000 + i)[0]
        hit_cfg.append(beat_alignment(beats, norm(guided)))
        hit_free.append(beat_alignment(beats, norm(free)))
    return {"beat_hit_cfg": sum(hit_cfg) / len(hit_cfg), "beat_hit_uncond": sum(hit_free) / len(hit_free)}


def summarise(results: dict) -> str:
    lines = []
    for skel, res in results.items():
        rows = []
        for name, runs in res["runs"].items():
            cells = [name]
            for m in (*METRICS, "codebook_usage", "perplexity", "cpu_s"):
                vals = [r[m] for r in runs if r.get(m) is not None]
                if not vals:
                    cells.append("-")
                    continue
                sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
                cells.append(f"{statistics.mean(vals):.3g} ± {sd:.2g}")
            rows.append(cells)
        lines += [f"### {skel}", "", markdown_table(["method", "coverage ↑", "global div ↑", "local div ↑", "SIFID ↓",
                                                     "intra div", "codebook usage", "perplexity", "CPU s"], rows), ""]
        md = res["runs"].get("motiondreamer", [])
        if md and "beat_hit_cfg" in md[0]:
            cfg = statistics.mean(r["beat_hit_cfg"] for r in md)
            free = statistics.mean(r["beat_hit_uncond"] for r in md)
            lines += [f"beat-hit rate (MotionDreamer, CFG w = 2 vs unguided): {cfg:.3f} vs {free:.3f}", ""]
    return "\n".join(lines)


def merge(tags: list[str]) -> None:
    """One table from runs made separately (each skeleton in its own process)."""
    import json

    out = results_dir("motiondreamer")
    parts = [json.loads((out / f"motiondreamer_{t}.json").read_text()) for t in tags]
    results: dict = {}
    for part in parts:  # runs of the same skeleton (other seeds) are appended
        for skel, res in part["results"].items():
            into = results.setdefault(skel, {"feature_encoder_cpu_s": res["feature_encoder_cpu_s"], "runs": {}})
            for name, runs in res["runs"].items():
                into["runs"].setdefault(name, []).extend(runs)
    total = sum(p["cpu_s"] for p in parts)
    cmds = "; ".join(f"`{p['meta'].get('command', '')}`" for p in parts)
    text = (f"# MotionDreamer benchmark\n\nMerged from {len(parts)} runs ({cmds}), made in parallel on a shared "
            f"2-core machine, {provenance_line(parts[0]['meta'])}\n\nTotal {total:.0f} CPU s. "
            f"Settings: {json.dumps({k: v for k, v in parts[0]['args'].items() if k not in ('skeletons', 'tag')})}"
            f"\n\n{summarise(results)}")
    write_json(out / "motiondreamer.json", {"parts": tags, "results": results, "cpu_s": total,
                                            "meta": [p["meta"] for p in parts]})
    write_text(out / "motiondreamer.md", text)
    print(text)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--skeletons", default="biped,quadruped,snake")
    p.add_argument("--frames", type=int, default=240)
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--vq-steps", type=int, default=150)
    p.add_argument("--gen-steps", type=int, default=200)
    p.add_argument("--sinmdm-steps", type=int, default=250)
    p.add_argument("--enc-steps", type=int, default=100)
    p.add_argument("--sample-steps", type=int, default=12)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--coverage-threshold", type=float, default=0.5,
                   help="coverage's per-element RMS threshold (0.5: what the committed table used; "
                        "steerdiff.metrics.motion.coverage now defaults to 0.25)")
    p.add_argument("--quick", action="store_true", help="tiny settings (a smoke run)")
    p.add_argument("--tag", default="")
    p.add_argument("--merge", default=None, metavar="TAGS",
                   help="combine earlier runs motiondreamer_<tag>.json (comma-separated tags, e.g. one per skeleton "
                        "run in parallel) into motiondreamer.md / .json, and exit")
    args = p.parse_args(argv)
    if args.merge:
        merge(args.merge.split(","))
        return
    if args.quick:
        args.vq_steps, args.gen_steps, args.sinmdm_steps, args.enc_steps, args.count = 60, 60, 60, 30, 2
    seeds = [int(s) for s in args.seeds.split(",")]
    torch.set_num_threads(1)
    results, t0 = {}, time.process_time()
    for skel in args.skeletons.split(","):
        skeleton(skel)  # refuses an unknown name early
        results[skel] = run_skeleton(skel, seeds, args)
    meta = provenance(argv, __file__)
    table = summarise(results)
    total = time.process_time() - t0
    text = (f"# MotionDreamer benchmark\n\n{provenance_line(meta)}\n\nTotal {total:.0f} CPU s. Seeds {seeds}; "
            f"{args.count} motions of {args.frames} frames per method and seed.\n\n{table}")
    out = results_dir("motiondreamer")
    name = "motiondreamer" + (f"_{args.tag}" if args.tag else "") + ("_quick" if args.quick else "")
    write_json(out / f"{name}.json", {"meta": meta, "args": vars(args), "results": results, "cpu_s": total})
    write_text(out / f"{name}.md", text)
    print(text)


if __name__ == "__main__":
    main()
