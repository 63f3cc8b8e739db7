"""Which particles a process holds, and the exchanges an SMC step needs when they are spread over processes.

An SMC population of ``G`` groups of ``P`` particles is ``G * P`` rows (group-major). A :class:`ParticleShard`
assigns each row to one rank of a :class:`~steerdiff.distributed.DistContext`:

* ``groups``: rank ``r`` holds whole groups ``r G/W ... (r+1) G/W - 1`` (when ``W`` divides ``G``): resampling
  never moves a particle between ranks; only the per-particle scalars travel;
* ``particles``: rank ``r`` holds particles ``r P/W ... (r+1) P/W - 1`` of every group (when ``W`` divides ``P``):
  one population is spread over all ranks, and resampling moves the states of the particles whose ancestor lives
  on another rank, point to point.

Per-row tensors (states, denoised values, gradients, conditions) stay local; per-particle scalars (log-weights,
rewards, twists, proposal ratios: ``[G, P]`` float64) are gathered after every step so that every rank holds them
all, computes the same weights, ESS and tempering level, and draws the same ancestors from the same uniforms
(a group's uniforms come from the generator of its first row, drawn by the rank that holds that row and shared).
Every random draw of a particle comes from the generator of its global row, so a sharded run equals the
one-process run bit for bit (when the denoiser's micro-batches are the same: :meth:`ParticleShard.chunks`).

With one process (:data:`steerdiff.distributed.SINGLE`) every method is the identity, so the samplers have one
code path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..distributed import CommStats, DistContext, all_gather, all_reduce_sum, exchange

LAYOUTS = ("auto", "groups", "particles")


def choose_layout(world: int, groups: int, particles: int, shard_by: str = "auto") -> str:
    """``groups`` or ``particles`` (``single`` for one process); ``auto`` prefers whole groups (no state moves).

    Raises:
        ValueError: an unknown ``shard_by``, or a world size that divides neither what was asked nor (``auto``)
            the groups or the particles.
    """
    if shard_by not in LAYOUTS:
        raise ValueError(f"shard_by must be one of {LAYOUTS}, got {shard_by!r}")
    if world == 1:
        return "single"
    fits = {"groups": groups % world == 0, "particles": particles % world == 0}
    if shard_by == "auto":
        for layout in ("groups", "particles"):
            if fits[layout]:
                return layout
        raise ValueError(
            f"the world size {world} divides neither the number of groups ({groups}) nor the particles per group "
            f"({particles}): use a particle count (or number of groups) that the {world} processes divide, e.g. "
            f"particles={-(-particles // world) * world}")
    if not fits[shard_by]:
        n = groups if shard_by == "groups" else particles
        raise ValueError(f"shard_by={shard_by!r} needs the world size {world} to divide the number of {shard_by} "
                         f"({n})")
    return shard_by


class ParticleShard:
    """The rows of ``G * P`` that this rank holds, and the SMC exchanges over a :class:`DistContext`.

    Args:
        ctx: the process group (``SINGLE``: everything local, no communication).
        groups, particles: the population's ``G`` and ``P``.
        shard_by: ``auto``, ``groups`` or ``particles`` (:func:`choose_layout`).
    """

    def __init__(self, ctx: DistContext, groups: int, particles: int, shard_by: str = "auto"):
        self.ctx, self.groups, self.particles = ctx, groups, particles
        self.layout = choose_layout(ctx.world, groups, particles, shard_by)
        self.stats = CommStats()
        n, w = groups * particles, ctx.world
        ids = torch.arange(n)
        if self.layout == "single":
            owner = torch.zeros(n, dtype=torch.int64)
        elif self.layout == "groups":
            owner = (ids // particles) // (groups // w)
        else:
            owner = (ids % particles) // (particles // w)
        self.owner = owner
        self.rows_of = [ids[owner == r] for r in range(w)]
        self.position = torch.empty(n, dtype=torch.int64)  # each row's index among its owner's rows
        for r in range(w):
            self.position[self.rows_of[r]] = torch.arange(len(self.rows_of[r]))
        self.rows = self.rows_of[ctx.rank]

    @property
    def local(self) -> bool:
        """One process: nothing to exchange."""
        return self.layout == "single"

    @property
    def state_moves(self) -> bool:
        """Resampling can move a particle to another rank (``particles`` layout)."""
        return self.layout == "particles"

    def __repr__(self) -> str:
        return (f"ParticleShard(layout={self.layout!r}, rank={self.ctx.rank}, world={self.ctx.world}, "
                f"rows={len(self.rows)} of {self.groups * self.particles})")

    # -------------------------------------------------------------------------------------------- rows
    def take(self, t: Tensor | None) -> Tensor | None:
        """This rank's rows of a full ``[G * P, ...]`` tensor (the tensor itself in one process)."""
        if t is None or self.local:
            return t
        return t[self.rows.to(t.device)]

    def take_list(self, items: Sequence | None) -> list | None:
        """This rank's entries of a per-row list (e.g. generators)."""
        if items is None or self.local:
            return None if items is None else list(items)
        return [items[int(i)] for i in self.rows]

    def chunks(self, batch_size: int | None) -> list[slice]:
        """Micro-batches of the local rows: runs of consecutive global rows, cut at multiples of ``batch_size``.

        The one-process run cuts its ``G * P`` rows at the same global multiples, so whenever ``batch_size``
        divides the rank's runs of consecutive rows (``P / W`` rows per group for the particle layout, ``G P / W``
        for the group layout) both evaluate the denoiser on the same batches, and a denoiser whose output depends on
        the batch's size (most networks do, at float rounding) still gives bit-identical results.
        """
        rows = self.rows.tolist()
        out, start = [], 0
        for k in range(1, len(rows) + 1):
            if k == len(rows) or rows[k] != rows[k - 1] + 1 or (
                    batch_size is not None and rows[k] // batch_size != rows[k - 1] // batch_size):
                out.append(slice(start, k))
                start = k
        return out

    def same_batches(self, batch_size: int | None) -> bool:
        """Whether this rank's micro-batches (:meth:`chunks`) are whole micro-batches of the one-process run, so
        that a denoiser whose rounding depends on the batch size still gives bit-identical results."""
        n = self.groups * self.particles
        step = n if batch_size is None else batch_size
        rows = self.rows.tolist()
        return all(rows[c.start] % step == 0 and (c.stop - c.start == step or rows[c.stop - 1] == n - 1)
                   for c in self.chunks(batch_size))

    # -------------------------------------------------------------------------------------------- gathers
    def gather(self, t: Tensor) -> Tensor:
        """``[G * P, ...]`` in global order from every rank's local rows ``t [n_local, ...]``."""
        if self.local:
            return t
        parts = all_gather(self.ctx, t, self.stats)
        full = t.new_empty((self.groups * self.particles, *t.shape[1:]))
        for r, part in enumerate(parts):
            full[self.rows_of[r].to(t.device)] = part
        return full

    def per_particle(self, t: Tensor) -> Tensor:
        """``[G, P]`` from the local per-row values ``t [n_local]`` (e.g. rewards, flags, proposal ratios)."""
        return self.gather(t).view(self.groups, self.particles)

    def gather_rows(self, t: Tensor, rows: Tensor) -> Tensor:
        """Rows ``rows`` (global indices) of the population's ``[G * P, ...]`` tensor whose local part is ``t``, on
        every rank: each rank sends the requested rows it holds (padded to the largest share)."""
        if self.local:
            return t[rows.to(t.device)]
        rows = rows.cpu()
        owners = self.owner[rows]
        counts = torch.bincount(owners, minlength=self.ctx.world)
        mine = (owners == self.ctx.rank).nonzero().flatten()
        buf = t.new_zeros((int(counts.max()), *t.shape[1:]))
        buf[: len(mine)] = t[self.position[rows[mine]].to(t.device)]
        parts = all_gather(self.ctx, buf, self.stats)
        out = t.new_empty((len(rows), *t.shape[1:]))
        for r, part in enumerate(parts):
            where = (owners == r).nonzero().flatten()
            out[where.to(t.device)] = part[: len(where)]
        return out

    def total(self, n: float) -> float:
        """The sum of a per-rank count over the ranks."""
        if self.local:
            return n
        return float(all_reduce_sum(self.ctx, torch.tensor([float(n)], dtype=torch.float64), self.stats))

    def group_generators(self, generators: Sequence | None) -> list | None:
        """Per group, the generator of its first row from this rank's per-row ``generators`` (None for the groups
        whose first row another rank holds); None without generators (the global RNG)."""
        if generators is None:
            return None
        if self.local:
            return list(generators[:: self.particles])
        out = []
        for g in range(self.groups):
            first = g * self.particles
            out.append(generators[int(self.position[first])] if int(self.owner[first]) == self.ctx.rank else None)
        return out

    def group_uniforms(self, group_generators: Sequence | None, groups: Tensor, n: int,
                       dtype: torch.dtype = torch.float64) -> Tensor:
        """``[len(groups), n]`` uniforms, row ``k`` from ``group_generators[groups[k]]`` (:meth:`group_generators`;
        None: the global RNG, one process only), drawn on the rank that holds the group's first row and shared."""
        if group_generators is None:
            if not self.local:
                raise ValueError("a sharded run needs per-row generators (pass generator= an int seed)")
            return torch.rand(len(groups), n, dtype=dtype)
        if self.local:
            return torch.stack([torch.rand(n, generator=group_generators[int(g)], dtype=dtype) for g in groups])
        owners = self.owner[groups.cpu() * self.particles]
        drawn = torch.zeros(len(groups), n, dtype=dtype)
        for k, g in enumerate(groups.tolist()):
            if group_generators[g] is not None:
                drawn[k] = torch.rand(n, generator=group_generators[g], dtype=dtype)
        return self.gather_rows_of(drawn, owners)

    def gather_rows_of(self, drawn: Tensor, owners: Tensor) -> Tensor:
        """Row ``k`` of ``drawn [m, ...]`` from rank ``owners[k]`` (each rank filled its own rows), on every rank."""
        parts = all_gather(self.ctx, drawn, self.stats)
        out = torch.empty_like(drawn)
        for r, part in enumerate(parts):
            where = owners == r
            out[where] = part[where]
        return out

    # -------------------------------------------------------------------------------------------- resampling
    def _index_tables(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """``(group offsets [G, 1], this rank's rows, position of each row)`` on ``device``, made once per device."""
        cache = self.__dict__.setdefault("_tables", {})
        if device not in cache:
            offsets = (self.particles * torch.arange(self.groups))[:, None]
            cache[device] = tuple(t.to(device) for t in (offsets, self.rows, self.position))
        return cache[device]

    def reindex_rows(self, tensors: Sequence[Tensor | None], anc: Tensor) -> list[Tensor | None]:
        """Each local row's ancestor's row, for every tensor of ``tensors`` (local ``[n_local, ...]``), given the
        ancestors ``anc [G, P]`` (the same on every rank). Rows whose ancestor lives on another rank are received
        from it; each rank sends every distinct row another rank needs once."""
        if not self.state_moves:
            # Whole groups per rank: every ancestor is local, and the index arithmetic runs on the ancestors' own
            # device (no copy of them to the host: on an accelerator that would wait for the device every
            # resampling step). The same integers as on the host, so the same rows.
            offsets, rows, position = self._index_tables(anc.device)
            idx = position[(anc + offsets).flatten()[rows]]
            return [None if t is None else t[idx if idx.device == t.device else idx.to(t.device)] for t in tensors]
        # Particles spread over ranks: the point-to-point exchange sizes its messages by how many rows each rank
        # needs from each other one, which the host must know to post the receives: the ancestors are read here.
        offsets = (self.particles * torch.arange(self.groups))[:, None]
        src = (anc.cpu() + offsets).flatten()  # global source row of each global destination row
        me = self.ctx.rank
        mine_src = src[self.rows]
        need = {q: torch.unique(mine_src[self.owner[mine_src] == q]) for q in range(self.ctx.world) if q != me}
        give = {}
        for q in range(self.ctx.world):
            if q == me:
                continue
            theirs = src[self.rows_of[q]]
            give[q] = torch.unique(theirs[self.owner[theirs] == me])
        # One message per (destination, dtype): the per-row tensors of one dtype travel packed side by side, and
        # all the packs go in one round trip.
        packs: dict[tuple, list[int]] = {}
        for k, t in enumerate(tensors):
            if t is not None:
                packs.setdefault((t.dtype, t.device), []).append(k)
        flats = [torch.cat([tensors[k].reshape(tensors[k].shape[0], -1) for k in ks], 1) for ks in packs.values()]
        got = exchange(self.ctx, {q: [f[self.position[rows].to(f.device)] for f in flats] for q, rows in give.items()},
                       {q: len(rows) for q, rows in need.items()}, flats, self.stats)
        out: list[Tensor | None] = [None] * len(tensors)
        own = self.owner[mine_src] == me
        for p, (ks, flat) in enumerate(zip(packs.values(), flats, strict=True)):
            new = flat.new_empty(flat.shape)
            new[own.nonzero().flatten().to(flat.device)] = flat[self.position[mine_src[own]].to(flat.device)]
            for q, rows in need.items():
                if len(rows) == 0:
                    continue
                where = (self.owner[mine_src] == q).nonzero().flatten()
                new[where.to(flat.device)] = got[q][p][torch.searchsorted(rows, mine_src[where]).to(flat.device)]
            widths = [tensors[k][0].numel() for k in ks]
            for k, part in zip(ks, new.split(widths, 1), strict=True):
                out[k] = part.reshape(tensors[k].shape)
        return out
