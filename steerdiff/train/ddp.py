"""Data-parallel training over ``torch.distributed``: data chunks, their random streams, gradient averaging.

The global batch of every optimizer step is split into ``data_shards`` equal chunks. Chunk ``c`` draws its
condition dropout, sigmas and noise from its own generator and its dropout masks from its own global-RNG state,
both seeded from ``(seed, c)``; rank ``r`` of ``W`` computes chunks ``r, r + W, ...``. The gradient of the mean
chunk loss is then the sum over ranks of each rank's chunk gradients (one all-reduce of a flat buffer), so a run
on ``W`` processes equals a one-process run with the same ``data_shards`` (which computes the chunks in turn, a
gradient accumulation) up to the order of the floating-point sum. Chunk 0 keeps the seed itself, so that
``data_shards=1`` is exactly the one-process trainer of before.

This module holds the pieces that know about ranks; :func:`steerdiff.train.train` uses them. Torch's
``DistributedDataParallel`` is not used: it averages over ranks (not over chunks, so no accumulation on a rank),
buckets gradients in an order of its own, and would wrap the model that objectives and checkpoints see.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor, nn

from ..distributed import DistContext, all_gather, all_reduce_sum, broadcast


def resolve_shards(data_shards: int | None, batch_size: int, world: int) -> int:
    """The number of data chunks per step: ``data_shards``, or the world size when None.

    Raises:
        ValueError: ``batch_size`` not divisible by the chunk count, or the chunk count not a multiple of the
            number of processes.
    """
    shards = world if data_shards is None else data_shards
    if batch_size % shards:
        raise ValueError(f"batch_size ({batch_size}) must be divisible by data_shards ({shards}"
                         f"{', the number of processes' if data_shards is None else ''}): every chunk of the global "
                         "batch has the same size")
    if shards % world:
        raise ValueError(f"data_shards ({shards}) must be a multiple of the number of processes ({world}): every "
                         "process computes the same number of chunks")
    return shards


def local_chunks(shards: int, ctx: DistContext) -> list[int]:
    """The chunks this rank computes: ``rank, rank + world, ...`` (all of them in one process)."""
    return list(range(ctx.rank, shards, ctx.world))


def _mix(seed: int, chunk: int, stream: str) -> int:
    # A hash, not an affine mix: the chunk seeds must not collide with the per-epoch permutation seeds.
    digest = hashlib.sha256(f"steerdiff.train:{stream}:{seed}:{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def chunk_generator(seed: int, chunk: int) -> torch.Generator:
    """The generator of chunk ``chunk`` (condition dropout, sigmas, noise); chunk 0's is seeded by ``seed``."""
    return torch.Generator().manual_seed(seed if chunk == 0 else _mix(seed, chunk, "objective"))


def chunk_torch_state(seed: int, chunk: int) -> Tensor:
    """The initial global-RNG state (dropout layers) of chunk ``chunk``; chunk 0's is ``torch.manual_seed(seed)``'s."""
    return torch.Generator().manual_seed(seed if chunk == 0 else _mix(seed, chunk, "torch")).get_state()


def _by_dtype(tensors: list[Tensor]) -> dict[torch.dtype, list[int]]:
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return groups


@torch.no_grad()
def broadcast_model(model: nn.Module, ctx: DistContext) -> None:
    """Copy rank 0's parameters and buffers into every rank's model (one broadcast per dtype)."""
    if not ctx.distributed:
        return
    tensors = list(model.state_dict().values())
    for idx in _by_dtype(tensors).values():
        flat = broadcast(ctx, torch.cat([tensors[i].detach().reshape(-1) for i in idx]), src=0)
        for i, part in zip(idx, flat.split([tensors[i].numel() for i in idx]), strict=True):
            tensors[i].copy_(part.view_as(tensors[i]))


@torch.no_grad()
def sum_gradients(params: list[nn.Parameter], ctx: DistContext, stats: Tensor) -> Tensor:
    """Sum the gradients of ``params`` over the ranks in place (one flat all-reduce per dtype) and ``stats``.

    ``stats`` (float64, e.g. per-chunk losses with zeros for the chunks of other ranks) travels with a flag per
    parameter that says whether any rank has its gradient: a parameter no rank touched keeps ``grad = None``, as
    in one process, where AdamW skips it. Returns the summed ``stats``.
    """
    if not ctx.distributed:
        return stats
    flags = torch.tensor([p.grad is not None for p in params], dtype=torch.float64)
    summed = all_reduce_sum(ctx, torch.cat([stats.to(torch.float64), flags]))
    present = summed[stats.numel():] > 0
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    for idx in _by_dtype(grads).values():
        idx = [i for i in idx if present[i]]
        if not idx:
            continue
        flat = all_reduce_sum(ctx, torch.cat([grads[i].reshape(-1) for i in idx]))
        for i, part in zip(idx, flat.split([grads[i].numel() for i in idx]), strict=True):
            if params[i].grad is None:
                params[i].grad = part.view_as(params[i]).clone()
            else:
                params[i].grad.copy_(part.view_as(params[i]))
    return summed[: stats.numel()]


def gather_states(states: dict[int, Tensor], shards: int, ctx: DistContext) -> dict[int, Tensor]:
    """Every chunk's state (equal-sized uint8 tensors, e.g. generator states) from the ranks that hold them.

    ``states`` maps this rank's chunks (:func:`local_chunks`) to their state; every rank receives all of them.
    """
    if not ctx.distributed:
        return dict(states)
    out = {}
    for j, chunk in enumerate(local_chunks(shards, ctx)):
        for rank, state in enumerate(all_gather(ctx, states[chunk])):
            out[rank + j * ctx.world] = state
    return dict(sorted(out.items()))
