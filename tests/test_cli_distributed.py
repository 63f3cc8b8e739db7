"""Seed-sharded ``steerdiff sample`` / ``steerdiff restore`` under torchrun (gloo, 2 CPU processes, 1 thread each)
write the same files as one process: every tensor of samples.safetensors bit for bit (and its metadata), the PNG
grid byte for byte, metrics.json but for its seconds; the same for ``steerdiff align`` (DAS, FK steering), whose
particles steerdiff.align spreads over the ranks; ranks given different arguments fail on both ranks.

The one-process reference and the two-process runs execute the same commands (tests/cli_dist_worker.py) in separate
processes with one thread each; the literal ``torchrun --no-python steerdiff ...`` entry point is checked against the
same reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from teardown import TEARDOWN_ABORT, TEARDOWN_REPEATS, teardown_abort

from steerdiff.distributed import DistContext
from steerdiff.distributed.seeds import chunks, format_seeds, own_chunks, parse_seeds

WORKER = Path(__file__).with_name("cli_dist_worker.py")
VENV_BIN = Path(sys.executable).parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
TIMEOUT = 150  # seconds for a whole launch: a hung rank fails the test instead of the suite


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    return env | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PATH": f"{VENV_BIN}{os.pathsep}{env['PATH']}",
                  "STEERDIFF_SKIP_BROWSER": "1"}


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, env=_env(), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    for _ in range(TEARDOWN_REPEATS):
        if res.returncode == 0 or not teardown_abort([res.returncode], res.stderr):  # see tests/teardown.py
            break
        warnings.warn(f"a rank aborted at teardown ({TEARDOWN_ABORT!r}); repeating the launch", RuntimeWarning,
                      stacklevel=2)
        res = subprocess.run(argv, env=_env(), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, f"{argv} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The worker's jobs in one process (``w1``) and on two ranks under torchrun (``w2``)."""
    root = tmp_path_factory.mktemp("cli_dist")
    _run([sys.executable, str(WORKER), str(root), "w1"], root)
    _run([*TORCHRUN, str(WORKER), str(root), "w2"], root)
    return root


def _records(root: Path, mode: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((root / mode).glob("rank*.json"))]


def _assert_same_outputs(a: Path, b: Path) -> None:
    from safetensors import safe_open

    fa, fb = safe_open(str(a / "samples.safetensors"), "pt"), safe_open(str(b / "samples.safetensors"), "pt")
    assert sorted(fa.keys()) == sorted(fb.keys())
    for key in fa.keys():
        ta, tb = fa.get_tensor(key), fb.get_tensor(key)
        assert ta.dtype == tb.dtype and ta.shape == tb.shape, key
        # Bitwise: equal bytes (NaN chains of a solver compare equal too).
        assert ta.contiguous().view(torch.uint8).equal(tb.contiguous().view(torch.uint8)), f"{a.name}: {key}"
    assert fa.metadata() == fb.metadata()
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    # Seconds (wall_time_s; align's model_time_s, smc_time_s) are measurements of time, the only entries that differ.
    timed = {k for k in ma if k.endswith("time_s")}
    assert "wall_time_s" in timed and timed == {k for k in mb if k.endswith("time_s")}
    assert {k: v for k, v in ma.items() if k not in timed} == {k: v for k, v in mb.items() if k not in timed}
    pngs = sorted(p.name for p in a.glob("*.png"))
    assert pngs and pngs == sorted(p.name for p in b.glob("*.png"))
    for name in pngs:
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{a.name}: {name}"


SHARDED_HERE = ["sample_b8", "sample_default", "sample_gmm", "restore_hr", "restore_dps"]  # chunks of the CLI
BITWISE = [*SHARDED_HERE, "align_das", "align_fk"]  # align: particles sharded inside steerdiff.align
JOBS = [*BITWISE, "align_das_default_batch"]
ROUNDING = 1e-4  # docs/distributed.md, "What is equal": the bound stated where runs agree to float rounding only


