"""Seed-sharded work: seeds in fixed chunks, the chunks shared over the ranks, the rows gathered in global order.

The unit of work is a chunk of ``batch`` consecutive items (seeds, chains) in global order; rank ``r`` runs a
contiguous share of the chunks (:func:`own_chunks`) and :func:`gather_rows` puts the rows back together in global
order on every rank (:func:`map_chunks` does both around a function of one chunk).

Why chunks of a fixed size rather than ``n / world`` rows per rank: a network's output changes at float rounding
with the batch it is evaluated in (the digits UNet on the CPU: batch 32 vs one row differ by 1e-6). A chunk does
not depend on the number of processes, and a one-process run evaluates the same chunks in turn, so every sample is
bit-identical for any world size (it still depends on ``batch``). This is EDM's "seeds are the unit of work".

    ctx = sd.distributed.init()
    def one_chunk(c):                               # c: a slice of the seed list
        noise = sd.randn((c.stop - c.start, 2), seeds=seeds[c])
        return {"x": sd.sample(model, noise, sigmas)}, {}
    rows, per_rank = sd.distributed.map_chunks(ctx, len(seeds), 64, one_chunk)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .collectives import all_gather, broadcast, split_evenly
from .context import DistContext

# Seeds as numpy and EDM take them (the same bound as --seed).
MAX_SEED = 2**32 - 1
MAX_SEEDS = 10**8  # a range longer than this is a typo (and would not fit in memory as a list of ints)


# ----------------------------------------------------------------------------------------------- --seeds
def parse_seeds(text: str) -> list[int]:
    """``"0-9999"``, ``"1,5,7"`` or a mix (``"0-3,10,20-21"``) as the list of seeds, in the order given.

    Raises:
        ValueError: an empty list, a piece that is not an integer or ``A-B`` with ``A <= B``, a seed outside
            ``[0, 2**32 - 1]``.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("give seeds as a range A-B, a comma list, or both (e.g. 0-9999 or 1,5,7 or 0-3,10)")
    seeds: list[int] = []
    for piece in text.split(","):
        piece = piece.strip()
        lo, sep, hi = piece.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"{piece!r} is not a seed or a range A-B of seeds (non-negative integers)") from None
        if not (0 <= a <= MAX_SEED and 0 <= b <= MAX_SEED):
            raise ValueError(f"{piece!r}: seeds must lie in [0, {MAX_SEED}]")
        if b < a:
            raise ValueError(f"{piece!r}: a range A-B needs A <= B")
        if len(seeds) + b - a + 1 > MAX_SEEDS:
            raise ValueError(f"more than {MAX_SEEDS} seeds")
        seeds.extend(range(a, b + 1))
    return seeds


def format_seeds(seeds: Sequence[int]) -> str:
    """The compact form :func:`parse_seeds` reads back: runs of consecutive seeds as ``A-B``."""
    parts: list[str] = []
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ",".join(parts)


# ----------------------------------------------------------------------------------------------- chunks
def chunks(n: int, batch: int) -> list[slice]:
    """Items ``0..n-1`` cut into consecutive chunks of ``batch`` (the last one shorter)."""
    if n < 1 or batch < 1:
        raise ValueError(f"n and batch must be positive, got n={n}, batch={batch}")
    return [slice(a, min(a + batch, n)) for a in range(0, n, batch)]


def own_chunks(dist: DistContext, n: int, batch: int) -> list[slice]:
    """This rank's contiguous share of :func:`chunks` (the first ranks get one chunk more when they do not divide
    evenly; a rank may get none when there are fewer chunks than ranks)."""
    every = chunks(n, batch)
    return every[split_evenly(len(every), dist.world, dist.rank)]


def _rows_per_rank(n: int, batch: int, world: int) -> list[int]:
    every = chunks(n, batch)
    return [sum(c.stop - c.start for c in every[split_evenly(len(every), world, r)])
            for r in range(world)]


_HEADER_BYTES = 8192


