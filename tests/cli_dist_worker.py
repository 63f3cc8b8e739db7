"""Worker for tests/test_cli_distributed.py: run a list of ``steerdiff`` commands in this process, one after another.

    python tests/cli_dist_worker.py OUT_ROOT MODE          # one process (MODE = w1)
    torchrun --standalone --nproc_per_node=2 tests/cli_dist_worker.py OUT_ROOT w2

Each job writes its outputs to ``OUT_ROOT/MODE/<job>``; what every rank printed and any error it raised go to
``OUT_ROOT/MODE/rank<r>.json``. Under a launcher the process group is started once here, so that every command
reuses it (``steerdiff.app.cli._shard.begin`` joins an existing group and leaves it open); the literal ``torchrun
--no-python steerdiff ...`` path is tested on its own in the test module. ``{RANK}`` in a job's arguments is
replaced by the rank, so that ranks can be given different arguments on purpose.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

DIGITS = ["--model", "digits", "--steps", "6", "--no-progress"]
RESTORE = ["restore", "--model", "digits", "--task", "inpaint-center", "--input", "digits:test:0", "--steps", "8"]
JOBS = {
    # 4 chunks of 8: two per rank.
    "sample_b8": ["sample", *DIGITS, "--seed", "0", "--n", "32", "--batch", "8"],
    # The default --batch: one chunk, rank 1 has none.
    "sample_default": ["sample", *DIGITS, "--seed", "0", "--n", "32"],
    # Seeds out of order and not from 0, 5 chunks (3 + 2), the last one short; a mixture, float64, guided.
    "sample_gmm": ["sample", "--model", "gmm2d", "--seeds", "7-10,40,3,99-101", "--batch", "2", "--steps", "8",
                   "--class", "1", "--scale", "3", "--method", "ddpm", "--no-progress"],
    # HR chains in chunks of 2: 3 chunks (2 + 1).
    "restore_hr": [*RESTORE, "--method", "hr", "--chains", "6", "--batch", "2"],
    # DPS (gradients through the network) with chunks of one chain.
    "restore_dps": [*RESTORE, "--method", "dps", "--chains", "3", "--batch", "1"],
    # SMC particles spread over the ranks by steerdiff.align (the command passes the process group and writes).
    "align_das": ["align", "--model", "digits", "--reward", "class:3", "--particles", "8", "--n", "4", "--steps", "5",
                  "--batch-size", "4", "--no-progress"],
    # The default --batch-size (256): one micro-batch of 32 rows in one process, 16 rows on each rank; the
    # documented exception to bitwise equality (rank 0 warns), compared to float rounding only.
    "align_das_default_batch": ["align", "--model", "digits", "--reward", "class:3", "--particles", "8", "--n", "4",
                                "--steps", "5", "--no-progress"],
    "align_fk": ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--alpha", "0.5", "--method", "fk",
                 "--particles", "8", "--n", "3", "--steps", "6", "--no-progress"],
}
MISMATCH = {"mismatch": ["sample", "--model", "gmm2d", "--seeds", "0-{RANK}1", "--steps", "4", "--no-progress"]}


def _count_rows() -> dict:
    """Count the rows this rank samples (``core.sample``) or solves (``restore``'s ``solve``), so that the test sees
    that every rank did its share of the work."""
    import steerdiff.app.cli.restore as restore
    from steerdiff import core

    rows: dict = {}
    sample, solve = core.sample, restore.solve

    def counted_sample(model, noise, *args, **kwargs):
        rows["n"] = rows.get("n", 0) + noise.shape[0]
        return sample(model, noise, *args, **kwargs)

    def counted_solve(*args, chains, **kwargs):
        rows["n"] = rows.get("n", 0) + chains
        return solve(*args, chains=chains, **kwargs)

    core.sample, restore.solve = counted_sample, counted_solve
    return rows


def main() -> None:
    root, mode = Path(sys.argv[1]), sys.argv[2]
    from steerdiff import distributed
    from steerdiff.app.cli import main as cli

    ctx = distributed.init(backend="gloo", timeout=60)
    rows = _count_rows()
    out = root / mode
    out.mkdir(parents=True, exist_ok=True)
    jobs = JOBS | (MISMATCH if ctx.distributed else {})
    record = {"rank": ctx.rank, "world": ctx.world, "jobs": {}}
    for name, args in jobs.items():
        args = [a.replace("{RANK}", str(ctx.rank)) for a in args] + ["--out", str(out / name)]
        buf = io.StringIO()
        error = None
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                cli.main(args, standalone_mode=False)
            except Exception as err:  # recorded; the test decides which jobs must fail
                error = f"{type(err).__name__}: {err}"
        record["jobs"][name] = {"output": buf.getvalue(), "error": error, "rows": rows.pop("n", 0)}
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(record, indent=1))
    distributed.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