@pytest.mark.parametrize("job", BITWISE)
def test_two_ranks_write_what_one_process_writes(runs, job):
    _assert_same_outputs(runs / "w1" / job, runs / "w2" / job)


def test_align_with_other_micro_batches_warns_and_agrees_to_rounding(runs):
    """README / docs/distributed.md: align is bitwise only when --batch-size cuts a rank's rows as one process does;
    otherwise rank 0 says so, and the samples agree to float rounding."""
    from steerdiff.io import load_tensors

    r0, r1 = _records(runs, "w2")
    assert "batch_size=256" in r0["jobs"]["align_das_default_batch"]["output"]
    assert r1["jobs"]["align_das_default_batch"]["output"] == ""
    one = _records(runs, "w1")[0]
    assert "batch_size" not in one["jobs"]["align_das_default_batch"]["output"]  # one process: nothing to warn of
    a, b = (load_tensors(runs / m / "align_das_default_batch" / "samples.safetensors")["samples"] for m in ("w1", "w2"))
    assert a.shape == b.shape and float((a - b).abs().max()) <= ROUNDING


def test_threads_per_process_change_samples_at_rounding_only(runs, tmp_path):
    """README / docs/distributed.md: the files are bitwise equal at the same number of threads per process
    (torchrun gives each rank one unless OMP_NUM_THREADS is set); one process at two threads agrees to float
    rounding (the digits UNet in chunks of 8 seeds rounds differently with the thread count on some CPUs)."""
    import runpy

    from steerdiff.io import load_tensors

    job = runpy.run_path(str(WORKER))["JOBS"]["sample_b8"]
    env = _env() | {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    res = subprocess.run([sys.executable, "-m", "steerdiff.app.cli", *job, "--out", str(tmp_path / "t2")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr[-3000:]
    a = load_tensors(runs / "w1" / "sample_b8" / "samples.safetensors")["samples"]
    b = load_tensors(tmp_path / "t2" / "samples.safetensors")["samples"]
    assert a.shape == b.shape and float((a - b).abs().max()) <= ROUNDING


def test_work_is_shared_and_only_rank_0_speaks(runs):
    one, = _records(runs, "w1")
    r0, r1 = _records(runs, "w2")
    assert (r0["world"], r1["world"]) == (2, 2)
    for job in JOBS:
        assert one["jobs"][job]["error"] is None and r0["jobs"][job]["error"] is None, job
        assert r1["jobs"][job]["error"] is None and r1["jobs"][job]["output"] == "", job
        assert "wrote" in r0["jobs"][job]["output"]
    for job in SHARDED_HERE:  # every row ran exactly once, on one of the ranks
        assert r0["jobs"][job]["rows"] + r1["jobs"][job]["rows"] == one["jobs"][job]["rows"], job
    # 4 chunks of 8 seeds: two per rank; 5 chunks of 2 (9 seeds): 3 + 2; 6 chains in chunks of 2: 2 + 1 chunks.
    assert (r0["jobs"]["sample_b8"]["rows"], r1["jobs"]["sample_b8"]["rows"]) == (16, 16)
    assert (r0["jobs"]["sample_gmm"]["rows"], r1["jobs"]["sample_gmm"]["rows"]) == (6, 3)
    assert (r0["jobs"]["restore_hr"]["rows"], r1["jobs"]["restore_hr"]["rows"]) == (4, 2)
    # One chunk (the default --batch is larger than 32 seeds): rank 1 has nothing to do and still takes part.
    assert (r0["jobs"]["sample_default"]["rows"], r1["jobs"]["sample_default"]["rows"]) == (32, 0)


def test_the_chunk_size_is_what_a_sample_depends_on(runs):
    """Negative control: a batch of 8 and one of 32 differ at float rounding on the UNet, so equality across world
    sizes above holds because the chunks are fixed, not because batching never matters."""
    from steerdiff.io import load_tensors

    a = load_tensors(runs / "w1" / "sample_b8" / "samples.safetensors")["samples"]
    b = load_tensors(runs / "w1" / "sample_default" / "samples.safetensors")["samples"]
    assert not torch.equal(a, b) and torch.allclose(a, b, atol=1e-4)


def test_ranks_given_different_arguments_fail_on_every_rank(runs):
    for rec in _records(runs, "w2"):
        err = rec["jobs"]["mismatch"]["error"]
        assert err is not None and "--seeds" in err and "different arguments" in err, err
        assert f"rank {rec['rank']} of 2" in err
    assert not (runs / "w2" / "mismatch").exists()


def test_torchrun_steerdiff_entry_point(runs, tmp_path):
    """The command of the issue, through torchrun and the ``steerdiff`` script (``--`` ends torchrun's options:
    Python 3.11's argparse takes ``--n`` for an abbreviation of torchrun's ``--nnodes``/``--nproc-per-node``)."""
    import runpy

    worker_jobs = runpy.run_path(str(WORKER))["JOBS"]  # run_name is not __main__: only the definitions run
    out = tmp_path / "tr"
    res = _run([*TORCHRUN, "--no-python", "--", "steerdiff", *worker_jobs["sample_b8"], "--out", str(out)], tmp_path)
    assert res.stdout.count("wrote ") == 1  # rank 0 alone prints
    _assert_same_outputs(runs / "w1" / "sample_b8", out)


# ------------------------------------------------------------------------------------------------ in one process
def test_seed_lists_parse_and_format():
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("5, 1,7-8") == [5, 1, 7, 8]
    for seeds in ([0, 1, 2, 3], [5, 1, 7, 8], [9], [2, 3, 3, 4, 10, 11]):
        assert parse_seeds(format_seeds(seeds)) == seeds
    assert format_seeds(list(range(10000))) == "0-9999"
    for bad in ("", "a", "3-1", "-1", "1-", f"0,{2**32}", "1,,2"):
        with pytest.raises(ValueError):
            parse_seeds(bad)


@pytest.mark.parametrize("n,batch", [(1, 4), (32, 8), (33, 8), (9, 2), (5, 64), (100, 7)])
def test_chunks_are_shared_in_order_for_any_world_size(n, batch):
    every = chunks(n, batch)
    assert [i for c in every for i in range(c.start, c.stop)] == list(range(n))
    assert all(c.stop - c.start == batch for c in every[:-1])
    for world in (1, 2, 3, 8):
        shared = [c for r in range(world) for c in own_chunks(DistContext(rank=r, world=world), n, batch)]
        assert shared == every  # contiguous shares, concatenated in rank order = global order


def test_sample_cli_seeds_options(tmp_path):
    from click.testing import CliRunner
    from safetensors import safe_open

    from steerdiff.app.cli import main

    base = ["sample", "--model", "gmm2d", "--steps", "3", "--no-progress"]
    res = CliRunner().invoke(main, [*base, "--seeds", "4-6,1", "--batch", "3", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    f = safe_open(str(tmp_path / "a" / "samples.safetensors"), "pt")
    assert f.get_tensor("seeds").tolist() == [4, 5, 6, 1] and f.get_tensor("samples").shape == (4, 2)
    meta = f.metadata()
    assert meta["seeds"] == "4-6,1" and json.loads(meta["options"])["batch"] == 3
    # A sample is a function of its seed: seed 5 alone (in a batch of its own) is row 1 above.
    res = CliRunner().invoke(main, [*base, "--seeds", "5,9", "--batch", "1", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    g = safe_open(str(tmp_path / "b" / "samples.safetensors"), "pt")
    assert torch.equal(g.get_tensor("samples")[0], f.get_tensor("samples")[1])
    for args, hint in ((["--seeds", "3-1"], "--seeds"), (["--seeds", "0-3", "--n", "4"], "--seeds"),
                       (["--seeds", "7"], "--seeds"), (["--batch", "0"], "--batch")):
        res = CliRunner().invoke(main, [*base, *args, "--out", str(tmp_path / "bad")])
        assert res.exit_code == 2 and hint in res.output, res.output
