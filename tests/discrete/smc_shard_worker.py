"""One rank of the sharded discrete-SMC test (started by ``tests/discrete/test_steering.py`` through ``run_ranks``):
``python smc_shard_worker.py OUT``. Runs :func:`steerdiff.discrete.smc` once in one process and once with whole groups
per rank over gloo, and writes ``OUT/rank<r>.json``: per field, whether the two results are bitwise equal."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

import steerdiff as sd  # noqa: E402
import steerdiff.discrete as dd  # noqa: E402
from steerdiff.distributed import SINGLE  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    ctx = sd.distributed.init(backend="gloo", timeout=float(os.environ.get("SD_TEST_TIMEOUT", "60")))
    proc = dd.make_process("absorbing", 3, schedule="linear")
    model = dd.TableModel(dd.random_table(4, 3, labels=2, seed=1), 4, proc)
    kw = dict(length=4, steps=4, alpha=1.0, num_samples=4, particles=8, generator=11,
              cond=torch.tensor([0, 1, 0, 1]), guidance=dd.CFG(1.5))

    def reward(x):
        return (x == 2).sum(-1).double()

    single = dd.smc(model, proc, reward, dist=SINGLE, **kw)
    sharded = dd.smc(model, proc, reward, dist=ctx, **kw)
    equal = {f: bool(torch.equal(getattr(single, f), getattr(sharded, f)))
             for f in ("samples", "log_weights", "rewards", "ess", "log_evidence")}
    equal["nfe"] = single.nfe == sharded.nfe
    (out / f"rank{ctx.rank}.json").write_text(json.dumps({"rank": ctx.rank, "equal": equal}))
    sd.distributed.shutdown()


if __name__ == "__main__":
    main()
