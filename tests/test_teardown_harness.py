"""The multi-process harness repeats a launch only for the one known teardown flake (``tests/teardown.py``): a
rank's C++ abort after its work, with no Python exception; a worker's exception is never repeated."""

from teardown import TEARDOWN_ABORT, teardown_abort

TORCHRUN = ("W1204 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 11365 closing signal "
            "SIGTERM\nTraceback (most recent call last):\n  File \"torch/distributed/run.py\", line 1032\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")


def test_a_teardown_abort_is_recognised_from_a_rank_and_from_torchrun():
    assert teardown_abort([-6, 0], TEARDOWN_ABORT + "\n")
    assert teardown_abort([1], TEARDOWN_ABORT + "\n" + TORCHRUN)


def test_a_python_exception_or_another_failure_is_not():
    worker = "Traceback (most recent call last):\n  File \"worker.py\", line 3\nValueError: boom\n"
    assert not teardown_abort([1], worker + TEARDOWN_ABORT + "\n" + TORCHRUN)
    assert not teardown_abort([1, 0], worker)
    assert not teardown_abort([0, 0], "")
    assert not teardown_abort([None, 0], "")  # a rank killed at the deadline (a hang) is a real failure


def test_a_repeated_launch_starts_from_the_state_the_first_one_had(tmp_path):
    """The repeat runs ``before`` again and empties ``fresh`` again: a launch that changed its directory (a resumed
    training run that finished) would otherwise repeat against its own output (the DDP resume test once saw the
    repeated run resume from its own final checkpoint and train no steps)."""
    import sys
    import warnings

    from conftest import launch_ranks

    out, attempts = tmp_path / "out", tmp_path / "attempts"
    out.mkdir()
    attempts.mkdir()
    # Each rank records which files it found in out/ and leaves one of its own; the first launch's rank 1 then dies
    # the way the known flake does (SIGABRT after its work, gloo's last line on stderr).
    script = tmp_path / "worker.py"
    script.write_text(
        "import os, sys\n"
        f"out, att = {str(out)!r}, {str(attempts)!r}\n"
        "rank = os.environ['RANK']\n"
        "n = len([p for p in os.listdir(att) if p.startswith(rank + '_')])\n"
        "old = [f for f in os.listdir(out) if not f.endswith(f'_{n}')]  # the other rank may have written this time\n"
        "open(os.path.join(att, f'{rank}_{n}'), 'w').write(','.join(sorted(old)))\n"
        "open(os.path.join(out, f'left_by_{rank}_{n}'), 'w').close()\n"
        f"if rank == '1' and n == 0:\n    sys.stderr.write({TEARDOWN_ABORT!r} + '\\n'); sys.stderr.flush(); "
        "os.abort()\n")
    calls = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ranks = launch_ranks([sys.executable, str(script)], world=2, timeout=60, fresh=out,
                             before=lambda: calls.append(sorted(p.name for p in out.iterdir())))
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr for r in ranks]
    assert sum("repeating the launch" in str(w.message) for w in seen) == 1  # repeated once: the 2nd launch passed
    assert len(calls) == 2 and calls == [[], []]  # fresh is emptied before `before` runs, both times
    for rank in (0, 1):  # the second launch found out/ as empty as the first did
        assert (attempts / f"{rank}_1").read_text() == "", rank
