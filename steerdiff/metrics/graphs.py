"""Graph generation metrics: MMD of graph statistics, validity per domain, V.U.N., conformity to asked statistics
(``docs/methods/discrete.md``, "Graph metrics").

**MMD** (GraphRNN, You et al., ICML 2018, Sec. 4.2; GRAN, Liao et al., NeurIPS 2019, Sec. 5; SPECTRE, Martinkus et
al., ICML 2022; DiGress, Vignac et al., ICLR 2023, Sec. 6.1, all report these): each graph is summarised by a histogram,

* ``degree``: counts of nodes of degree 0, 1, 2, ... (``nx.degree_histogram``);
* ``clustering``: the local clustering coefficients in 100 bins over [0, 1];
* ``spectre``: the eigenvalues of the normalised Laplacian in 200 bins over [-1e-5, 2];

histograms are normalised to sum 1 (GRAN's ``is_hist``), zero-padded to a common length, and compared between the two
sets by the biased (V-statistic) squared MMD ``mean k(X, X') + mean k(Y, Y') - 2 mean k(X, Y)``, the number those
papers print. Default kernel: **Gaussian TV**, ``k = exp(-TV(x, y)^2 / (2 sigma^2))`` with ``TV = 1/2 |x - y|_1``, the
kernel of GRAN's and SPECTRE's evaluation code that DiGress and LGGM report, with their bandwidths: ``sigma = 1`` for
degree and spectrum, ``0.1`` for clustering. ``gaussian_emd`` is GraphRNN's kernel, ``exp(-EMD^2 / (2 sigma^2))``
with the 1-D earth mover's distance ``sum |CDF_x - CDF_y| * w`` (bin width ``w``: 1 for degree, 1/100 for clustering
(GraphRNN's ``distance_scaling = bins``), 2/200 for the spectrum). Neither Gaussian-of-distance kernel is positive
definite in general (O'Bray et al., ICLR 2022, "Evaluation Metrics for Graph Generative Models", Sec. 3.2), so their
MMD can be slightly negative; ``rbf`` (Gaussian of the Euclidean distance) and ``laplacian_tv`` (``exp(-TV /
sigma)``; L1 is conditionally negative definite) are positive definite alternatives.

**Orbit counts** (GraphRNN's 4-node graphlet orbits, computed by the ORCA C++ program) are absent: no maintained pip
package computes them without compiling, and none is installed here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence

import networkx as nx
import numpy as np
from scipy.spatial.distance import cdist

# ------------------------------------------------------------------------------------------------ descriptors
Descriptor = Callable[[nx.Graph], np.ndarray]


def degree_histogram(g: nx.Graph) -> np.ndarray:
    """Node counts per degree ``0..max``."""
    return np.asarray(nx.degree_histogram(g), dtype=np.float64)


def clustering_histogram(g: nx.Graph, bins: int = 100) -> np.ndarray:
    """Histogram of the local clustering coefficients in ``bins`` bins over [0, 1]."""
    c = list(nx.clustering(g).values())
    return np.histogram(c, bins=bins, range=(0.0, 1.0))[0].astype(np.float64)


def spectrum_histogram(g: nx.Graph, bins: int = 200) -> np.ndarray:
    """Histogram of the normalised Laplacian's eigenvalues in ``bins`` bins over [-1e-5, 2] (GRAN's range)."""
    if g.number_of_nodes() == 0:
        return np.zeros(bins)
    lap = nx.normalized_laplacian_matrix(g, nodelist=sorted(g.nodes)).toarray()
    return np.histogram(np.linalg.eigvalsh(lap), bins=bins, range=(-1e-5, 2.0))[0].astype(np.float64)


# name: (descriptor, GRAN/SPECTRE bandwidth, bin width for the EMD)
STATISTICS: dict[str, tuple[Descriptor, float, float]] = {
    "degree": (degree_histogram, 1.0, 1.0),
    "clustering": (clustering_histogram, 0.1, 1.0 / 100),
    "spectre": (spectrum_histogram, 1.0, 2.0 / 200),
}


# ------------------------------------------------------------------------------------------------ kernels
def _tv(x: np.ndarray, y: np.ndarray, width: float) -> np.ndarray:
    return 0.5 * cdist(x, y, "cityblock")


def _emd(x: np.ndarray, y: np.ndarray, width: float) -> np.ndarray:
    return width * cdist(np.cumsum(x, 1), np.cumsum(y, 1), "cityblock")


KERNELS: dict[str, Callable[[np.ndarray, np.ndarray, float, float], np.ndarray]] = {
    "gaussian_tv": lambda x, y, s, w: np.exp(-_tv(x, y, w) ** 2 / (2 * s * s)),
    "gaussian_emd": lambda x, y, s, w: np.exp(-_emd(x, y, w) ** 2 / (2 * s * s)),
    "rbf": lambda x, y, s, w: np.exp(-cdist(x, y, "sqeuclidean") / (2 * s * s)),
    "laplacian_tv": lambda x, y, s, w: np.exp(-_tv(x, y, w) / s),
}
"""Kernels between rows of normalised histograms ``[n, d]``, ``[m, d]`` -> ``[n, m]`` (bandwidth ``s``, bin width
``w``); see the module docstring."""


def _as_graphs(graphs) -> list[nx.Graph]:
    if hasattr(graphs, "edges") and hasattr(graphs, "mask") and hasattr(graphs, "nodes"):
        from ..data.graphs import to_networkx  # a GraphBatch

        return to_networkx(graphs)
    graphs = list(graphs)
    if not all(isinstance(g, nx.Graph) for g in graphs):
        raise TypeError("graphs must be networkx graphs or a GraphBatch")
    return graphs


def _stack(hists: Sequence[np.ndarray], length: int) -> np.ndarray:
    out = np.zeros((len(hists), length))
    for i, h in enumerate(hists):
        out[i, : len(h)] = h
    s = out.sum(1, keepdims=True)
    return np.divide(out, s, out=np.zeros_like(out), where=s > 0)


def mmd2(x: Sequence[np.ndarray], y: Sequence[np.ndarray], kernel: str = "gaussian_tv", sigma: float = 1.0,
         bin_width: float = 1.0) -> float:
    """The biased squared MMD between two sets of histograms (normalised and zero-padded here)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    if not len(x) or not len(y):
        raise ValueError(f"both sets must be non-empty, got {len(x)} and {len(y)}")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    d = max(max(len(h) for h in x), max(len(h) for h in y))
    xs, ys = _stack(x, d), _stack(y, d)
    k = KERNELS[kernel]
    return float(k(xs, xs, sigma, bin_width).mean() + k(ys, ys, sigma, bin_width).mean()
                 - 2 * k(xs, ys, sigma, bin_width).mean())


