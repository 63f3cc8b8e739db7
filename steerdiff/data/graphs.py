"""Graph families as data: seeded offline generation with networkx, dense tensors, per-graph statistics
(``docs/methods/discrete.md``, "Graphs").

**Interface** (kept stable: the graph denoisers, LGGM training and the text-to-graph prompts build on it):

* a graph batch is :class:`GraphBatch` ``(nodes, edges, mask)``: ``nodes`` long ``[B, n]`` node types in
  ``0..Kx-1``; ``edges`` long ``[B, n, n]`` edge types, symmetric with a zero diagonal, ``0`` = no edge; ``mask`` bool
  ``[B, n]``, the real nodes (padded nodes are type 0 with no edges), padded to ``n``;
* :func:`from_networkx` ``(graphs, n_max) -> GraphBatch`` and :func:`to_networkx` ``(batch) -> list[nx.Graph]``
  (node attribute ``"type"``, default 0; edge attribute ``"type"``, default 1);
* :data:`DOMAINS`, the registered graph families (:class:`Domain`), and :func:`generate` ``(domain, count, seed) ->
  list[nx.Graph]``: graph ``i`` of a seed is the same whatever ``count`` (prefix-stable, keyed by ``(seed, domain,
  i)``), node counts uniform in the domain's range (8-20 by default); :data:`CORPUS_FAMILIES`, more families for a
  larger LGGM pre-training corpus only (random geometric, Waxman, Holme-Kim, caveman, duplication-divergence), which
  :func:`generate` takes too;
* :func:`type_marginals` ``(batch) -> (node_pi, edge_pi)``: DiGress's marginals for the ``marginal`` process;
* :func:`describe` ``(graph) -> dict``: node and edge counts, average degree, triangles, average clustering,
  planarity, tree-ness, connectedness (the statistics text-to-graph prompts ask for).

The families are the ones graph generative models are evaluated on: GraphRNN's community and ego sets (You et al.,
ICML 2018, Sec. 4.1), GRAN's lobster and grid sets (Liao et al., NeurIPS 2019, Sec. 5), SPECTRE's planar and SBM sets
(Martinkus et al., ICML 2022, Sec. 5), and the classical random-graph models (Erdős-Rényi, Barabási-Albert,
Watts-Strogatz, uniform random trees, random regular graphs), each a domain in LGGM's sense (Wang et al., ICLR 2025).
They are built small (8-20 nodes) so that a model trains on this machine; the parameters are in each domain's note.
All graphs here have one node type and one edge type (``Kx = 1``, ``Ke = 2``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from ..io.plugins import Registry
from ._rng import check_count, check_seed

N_RANGE = (8, 20)


# ------------------------------------------------------------------------------------------------ the batch
@dataclass
class GraphBatch:
    """Dense padded graphs (see the module docstring): ``nodes [B, n]``, ``edges [B, n, n]``, ``mask [B, n]``."""

    nodes: Tensor
    edges: Tensor
    mask: Tensor

    def __post_init__(self):
        b, n = self.nodes.shape if self.nodes.dim() == 2 else (None, None)
        if b is None or tuple(self.edges.shape) != (b, n, n) or tuple(self.mask.shape) != (b, n):
            raise ValueError(f"GraphBatch needs nodes [B, n], edges [B, n, n], mask [B, n]; got "
                             f"{tuple(self.nodes.shape)}, {tuple(self.edges.shape)}, {tuple(self.mask.shape)}")

    def __len__(self) -> int:
        return self.nodes.shape[0]

    @property
    def n(self) -> int:
        """The padded node count."""
        return self.nodes.shape[1]

    @property
    def num_nodes(self) -> Tensor:
        """``[B]`` the real node counts."""
        return self.mask.sum(1)

    def to(self, device) -> GraphBatch:
        return GraphBatch(self.nodes.to(device), self.edges.to(device), self.mask.to(device))

    def __getitem__(self, index) -> GraphBatch:
        """Rows of the batch (an int keeps the batch axis)."""
        if isinstance(index, int):
            index = slice(index, index + 1) if index != -1 else slice(-1, None)
        return GraphBatch(self.nodes[index], self.edges[index], self.mask[index])


def check_batch(batch: GraphBatch, name: str = "batch") -> GraphBatch:
    """Raise naming ``name`` unless ``batch`` is a valid :class:`GraphBatch` (long types, symmetric edges, zero
    diagonal, nothing on padded nodes). Reads the tensors on the host: for inputs, not inside sampling loops."""
    if not isinstance(batch, GraphBatch):
        raise TypeError(f"{name} must be a GraphBatch, got {type(batch).__name__}")
    if batch.nodes.dtype != torch.long or batch.edges.dtype != torch.long or batch.mask.dtype != torch.bool:
        raise ValueError(f"{name}: nodes and edges must be long and mask bool, got {batch.nodes.dtype}, "
                         f"{batch.edges.dtype}, {batch.mask.dtype}")
    e = batch.edges
    if not torch.equal(e, e.transpose(1, 2)):
        raise ValueError(f"{name}.edges must be symmetric")
    if bool(e.diagonal(dim1=1, dim2=2).any()):
        raise ValueError(f"{name}.edges must have a zero diagonal")
    pad = ~batch.mask
    if bool((e * (pad[:, :, None] | pad[:, None, :])).any()) or bool((batch.nodes * pad).any()):
        raise ValueError(f"{name}: padded nodes must be type 0 with no edges")
    return batch


def type_marginals(batch: GraphBatch, node_classes: int = 1, edge_classes: int = 2) -> tuple[Tensor, Tensor]:
    """``(node_pi [Kx], edge_pi [Ke])`` float64: the frequencies of node types over real nodes and of edge types
    (``0`` = no edge) over real unordered pairs: the marginals DiGress's ``marginal`` process draws noise from
    (Vignac et al. 2023, Sec. 4.1)."""
    mask = batch.mask
    nodes = batch.nodes[mask]
    pairs = (mask[:, :, None] & mask[:, None, :]).triu(1)
    edges = batch.edges[pairs]
    if nodes.numel() == 0 or int(nodes.max()) >= node_classes or (edges.numel() and int(edges.max()) >= edge_classes):
        raise ValueError(f"batch holds types beyond node_classes = {node_classes} / edge_classes = {edge_classes} "
                         "(or no real node)")
    node_pi = torch.bincount(nodes, minlength=node_classes).double()
    edge_pi = torch.bincount(edges, minlength=edge_classes).double()
    return node_pi / node_pi.sum(), edge_pi / edge_pi.sum().clamp_min(1)


def from_networkx(graphs: Sequence[nx.Graph], n_max: int | None = None) -> GraphBatch:
    """A :class:`GraphBatch` from networkx graphs, padded to ``n_max`` (default: the largest graph).

    Nodes are taken in ``graph.nodes`` order; node type = attribute ``"type"`` (default 0), edge type = attribute
    ``"type"`` (default 1, must be >= 1). Self-loops are refused (the diagonal is zero by convention).
    """
    graphs = list(graphs)
    sizes = [g.number_of_nodes() for g in graphs]
    n = max(sizes, default=0) if n_max is None else check_count(n_max, "n_max")
    if sizes and max(sizes) > n:
        raise ValueError(f"n_max = {n} is smaller than the largest graph ({max(sizes)} nodes)")
    b = len(graphs)
    nodes = torch.zeros(b, n, dtype=torch.long)
    edges = torch.zeros(b, n, n, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.bool)
    for i, g in enumerate(graphs):
        index = {v: j for j, v in enumerate(g.nodes)}
        mask[i, : len(index)] = True
        for v, j in index.items():
            nodes[i, j] = int(g.nodes[v].get("type", 0))
        for u, v, data in g.edges(data=True):
            if u == v:
                raise ValueError(f"graph {i} has a self-loop at node {u!r}")
            k = int(data.get("type", 1))
            if k < 1:
                raise ValueError(f"graph {i}: edge types must be >= 1 (0 is no edge), got {k}")
            edges[i, index[u], index[v]] = edges[i, index[v], index[u]] = k
    return GraphBatch(nodes, edges, mask)


def to_networkx(batch: GraphBatch) -> list[nx.Graph]:
    """networkx graphs of the real nodes of each row (nodes ``0..n_i-1`` in mask order, ``"type"`` attributes)."""
    out = []
    nodes, edges, mask = batch.nodes.cpu(), batch.edges.cpu(), batch.mask.cpu()
    for i in range(len(batch)):
        idx = mask[i].nonzero().flatten()
        g = nx.Graph()
        for j, v in enumerate(idx.tolist()):
            g.add_node(j, type=int(nodes[i, v]))
        sub = edges[i][idx][:, idx]
        us, vs = torch.triu(sub, 1).nonzero(as_tuple=True)
        g.add_edges_from((int(u), int(v), {"type": int(sub[u, v])}) for u, v in zip(us, vs, strict=True))
        out.append(g)
    return out


# ------------------------------------------------------------------------------------------------ statistics
def describe(graph: nx.Graph | GraphBatch) -> dict:
    """Statistics of one graph (a networkx graph or a one-row batch): ``nodes``, ``edges``, ``avg_degree``
    (``2E/N``), ``max_degree``, ``triangles``, ``clustering`` (average local clustering, Watts & Strogatz 1998),
    ``is_planar``, ``is_tree``, ``connected``, ``components``."""
    if isinstance(graph, GraphBatch):
        if len(graph) != 1:
            raise ValueError(f"describe takes one graph, got a batch of {len(graph)}")
        graph = to_networkx(graph)[0]
    n, e = graph.number_of_nodes(), graph.number_of_edges()
    return {
        "nodes": n,
        "edges": e,
        "avg_degree": 2.0 * e / n if n else 0.0,
        "max_degree": max((d for _, d in graph.degree), default=0),
        "triangles": sum(nx.triangles(graph).values()) // 3,
        "clustering": nx.average_clustering(graph) if n else 0.0,
        "is_planar": nx.check_planarity(graph)[0],
        "is_tree": n > 0 and nx.is_tree(graph),
        "connected": n > 0 and nx.is_connected(graph),
        "components": nx.number_connected_components(graph) if n else 0,
    }


# ------------------------------------------------------------------------------------------------ domains
@dataclass(frozen=True)
class Domain:
    """A registered graph family: ``make(n, rng) -> nx.Graph`` with about ``n`` nodes (exactly ``n`` unless the note
    says otherwise) from a numpy generator; ``n_range`` the node counts drawn (inclusive); ``note`` the parameters.
    ``varied(n, rng)``, where the family has parameters, draws them per graph over a range (``varied_note``) before
    drawing the graph: the same family with more spread, for a more varied pre-training corpus (LGGM's corpus mixes
    graphs of many sizes and densities within a domain); ``None`` where the family has no parameter to vary."""

    name: str
    make: Callable[[int, np.random.Generator], nx.Graph]
    n_range: tuple[int, int] = N_RANGE
    note: str = ""
    varied: Callable[[int, np.random.Generator], nx.Graph] | None = None
    varied_note: str = ""


DOMAINS: Registry[Domain] = Registry("graph domain", argument="domain")


def domain(name: str, n_range: tuple[int, int] = N_RANGE, note: str = "", aliases: tuple[str, ...] = (),
           varied: Callable[[int, np.random.Generator], nx.Graph] | None = None, varied_note: str = ""):
    """Decorator registering ``make(n, rng)`` as the graph domain ``name`` (``varied``: :class:`Domain`'s)."""

    def decorate(make):
        DOMAINS.add(name, Domain(name, make, n_range, note, varied, varied_note), aliases)
        return make

    return decorate


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(2**31 - 1))