def _broadcast_header(dist: DistContext, local: dict[str, Tensor]) -> list[tuple[str, torch.dtype, tuple]]:
    """Rank 0's tensor names, dtypes and trailing shapes, on every rank (one broadcast of a small JSON text)."""
    buf = torch.zeros(_HEADER_BYTES, dtype=torch.uint8)
    if dist.is_main:
        text = json.dumps([[k, str(t.dtype).removeprefix("torch."), list(t.shape[1:])]
                           for k, t in sorted(local.items())]).encode()
        if len(text) > _HEADER_BYTES:
            raise ValueError(f"gather_rows: too many tensors to describe in {_HEADER_BYTES} bytes")
        buf[:len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    buf = broadcast(dist, buf)
    text = bytes(buf[buf != 0].tolist()).decode()
    return [(k, getattr(torch, dtype), tuple(tail)) for k, dtype, tail in json.loads(text)]


def gather_rows(dist: DistContext, local: dict[str, Tensor], n: int, batch: int) -> dict[str, Tensor]:
    """Each tensor's rows of every rank, concatenated in global order (the order of :func:`chunks`), on every rank.

    ``local[k]`` holds this rank's rows of :func:`own_chunks` in order (every rank the same names; a rank without
    chunks may pass an empty dict). Rank 0 always holds the first chunk, so its tensors tell the others the names,
    trailing shapes and dtypes; ranks send their rows padded to the longest share, and the padding is cut away.

    Raises:
        ValueError: a rank's tensor of another shape or dtype than rank 0's, or with the wrong number of rows.
    """
    if not dist.distributed:
        return dict(local)
    rows = _rows_per_rank(n, batch, dist.world)
    out = {}
    for key, dtype, tail in _broadcast_header(dist, local):
        mine = local.get(key)
        if mine is None and rows[dist.rank] == 0:
            mine = torch.empty((0, *tail), dtype=dtype)
        if mine is None or tuple(mine.shape[1:]) != tail or mine.dtype != dtype or mine.shape[0] != rows[dist.rank]:
            got = "nothing" if mine is None else f"{tuple(mine.shape)} {mine.dtype}"
            raise ValueError(f"gather_rows: rank {dist.rank}'s {key!r} is {got}, expected "
                             f"[{rows[dist.rank]}, {', '.join(map(str, tail))}] {dtype}")
        pad = torch.zeros((max(rows), *tail), dtype=dtype, device=mine.device)
        pad[:mine.shape[0]] = mine
        parts = all_gather(dist, pad)
        out[key] = torch.cat([p[:r] for p, r in zip(parts, rows, strict=True)])
    return out


def gather_values(dist: DistContext, values: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's numbers (the same names on every rank), in rank order (one all-gather of float64)."""
    names = sorted(values)
    mine = torch.tensor([float(values[k]) for k in names], dtype=torch.float64)
    return [dict(zip(names, t.tolist(), strict=True)) for t in all_gather(dist, mine)]


def map_chunks(dist: DistContext, n: int, batch: int,
               fn: Callable[[slice], tuple[dict[str, Tensor], dict[str, float]]], numbers: Sequence[str] = (),
               progress: bool = False) -> tuple[dict[str, Tensor], list[dict[str, float]]]:
    """Run ``fn`` on this rank's chunks and gather: ``fn(chunk) -> (tensors with one row per item, {name: number})``
    with the names ``numbers``.

    Returns the gathered tensors in global order (on every rank) and, per rank, its numbers summed over its chunks
    (0 for a rank without chunks) plus ``wall_time_s``, the seconds it spent in ``fn``. ``progress`` shows a bar
    over the chunks (rank 0 only, when it has several).
    """
    from tqdm.auto import tqdm

    mine = own_chunks(dist, n, batch)
    parts: list[dict[str, Tensor]] = []
    sums = dict.fromkeys(numbers, 0.0)
    wall = 0.0
    for c in tqdm(mine, disable=not (progress and dist.is_main and len(mine) > 1), desc="chunks", leave=False):
        t0 = time.perf_counter()
        tensors, values = fn(c)
        wall += time.perf_counter() - t0
        parts.append({k: v.detach().cpu() for k, v in tensors.items()})
        if set(values) != set(sums):
            raise ValueError(f"map_chunks: fn returned the numbers {sorted(values)}, declared {sorted(sums)}")
        for k, v in values.items():
            sums[k] += float(v)
    local = {k: torch.cat([p[k] for p in parts]) for k in parts[0]} if parts else {}
    gathered = gather_rows(dist, local, n, batch)
    return gathered, gather_values(dist, {**sums, "wall_time_s": wall})
