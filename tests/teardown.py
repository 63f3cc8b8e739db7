"""The one known flake of the multi-process tests, recognised narrowly so that a launch can be repeated once."""

from __future__ import annotations

TEARDOWN_ABORT = "terminate called without an active exception"


def teardown_abort(returncodes: list[int | None], stderr: str) -> bool:
    """Whether a multi-process launch failed only by a rank's C++ abort at process teardown: some process died of
    SIGABRT (-6 as a child, 134 through a shell or torchrun, 1 for torchrun's own exit) whose last stderr line is
    gloo's ``terminate called without an active exception``, and no Python exception was printed.

    Seen in about one full-suite run in four on the 2-core CI machine (torch 2.13 CPU, gloo), in different
    distributed fixtures, never in isolated runs of those tests (0 of 11); the ranks had finished their work (the
    other rank returned 0 after every collective). The launch is then repeated once, with a warning, so that the
    flake is visible without failing CI; a second failure fails the test as before.
    """
    # torchrun reports a failed child with a traceback of its own (ChildFailedError); any other traceback is a
    # worker's Python exception, a real failure.
    blocks = stderr.split("Traceback (most recent call last):")[1:]
    if any("ChildFailedError" not in block for block in blocks):
        return False
    return TEARDOWN_ABORT in stderr and any(rc not in (0, None) for rc in returncodes)
