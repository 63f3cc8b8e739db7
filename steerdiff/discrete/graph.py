"""Graph diffusion on the discrete core: DiGress's forward process on nodes and edges, as one token sequence
(``docs/methods/discrete.md``, "Graphs").

DiGress (Vignac et al., ICLR 2023, Sec. 3-4) noises each node type and each edge type of a graph as an independent
categorical variable, the edge noise symmetric, with transitions ``alpha_t I + (1 - alpha_t) 1 m^T`` (``m`` uniform or
the data's marginal, per kind). Here a graph of ``n`` node slots is **flattened** into one sequence of length
``L = n + n(n-1)/2`` (node tokens first, then the upper-triangle edge tokens in ``torch.triu_indices`` order), so that
every sampler, guider and SMC of :mod:`steerdiff.discrete` applies as it is:

* clean vocabulary ``K = Kx + Ke``: node type ``k`` is token ``k``, edge type ``e`` is token ``Kx + e``; with one node
  type (``node_process=None``) the node tokens are left out (``L = n(n-1)/2``, ``K = Ke``);
* the absorbing process adds the mask (token ``K``); a last state, ``pad``, marks the positions of padded nodes (a node
  slot beyond the graph's node count and every pair touching one): the reverse step keeps it, so padded nodes are
  untouched;
* an edge token is one variable per unordered pair, so the edge noise is symmetric by construction;
* :meth:`GraphProcess.posterior` applies the node process to node positions and the edge process to edge positions
  (their own ``m``; one shared schedule, since a sampler step has one time).

The graph denoiser convention: ``D(nodes [B, n], edges [B, n, n], mask [B, n], t [B], cond) -> (p_nodes [B, n, Kx],
p_edges [B, n, n, Ke])``, the probabilities of the clean types; noisy nodes and edges come in their own kind's coding
(types, and ``Kx`` / ``Ke`` for the mask under the absorbing process), padded entries 0. :func:`flat_denoiser` turns
it into the sequence convention (``p_edges`` symmetrised: ``(p_ij + p_ji) / 2``). :func:`sample_graphs` returns a
:class:`steerdiff.data.graphs.GraphBatch`; NFE as the sampler's (``nfe_of``; a doubled CFG batch counts 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..core.noise import GeneratorLike
from ..data.graphs import GraphBatch
from .process import Process, categorical, make_process, onehot_states
from .sampling import RowRandom, sample
from .steer import DiscreteSteerResult, best_of_n, smc


class GraphProcess(Process):
    """The forward process of graphs with ``n`` node slots, flattened (see the module docstring).

    Args:
        edge_process: a :class:`Process` over the ``Ke`` edge types (type 0 = no edge).
        n: the node slots.
        node_process: a :class:`Process` over the ``Kx`` node types of the same kind (absorbing or not) and
            schedule, or None for graphs with one node type (node tokens left out of the sequence).
    """

    def __init__(self, edge_process: Process, n: int, node_process: Process | None = None):
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"n must be an integer >= 2, got {n!r}")
        if not isinstance(edge_process, Process) or isinstance(edge_process, GraphProcess):
            raise TypeError(f"edge_process must be a Process over edge types, got {edge_process!r}")
        if node_process is not None:
            if node_process.absorbing != edge_process.absorbing:
                raise ValueError("node_process and edge_process must both be absorbing or both not")
            ts = (0.1, 0.3, 0.5, 0.7, 0.9)
            if any(abs(node_process.alpha(t) - edge_process.alpha(t)) > 1e-12 for t in ts):
                raise ValueError("node_process and edge_process must share their schedule (one time per step)")
        self.name = f"graph-{edge_process.name}"
        self.n, self.node_process, self.edge_process = n, node_process, edge_process
        self.kx = node_process.num_classes if node_process is not None else 1
        self.ke = edge_process.num_classes
        self.node_slots = n if node_process is not None else 0  # node positions in the sequence
        self.offset = self.kx if node_process is not None else 0  # the token of edge type 0
        self.rows, self.cols = torch.triu_indices(n, n, 1)
        self.length = self.node_slots + len(self.rows)
        self.num_classes = self.offset + self.ke
        self.absorbing = edge_process.absorbing
        self.mask_index = self.num_classes if self.absorbing else None
        self.pad_index = self.num_classes + int(self.absorbing)
        self.num_states = self.pad_index + 1
        self.schedule = edge_process.schedule

    def __repr__(self) -> str:
        return f"GraphProcess({self.edge_process!r}, n={self.n}, node_process={self.node_process!r})"

    @property
    def m(self):
        raise AttributeError("a GraphProcess has one m per kind: see node_process.m and edge_process.m")

    def transition(self, t: float, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
        raise NotImplementedError("a GraphProcess has one transition per kind: see node_process / edge_process")

    # ------------------------------------------------------------------------------------------ layout
    def _check_x(self, x: Tensor, name: str = "x") -> None:
        if x.dim() != 2 or x.shape[1] != self.length:
            raise ValueError(f"{name} must be [B, L] with L = {self.length} for n = {self.n}, got {tuple(x.shape)}")

    def _index(self, device) -> tuple[Tensor, Tensor]:
        return self.rows.to(device), self.cols.to(device)

    def flatten(self, batch: GraphBatch) -> Tensor:
        """``[B, L]`` clean states of a :class:`GraphBatch` with ``n`` node slots (padded positions: ``pad``)."""
        if batch.n != self.n:
            raise ValueError(f"batch has {batch.n} node slots, the process {self.n}")
        return self.join(batch.nodes, batch.edges, batch.mask)

    def split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(nodes [B, n], edges [B, n, n], mask [B, n])`` of states ``x [B, L]`` in each kind's coding: types, and
        ``Kx`` / ``Ke`` for the mask (absorbing); padded entries 0, edges symmetric with a zero diagonal. Without node
        tokens, a node is real when one of its pairs is not ``pad`` (so graphs need >= 2 real nodes)."""
        self._check_x(x)
        b, dev = x.shape[0], x.device
        r, c = self._index(dev)
        xe = x[:, self.node_slots:]
        pad_e = xe == self.pad_index
        if self.absorbing:
            ev = torch.where(xe == self.mask_index, torch.full_like(xe, self.ke), xe - self.offset)
        else:
            ev = xe - self.offset
        ev = torch.where(pad_e, torch.zeros_like(ev), ev)
        edges = torch.zeros(b, self.n, self.n, dtype=torch.long, device=dev)
        edges[:, r, c] = ev
        edges[:, c, r] = ev
        if self.node_process is None:
            real = torch.zeros(b, self.n, self.n, dtype=torch.bool, device=dev)
            real[:, r, c] = ~pad_e
            real[:, c, r] = ~pad_e
            mask = real.any(2)
            nodes = torch.zeros(b, self.n, dtype=torch.long, device=dev)
        else:
            xn = x[:, : self.n]
            mask = xn != self.pad_index
            nodes = torch.where(xn == self.mask_index, torch.full_like(xn, self.kx), xn) if self.absorbing else xn
            nodes = torch.where(mask, nodes, torch.zeros_like(nodes))
        return nodes, edges, mask

    def join(self, nodes: Tensor, edges: Tensor, mask: Tensor) -> Tensor:
        """The states ``x [B, L]`` of ``(nodes, edges, mask)`` in each kind's coding: the inverse of :meth:`split`."""
        r, c = self._index(edges.device)
        e = edges[:, r, c]
        if self.absorbing:
            e = torch.where(e == self.ke, torch.full_like(e, self.mask_index), e + self.offset)
        else:
            e = e + self.offset
        e = torch.where(mask[:, r] & mask[:, c], e, torch.full_like(e, self.pad_index))
        if self.node_process is None:
            return e
        xn = torch.where(nodes == self.kx, torch.full_like(nodes, self.mask_index), nodes) if self.absorbing else nodes
        return torch.cat([torch.where(mask, xn, torch.full_like(xn, self.pad_index)), e], 1)

    def unflatten(self, x: Tensor) -> GraphBatch:
        """The :class:`GraphBatch` of clean states ``x [B, L]`` (no mask token left)."""
        return GraphBatch(*self.split(x))

    def pad(self, x: Tensor, num_nodes: Tensor) -> Tensor:
        """``x`` with the positions of node slots ``>= num_nodes [B]`` set to ``pad``."""
        self._check_x(x)
        real = torch.arange(self.n, device=x.device)[None] < num_nodes.to(x.device)[:, None]
        r, c = self._index(x.device)
        keep = real[:, r] & real[:, c]
        if self.node_process is not None:
            keep = torch.cat([real, keep], 1)
        return torch.where(keep, x, torch.full_like(x, self.pad_index))

    # ------------------------------------------------------------------------------------------ the process
    def prior(self, shape: tuple[int, int], u: Tensor, edge_marginal: Tensor | None = None) -> Tensor:
        """All mask (absorbing), else node and edge tokens drawn from their kind's ``m`` (uniforms ``u [B, L]``);
        ``edge_marginal [B, Ke]``: each row's edge tokens from its own limit instead of the process's (see
        :meth:`corrupt`)."""
        if shape[1] != self.length:
            raise ValueError(f"shape must be (B, {self.length}) for n = {self.n}, got {tuple(shape)}")
        if self.absorbing:
            if edge_marginal is not None:
                raise ValueError("edge_marginal is for the marginal and uniform processes; the absorbing one has "
                                 "the mask as its only limit")
            return torch.full(tuple(shape), self.mask_index, dtype=torch.long, device=u.device)
        ns = self.node_slots
        if edge_marginal is None:
            m_e = self.edge_process.m.to(u.device, torch.float32).expand(shape[0], shape[1] - ns, -1)
        else:
            if edge_marginal.shape != (shape[0], self.ke):
                raise ValueError(f"edge_marginal must be [B={shape[0]}, Ke={self.ke}], got "
                                 f"{tuple(edge_marginal.shape)}")
            m_e = edge_marginal.to(u.device, torch.float32)[:, None, :].expand(-1, shape[1] - ns, -1)
        e = categorical(m_e, u[:, ns:]) + self.offset
        if self.node_process is None:
            return e
        xn = categorical(self.node_process.m.to(u.device, torch.float32).expand(shape[0], ns, -1), u[:, :ns])
        return torch.cat([xn, e], 1)

    def noise(self, x0: Tensor, t: float, u: Tensor, v: Tensor) -> Tensor:
        """``x_t ~ q(x_t | x_0)`` per token (``pad`` kept), from uniforms ``u, v [B, L]``."""
        return self.noise_rows(x0, torch.full((x0.shape[0],), self.alpha(t), device=x0.device), u, v)

    def noise_rows(self, x0: Tensor, alpha: Tensor, u: Tensor, v: Tensor,
                   edge_marginal: Tensor | None = None) -> Tensor:
        """As :meth:`noise` with one survival probability per row, ``alpha [B]`` (training with a time per row), and
        optionally one edge limit per row, ``edge_marginal [B, Ke]`` (:meth:`prior`)."""
        self._check_x(x0, "x0")
        keep = (u < alpha.to(u.dtype)[:, None]) | (x0 == self.pad_index)
        return torch.where(keep, x0, self.prior(tuple(x0.shape), v, edge_marginal))

    def corrupt(self, batch: GraphBatch, t: Tensor, generator: torch.Generator | None = None,
                edge_marginal: Tensor | None = None) -> GraphBatch:
        """A noisy :class:`GraphBatch` ``G_t ~ q(G_t | G_0)`` at times ``t [B]`` (one per graph; read on the host
        once: a training helper), in the denoiser's input coding (:meth:`split`). ``edge_marginal [B, Ke]`` gives
        each graph the marginal transitions of its own edge marginal (DiGress's ``Q_t = alpha_t I + (1 - alpha_t)
        1 m^T`` with ``m`` per graph: a corpus of domains, each noised toward its own density) instead of the
        process's one ``m``; the same uniforms are drawn either way."""
        x0 = self.flatten(batch)
        alpha = torch.tensor([self.alpha(float(s)) for s in t.tolist()], dtype=torch.float32, device=x0.device)
        dev = generator.device if generator is not None else x0.device
        u = torch.rand(x0.shape, generator=generator, device=dev).to(x0.device)
        v = torch.rand(x0.shape, generator=generator, device=dev).to(x0.device)
        return GraphBatch(*self.split(self.noise_rows(x0, alpha, u, v, edge_marginal)))

    def posterior(self, x: Tensor, p0: Tensor, t: float, s: float) -> Tensor:
        """``[B, L, S]``: each kind's exact reverse step (:meth:`Process.posterior`) at its positions; ``pad`` kept."""
        dtype = torch.promote_types(p0.dtype, torch.float32)
        b, dev = x.shape[0], x.device
        out = torch.zeros(b, self.length, self.num_states, dtype=dtype, device=dev)
        ns, off = self.node_slots, self.offset
        parts = [(self.edge_process, slice(ns, None), off)]
        if self.node_process is not None:
            parts.append((self.node_process, slice(0, ns), 0))
        for proc, pos, first in parts:
            k = proc.num_classes
            xp = x[:, pos]
            coded = xp - first
            if self.absorbing:
                coded = torch.where(xp == self.mask_index, torch.full_like(xp, k), coded)
            coded = torch.where(xp == self.pad_index, torch.zeros_like(xp), coded)
            post = proc.posterior(coded, p0[:, pos, first:first + k], t, s).to(dtype)
            out[:, pos, first:first + k] = post[..., :k]
            if self.absorbing:
                out[:, pos, self.mask_index] = post[..., k]
        pad = (x == self.pad_index)[..., None]
        return torch.where(pad, onehot_states(x, self.num_states, dtype), out)


