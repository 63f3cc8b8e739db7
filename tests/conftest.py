"""Test-wide settings."""

import torch

# Tests run many small tensor ops; one intra-op thread avoids oversubscribing a 2-core machine (much faster here
# and deterministic across machines).
torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------ multi-process runs
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
from teardown import TEARDOWN_ABORT, TEARDOWN_REPEATS, teardown_abort  # noqa: E402


@dataclass
class RankResult:
    """One process of a :func:`run_ranks` launch."""

    rank: int
    returncode: int | None  # None: still running at the deadline (killed)
    stdout: str
    stderr: str
    seconds: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_once(argv: list[str], world: int = 2, timeout: float = 120.0, env: dict | None = None,
                 cwd=None) -> list[RankResult]:
    """One launch of :func:`launch_ranks`."""
    port = free_port()
    procs = []
    start = time.monotonic()
    for rank in range(world):
        e = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
             "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
             "MKL_NUM_THREADS": "1", **(env or {})}
        procs.append(subprocess.Popen(argv, env=e, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    out = []
    for rank, p in enumerate(procs):
        left = max(0.1, timeout - (time.monotonic() - start))
        try:
            so, se = p.communicate(timeout=left)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            rc = None
        out.append(RankResult(rank, rc, so, se, time.monotonic() - start))
    return out


def launch_ranks(argv: list[str], world: int = 2, timeout: float = 120.0, env: dict | None = None,
                 cwd=None, before: Callable[[], None] | None = None, fresh=None) -> list[RankResult]:
    """Start ``world`` processes of ``argv`` (e.g. ``[sys.executable, script, ...]``) with the launcher variables
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and one thread each, as torchrun would, but without
    torchrun's supervisor, so that a test sees what each rank does when another one dies. Every process still
    running ``timeout`` seconds after the start is killed (its returncode is None). A launch that failed only by a
    teardown abort (:func:`teardown_abort`) is repeated (up to ``TEARDOWN_REPEATS`` times), with a warning each
    time; ``before`` (if given) runs before each launch, to put back what the first one changed (a resumed run that
    finished would otherwise resume from its own final checkpoint and do nothing the second time); ``fresh``: a
    directory emptied before each launch."""
    if fresh is not None:
        before = _chain(_emptied(fresh), before)
    if before is not None:
        before()
    out = _launch_once(argv, world, timeout, env, cwd)
    for _ in range(TEARDOWN_REPEATS):
        aborted = [r for r in out if r.returncode in (-6, 134) and r.stderr.strip().endswith(TEARDOWN_ABORT)]
        if not (aborted and all(r.returncode in (0, -6, 134) for r in out) and teardown_abort(
                [r.returncode for r in out], "".join(r.stderr for r in out))):
            break
        import warnings

        warnings.warn(f"rank(s) {[r.rank for r in aborted]} aborted at teardown ({TEARDOWN_ABORT!r}); "
                      "repeating the launch", RuntimeWarning, stacklevel=2)
        if before is not None:
            before()
        out = _launch_once(argv, world, timeout, env, cwd)
    return out


def _emptied(path) -> Callable[[], None]:
    """Remove everything in ``path`` (a launch repeated after a teardown abort then starts from the same empty
    directory as the first)."""
    import shutil
    from pathlib import Path

    def run() -> None:
        for p in Path(path).iterdir() if Path(path).exists() else ():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

    return run


def _chain(*hooks) -> Callable[[], None]:
    return lambda: [h() for h in hooks if h is not None] and None


@pytest.fixture(scope="session")
def run_ranks():
    """:func:`launch_ranks` as a fixture (``run_ranks([sys.executable, script], world=2, timeout=60)``)."""
    return launch_ranks


PYTHON = sys.executable
