"""Seed-sharded work for the command line: ``--seeds``, joining the launcher's group, speaking from rank 0.

Under ``torchrun`` (or any launcher that sets ``RANK`` / ``WORLD_SIZE``) a command calls :func:`begin`, which joins
the process group and checks that every rank was given the same options. The work (seeds of ``steerdiff sample``,
chains of ``steerdiff restore``) is cut into chunks of ``--batch`` items and shared over the ranks by
:func:`steerdiff.distributed.map_chunks` (``steerdiff/distributed/seeds.py``), and rank 0 writes the result.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import click
import torch
import torch.distributed as tdist

from ... import distributed
from ...distributed.seeds import format_seeds, map_chunks, parse_seeds

__all__ = ["SEEDS", "begin", "end", "format_seeds", "map_chunks", "parse_seeds", "rank_device"]


class SeedList(click.ParamType):
    """``--seeds``: a range ``A-B``, a comma list, or both (:func:`parse_seeds`)."""

    name = "seeds"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            return parse_seeds(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


SEEDS = SeedList()


# ----------------------------------------------------------------------------------------------- the process group
def begin(click_ctx: click.Context, what: str, device: torch.device,
          ignore: Sequence[str] = ()) -> tuple[distributed.DistContext, bool]:
    """Join the launcher's process group (one process: :data:`steerdiff.distributed.SINGLE`) and check that every
    rank got the same options (all of ``click_ctx.params`` but ``ignore``).

    A command on a CPU device uses gloo (NCCL only carries CUDA tensors). On ranks other than 0 warnings are
    silenced, so that only rank 0 speaks. Returns ``(context, started)``; pass ``started`` to :func:`end`.

    Raises:
        click.UsageError: on every rank, when the ranks were given different options.
    """
    started = not (tdist.is_available() and tdist.is_initialized())
    dist = distributed.init(backend="gloo" if device.type == "cpu" else None)
    started = started and dist.distributed
    # Keyed by the options' flags, so that the error names --seeds rather than the Python name seed_list.
    flags = {p.name: p.opts[0] for p in click_ctx.command.params}
    values = {flags.get(k, k): v for k, v in click_ctx.params.items() if k not in ignore}
    try:
        distributed.check_same(dist, f"steerdiff {what}", **values)
    except ValueError as err:
        end(started)
        raise click.UsageError(str(err)) from err
    if not dist.is_main:
        warnings.simplefilter("ignore")
    return dist, started


def end(started: bool) -> None:
    """Leave the process group if :func:`begin` started it."""
    if started:
        distributed.shutdown()


def rank_device(dist: distributed.DistContext, device: torch.device) -> torch.device:
    """``--device cuda`` (no index) under a launcher means this rank's own GPU."""
    if dist.distributed and device.type == "cuda" and device.index is None:
        return dist.device if dist.device.type == "cuda" else device
    return device


