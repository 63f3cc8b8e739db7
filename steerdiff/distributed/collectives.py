"""The few collectives steerdiff's sharded code needs, as functions of a :class:`DistContext`, with byte counts.

Every function is the identity (no communication) for a one-process context, so sharded code has one path.
Tensors travel through ``ctx.device`` (the GPU with NCCL) and come back on the device they came from. Bytes sent
by this rank are added to a :class:`CommStats`, when one is passed, so that a sampler can report what it moved.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import Tensor

from .context import DistContext


@dataclass
class CommStats:
    """Bytes this rank sent, by kind: ``gathered`` (all-gathers and all-reduces: weights, flags, counts) and
    ``moved`` (point-to-point particle states)."""

    gathered: int = 0
    moved: int = 0
    calls: int = 0

    def as_dict(self) -> dict:
        return {"gathered_bytes": self.gathered, "moved_bytes": self.moved, "collective_calls": self.calls}


class DistributedError(RuntimeError):
    """A collective failed: another rank exited, crashed or stopped answering within the timeout."""


@contextlib.contextmanager
def _guard(ctx: DistContext, op: str) -> Iterator[None]:
    try:
        yield
    except DistributedError:
        raise
    except RuntimeError as err:  # gloo / NCCL report a dead or hung peer as a RuntimeError
        raise DistributedError(f"rank {ctx.rank} of {ctx.world}: {op} failed, so another rank exited, crashed or "
                               f"stopped answering (the timeout is set by sd.distributed.init(timeout=...)): "
                               f"{err}") from err


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _to_comm(ctx: DistContext, t: Tensor) -> Tensor:
    # gloo cannot send bool tensors: they travel as uint8.
    t = t.to(torch.uint8) if t.dtype == torch.bool else t
    return t.to(ctx.device).contiguous()


def all_gather(ctx: DistContext, t: Tensor, stats: CommStats | None = None) -> list[Tensor]:
    """Every rank's ``t`` (same shape and dtype on every rank), in rank order; ``[t]`` in one process."""
    if not ctx.distributed:
        return [t]
    src = _to_comm(ctx, t)
    out = [torch.empty_like(src) for _ in range(ctx.world)]
    with _guard(ctx, "all_gather"):
        tdist.all_gather(out, src, group=ctx.group)
    if stats is not None:
        stats.gathered += _nbytes(src)
        stats.calls += 1
    return [o.to(device=t.device, dtype=t.dtype) for o in out]


def all_reduce_sum(ctx: DistContext, t: Tensor, stats: CommStats | None = None) -> Tensor:
    """The sum of ``t`` over the ranks (a new tensor; ``t`` itself in one process)."""
    if not ctx.distributed:
        return t
    buf = _to_comm(ctx, t).clone()
    with _guard(ctx, "all_reduce"):
        tdist.all_reduce(buf, op=tdist.ReduceOp.SUM, group=ctx.group)
    if stats is not None:
        stats.gathered += _nbytes(buf)
        stats.calls += 1
    return buf.to(device=t.device, dtype=t.dtype)


def broadcast(ctx: DistContext, t: Tensor, src: int = 0, stats: CommStats | None = None) -> Tensor:
    """Rank ``src``'s ``t`` on every rank (every rank passes a tensor of the same shape and dtype)."""
    if not ctx.distributed:
        return t
    buf = _to_comm(ctx, t).clone()
    with _guard(ctx, "broadcast"):
        tdist.broadcast(buf, src=src, group=ctx.group)
    if stats is not None and ctx.rank == src:
        stats.gathered += _nbytes(buf)
        stats.calls += 1
    return buf.to(device=t.device, dtype=t.dtype)


