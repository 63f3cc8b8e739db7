"""One rank of the sharded tree-search test (started by ``tests/align/test_tree_search.py`` through
``launch_ranks``): ``python tree_shard_worker.py OUT``. Runs tree search once in one process (``dist=SINGLE``) and
once sharded over the gloo group (whole trees per rank), for each expansion (the default open one, splitting and
sweeps with the look-ahead, also widened), and writes ``OUT/rank<r>.json``: per expansion and field, whether the
two results are bitwise equal, and whether the rank's checkpoint resumes to the same result."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

import steerdiff as sd  # noqa: E402
from steerdiff.align.rewards import Quadratic  # noqa: E402
from steerdiff.align.tree_search import tree_search  # noqa: E402
from steerdiff.core.noise import randn  # noqa: E402
from steerdiff.distributed import SINGLE  # noqa: E402
from steerdiff.models import GaussianMixture  # noqa: E402

FIELDS = ("samples", "rewards", "log_weights", "particles_final", "log_evidence", "nonfinite")


def same(a, b) -> bool:
    return a.shape == b.shape and torch.equal(torch.nan_to_num(a.double(), 7.0, 8.0, 9.0),
                                              torch.nan_to_num(b.double(), 7.0, 8.0, 9.0))


def main() -> None:
    out = Path(sys.argv[1])
    ctx = sd.distributed.init(backend="gloo", timeout=float(os.environ.get("SD_TEST_TIMEOUT", "60")))
    mix = GaussianMixture([0.3, 0.7], [[-1.5, 0.5], [1.5, -0.5]], 0.3)
    r = Quadratic.around([1.0, 1.0], [1.0, 0.0])
    sig = sd.sigmas.karras(6, 0.02, 20.0)
    noise = randn((4 * 3, 2), seeds=0, dtype=torch.float64)  # 4 groups of up to 3 rows
    cases = {"open": dict(particles=3, branching=2),
             "split": dict(particles=2, expand="split", lookahead=1.0, split_sigma=(0.1, 5.0)),
             "sweep": dict(particles=3, expand="sweep", lookahead=1.0, split_sigma=5.0),
             "sweep_widen": dict(particles=2, expand="sweep", lookahead=1.0, split_sigma=5.0, widen=(2.0, 4))}
    result = {"rank": ctx.rank}
    for case, extra in cases.items():
        kw = dict(alpha=0.5, generator=7, draws=2, **extra)
        single = tree_search(mix, r, noise, sig, nfe=60, dist=SINGLE, **kw)
        sharded = tree_search(mix, r, noise, sig, nfe=60, dist=ctx, **kw)
        equal = {name: same(getattr(single, name), getattr(sharded, name)) for name in FIELDS}
        equal["nfe"] = single.nfe == sharded.nfe and single.reward_evals == sharded.reward_evals
        equal["rollouts"] = torch.equal(single.extras["rollouts"], sharded.extras["rollouts"])
        ck = out / f"tree_{case}.safetensors"
        tree_search(mix, r, noise, sig, nfe=30, dist=ctx, checkpoint=ck, **kw)
        resumed = tree_search(mix, r, noise, sig, nfe=60, dist=ctx, resume=ck, **kw)
        # the rollouts per tree (one per chain of a sweep): beyond the root's chains, so that the expansion ran
        resumes = all(same(getattr(single, n), getattr(resumed, n)) for n in FIELDS)
        result[case] = {"equal": equal, "checkpoint": resumes,
                        "min_rollouts": float(single.extras["rollouts"].min()), "particles": extra["particles"]}
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(result, indent=1))
    sd.distributed.shutdown()


if __name__ == "__main__":
    main()
