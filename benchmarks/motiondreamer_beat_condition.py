"""Can training make classifier-free guidance on MotionDreamer's beat flags work? (``docs/methods/motiondreamer.md``,
"Beat-aligned generation".)

Retrains the generator of the shipped model of one skeleton (its tokeniser reused, the recipe's 2000 steps and seed)
with a higher condition dropout, (i) whole rows nulled with probability 0.5 (``cond_drop``), (ii) each position
nulled on its own with probability 0.5 (``cond_token_drop``, rows at the recipe's 0.1), and measures CFG at w = 2
and 4 against unguided sampling on 32 beat sequences (those of ``benchmarks/motiondreamer.py --beat-count 32``,
decoding seeds ``7000 + i``): the beat-hit rate, the paired gain with its standard error, and coverage / global
diversity / SIFID of both arms (the benchmark's extractor). About 170 CPU s per skeleton on one thread.

    OMP_NUM_THREADS=1 python benchmarks/motiondreamer_beat_condition.py quadruped
"""

import json
import sys
import time
from pathlib import Path

import torch

from steerdiff.data.motion import FeatureStats, motion_features
from steerdiff.data.motion_synth import generate_motion, reference_motion
from steerdiff.metrics.motion import train_feature_encoder
from steerdiff.models.io import ASSETS_DIR
from steerdiff.motion.apps import beat_alignment
from steerdiff.motion.dreamer import MotionDreamer, fit
from steerdiff.motion.generator import GeneratorConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import results_dir, write_json  # noqa: E402
from motiondreamer import _beat_sequences, _styles_of, evaluate  # noqa: E402


def main(skel: str, n: int = 32) -> dict:
    torch.set_num_threads(1)
    base = MotionDreamer.load(ASSETS_DIR / f"motiondreamer_{skel}")
    ref = motion_features(reference_motion(skel, frames=240, seed=0))
    stats = FeatureStats.fit(ref)
    extra = [motion_features(generate_motion(s, frames=240, seed=k)) for s in _styles_of(skel) for k in (1, 2)]
    enc, _ = train_feature_encoder([ref, *extra], steps=100, seed=0)
    norm = base.tokenizer.normalize
    seqs = _beat_sequences(ref, norm, n, 123)
    out = {}
    for name, kw in [("row0.5", {"cond_drop": 0.5}), ("tok0.5", {"cond_token_drop": 0.5})]:
        t0 = time.process_time()
        md = fit(ref, skel, gen=GeneratorConfig(steps=2000, seed=0, **kw), tokenizer=base.tokenizer,
                 tokenizer_log=base.meta.get("tokenizer_log"))
        tr = time.process_time() - t0
        for w in (2.0, 4.0):
            hc, hf, fc, ff = [], [], [], []
            for i, b in enumerate(seqs):
                g = md.sample(1, 240, seed=7000 + i, beats=b, guidance_scale=w)[0]
                f = md.sample(1, 240, seed=7000 + i)[0]
                hc.append(beat_alignment(b, norm(g)))
                hf.append(beat_alignment(b, norm(f)))
                fc.append(g)
                ff.append(f)
            d = torch.tensor(hc) - torch.tensor(hf)
            r = {"train_cpu": tr, "final_loss": md.meta["generator_log"]["final_loss"], "cfg": sum(hc) / n,
                 "free": sum(hf) / n, "gain": float(d.mean()), "gain_se": float(d.std() / n**0.5),
                 "free_metrics": evaluate(ref, ff, stats, enc, 0.25),
                 "cfg_metrics": evaluate(ref, fc, stats, enc, 0.25)}
            out[f"{name}_w{w:g}"] = r
            print(name, w, json.dumps(r), flush=True)
    write_json(results_dir("motiondreamer") / f"beat_condition_{skel}.json", out)
    return out


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "quadruped")
