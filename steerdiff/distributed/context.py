"""The process group a run spreads over: who this process is, how many there are, where tensors travel.

:func:`init` reads the variables every launcher sets (``torchrun``, ``accelerate launch``, SLURM's ``srun`` through
torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and starts
``torch.distributed`` (NCCL when CUDA is there, gloo otherwise); without them it returns the one-process context
:data:`SINGLE`, so the same script runs with and without a launcher. Samplers, SMC functions and the trainer take a
:class:`DistContext` as ``dist=``; ``None`` there means :func:`current`, the context :func:`init` installed (or
:data:`SINGLE`).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a collective waits for a missing rank before every waiting rank raises (instead of hanging)."""


@dataclass(frozen=True)
class DistContext:
    """A process group: this process's ``rank`` among ``world`` processes, the torch ``group`` (None: the default
    group, or no group at all for :data:`SINGLE`), and ``device``, where tensors go for collectives (the GPU of
    this rank with NCCL, the CPU with gloo)."""

    rank: int = 0
    world: int = 1
    group: Any = None
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def __repr__(self) -> str:
        return f"DistContext(rank={self.rank}, world={self.world}, backend={self.backend})"


SINGLE = DistContext()
"""The one-process context: every collective is the identity."""

_current: DistContext = SINGLE


def current() -> DistContext:
    """The context :func:`init` installed in this process, or :data:`SINGLE`."""
    return _current


def resolve(dist: DistContext | None) -> DistContext:
    """``dist``, or :func:`current` when None; a clear error for anything else."""
    if dist is None:
        return _current
    if not isinstance(dist, DistContext):
        raise TypeError(f"dist must be a steerdiff.distributed.DistContext (from sd.distributed.init()) or None, "
                        f"got {type(dist).__name__}")
    return dist


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def init(backend: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, device: str | torch.device | None = None,
         ) -> DistContext:
    """Start (or join) the process group from the launcher's environment and install it as :func:`current`.

    Args:
        backend: ``"nccl"``, ``"gloo"`` or None (NCCL when CUDA is available, gloo otherwise).
        timeout: seconds a collective waits for the other ranks; a rank that died or went astray makes the others
            raise after at most this long (gloo usually notices a dead peer at once).
        device: the device collectives use; default ``cuda:LOCAL_RANK`` with NCCL, the CPU with gloo.

    Returns:
        The :class:`DistContext`; :data:`SINGLE` when ``WORLD_SIZE`` is unset or 1 (no process group is started).

    Raises:
        ValueError: inconsistent ``RANK`` / ``WORLD_SIZE``, an unknown backend or a non-positive timeout.
    """
    global _current
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if backend is not None and backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl', 'gloo' or None (choose from the hardware), got {backend!r}")
    if tdist.is_available() and tdist.is_initialized():  # joined already (e.g. by accelerate): reuse it
        _current = _from_group(device)
        return _current
    world = _env_int("WORLD_SIZE")
    if world is None or world == 1:
        _current = SINGLE
        return SINGLE
    rank = _env_int("RANK")
    if rank is None or not 0 <= rank < world:
        raise ValueError(f"RANK must be set to an integer in [0, WORLD_SIZE={world}) by the launcher, got "
                         f"{os.environ.get('RANK')!r}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local = _env_int("LOCAL_RANK") or 0
        dev = torch.device(device) if device is not None else torch.device("cuda", local)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device(device) if device is not None else torch.device("cpu")
    tdist.init_process_group(backend, rank=rank, world_size=world,
                             timeout=datetime.timedelta(seconds=float(timeout)))
    _current = DistContext(rank=rank, world=world, group=None, device=dev, backend=backend)
    return _current


def _from_group(device) -> DistContext:
    backend = tdist.get_backend()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return DistContext(rank=tdist.get_rank(), world=tdist.get_world_size(), group=None, device=torch.device(device),
                       backend=backend)


def shutdown() -> None:
    """Leave the process group (if :func:`init` started one) and reset :func:`current` to :data:`SINGLE`."""
    global _current
    if _current.distributed and tdist.is_initialized():
        tdist.destroy_process_group()
    _current = SINGLE
