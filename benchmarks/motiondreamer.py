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

``--frontier``: the comparison at equal fidelity. Per skeleton and seed it trains MotionDreamer, baseline (a)
(``full_noreg``) and baseline (b) (``sinmdm``, ``--frontier-sinmdm-steps`` steps) once, then sweeps each one's
sampling knobs (MotionDreamer and (a): the token draws' softmax temperature, MaskGIT's choice temperature, the decoding
rounds (with ``--sequential``: one token per round too), and for MotionDreamer the attention window at sampling;
SinMDM: the starting-noise scale of its ODE sampler)
and scores every setting (coverage at ``--coverage-threshold``, default the metric's 0.25). It writes every setting's
point (the diversity-vs-SIFID frontier per method) and, per SIFID level ``s``, each method's best coverage / global /
local diversity among its settings whose SIFID is at most ``s`` (mean +- std over seeds; ``-`` where a seed has no
setting that good):

    OMP_NUM_THREADS=1 python benchmarks/motiondreamer.py --frontier --skeletons biped --seeds 0,1,2

The tokenisers' and generators' training steps are ``--vq-steps`` / ``--gen-steps`` (defaults 150 / 200, the first
frontier's; ``docs/methods/motiondreamer.md`` "Equal fidelity" shows that the generator needs ~2000 to learn the
reference's local token grammar, and the shipped recipe trains 500 / 2000).

``--evaluate``: saved models (default the shipped ``steerdiff/assets/motiondreamer_<skeleton>``; ``--models`` names
folders, ``--tag`` names the output) at the default sampling setting, per sampling seed ``s`` in ``--seeds`` (seed
``1000 s``, ``--count`` motions): the metrics above (SIFID from the benchmark's extractor trained ``--enc-steps`` on the
reference and its skeleton's other styles, as in the tables, and ``sifid_shipped`` from the shipped extractor
``motion_features_<skeleton>``) and the beat-hit rates of the plain benchmark; then the seams of ``steerdiff motion
--edit 80:160 --count 8`` (``--edit-span``, ``--edit-count``; decoding seed 0): each seam's frame-to-frame step
against the reference's largest step, and the largest step of the tokeniser's decoding of the reference's own tokens
(the decoder's step without any edit):

    OMP_NUM_THREADS=1 python benchmarks/motiondreamer.py --evaluate --seeds 0,1,2 --tag shipped

With ``--beat-count N`` it adds the beat-aligned study (:func:`beat_study`): ``N`` motions per arm (unguided, CFG on
the beat flags, best-of-N on the beat reward, SMC steering towards it, SMC on top of CFG), the beat-hit rate with its
standard error and the paired gain over unguided sampling, and each arm's coverage / diversities / SIFID:

    OMP_NUM_THREADS=1 python benchmarks/motiondreamer.py --evaluate --seeds 0,1,2 --beat-count 32 --tag beats
"""

from __future__ import annotations

import argparse
import json
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
from steerdiff.motion.apps import align_to_beats, beat_alignment, beat_reward, decode_batch, kinematic_beats
from steerdiff.motion.dreamer import MotionDreamer, fit
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


def _sweep_settings(method: str, args) -> list[dict]:
    """The sampling settings a method is scored at (one knob moved at a time from the defaults, plus temperature x
    greedy choice order)."""
    if method == "sinmdm":
        return [{"noise_scale": v} for v in _floats(args.noise_scales)]
    base = {"temperature": 1.0, "choice_temperature": 1.0, "rounds": args.sample_steps}
    out = [{**base, "temperature": t} for t in _floats(args.temperatures)]
    out += [{**base, "temperature": t, "choice_temperature": 0.0} for t in _floats(args.temperatures)]
    out += [{**base, "choice_temperature": 4.5}]
    out += [{**base, "rounds": r} for r in (4, 24) if r != args.sample_steps]
    if args.sequential:  # one token per round (rounds = tokens): each draw sees every token decoded before it
        seq = {**base, "rounds": -(-args.frames // MotionVQConfig.downsample)}
        out += [seq, *({**seq, "temperature": t, "choice_temperature": 0.0} for t in _floats(args.sequential))]
    if method.startswith("motiondreamer"):  # the attention window at sampling, around the trained one
        trained = args.window if method == "motiondreamer" else int(method.rsplit("_w", 1)[1])
        out += [{**base, "window": w} for w in (trained - 1, trained + 2) if w >= 1]
    return out


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _key(setting: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in setting.items())


def run_frontier(skel: str, seeds: list[int], args) -> dict:
    """Every sampling setting's metrics per method and seed (see the module docstring, ``--frontier``)."""
    ref = motion_features(reference_motion(skel, frames=args.frames))
    stats = FeatureStats.fit(ref)
    extra = [motion_features(generate_motion(s, frames=args.frames, seed=k)) for s in _styles_of(skel) for k in (1, 2)]
    c0 = time.process_time()
    enc, _ = train_feature_encoder([ref, *extra], steps=args.enc_steps, seed=0)
    out = {"feature_encoder_cpu_s": time.process_time() - c0, "points": {}, "train_cpu_s": {}}
    for seed in seeds:
        models, tokenizers = {}, {}
        windows = [int(w) for w in args.frontier_windows.split(",")] if args.frontier_windows else []
        arms = [("motiondreamer", True, args.window), *((f"motiondreamer_w{w}", True, w) for w in windows),
                ("full_noreg", False, None)]
        for name, reg, window in arms:
            c0 = time.process_time()
            vq = MotionVQConfig(steps=args.vq_steps, reg_weight=0.1 if reg else 0.0, seed=seed)
            if reg not in tokenizers:  # the wider-window arms share MotionDreamer's tokeniser (its cost counted once)
                res = train_motion_vq(ref, vq)
                tokenizers[reg] = (res.model, res.log)
            gen = GeneratorConfig(steps=args.gen_steps, window=window, absolute=window is None, seed=seed)
            tok, tok_log = tokenizers[reg]
            models[name] = fit(ref, skel, vq=vq, gen=gen, tokenizer=tok, tokenizer_log=tok_log)
            out["train_cpu_s"].setdefault(name, []).append(time.process_time() - c0)
        c0 = time.process_time()
        sin_cfg = replace(SinMDMConfig(), steps=args.frontier_sinmdm_steps, seed=seed,
                          **{k: getattr(args, f"sinmdm_{k}") for k in ("hidden", "layers", "kernel", "lr")})
        sin, sin_log = train_sinmdm(stats.normalize(ref), sin_cfg)
        out["train_cpu_s"].setdefault("sinmdm", []).append(time.process_time() - c0)
        out["sinmdm"] = {"config": sin_log["config"], "receptive_field": sin_log["receptive_field"],
                         "final_loss": sin_log["final_loss"]}
        for name in (*models, "sinmdm"):
            for setting in _sweep_settings(name, args):
                if name == "sinmdm":
                    feats = stats.denormalize(sample_sinmdm(sin, ref.shape[0], args.count, steps=18, seed=1000 * seed,
                                                            noise_scale=setting["noise_scale"]))
                else:
                    kw = {k: v for k, v in setting.items() if k != "rounds"}
                    if "window" in kw:
                        kw["window"] = int(kw["window"])
                    feats = models[name].sample(args.count, ref.shape[0], steps=int(setting["rounds"]),
                                                seed=1000 * seed, **kw)
                row = evaluate(ref, list(feats), stats, enc, args.coverage_threshold)
                out["points"].setdefault(name, {}).setdefault(_key(setting), []).append(row)
                print(f"[{skel}] seed {seed} {name} {_key(setting)}: "
                      + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    return out


def _mean_sd_cell(vals: list) -> str:
    """``mean ± sd`` over seeds, or ``-`` where some seed has no value."""
    if any(v is None for v in vals):
        return "-"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.mean(vals):.3g} ± {sd:.2g}"


def _best_at(rows_by_setting: dict, seed_index: int, level: float, metric: str) -> float | None:
    vals = [rows[seed_index][metric] for rows in rows_by_setting.values()
            if len(rows) > seed_index and rows[seed_index]["sifid"] <= level]
    return max(vals) if vals else None


def _best_joint(rows_by_setting: dict, seed_index: int, level: float, min_coverage: float, metric: str):
    vals = [rows[seed_index][metric] for rows in rows_by_setting.values()
            if len(rows) > seed_index and rows[seed_index]["sifid"] <= level
            and rows[seed_index]["coverage"] >= min_coverage]
    return max(vals) if vals else None


def summarise_frontier(results: dict, levels: list[float], joint_coverage: float = 0.9) -> str:
    lines = []
    for skel, res in results.items():
        n_seeds = max(len(r) for pts in res["points"].values() for r in pts.values())
        lines += [f"### {skel}", "", "Best value among a method's sampling settings whose SIFID is at most the level "
                  f"(mean ± std over {n_seeds} seed(s); `-`: some seed has no setting with SIFID that low).", ""]
        rows = []
        for level in levels:
            for name, pts in res["points"].items():
                cells = [f"≤ {level:g}", name]
                for m in ("coverage", "global_div", "local_div"):
                    cells.append(_mean_sd_cell([_best_at(pts, i, level, m) for i in range(n_seeds)]))
                rows.append(cells)
        lines += [markdown_table(["SIFID level", "method", "coverage ↑", "global div ↑", "local div ↑"], rows), ""]
        lines += [f"One setting for both (no envelope): the best global / local diversity among a method's settings "
                  f"with SIFID at most the level **and** coverage at least {joint_coverage:g} (per seed, then mean ± "
                  "std; `-`: some seed has no such setting).", ""]
        rows = []
        for level in levels:
            for name, pts in res["points"].items():
                cells = [f"≤ {level:g}", name]
                for m in ("global_div", "local_div"):
                    cells.append(_mean_sd_cell([_best_joint(pts, i, level, joint_coverage, m)
                                                for i in range(n_seeds)]))
                rows.append(cells)
        lines += [markdown_table(["SIFID level", "method", "global div ↑", "local div ↑"], rows), ""]
        lines += ["Every setting (mean over seeds), sorted by SIFID per method:", ""]
        rows = []
        for name, pts in res["points"].items():
            means = {k: {m: statistics.mean(r[m] for r in rs) for m in METRICS} for k, rs in pts.items()}
            for k, v in sorted(means.items(), key=lambda kv: kv[1]["sifid"]):
                rows.append([name, k, *(f"{v[m]:.3g}" for m in ("sifid", "coverage", "global_div", "local_div",
                                                                "intra_div"))])
        lines += [markdown_table(["method", "setting", "SIFID ↓", "coverage ↑", "global div ↑", "local div ↑",
                                  "intra div"], rows), ""]
        tr = {k: statistics.mean(v) for k, v in res["train_cpu_s"].items()}
        lines += ["Training CPU s per seed: " + ", ".join(f"{k} {v:.0f}" for k, v in tr.items()), ""]
    return "\n".join(lines)


def beat_test(md, ref: Tensor, seed: int, args) -> dict:
    """Beat-hit rate (kinematic beats within 2 frames of the requested ones) with CFG (w = ``--beat-scale``, default 2)
    vs unguided, on beat sequences drawn at the reference's own beat rate (random phase per motion)."""
    norm = md.tokenizer.normalize
    ref_beats = kinematic_beats(norm(ref))
    gap = max(int(ref.shape[0] / max(len(ref_beats), 1)), 6)
    g = torch.Generator().manual_seed(seed)
    hit_cfg, hit_free = [], []
    for i in range(args.count):
        beats = list(range(int(torch.randint(0, gap, (1,), generator=g)), ref.shape[0], gap))
        guided = md.sample(1, ref.shape[0], steps=args.sample_steps, seed=5000 + i, beats=beats,
                           guidance_scale=args.beat_scale)[0]
        free = md.sample(1, ref.shape[0], steps=args.sample_steps, seed=5000 + i)[0]
        hit_cfg.append(beat_alignment(beats, norm(guided)))
        hit_free.append(beat_alignment(beats, norm(free)))
    return {"beat_hit_cfg": sum(hit_cfg) / len(hit_cfg), "beat_hit_uncond": sum(hit_free) / len(hit_free)}


def _beat_sequences(ref: Tensor, norm, count: int, seed: int) -> list[list[int]]:
    """``count`` beat sequences at the reference's own beat rate, random phase each (as :func:`beat_test`)."""
    gap = max(int(ref.shape[0] / max(len(kinematic_beats(norm(ref))), 1)), 6)
    g = torch.Generator().manual_seed(seed)
    return [list(range(int(torch.randint(0, gap, (1,), generator=g)), ref.shape[0], gap)) for _ in range(count)]


BEAT_ARMS = ("unguided", "cfg", "best_of_n", "smc", "smc_cfg")


def beat_study(md, ref: Tensor, stats: FeatureStats, enc, args) -> dict:
    """Beat-aligned generation, ``--beat-count`` motions per arm, each its own beat sequence (shared by the arms) and
    decoding seed ``7000 + i``: unguided; CFG at ``--beat-scale`` on the beat flags; best-of-N (``--beat-particles``
    unguided draws, the highest :func:`beat_reward` kept: the same NFE as SMC); SMC steering towards the beat reward
    (``--beat-particles`` particles, ``--beat-alpha``); SMC on top of CFG. Per arm the beat-hit rate (mean, its SE,
    and the paired difference to unguided with its SE), NFE and CPU s per motion, and the arm's motions' coverage,
    diversities and SIFID."""
    norm = md.tokenizer.normalize
    seqs = _beat_sequences(ref, norm, args.beat_count, 123)
    n_tok, frames = md.reference_tokens.shape[0], ref.shape[0]
    p, a, w = args.beat_particles, args.beat_alpha, args.beat_scale
    out = {}
    for arm in BEAT_ARMS:
        feats, t0 = [], time.process_time()
        for i, beats in enumerate(seqs):
            seed = 7000 + i
            if arm == "unguided":
                f = md.sample(1, frames, steps=args.sample_steps, seed=seed)[0]
            elif arm == "cfg":
                f = md.sample(1, frames, steps=args.sample_steps, seed=seed, beats=beats, guidance_scale=w)[0]
            elif arm == "best_of_n":
                cand = md.sample(p, frames, steps=args.sample_steps, seed=seed * 1000)
                f = cand[int(beat_reward(beats, normalize=norm)(cand).argmax())]
            else:
                cond = md.beats_to_cond(beats, n_tok, 1) if arm == "smc_cfg" else None
                f = align_to_beats(md.generator, md.tokenizer, beats, n_tok, particles=p, alpha=a,
                                   steps=args.sample_steps, seed=seed * 1000, cond=cond,
                                   guidance_scale=w if cond is not None else None).features[0, :frames]
            feats.append(f)
        cpu = (time.process_time() - t0) / len(seqs)
        hits = [beat_alignment(b, norm(f)) for b, f in zip(seqs, feats, strict=True)]
        nfe = args.sample_steps * (2 if arm in ("cfg", "smc_cfg") else 1) * (p if arm in ("best_of_n", "smc",
                                                                                        "smc_cfg") else 1)
        out[arm] = {"hits": hits, "cpu_s_per_motion": cpu, "nfe_per_motion": nfe,
                    **evaluate(ref, feats, stats, enc, args.coverage_threshold)}
    base = out["unguided"]["hits"]
    for r in out.values():
        h = torch.tensor(r["hits"], dtype=torch.float64)
        d = h - torch.tensor(base, dtype=torch.float64)
        r.update({"hit": float(h.mean()), "hit_se": float(h.std() / len(h) ** 0.5), "gain": float(d.mean()),
                  "gain_se": float(d.std() / len(d) ** 0.5)})
    return out


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


def evaluate_model(directory: str | Path, seeds: list[int], args) -> dict:
    """One saved model at the default sampling setting and its edit seams (module docstring, ``--evaluate``)."""
    from steerdiff.app.recipes.motion_features import load_motion_feature_encoder

    md = MotionDreamer.load(directory)
    skel, ref_meta = md.skeleton, md.meta.get("reference", {"frames": 240, "seed": 0})
    ref = motion_features(reference_motion(skel, frames=ref_meta["frames"], seed=ref_meta["seed"]))
    stats = FeatureStats.fit(ref)
    extra = [motion_features(generate_motion(s, frames=ref.shape[0], seed=k)) for s in _styles_of(skel) for k in (1, 2)]
    enc, _ = train_feature_encoder([ref, *extra], steps=args.enc_steps, seed=0)
    shipped_enc = load_motion_feature_encoder(skel)
    rows = []
    for seed in seeds:
        feats = list(md.sample(args.count, ref.shape[0], steps=args.sample_steps, seed=1000 * seed))
        row = evaluate(ref, feats, stats, enc, args.coverage_threshold)
        row["sifid_shipped"] = sifid(shipped_enc, ref, feats)
        row.update(beat_test(md, ref, seed, args))
        rows.append(row)
    beats = beat_study(md, ref, stats, enc, args) if args.beat_count else None
    start, end = (int(v) for v in args.edit_span.split(":"))
    res = md.edit(ref, start, end, count=args.edit_count, steps=args.sample_steps, seed=0)
    kept = torch.cat([res.features[:, : res.span[0]], res.features[:, res.span[1]:]], 1)
    same = torch.cat([ref[: res.span[0]], ref[res.span[1]:]]).expand_as(kept)
    recon = decode_batch(md.tokenizer, md.reference_tokens[None])[0]
    seams = res.seams["seam_steps"].flatten()
    gen_log = md.meta.get("generator_log", {})
    return {"model": str(directory), "skeleton": skel, "gen_steps": gen_log.get("config", {}).get("steps"),
            "final_loss": gen_log.get("final_loss"), "train_cpu_s": md.meta.get("train_cpu_s"), "rows": rows,
            "beats": beats,
            "edit": {"span": list(res.span), "kept_bit_identical": bool(torch.equal(kept, same)),
                     "seam_steps": seams.tolist(), "reference_max": res.seams["reference_max"],
                     "reference_p99": res.seams["reference_p99"],
                     "above_reference_max": int((seams > res.seams["reference_max"]).sum()),
                     "decoder_reference_max": float((recon[1:] - recon[:-1]).norm(dim=-1).max())}}


def _beat_table(results: list, args) -> str:
    rows = []
    for r in results:
        for arm, b in r["beats"].items():
            rows.append([r["skeleton"], arm, f"{b['hit']:.3f} ± {b['hit_se']:.3f}",
                         "-" if arm == "unguided" else f"{b['gain']:+.3f} ± {b['gain_se']:.3f}",
                         str(b["nfe_per_motion"]), f"{b['cpu_s_per_motion']:.2f}",
                         *(f"{b[m]:.3g}" for m in ("coverage", "global_div", "local_div", "sifid"))])
    return (f"\nBeat-aligned generation: {args.beat_count} motions per arm, each on its own beat sequence at the "
            f"reference's beat rate (random phase; shared by the arms); beat hit = requested beats met by a kinematic "
            f"beat within 2 frames (mean ± SE over motions; gain: paired difference to unguided ± its SE). CFG w = "
            f"{args.beat_scale:g}; best-of-N and SMC with {args.beat_particles} draws / particles, SMC alpha "
            f"{args.beat_alpha:g}; coverage, diversities and SIFID (benchmark extractor) over the arm's motions.\n\n"
            + markdown_table(["skeleton", "arm", "beat hit", "gain vs unguided", "NFE / motion", "CPU s / motion",
                              "coverage", "global div", "local div", "SIFID ↓"], rows) + "\n")


def evaluate_main(argv, args, seeds: list[int]) -> None:
    from steerdiff.models.io import ASSETS_DIR

    dirs = args.models.split(",") if args.models else [str(ASSETS_DIR / f"motiondreamer_{s}")
                                                        for s in args.skeletons.split(",")]
    results, t0 = [], time.process_time()
    for d in dirs:
        results.append(evaluate_model(d, seeds, args))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "rows"}), flush=True)
    rows, seam_rows = [], []
    for r in results:
        cells = [r["skeleton"], Path(r["model"]).name, str(r["gen_steps"]), f"{r['final_loss']:.3g}",
                 f"{r['train_cpu_s']:.0f}"]
        cells += [_mean_sd_cell([row[m] for row in r["rows"]])
                  for m in (*METRICS, "sifid_shipped", "beat_hit_cfg", "beat_hit_uncond")]
        rows.append(cells)
        e = r["edit"]
        seam_rows.append([r["skeleton"], Path(r["model"]).name, f"{max(e['seam_steps']):.3g}",
                          f"{e['above_reference_max']} / {len(e['seam_steps'])}", f"{e['reference_max']:.3g}",
                          f"{e['reference_p99']:.3g}", f"{e['decoder_reference_max']:.3g}",
                          str(e["kept_bit_identical"])])
    meta = provenance(argv, __file__)
    total = time.process_time() - t0
    text = (f"# MotionDreamer: saved models at the default sampling\n\n{provenance_line(meta)}\n\nTotal {total:.0f} "
            f"CPU s. {args.count} motions per sampling seed {seeds} ({args.sample_steps} rounds, temperatures 1, "
            f"trained window); coverage threshold {args.coverage_threshold:g}; mean ± std over the sampling seeds.\n\n"
            + markdown_table(["skeleton", "model", "generator steps", "final loss", "train CPU s", "coverage ↑",
                              "global div ↑", "local div ↑", "SIFID ↓", "intra div", "SIFID (shipped extractor) ↓",
                              f"beat hit (CFG w = {args.beat_scale:g})", "beat hit (unguided)"],
                             rows)
            + f"\n\nEdit `{args.edit_span}`, {args.edit_count} motions (decoding seed 0; what `steerdiff motion "
            f"--edit {args.edit_span} --count {args.edit_count}` writes): seam steps against the reference's.\n\n"
            + markdown_table(["skeleton", "model", "largest seam step", "seams above the reference's max",
                              "reference max step", "reference p99 step", "decoder's max step on the reference",
                              "kept bit-identical"], seam_rows) + "\n")
    if args.beat_count:
        text += _beat_table(results, args)
    out = results_dir("motiondreamer")
    name = "evaluate" + (f"_{args.tag}" if args.tag else "")
    write_json(out / f"{name}.json", {"meta": meta, "args": vars(args), "results": results, "cpu_s": total})
    write_text(out / f"{name}.md", text)
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
    p.add_argument("--coverage-threshold", type=float, default=None,
                   help="coverage's per-element RMS threshold (default 0.5 for the plain table, what the committed "
                        "table used; 0.25 with --frontier, steerdiff.metrics.motion.coverage's default)")
    p.add_argument("--frontier", action="store_true",
                   help="sweep each method's sampling knobs and compare at equal SIFID (module docstring)")
    p.add_argument("--frontier-sinmdm-steps", type=int, default=1500, help="baseline (b)'s training steps there")
    p.add_argument("--sinmdm-hidden", type=int, default=64, help="baseline (b)'s width (--frontier)")
    p.add_argument("--sinmdm-layers", type=int, default=4, help="baseline (b)'s residual blocks (--frontier)")
    p.add_argument("--sinmdm-kernel", type=int, default=5, help="baseline (b)'s temporal kernel (--frontier)")
    p.add_argument("--sinmdm-lr", type=float, default=2e-3, help="baseline (b)'s learning rate (--frontier)")
    p.add_argument("--frontier-windows", default="6",
                   help="extra MotionDreamer arms trained with these attention windows (--frontier; '' for none)")
    p.add_argument("--temperatures", default="0.7,1,1.4,2,3,5", help="token temperatures swept (--frontier)")
    p.add_argument("--sequential", default="",
                   help="also score one-token-per-round decoding (rounds = the token count) at choice temperature 1, "
                        "and at greedy order with these token temperatures (--frontier; e.g. '0.7,1,1.5,2')")
    p.add_argument("--noise-scales", default="0.5,0.7,0.85,1,1.2", help="SinMDM noise scales swept (--frontier)")
    p.add_argument("--sifid-levels", default="0.15,0.25,0.35,0.5,0.7,1",
                   help="SIFID levels of the matched table (--frontier)")
    p.add_argument("--evaluate", action="store_true",
                   help="score saved models at the default sampling and their edit seams (module docstring)")
    p.add_argument("--models", default="", help="--evaluate: model folders (default: the shipped ones of "
                                                "--skeletons)")
    p.add_argument("--beat-scale", type=float, default=2.0, help="CFG scale of the beat-hit test")
    p.add_argument("--beat-count", type=int, default=0,
                   help="--evaluate: also the beat-aligned study on this many motions per arm (0: off; 32 in the docs)")
    p.add_argument("--beat-particles", type=int, default=32, help="best-of-N draws / SMC particles of the beat study")
    p.add_argument("--beat-alpha", type=float, default=0.02, help="SMC's tilt temperature in the beat study")
    p.add_argument("--edit-span", default="80:160", help="--evaluate: the edited frames START:END")
    p.add_argument("--edit-count", type=int, default=8, help="--evaluate: edited motions")
    p.add_argument("--quick", action="store_true", help="tiny settings (a smoke run)")
    p.add_argument("--tag", default="")
    p.add_argument("--merge", default=None, metavar="TAGS",
                   help="combine earlier runs motiondreamer_<tag>.json (comma-separated tags, e.g. one per skeleton "
                        "run in parallel) into motiondreamer.md / .json, and exit")
    p.add_argument("--frontier-render", default=None, metavar="TAGS",
                   help="re-render earlier --frontier runs frontier_<tag>.json (comma-separated tags) into one "
                        "frontier.md at --sifid-levels, and exit")
    p.add_argument("--render-name", default="frontier", help="--frontier-render writes <name>.md")
    args = p.parse_args(argv)
    if args.frontier_render:
        frontier_render(args.frontier_render.split(","), _floats(args.sifid_levels), args.render_name)
        return
    if args.merge:
        merge(args.merge.split(","))
        return
    if args.quick:
        args.vq_steps, args.gen_steps, args.sinmdm_steps, args.enc_steps, args.count = 60, 60, 60, 30, 2
        args.frontier_sinmdm_steps = 60
    seeds = [int(s) for s in args.seeds.split(",")]
    torch.set_num_threads(1)
    if args.coverage_threshold is None:
        args.coverage_threshold = 0.25 if args.frontier or args.evaluate else 0.5
    if args.frontier:
        frontier_main(argv, args, seeds)
        return
    if args.evaluate:
        evaluate_main(argv, args, seeds)
        return
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


