"""The shipped motion feature extractors of the single-instance motion metrics, one per procedural skeleton
(MotionDreamer, Wang et al., ICLR 2025, Sec. 4.1; docs/methods/motiondreamer.md "Metrics").

Each is a :class:`steerdiff.metrics.motion.MotionFeatureEncoder` trained self-supervised
(:func:`steerdiff.metrics.motion.train_feature_encoder`) on every style of its skeleton at seeds 100-103 (300 frames
each; the references of the benchmarks use seed 0), and lives in ``steerdiff/assets/motion_features_<skeleton>.json``
(+ ``.safetensors``: plain files, not a model directory, since ``steerdiff.models.load`` does not build it).
Remake them with::

    OMP_NUM_THREADS=1 python -m steerdiff.app.recipes.motion_features
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import torch

from ...data.motion import motion_features
from ...data.motion_synth import SKELETONS, STYLES, generate_motion
from ...metrics.motion import MotionFeatureEncoder, train_feature_encoder
from ...models.io import ASSETS_DIR

ROOT = ASSETS_DIR
SEEDS = (100, 101, 102, 103)
COMMAND = "OMP_NUM_THREADS=1 python -m steerdiff.app.recipes.motion_features"


def training_motions(skeleton: str, frames: int = 300) -> list[torch.Tensor]:
    """Feature sequences of every style of ``skeleton`` at :data:`SEEDS`."""
    styles = [s for s in STYLES.names() if STYLES.get(s).skeleton == skeleton]
    return [motion_features(generate_motion(s, frames, seed=seed)) for s in styles for seed in SEEDS]


def make(skeleton: str, out_root: str | Path = ROOT, steps: int = 400) -> Path:
    """Train and save the extractor of ``skeleton`` (the registered skeleton names)."""
    SKELETONS.get(skeleton)
    wall = time.perf_counter()
    enc, log = train_feature_encoder(training_motions(skeleton), steps=steps, seed=0)
    meta = {"skeleton": skeleton, "seeds": list(SEEDS), "command": COMMAND, "machine": platform.machine(),
            "torch_threads": torch.get_num_threads(), "wall_seconds": time.perf_counter() - wall,
            "cpu_seconds": log["cpu_seconds"], "final_loss": log["curve"][-1]["loss"], "steps": steps}
    return enc.save(Path(out_root) / f"motion_features_{skeleton}", meta)


def load_motion_feature_encoder(skeleton: str, root: str | Path = ROOT) -> MotionFeatureEncoder:
    """The shipped extractor of ``skeleton``.

    Raises:
        FileNotFoundError: not made yet (the message gives the command).
    """
    SKELETONS.get(skeleton)
    path = Path(root) / f"motion_features_{skeleton}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no motion feature extractor for {skeleton!r} in {path}: run `{COMMAND}`")
    return MotionFeatureEncoder.load(path)


def main() -> int:
    for name in SKELETONS.names():
        print(name, make(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
