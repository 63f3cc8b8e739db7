"""LGGM: one graph generative model pre-trained across graph domains, and text-to-graph (``docs/methods/lggm.md``).

Wang et al., "Large Graph Generative Models" (ICLR 2025): a DiGress model (:mod:`steerdiff.discrete.graph_train`)
pre-trained on graphs from many domains at once (Sec. 3.1-3.2) generates graphs of a domain it never saw (zero-shot)
and, fine-tuned on that domain, beats a model trained on it alone (Sec. 4.2, Tables 2-3); conditioned on a text
description of the domain and statistics it generates graphs that have them (text-to-graph, Sec. 3.3).

Here: the domains are the networkx families of :mod:`steerdiff.data.graphs`; :func:`domain_data` builds the mixed
pre-training set (equal counts per domain, one padded batch); :func:`prompt` writes the descriptions, e.g.
``"a planar graph with 12 nodes and average degree 4.5"`` (domain, node count, average degree rounded to 0.5; each
part left out at random in training so that partial prompts work), and :func:`vocabulary` the words the tiny
bag-of-words text encoder of :class:`steerdiff.models.GraphTransformer` knows (LGGM uses a pre-trained language
model; nothing is downloaded here). :func:`asked_node_count` reads the node count from a prompt: the sampler takes
``n`` from it, as DiGress takes ``n`` from the data's distribution.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..data.graphs import DOMAINS, GraphBatch, describe, from_networkx, generate, to_networkx
from ..metrics.graphs import TOLERANCE, is_valid
from ..models.graph_transformer import words as words_of

_NODES = re.compile(r"(\d+)\s+nodes")
_DEGREE = re.compile(r"degree\s+(\d+(?:\.\d+)?)")
DEGREE_STEP = 0.5  # the resolution of an asked average degree (docs/methods/lggm.md, "Text-to-graph")


def domain_word(name: str) -> str:
    """A domain's name as one prompt word (``erdos_renyi`` -> ``erdos-renyi``)."""
    return name.replace("_", "-")


def round_degree(d: float) -> float:
    """The average degree rounded to :data:`DEGREE_STEP`."""
    return round(d / DEGREE_STEP) * DEGREE_STEP


def prompt(domain: str | None = None, nodes: int | None = None, avg_degree: float | None = None) -> str:
    """The description of a graph, each part optional: ``"a <domain> graph with <n> nodes and average degree <d>"``
    (``d`` rounded to :data:`DEGREE_STEP`, one decimal); with no part the empty (null) prompt."""
    if domain is None and nodes is None and avg_degree is None:
        return ""
    text = f"a {domain_word(domain)} graph" if domain is not None else "a graph"
    extra = []
    if nodes is not None:
        extra.append(f"{int(nodes)} nodes")
    if avg_degree is not None:
        extra.append(f"average degree {round_degree(avg_degree):.1f}")
    return text + (" with " + " and ".join(extra) if extra else "")


def vocabulary(n_max: int, max_degree: float = 10.0, extra_domains: Sequence[str] = ()) -> list[str]:
    """The words of every :func:`prompt` over the registered domains (and ``extra_domains``, e.g. corpus families of
    :data:`steerdiff.data.graphs.CORPUS_FAMILIES`, after them), node counts ``2..n_max`` and average degrees
    ``0..max_degree`` in steps of :data:`DEGREE_STEP`."""
    words = ["a", "graph", "with", "nodes", "and", "average", "degree"]
    words += [domain_word(d) for d in DOMAINS.names()]
    words += [domain_word(d) for d in extra_domains if d not in DOMAINS]
    words += [str(k) for k in range(2, n_max + 1)]
    words += [f"{k * DEGREE_STEP:.1f}" for k in range(int(max_degree / DEGREE_STEP) + 1)]
    return words


def asked_node_count(text: str) -> int | None:
    """The node count a prompt asks for (``"... 12 nodes ..."``), or None."""
    found = _NODES.search(text.lower())
    return int(found.group(1)) if found else None


def asked_degree(text: str) -> float | None:
    """The average degree a prompt asks for (``"... average degree 2.5"``), or None."""
    found = _DEGREE.search(text.lower())
    return float(found.group(1)) if found else None


def asked_of(text: str) -> dict:
    """The statistics a prompt asks for (``domain``, ``nodes``, ``avg_degree``), as
    :func:`steerdiff.metrics.graphs.graph_conformity` takes them."""
    asked = {}
    found = words_of(text)
    for d in DOMAINS.names():
        if domain_word(d) in found:
            asked["domain"] = d
    if (n := asked_node_count(text)) is not None:
        asked["nodes"] = n
    if (deg := asked_degree(text)) is not None:
        asked["avg_degree"] = deg
    return asked


