"""The recipe of the shipped MotionDreamer models ``steerdiff/assets/motiondreamer_<skeleton>/`` (Wang et al., ICLR
2025; ``docs/methods/motiondreamer.md``, "Shipped models").

One model per skeleton (biped, quadruped, snake), trained on its reference motion
(:func:`steerdiff.data.motion_synth.reference_motion`, ``frames`` frames, seed 0): the tokeniser with codebook
distribution regularisation (:class:`steerdiff.train.motion_vq.MotionVQConfig` defaults), the local-attention generator
(:class:`steerdiff.motion.generator.GeneratorConfig` defaults but :data:`GEN_STEPS` optimiser steps) conditioned on
per-token beat flags. The generator needs about 2000 steps to learn the reference's local token grammar (SIFID at the
default sampling 1.06 / 0.70 / 0.19 after 200 / 800 / 2000 steps, ``docs/methods/motiondreamer.md`` "Trained longer");
the models shipped before trained 800.

    python -m steerdiff.app.recipes.motiondreamer --skeleton biped --out runs/motiondreamer_biped
    python scripts/make_assets.py --only motiondreamer_biped,motiondreamer_quadruped,motiondreamer_snake
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ...data.motion import motion_features
from ...data.motion_synth import reference_motion
from ...motion.dreamer import MotionDreamer, fit
from ...motion.generator import GeneratorConfig
from ...train.motion_vq import MotionVQConfig

SKELETONS = ("biped", "quadruped", "snake")
FRAMES = 240
GEN_STEPS = 2000  # the long frontier's generator budget (benchmarks/motiondreamer.py --gen-steps 2000)


def asset_name(skeleton: str) -> str:
    """The shipped folder's name for a skeleton."""
    return f"motiondreamer_{skeleton}"


def make(skeleton: str, out: str | Path, *, frames: int = FRAMES, seed: int = 0, vq_steps: int | None = None,
         gen_steps: int = GEN_STEPS) -> MotionDreamer:
    """Train and save the model of ``skeleton`` into ``out`` (records CPU and wall time and the command).

    ``vq_steps`` None: the tokeniser's default; ``gen_steps``: the generator's optimiser steps.
    """
    if skeleton not in SKELETONS:
        raise ValueError(f"skeleton must be one of {SKELETONS}, got {skeleton!r}")
    t0 = time.perf_counter()
    motion = reference_motion(skeleton, frames=frames, seed=seed)
    vq = MotionVQConfig(seed=seed) if vq_steps is None else MotionVQConfig(steps=vq_steps, seed=seed)
    gen = GeneratorConfig(steps=gen_steps, seed=seed)
    md = fit(motion_features(motion), skeleton, vq=vq, gen=gen, fps=motion.fps)
    md.meta.update({"reference": {"frames": frames, "seed": seed}, "train_wall_s": time.perf_counter() - t0,
                    "threads": torch.get_num_threads(),
                    "command": f"python -m steerdiff.app.recipes.motiondreamer --skeleton {skeleton} --out {out}"})
    md.save(out)
    return md


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Train a MotionDreamer model on a skeleton's reference motion.")
    p.add_argument("--skeleton", choices=SKELETONS, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--frames", type=int, default=FRAMES)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    md = make(args.skeleton, args.out, frames=args.frames)
    print(f"{args.skeleton}: {md.meta['train_cpu_s']:.0f} CPU s, {md.meta['train_wall_s']:.0f} s wall -> {args.out}")


if __name__ == "__main__":
    main()
