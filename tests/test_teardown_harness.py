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