def exchange(ctx: DistContext, sends: dict[int, Sequence[Tensor]], recv_rows: dict[int, int],
             likes: Sequence[Tensor], stats: CommStats | None = None) -> dict[int, list[Tensor]]:
    """Point-to-point exchange of several tensors at once: send ``sends[r]`` (one tensor per entry of ``likes``,
    all with the same number of rows) to rank ``r``, and receive ``recv_rows[r]`` rows shaped like ``likes[k][0]``
    (for each ``k``) from rank ``r``; both sides must agree on the counts (they are computed from shared data).

    Every receive and send is posted before any is waited on, so the exchange cannot deadlock whatever the pattern,
    and all of it costs one round trip. Entries for this rank itself are not allowed (the caller copies those).
    """
    if ctx.rank in sends or ctx.rank in recv_rows:
        raise ValueError("exchange: a rank does not send to itself")
    if not ctx.distributed:
        return {}
    received = {r: [torch.empty((n, *like.shape[1:]), dtype=_to_comm(ctx, like[:0]).dtype, device=ctx.device)
                    for like in likes] for r, n in recv_rows.items() if n > 0}
    payload = {r: [_to_comm(ctx, t) for t in ts] for r, ts in sends.items() if len(ts) and ts[0].shape[0] > 0}
    with _guard(ctx, "point-to-point exchange"):
        works = [tdist.irecv(buf, src=r, group=ctx.group) for r, bufs in sorted(received.items()) for buf in bufs]
        works += [tdist.isend(t, dst=r, group=ctx.group) for r, ts in sorted(payload.items()) for t in ts]
        for w in works:
            w.wait()
    if stats is not None:
        stats.moved += sum(_nbytes(t) for ts in payload.values() for t in ts)
        stats.calls += sum(len(ts) for ts in payload.values())
    return {r: [buf.to(device=like.device, dtype=like.dtype) for buf, like in zip(bufs, likes, strict=True)]
            for r, bufs in received.items()}


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (nothing in one process)."""
    if ctx.distributed:
        with _guard(ctx, "barrier"):
            tdist.barrier(group=ctx.group)


# ------------------------------------------------------------------------------------------------ fingerprints
def _digest(value) -> int:
    """A 62-bit digest of a value: exact for numbers, strings, None and their nestings; shape, dtype and two
    weighted sums for a tensor (so that equal arguments agree at the cost of one pass over the data)."""
    h = hashlib.sha256()

    def feed(v) -> None:
        if isinstance(v, Tensor):
            t = v.detach()
            h.update(f"T{tuple(t.shape)}{t.dtype}".encode())
            if t.numel():
                flat = t.flatten().to(torch.float64)
                ramp = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device).remainder_(977)
                h.update(f"{float(flat.nan_to_num(0, 1e300, -1e300).sum())!r}"
                         f"{float((flat.nan_to_num(0, 1e300, -1e300) * ramp).sum())!r}".encode())
        elif isinstance(v, dict):
            h.update(b"{")
            for k in sorted(v, key=str):
                feed(str(k))
                feed(v[k])
            h.update(b"}")
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for item in v:
                feed(item)
            h.update(b"]")
        elif isinstance(v, float):
            h.update(("nan" if math.isnan(v) else repr(v)).encode())
        elif v is None or isinstance(v, (bool, int, str)):
            h.update(f"{type(v).__name__}:{v!r}".encode())
        elif callable(v):
            h.update(f"callable:{getattr(v, '__qualname__', type(v).__qualname__)}".encode())
        else:
            h.update(f"{type(v).__qualname__}:{v!r}".encode())

    feed(value)
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 62) - 1)


def check_same(ctx: DistContext, what: str, stats: CommStats | None = None, **values) -> None:
    """Raise on every rank if the ranks disagree on any of ``values`` (one small all-gather of digests).

    Sharded code calls this before its first collective: ranks that were given different arguments would otherwise
    wait on different collectives and hang until the timeout.

    Raises:
        ValueError: naming the arguments that differ and the ranks that hold each distinct value.
    """
    if not ctx.distributed or not values:
        return
    names = sorted(values)
    mine = torch.tensor([_digest(values[n]) for n in names], dtype=torch.int64)
    table = torch.stack(all_gather(ctx, mine, stats))  # [world, n]
    differ = [n for k, n in enumerate(names) if bool((table[:, k] != table[0, k]).any())]
    if differ:
        groups = {}
        for n in differ:
            k = names.index(n)
            by_value: dict[int, list[int]] = {}
            for r in range(ctx.world):
                by_value.setdefault(int(table[r, k]), []).append(r)
            groups[n] = sorted(by_value.values())
        detail = "; ".join(f"{n}: ranks {' vs '.join(str(g) for g in gs)}" for n, gs in groups.items())
        raise ValueError(f"{what}: the ranks were given different arguments ({detail}); every rank must make the "
                         f"same call (this is rank {ctx.rank} of {ctx.world})")


def split_evenly(n: int, world: int, rank: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` items: the first ``n % world`` ranks get one more."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def shares(n: int, world: int) -> Sequence[slice]:
    """:func:`split_evenly` for every rank."""
    return [split_evenly(n, world, r) for r in range(world)]
