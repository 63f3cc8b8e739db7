"""Running steerdiff on several processes with ``torch.distributed`` (``docs/distributed.md``).

* :func:`init` / :func:`current` / :func:`shutdown`: the process group from the launcher's environment, as a
  :class:`DistContext` that samplers, SMC functions and the trainer take as ``dist=``;
* :mod:`.collectives`: all-gather, all-reduce, broadcast and a point-to-point exchange (identities in one process),
  an argument fingerprint that raises on every rank when ranks disagree (:func:`check_same`), byte counts;
* :mod:`.seeds`: seed-sharded work, seeds in fixed chunks shared over the ranks and gathered in global order
  (:func:`map_chunks`, :func:`parse_seeds`); :func:`split_evenly`: a rank's share of any list of work items.

Results do not depend on the number of processes: work is split by global index (a seed, a particle) and every
random draw comes from the generator of that index.
"""

from .collectives import (
    CommStats,
    DistributedError,
    all_gather,
    all_reduce_sum,
    barrier,
    broadcast,
    check_same,
    exchange,
    shares,
    split_evenly,
)
from .context import DEFAULT_TIMEOUT_S, SINGLE, DistContext, current, init, resolve, shutdown
from .seeds import chunks, format_seeds, gather_rows, map_chunks, own_chunks, parse_seeds

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "SINGLE",
    "CommStats",
    "DistContext",
    "DistributedError",
    "all_gather",
    "all_reduce_sum",
    "barrier",
    "broadcast",
    "check_same",
    "chunks",
    "format_seeds",
    "gather_rows",
    "map_chunks",
    "own_chunks",
    "parse_seeds",
    "current",
    "exchange",
    "init",
    "resolve",
    "shares",
    "shutdown",
    "split_evenly",
]
