"""One rank of the sharded noise-search test (started by ``tests/align/test_noise_search.py`` through
``launch_ranks``).

``python search_worker.py OUT``: joins the gloo group and runs each case twice in this process, once with one process
(``dist=SINGLE``) and once sharded over the group, and writes ``OUT/rank<r>.json``: per case, whether every output of
the two runs is bitwise equal.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

import steerdiff as sd  # noqa: E402
from steerdiff.align import noise_search  # noqa: E402
from steerdiff.align.rewards import Quadratic, ink  # noqa: E402
from steerdiff.app.protocols.das import validation_sigmas  # noqa: E402
from steerdiff.distributed import SINGLE  # noqa: E402
from steerdiff.models import GaussianMixture  # noqa: E402


def same(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def pair(ctx, **kw) -> dict:
    one = noise_search(dist=SINGLE, **kw)
    many = noise_search(dist=ctx, **kw)
    equal = {k: same(getattr(one, k), getattr(many, k)) for k in ("samples", "rewards")}
    for k in ("best_per_round", "improved", "pivot_noise"):
        equal[k] = same(one.extras[k], many.extras[k])
    equal["cost"] = (one.nfe, one.reward_evals) == (many.nfe, many.reward_evals)
    return {"equal": equal, "layout": (many.extras["communication"] or {}).get("layout")}


def main() -> None:
    out = Path(sys.argv[1])
    ctx = sd.distributed.init(backend="gloo", timeout=float(os.environ.get("SD_TEST_TIMEOUT", "60")))
    mix = GaussianMixture([0.3, 0.7], [[-2.0, 0.0, 1.0], [2.0, 1.0, -1.0]], 0.4)
    r = Quadratic.around([1.0, 0.5, 0.2], c=[1.0, 1.0, 0.0])
    sig = validation_sigmas(8)
    cases = {}
    for search in ("random", "zero_order", "paths"):
        for layout, groups, p in (("particles", 2, 8), ("groups", 4, 4)):
            noise = sd.randn((groups * p, 3), seeds=0, dtype=torch.float64)
            cases[f"{search}_{layout}"] = pair(ctx, denoiser=mix, reward=r, noise=noise, sigmas=sig, particles=p,
                                               search=search, rounds=3, generator=11, batch_size=4, shard_by=layout)
    from steerdiff.models.io import ASSETS_DIR, load

    model = load(ASSETS_DIR / "digits")
    noise = sd.randn((2 * 4, *model.sample_shape), seeds=0)
    sig = sd.sigmas.karras(5, 0.002, 80.0)
    cases["unet_zero_order"] = pair(ctx, denoiser=model, reward=ink, noise=noise, sigmas=sig,
                                    particles=4, search="zero_order", rounds=2, generator=0, batch_size=2,
                                    cond=torch.tensor([3, 5]), shard_by="particles")
    (out / f"rank{ctx.rank}.json").write_text(json.dumps({"rank": ctx.rank, "cases": cases}, indent=1))
    sd.distributed.shutdown()


if __name__ == "__main__":
    main()