def graph_process(kind: str, n: int, edge_classes: int = 2, node_classes: int = 1, schedule=None,
                  edge_marginal=None, node_marginal=None) -> GraphProcess:
    """A :class:`GraphProcess` from a registered process name (``absorbing``, ``uniform``, ``marginal``; DiGress uses
    ``marginal`` with the data's node and edge marginals, ``edge_marginal`` / ``node_marginal``)."""
    opts = {} if schedule is None else {"schedule": schedule}
    e_opts = dict(opts, pi=edge_marginal) if kind == "marginal" else opts
    edge = make_process(kind, edge_classes, **e_opts)
    node = None
    if node_classes > 1:
        node = make_process(kind, node_classes, **(dict(opts, pi=node_marginal) if kind == "marginal" else opts))
    return GraphProcess(edge, n, node)


# ------------------------------------------------------------------------------------------------ denoisers
GraphDenoiser = Callable[..., tuple[Tensor, Tensor]]


def flat_denoiser(denoiser: GraphDenoiser, process: GraphProcess) -> Callable:
    """The sequence denoiser ``(x [B, L], t [B], cond) -> [B, L, K]`` of a graph denoiser ``D(nodes, edges, mask, t,
    cond) -> (p_nodes [B, n, Kx], p_edges [B, n, n, Ke])``; edge probabilities symmetrised, padded positions one-hot
    (they are never drawn)."""
    gp = process

    def flat(x: Tensor, t: Tensor, cond=None) -> Tensor:
        nodes, edges, mask = gp.split(x)
        p_nodes, p_edges = denoiser(nodes, edges, mask, t, cond)
        b = x.shape[0]
        if tuple(p_nodes.shape) != (b, gp.n, gp.kx) or tuple(p_edges.shape) != (b, gp.n, gp.n, gp.ke):
            raise ValueError(f"the graph denoiser must return p_nodes [B, n, Kx] = {(b, gp.n, gp.kx)} and p_edges "
                             f"[B, n, n, Ke] = {(b, gp.n, gp.n, gp.ke)}, got {tuple(p_nodes.shape)} and "
                             f"{tuple(p_edges.shape)}")
        r, c = gp._index(x.device)
        pe = 0.5 * (p_edges[:, r, c] + p_edges[:, c, r])
        out = torch.zeros(b, gp.length, gp.num_classes, dtype=pe.dtype, device=x.device)
        out[:, gp.node_slots:, gp.offset:] = pe
        if gp.node_process is not None:
            out[:, : gp.n, : gp.kx] = p_nodes.to(pe.dtype)
        first = torch.zeros(gp.length, dtype=torch.long, device=x.device)
        first[gp.node_slots:] = gp.offset
        onehot = onehot_states(first, gp.num_classes, out.dtype).expand_as(out)
        return torch.where((x == gp.pad_index)[..., None], onehot, out)

    return flat