def domain_data(domains: Sequence[str], count: int, seed: int = 0, n_max: int = 20,
                varied: bool = False) -> tuple[GraphBatch, list[str], list[dict]]:
    """``count`` graphs of each domain or corpus family (:func:`steerdiff.data.graphs.generate`, seed ``seed``;
    ``varied``: each graph's family parameters drawn over a range) in one batch padded to ``n_max``, with each
    graph's domain and :func:`steerdiff.data.graphs.describe` statistics."""
    graphs, names = [], []
    for d in domains:
        gs = generate(d, count, seed, varied=varied)
        graphs += gs
        names += [d] * len(gs)
    return from_networkx(graphs, n_max), names, [describe(g) for g in graphs]


def domain_weights(names: Sequence[str], boost: dict[str, float] | None = None) -> Tensor:
    """``[N]`` sampling weights of training graphs of domains ``names``: ``boost[d]`` for a graph of domain ``d``, 1
    for a domain not named (for :func:`steerdiff.discrete.graph_train.train_graphs`' ``weights``: more batches of the
    domains a model finds hard)."""
    boost = dict(boost or {})
    unknown = sorted(set(boost) - set(DOMAINS.names()))
    if unknown:
        raise ValueError(f"boost names unknown domains {unknown}; the domains are {DOMAINS.names()}")
    bad = {d: w for d, w in boost.items() if not (isinstance(w, (int, float)) and np.isfinite(w) and w > 0)}
    if bad:
        raise ValueError(f"boost weights must be finite and > 0, got {bad}")
    return torch.tensor([float(boost.get(n, 1.0)) for n in names], dtype=torch.float64)


def training_prompts(names: Sequence[str], stats: Sequence[dict], seed: int = 0, p_part: float = 0.8) -> list[str]:
    """One prompt per training graph: each part (domain, node count, average degree) kept with probability ``p_part``
    (so the encoder learns partial descriptions; LGGM's prompts also vary, Sec. 3.3)."""
    if not 0.0 <= p_part <= 1.0:
        raise ValueError(f"p_part must lie in [0, 1], got {p_part!r}")
    rng = np.random.default_rng(seed)
    out = []
    for name, st in zip(names, stats, strict=True):
        keep = rng.random(3) < p_part
        out.append(prompt(name if keep[0] else None, st["nodes"] if keep[1] else None,
                          st["avg_degree"] if keep[2] else None))
    return out


def node_counts_for(prompts: Sequence[str], fallback: Tensor) -> Tensor:
    """``[B]`` node counts: the one each prompt asks for, else the entry of ``fallback [B]`` (drawn from the model's
    node-count distribution)."""
    asked = [asked_node_count(p) for p in prompts]
    return torch.tensor([a if a is not None else int(f) for a, f in zip(asked, fallback.tolist(), strict=True)])


def meets(graph, asked: dict) -> float:
    """The fraction of the statistics ``asked`` (``nodes``, ``avg_degree``, ``domain``, as :func:`asked_of` reads
    them) that a networkx ``graph`` meets, by the tolerances of :func:`steerdiff.metrics.graphs.conforms` (node count
    exactly, average degree within 0.5, the domain by :func:`steerdiff.metrics.graphs.is_valid`); 1 when nothing is
    asked. Computes only what is asked (a reward evaluated on every particle at every step)."""
    hits = []
    n = graph.number_of_nodes()
    if "nodes" in asked:
        hits.append(n == asked["nodes"])
    if "avg_degree" in asked:
        deg = 2 * graph.number_of_edges() / n if n else 0.0
        hits.append(abs(deg - asked["avg_degree"]) <= TOLERANCE["avg_degree"] + 1e-9)
    if "domain" in asked:
        hits.append(is_valid(graph, asked["domain"]))
    return float(np.mean(hits)) if hits else 1.0


def prompt_reward(asks: Sequence[dict]):
    """The reward ``r(graphs, index) -> [N]`` of :func:`steerdiff.discrete.graph_train.steer_graphs` for prompts
    asking ``asks[i]`` (:func:`asked_of`): graph ``j``'s :func:`meets` for ``asks[index[j]]`` (in [0, 1]). A
    host-side check (networkx: planarity, tree-ness, isomorphism to a grid), so it reads its graphs to the host."""
    asks = list(asks)

    def reward(graphs: GraphBatch, index: Tensor) -> Tensor:
        gs = to_networkx(graphs)
        return torch.tensor([meets(g, asks[i]) for g, i in zip(gs, index.tolist(), strict=True)],
                            dtype=torch.float32)

    return reward