@domain("erdos_renyi", note="G(n, p), p = 0.25 (Erdős & Rényi 1959)", aliases=("er",),
        varied=lambda n, rng: _erdos_renyi(n, rng, p=rng.uniform(0.1, 0.45)), varied_note="p ~ U(0.1, 0.45)")
def _erdos_renyi(n: int, rng: np.random.Generator, p: float = 0.25) -> nx.Graph:
    return nx.gnp_random_graph(n, p, seed=_seed(rng))


@domain("barabasi_albert", note="preferential attachment, m = 2 (Barabási & Albert 1999)", aliases=("ba",),
        varied=lambda n, rng: _barabasi_albert(n, rng, m=int(rng.integers(1, 5))), varied_note="m in {1, 2, 3, 4}")
def _barabasi_albert(n: int, rng: np.random.Generator, m: int = 2) -> nx.Graph:
    return nx.barabasi_albert_graph(n, m, seed=_seed(rng))


@domain("watts_strogatz", note="connected small world, k = 4, p = 0.2 (Watts & Strogatz 1998)", aliases=("ws",),
        varied=lambda n, rng: _watts_strogatz(n, rng, k=2 * int(rng.integers(1, 4)), p=rng.uniform(0.05, 0.4)),
        varied_note="k in {2, 4, 6}, p ~ U(0.05, 0.4)")