def table_denoiser(model: Callable, process: GraphProcess) -> GraphDenoiser:
    """The graph denoiser of an exact table over the flattened tokens: ``model(x [B, L], t, cond) -> [B, L, K]`` (a
    :class:`steerdiff.discrete.TableModel` of length ``L`` under ``process``, or under ``process.edge_process`` when
    there are no node tokens: the same coding), read through :meth:`GraphProcess.join`. For the exact checks of
    ``docs/methods/discrete.md``, "Graphs" (every slot real)."""

    def denoiser(nodes: Tensor, edges: Tensor, mask: Tensor, t: Tensor, cond=None) -> tuple[Tensor, Tensor]:
        p = model(process.join(nodes, edges, mask), t, cond)  # [B, L, K]
        r, c = process._index(edges.device)
        b, n, ns = edges.shape[0], process.n, process.node_slots
        p_edges = torch.zeros(b, n, n, process.ke, dtype=p.dtype, device=edges.device)
        p_edges[..., 0] = 1.0  # the diagonal: no self-loop
        p_edges[:, r, c] = p[:, ns:, process.offset:]
        p_edges[:, c, r] = p[:, ns:, process.offset:]
        if process.node_process is None:
            return torch.ones(b, n, 1, dtype=p.dtype, device=edges.device), p_edges
        return p[:, :ns, : process.kx], p_edges

    return denoiser