def graph_mmd(reference, generated, statistics: Iterable[str] = ("degree", "clustering", "spectre"),
              kernel: str = "gaussian_tv", sigma: dict | None = None) -> dict[str, float]:
    """``{statistic: MMD^2}`` between two sets of graphs (networkx lists or GraphBatches); bandwidths GRAN's unless
    ``sigma`` names one per statistic."""
    ref, gen = _as_graphs(reference), _as_graphs(generated)
    out = {}
    for name in statistics:
        if name not in STATISTICS:
            raise ValueError(f"statistics must be among {sorted(STATISTICS)}, got {name!r}")
        fn, s, w = STATISTICS[name]
        s = (sigma or {}).get(name, s)
        out[name] = mmd2([fn(g) for g in ref], [fn(g) for g in gen], kernel, s, w)
    return out


# ------------------------------------------------------------------------------------------------ validity
def is_lobster(g: nx.Graph) -> bool:
    """A tree whose leaves removed twice leave a path (or nothing)."""
    if not (g.number_of_nodes() and nx.is_tree(g)):
        return False
    h = g.copy()
    for _ in range(2):
        h.remove_nodes_from([v for v in list(h) if h.degree[v] <= 1] if h.number_of_nodes() > 2 else [])
    return h.number_of_nodes() == 0 or (nx.is_tree(h) and max(d for _, d in h.degree) <= 2)


