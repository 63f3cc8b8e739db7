"""The one known flake of the multi-process tests, recognised narrowly so that a launch can be repeated."""

from __future__ import annotations

TEARDOWN_ABORT = "terminate called without an active exception"
# Launches after the first one that a teardown abort may cost. Once was not enough: a fresh-clone CI run on a loaded
# machine saw the CLI's torchrun launch (many jobs, each a process-group set-up and tear-down) abort twice in a row.
TEARDOWN_REPEATS = 3


def teardown_abort(returncodes: list[int | None], stderr: str) -> bool:
    """Whether a multi-process launch failed only by a rank's C++ abort at process teardown: some process died of
    SIGABRT (-6 as a child, 134 through a shell or torchrun, 1 for torchrun's own exit) whose last stderr line is
    gloo's ``terminate called without an active exception``, and no Python exception was printed.

    Seen in about one full-suite run in four on the 2-core CI machine (torch 2.13 CPU, gloo), in different
    distributed fixtures, never in isolated runs of those tests (0 of 11); the ranks had finished their work (the
    other rank returned 0 after every collective). The launch is then repeated (up to :data:`TEARDOWN_REPEATS`
    times), with a warning each time, so that the flake is visible without failing CI; any other failure, or a
    teardown abort on the last repeat, fails the test as before.
    """
    # torchrun reports a failed child with a traceback of its own (ChildFailedError); any other traceback is a
    # worker's Python exception, a real failure.
    blocks = stderr.split("Traceback (most recent call last):")[1:]
    if any("ChildFailedError" not in block for block in blocks):
        return False
    return TEARDOWN_ABORT in stderr and any(rc not in (0, None) for rc in returncodes)