def _num_nodes(num_nodes, n: int) -> Tensor:
    nn_ = torch.as_tensor(num_nodes, dtype=torch.long).flatten()
    if nn_.numel() == 0 or bool((nn_ < 2).any()) or bool((nn_ > n).any()):
        raise ValueError(f"num_nodes must hold node counts in 2..{n}, got {nn_.tolist()}")
    return nn_


def sample_graphs(denoiser: GraphDenoiser, process: GraphProcess, steps: int, *, num_nodes: Sequence[int] | Tensor,
                  method: str = "ancestral", cond=None, guidance=None, generator: GeneratorLike = None, device=None,
                  return_stats: bool = False, **options):
    """Sample graphs with ``num_nodes [B]`` nodes each by a registered discrete sampler (``docs/methods/discrete.md``,
    "Graphs"): the flattened sequence (:class:`GraphProcess`) run by :func:`steerdiff.discrete.sample`, padded slots
    kept. Returns a :class:`GraphBatch` (and :class:`~steerdiff.discrete.DiscreteStats` with ``return_stats``).

    The unmasking samplers plan their grid for ``L`` tokens: with padding, the real ones are revealed first and the
    last steps reveal nothing, so for those samplers sample one node count per call (as DiGress draws ``n`` first).
    The start's randomness (non-absorbing) uses generators ``seed + i + 2**42`` for an int seed.
    """
    if not isinstance(process, GraphProcess):
        raise TypeError(f"process must be a GraphProcess, got {type(process).__name__}")
    counts = _num_nodes(num_nodes, process.n)
    b = len(counts)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if process.absorbing:
        x = torch.full((b, process.length), process.mask_index, dtype=torch.long, device=dev)
    else:
        start_gen = generator + 2**42 if isinstance(generator, int) and not isinstance(generator, bool) else generator
        u = RowRandom.make(start_gen, b).rand(b, process.length, dev)
        x = process.prior((b, process.length), u)
    x = process.pad(x, counts)
    out = sample(flat_denoiser(denoiser, process), process, steps, x=x, method=method, cond=cond, guidance=guidance,
                 generator=generator, return_stats=return_stats, **options)
    if return_stats:
        return process.unflatten(out[0]), out[1]
    return process.unflatten(out)