def is_grid(g: nx.Graph) -> bool:
    """Isomorphic to an ``r x c`` lattice with ``r c`` its node count."""
    n = g.number_of_nodes()
    return any(nx.is_isomorphic(g, nx.grid_2d_graph(r, n // r)) for r in range(1, int(n**0.5) + 1) if n % r == 0)


def _connected(g: nx.Graph) -> bool:
    return g.number_of_nodes() > 0 and nx.is_connected(g)


VALIDITY: dict[str, Callable[[nx.Graph], bool]] = {
    "tree": lambda g: g.number_of_nodes() > 0 and nx.is_tree(g),
    "lobster": is_lobster,
    "planar": lambda g: _connected(g) and nx.check_planarity(g)[0],
    "grid": is_grid,
    "regular": lambda g: g.number_of_nodes() > 0 and {d for _, d in g.degree} == {3},
    "barabasi_albert": _connected,
    "watts_strogatz": _connected,
    "ego": _connected,
    "community": _connected,
    "sbm": _connected,
    "erdos_renyi": lambda g: g.number_of_nodes() > 0,
}
"""Per domain, the property every graph of it has (SPECTRE's planar validity: connected and planar; trees and
lobsters exactly; grids up to isomorphism; the random models: connected, except G(n, p), which need not be)."""


def is_valid(g: nx.Graph, domain: str) -> bool:
    """Whether ``g`` has the defining property of ``domain`` (:data:`VALIDITY`)."""
    if domain not in VALIDITY:
        raise ValueError(f"domain must be one of {sorted(VALIDITY)}, got {domain!r}")
    return bool(VALIDITY[domain](g))


def validity(graphs, domain: str) -> float:
    """The fraction of ``graphs`` valid for ``domain``."""
    gs = _as_graphs(graphs)
    return float(np.mean([is_valid(g, domain) for g in gs])) if gs else float("nan")


def _isomorphism_classes(graphs: list[nx.Graph]) -> list[int]:
    """A class id per graph, equal iff isomorphic (WL hash to bucket, exact check within a bucket)."""
    reps: dict[str, list[tuple[nx.Graph, int]]] = {}
    ids, count = [], 0
    for g in graphs:
        with warnings.catch_warnings():  # networkx 3.5 warns that its hashes changed: used only as buckets here
            warnings.simplefilter("ignore", UserWarning)
            key = nx.weisfeiler_lehman_graph_hash(g)
        bucket = reps.setdefault(key, [])
        for h, cid in bucket:
            if nx.is_isomorphic(g, h):
                ids.append(cid)
                break
        else:
            bucket.append((g, count))
            ids.append(count)
            count += 1
    return ids


def vun(generated, train, domain: str) -> dict[str, float]:
    """SPECTRE's V.U.N. (Martinkus et al. 2022, Sec. 5): fractions of generated graphs that are ``valid``, ``unique``
    (not isomorphic to an earlier generated one), ``novel`` (not isomorphic to a training graph), and all three."""
    gen, ref = _as_graphs(generated), _as_graphs(train)
    ids = _isomorphism_classes(ref + gen)
    seen_train = set(ids[: len(ref)])
    gen_ids = ids[len(ref):]
    first = {}
    for i, c in enumerate(gen_ids):
        first.setdefault(c, i)
    valid = [is_valid(g, domain) for g in gen]
    unique = [first[c] == i for i, c in enumerate(gen_ids)]
    novel = [c not in seen_train for c in gen_ids]
    n = max(len(gen), 1)
    return {"valid": sum(valid) / n, "unique": sum(unique) / n, "novel": sum(novel) / n,
            "vun": sum(a and b and c for a, b, c in zip(valid, unique, novel, strict=True)) / n}


# ------------------------------------------------------------------------------------------------ conformity
TOLERANCE = {"nodes": 0, "edges": 0, "triangles": 0, "max_degree": 0, "components": 0, "avg_degree": 0.5,
             "clustering": 0.1}
"""Absolute tolerances when a number asked in a prompt counts as met (counts exactly; average degree within 0.5,
clustering within 0.1); booleans (``is_planar``, ``is_tree``, ``connected``) must be equal."""


def conforms(graph: nx.Graph, asked: dict, tolerance: dict | None = None) -> dict[str, bool]:
    """Per asked key, whether ``graph`` meets it: a statistic of :func:`steerdiff.data.graphs.describe` within
    :data:`TOLERANCE` (or ``tolerance``), or ``domain`` (then :func:`is_valid`)."""
    from ..data.graphs import describe

    stats = describe(graph)
    tol = {**TOLERANCE, **(tolerance or {})}
    out = {}
    for key, want in asked.items():
        if key == "domain":
            out[key] = is_valid(graph, want)
        elif key not in stats:
            raise ValueError(f"asked statistic must be 'domain' or one of {sorted(stats)}, got {key!r}")
        elif isinstance(stats[key], bool):
            out[key] = stats[key] == bool(want)
        else:
            out[key] = abs(stats[key] - want) <= tol.get(key, 0) + 1e-9
    return out


def graph_conformity(graphs, asked: dict | Sequence[dict], tolerance: dict | None = None) -> dict[str, float]:
    """The rate at which ``graphs`` meet the ``asked`` statistics (one dict for all, or one per graph): per key, and
    ``"all"`` (every asked key met)."""
    gs = _as_graphs(graphs)
    asks = [asked] * len(gs) if isinstance(asked, dict) else list(asked)
    if len(asks) != len(gs):
        raise ValueError(f"asked: {len(asks)} dicts for {len(gs)} graphs")
    hits = [conforms(g, a, tolerance) for g, a in zip(gs, asks, strict=True)]
    keys = sorted({k for h in hits for k in h})
    out = {k: float(np.mean([h[k] for h in hits if k in h])) for k in keys}
    out["all"] = float(np.mean([all(h.values()) for h in hits])) if hits else float("nan")
    return out