def _watts_strogatz(n: int, rng: np.random.Generator, k: int = 4, p: float = 0.2) -> nx.Graph:
    return nx.connected_watts_strogatz_graph(n, k, p, tries=1000, seed=_seed(rng))


@domain("community", note="GraphRNN's community-small: 2 equal communities, p_in = 0.3 (each made connected), "
        "0.05 n inter-community edges (You et al. 2018, Sec. 4.1)",
        varied=lambda n, rng: _community(n, rng, p_in=rng.uniform(0.2, 0.6), inter=rng.uniform(0.03, 0.15)),
        varied_note="p_in ~ U(0.2, 0.6), inter-community edges U(0.03, 0.15) n")
def _community(n: int, rng: np.random.Generator, p_in: float = 0.3, inter: float = 0.05) -> nx.Graph:
    sizes = [n // 2, n - n // 2]
    g = nx.Graph()
    g.add_nodes_from(range(n))
    start = 0
    for s in sizes:
        while True:  # each community a connected G(s, p_in), as GraphRNN draws it (p_in = 0.3)
            c = nx.gnp_random_graph(s, p_in, seed=_seed(rng))
            if nx.is_connected(c):
                break
        g.add_edges_from((u + start, v + start) for u, v in c.edges)
        start += s
    for _ in range(max(1, round(inter * n))):
        g.add_edge(int(rng.integers(sizes[0])), sizes[0] + int(rng.integers(sizes[1])))
    return g


@domain("sbm", note="SPECTRE's SBM, small: 2-4 blocks, p_in = 0.6, p_out = 0.02, resampled until connected "
        "(Martinkus et al. 2022, Sec. 5)",
        varied=lambda n, rng: _sbm(n, rng, blocks=(2, 5), p_in=rng.uniform(0.4, 0.8), p_out=rng.uniform(0.01, 0.06)),
        varied_note="2-5 blocks, p_in ~ U(0.4, 0.8), p_out ~ U(0.01, 0.06)")
def _sbm(n: int, rng: np.random.Generator, blocks: tuple[int, int] = (2, 4), p_in: float = 0.6,
         p_out: float = 0.02) -> nx.Graph:
    k = int(rng.integers(blocks[0], blocks[1] + 1))
    cuts = np.sort(rng.choice(np.arange(2, n - 1), size=k - 1, replace=False)) if n >= 2 * k else []
    sizes = np.diff(np.concatenate([[0], cuts, [n]])).astype(int).tolist()
    p = [[p_in if i == j else p_out for j in range(len(sizes))] for i in range(len(sizes))]
    for _ in range(1000):
        g = nx.stochastic_block_model(sizes, p, seed=_seed(rng))
        if nx.is_connected(g):
            break
    return nx.Graph(g.edges) if g.number_of_nodes() == n and nx.is_connected(g) else nx.path_graph(n)


@domain("planar", note="SPECTRE's planar set: the Delaunay triangulation of n uniform points in the unit square "
        "(Martinkus et al. 2022, Sec. 5)")
def _planar(n: int, rng: np.random.Generator) -> nx.Graph:
    from scipy.spatial import Delaunay

    tri = Delaunay(rng.random((n, 2)))
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for a, b, c in tri.simplices.tolist():
        g.add_edges_from(((a, b), (b, c), (a, c)))
    return g


@domain("tree", note="a uniform random labelled tree (a uniform Prüfer sequence)")
def _tree(n: int, rng: np.random.Generator) -> nx.Graph:
    return nx.from_prufer_sequence(rng.integers(n, size=n - 2).tolist())


@domain("grid", n_range=(8, 20), note="GRAN's grid, small: an r x c 2-D lattice, 2 <= r <= c, with r c the "
        "largest product <= n among the shapes drawn (Liao et al. 2019, Sec. 5); so not always exactly n nodes")
def _grid(n: int, rng: np.random.Generator) -> nx.Graph:
    shapes = [(r, c) for r in range(2, n + 1) for c in range(r, n + 1) if r * c <= n]
    best = max(r * c for r, c in shapes)
    choices = [s for s in shapes if s[0] * s[1] == best]
    r, c = choices[int(rng.integers(len(choices)))]
    return nx.convert_node_labels_to_integers(nx.grid_2d_graph(r, c))


@domain("ego", note="GraphRNN's ego sets, offline: the first n nodes in BFS order of the radius-2 ego net of a "
        "random node of a 300-node powerlaw-cluster graph (m = 2, p = 0.3) (You et al. 2018, Sec. 4.1; Holme & Kim "
        "2002); connected, n nodes",
        varied=lambda n, rng: _ego(n, rng, m=int(rng.integers(1, 4)), p=rng.uniform(0.1, 0.6)),
        varied_note="m in {1, 2, 3}, p ~ U(0.1, 0.6)")
def _ego(n: int, rng: np.random.Generator, m: int = 2, p: float = 0.3) -> nx.Graph:
    big = nx.powerlaw_cluster_graph(300, m, p, seed=_seed(rng))
    while True:
        centre = int(rng.integers(300))
        keep = [centre, *(v for _, v in nx.bfs_edges(big, centre, depth_limit=2))][:n]
        if len(keep) == n:
            return nx.convert_node_labels_to_integers(big.subgraph(keep).copy())


def _lobster_fn():
    return getattr(nx, "random_lobster_graph", None) or nx.random_lobster  # renamed in networkx 3.5


@domain("lobster", note="GRAN's lobster: nx.random_lobster with p1 = p2 = 0.7, backbone length drawn, redrawn until "
        "it has n nodes (Liao et al. 2019, Sec. 5)",
        varied=lambda n, rng: _lobster(n, rng, p1=rng.uniform(0.5, 0.85), p2=rng.uniform(0.5, 0.85)),
        varied_note="p1, p2 ~ U(0.5, 0.85)")
def _lobster(n: int, rng: np.random.Generator, p1: float = 0.7, p2: float = 0.7) -> nx.Graph:
    for _ in range(10000):
        g = _lobster_fn()(max(2, n // 4), p1, p2, seed=_seed(rng))
        if g.number_of_nodes() == n:
            return nx.convert_node_labels_to_integers(g)
    raise RuntimeError(f"no lobster with {n} nodes found")  # pragma: no cover - never seen for 8..20


@domain("regular", note="a uniform random 3-regular graph (n even: n rounded down)",
        varied=lambda n, rng: _regular(n, rng, d=int(rng.integers(2, 6))),
        varied_note="d in {2, 3, 4, 5} (d odd: n rounded down to even)")
def _regular(n: int, rng: np.random.Generator, d: int = 3) -> nx.Graph:
    return nx.random_regular_graph(d, n - n % 2 if d % 2 else n, seed=_seed(rng))


# ------------------------------------------------------------------------------------------------ corpus families
CORPUS_FAMILIES: Registry[Domain] = Registry("corpus family", argument="domain")
"""More classical graph families, for a larger LGGM pre-training corpus only (``benchmarks/lggm.py
--pretrain-extra``): not domains of the shipped model (its prompts, vocabulary and text-to-graph tables name
:data:`DOMAINS` only) and never held out. :func:`generate` takes their names as it takes a domain's."""


def corpus_family(name: str, note: str = ""):
    """Decorator registering ``make(n, rng)`` as the corpus family ``name`` (:data:`CORPUS_FAMILIES`)."""

    def decorate(make):
        if name in DOMAINS:
            raise ValueError(f"{name!r} is already a graph domain")
        CORPUS_FAMILIES.add(name, Domain(name, make, N_RANGE, note))
        return make

    return decorate


@corpus_family("random_geometric", note="n uniform points in the unit square joined within radius r, pi r^2 (n - 1) = "
               "6 (Penrose 2003; Gilbert 1961): spatial, not always connected or planar")
def _random_geometric(n: int, rng: np.random.Generator) -> nx.Graph:
    return nx.random_geometric_graph(n, float(np.sqrt(6.0 / (np.pi * (n - 1)))), seed=_seed(rng))


@corpus_family("waxman", note="Waxman's spatial random graph, beta = 0.9, alpha = 0.35 (Waxman 1988): edge "
               "probability decaying with distance; sparse, not always connected")
def _waxman(n: int, rng: np.random.Generator) -> nx.Graph:
    return nx.waxman_graph(n, beta=0.9, alpha=0.35, seed=_seed(rng))


@corpus_family("powerlaw_cluster", note="Holme and Kim's preferential attachment with triad formation, m = 2, "
               "p = 0.5 (Holme & Kim 2002): hubs and triangles")
def _powerlaw_cluster(n: int, rng: np.random.Generator) -> nx.Graph:
    return nx.powerlaw_cluster_graph(n, 2, 0.5, seed=_seed(rng))


@corpus_family("caveman", note="a ring of cliques of 3-5 nodes drawn (the last takes the remainder, up to 7), each "
               "joined to the next by one edge (connected caveman, Watts 1999)")
def _caveman(n: int, rng: np.random.Generator) -> nx.Graph:
    sizes, left = [], n
    while left > 0:
        k = int(rng.integers(3, 6))
        k = left if left - k < 3 else k  # no clique of fewer than 3 nodes
        sizes.append(k)
        left -= k
    g, starts = nx.Graph(), np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
    g.add_nodes_from(range(n))
    for start, k in zip(starts, sizes, strict=True):
        g.add_edges_from((start + a, start + b) for a in range(k) for b in range(a + 1, k))
    if len(sizes) > 1:
        g.add_edges_from((starts[i], starts[(i + 1) % len(sizes)] + 1) for i in range(len(sizes)))
    return g


@corpus_family("duplication_divergence", note="duplication-divergence, retention p = 0.4 (Ispolatov et al. 2005): "
               "a protein-interaction model; tree-like with hubs")
def _duplication_divergence(n: int, rng: np.random.Generator) -> nx.Graph:
    return nx.duplication_divergence_graph(n, 0.4, seed=_seed(rng))


def family(name: str) -> Domain:
    """The graph domain (:data:`DOMAINS`) or corpus family (:data:`CORPUS_FAMILIES`) called ``name``."""
    if isinstance(name, str) and name in CORPUS_FAMILIES:
        return CORPUS_FAMILIES.get(name)
    if isinstance(name, str) and name not in DOMAINS:
        raise ValueError(f"domain must be one of {DOMAINS.names()} or a corpus family {CORPUS_FAMILIES.names()}, "
                         f"got {name!r}")
    return DOMAINS.get(name)


def generate(domain: str, count: int, seed: int = 0, n_range: tuple[int, int] | None = None,
             varied: bool = False) -> list[nx.Graph]:
    """``count`` graphs of a registered domain (:data:`DOMAINS`) or corpus family (:data:`CORPUS_FAMILIES`), node
    counts uniform in ``n_range`` (default the domain's). Graph ``i`` uses a generator keyed by ``(seed, domain, i)``
    only, so it is the same for any ``count``. ``varied``: each graph from the domain's :attr:`Domain.varied` (its
    parameters drawn per graph) where it has one, from its fixed parameters otherwise."""
    spec = family(domain)
    if not isinstance(varied, bool):
        raise TypeError(f"varied must be a bool, got {varied!r}")
    make = spec.varied if varied and spec.varied is not None else spec.make
    count, seed = check_count(count, "count"), check_seed(seed)
    lo, hi = spec.n_range if n_range is None else n_range
    if not 4 <= lo <= hi:
        raise ValueError(f"n_range must be (lo, hi) with 4 <= lo <= hi, got {n_range!r}")
    key = zlib.crc32(spec.name.encode())
    out = []
    for i in range(count):
        rng = np.random.default_rng(np.random.SeedSequence([seed, key, i]))
        g = make(int(rng.integers(lo, hi + 1)), rng)
        out.append(nx.convert_node_labels_to_integers(nx.Graph(g)))
    return out


def generate_batch(domain: str, count: int, seed: int = 0, n_max: int | None = None) -> GraphBatch:
    """:func:`generate` as a :class:`GraphBatch` padded to ``n_max`` (default the domain's largest node count)."""
    return from_networkx(generate(domain, count, seed), n_max or family(domain).n_range[1])