def graph_reward(reward: Callable[[GraphBatch], Tensor], process: GraphProcess) -> Callable[[Tensor], Tensor]:
    """A sequence reward ``r(x [N, L]) -> [N]`` from a graph reward ``r(GraphBatch) -> [N]`` (for :func:`smc`)."""
    return lambda x: reward(process.unflatten(x))


def triangles(batch: GraphBatch) -> Tensor:
    """``[B]`` float: the number of triangles of each graph, ``trace(A^3) / 6`` (``A`` the 0/1 adjacency)."""
    a = (batch.edges > 0).to(torch.float32)
    return torch.einsum("bij,bjk,bki->b", a, a, a) / 6


def smc_graphs(denoiser: GraphDenoiser, process: GraphProcess, reward: Callable[[GraphBatch], Tensor], *,
               steps: int, alpha: float, **options) -> DiscreteSteerResult:
    """:func:`steerdiff.discrete.smc` on graphs with all ``n`` node slots real (options as there); ``samples`` are
    flat states (:meth:`GraphProcess.unflatten` them)."""
    return smc(flat_denoiser(denoiser, process), process, graph_reward(reward, process), length=process.length,
               steps=steps, alpha=alpha, **options)


def best_of_n_graphs(denoiser: GraphDenoiser, process: GraphProcess, reward: Callable[[GraphBatch], Tensor], *,
                     steps: int, n: int, **options) -> DiscreteSteerResult:
    """:func:`steerdiff.discrete.best_of_n` on graphs with all ``n`` node slots real (options as there)."""
    return best_of_n(flat_denoiser(denoiser, process), process, graph_reward(reward, process),
                     length=process.length, steps=steps, n=n, **options)