def frontier_main(argv, args, seeds: list[int]) -> None:
    results, t0 = {}, time.process_time()
    for skel in args.skeletons.split(","):
        skeleton(skel)
        results[skel] = run_frontier(skel, seeds, args)
    meta = provenance(argv, __file__)
    total = time.process_time() - t0
    text = (f"# MotionDreamer at equal fidelity (frontier)\n\n{provenance_line(meta)}\n\nTotal {total:.0f} CPU s. "
            f"Seeds {seeds}; {args.count} motions of {args.frames} frames per setting and seed; coverage threshold "
            f"{args.coverage_threshold:g}; SinMDM trained {args.frontier_sinmdm_steps} steps "
            f"(config, receptive field in the JSON).\n\n"
            f"{summarise_frontier(results, _floats(args.sifid_levels))}")
    out = results_dir("motiondreamer")
    name = "frontier" + (f"_{args.tag}" if args.tag else "") + ("_quick" if args.quick else "")
    write_json(out / f"{name}.json", {"meta": meta, "args": vars(args), "results": results, "cpu_s": total})
    write_text(out / f"{name}.md", text)
    print(text)


def frontier_render(tags: list[str], levels: list[float], name: str = "frontier") -> None:
    """One frontier table from runs made separately (e.g. one process per skeleton), at the given SIFID levels."""
    import json

    out = results_dir("motiondreamer")
    parts = [json.loads((out / f"frontier_{t}.json").read_text()) for t in tags]
    results: dict = {}
    for part in parts:  # runs of the same skeleton (other seeds, same settings) are appended seed by seed
        for skel, res in part["results"].items():
            if skel not in results:
                results[skel] = json.loads(json.dumps(res))
                continue
            into = results[skel]
            for method, pts in res["points"].items():
                for key, rows in pts.items():
                    into["points"].setdefault(method, {}).setdefault(key, []).extend(rows)
            for method, v in res["train_cpu_s"].items():
                into["train_cpu_s"].setdefault(method, []).extend(v)
    cmds = "; ".join(f"`{p['meta'].get('command', '')}`" for p in parts)
    a = parts[0]["args"]
    text = (f"# MotionDreamer at equal fidelity (frontier)\n\nFrom {len(parts)} run(s) ({cmds}), made in parallel "
            f"on a shared 2-core machine, {provenance_line(parts[0]['meta'])}\n\n"
            f"Total {sum(p['cpu_s'] for p in parts):.0f} CPU s. {a['count']} motions of {a['frames']} frames per "
            f"setting and seed; coverage threshold {a['coverage_threshold']:g}; SinMDM trained "
            f"{a['frontier_sinmdm_steps']} steps; tokenisers {a['vq_steps']}, generators {a['gen_steps']} steps.\n\n"
            f"{summarise_frontier(results, levels)}")
    write_text(out / f"{name}.md", text)
    print(text)


if __name__ == "__main__":
    main()
