"""A small permutation-equivariant graph transformer: the denoiser network of DiGress and LGGM.

DiGress (Vignac et al., ICLR 2023, Sec. 4 and App. B.1) denoises a graph with a transformer over node features
``X [B, n, dx]``, edge features ``E [B, n, n, de]`` and global features ``y [B, dy]``. One layer:

* attention scores per channel ``Y_ij = Q_i * K_j / sqrt(d)``, modulated by the edges (FiLM: ``Y (1 + E1_ij) +
  E2_ij``), which are then the new edge features (FiLM'd again by ``y``);
* nodes attend with a softmax over ``j`` of ``Y`` per channel (padded nodes excluded), the result FiLM'd by ``y``;
* ``y`` is updated from pooled nodes and edges (mean, min, max, std: DiGress's ``Xtoy`` / ``Etoy``);
* residual connections, layer norms and feed-forward blocks on all three.

Every operation is per node, per pair or a symmetric pooling over nodes, so permuting the nodes permutes the
outputs (equivariance); the edge output is symmetrised (``(L + L^T) / 2``). Global features hold the time ``t``,
the node count ``n / n_max``, structural features of the noisy graph and the embedding of a text condition.

The structural features are DiGress's "extra features" (Sec. 4, "Improving the input space", and App. B.2),
computed from the noisy graph at every step because message passing alone cannot count cycles (a graph transformer
is no more expressive than the 1-WL test, which tells a 6-cycle from two triangles only through such features):
``structure="full"`` (the default) adds to the degrees and triangles of ``"basic"`` the numbers of 4- and 5-cycles
through each node and of 3- to 6-cycles per graph (:func:`cycle_counts`, closed walks from powers of the adjacency
matrix), and spectral features (:func:`spectral_features`): the connected components (their number, each node's
component size and whether it lies in the largest), the five smallest non-zero Laplacian eigenvalues, and per node
the heat-kernel diagonal ``diag(V exp(-s Lambda) V^T)`` at three scales. DiGress feeds raw eigenvectors instead, whose
signs (and bases, for repeated eigenvalues: cycles, grids, many trees) are arbitrary; the heat-kernel diagonal is
a function of the Laplacian, so the model stays exactly permutation-equivariant. Configs saved before these features
existed say ``"structure": true``, which still means ``"basic"``.

The condition (``docs/methods/lggm.md``, "Text-to-graph") is a prompt as word ids ``[B, T]`` long, ``-1`` padding;
a row of ``-1`` is the null prompt (the library's null convention), so condition dropout and
:class:`steerdiff.discrete.CFG` work unchanged. The text encoder is a bag of words (mean word embedding of the
non-padding ids, through a two-layer MLP; a learned vector for the null prompt) over the vocabulary stored in the
config; :meth:`GraphTransformer.tokenize` turns prompts into ids. LGGM's text-to-graph (Wang et al., ICLR 2025,
Sec. 3.3) conditions on a pre-trained language model; the tiny encoder trained here stands in for it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .embed import json_config
from .io import register_model

UNK = "<unk>"
_WORD = re.compile(r"[a-z]+(?:-[a-z]+)*|\d+(?:\.\d+)?")


def words(prompt: str) -> list[str]:
    """The lower-cased words and numbers of a prompt (``"2.5"`` stays one token)."""
    return _WORD.findall(prompt.lower())


def _pool(x: Tensor, mask: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Mean, min, max and std of ``x`` over ``dims`` where ``mask`` (broadcastable, float) is 1: ``[B, 4 d]``."""
    count = mask.sum(dims).clamp_min(1.0)
    mean = (x * mask).sum(dims) / count
    big = torch.finfo(x.dtype).max / 4
    lo = torch.where(mask > 0, x, torch.full_like(x, big)).amin(dims)
    hi = torch.where(mask > 0, x, torch.full_like(x, -big)).amax(dims)
    var = (((x - mean.view(mean.shape[0], *([1] * len(dims)), -1)) ** 2) * mask).sum(dims) / count
    empty = mask.sum(dims) == 0
    lo, hi = torch.where(empty, 0.0, lo), torch.where(empty, 0.0, hi)
    return torch.cat([mean, lo, hi, (var.clamp_min(0) + 1e-6).sqrt()], -1)  # eps: sqrt has an infinite slope at 0


STRUCTURES = ("none", "basic", "full", "pairs")
HEAT_SCALES = (0.25, 1.0, 4.0)
N_EIGENVALUES = 5
_NODE_FEATURES = {"none": 0, "basic": 2, "full": 4 + 2 + len(HEAT_SCALES)}
_GRAPH_FEATURES = {"none": 0, "basic": 2, "full": 1 + 4 + 1 + N_EIGENVALUES}
_NODE_FEATURES["pairs"], _GRAPH_FEATURES["pairs"] = _NODE_FEATURES["full"], _GRAPH_FEATURES["full"]
_PAIR_FEATURES = {"none": 0, "basic": 0, "full": 0, "pairs": 2}


def _structure_name(structure: bool | str) -> str:
    """The feature set ``structure`` names: ``True`` (configs before version 2) is ``"basic"``, ``False`` ``"none"``."""
    if isinstance(structure, bool):
        return "basic" if structure else "none"
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be a bool or one of {STRUCTURES}, got {structure!r}")
    return structure


def cycle_counts(adj: Tensor) -> tuple[Tensor, Tensor]:
    """The cycles of simple graphs ``adj [B, n, n]`` (symmetric 0/1, zero diagonal, padded rows zero): the numbers of
    3-, 4- and 5-cycles through each node ``[B, n, 3]`` and of 3-, 4-, 5- and 6-cycles per graph ``[B, 4]``.

    DiGress's cycle features (Vignac et al. 2023, App. B.2): closed walks ``diag(A^k)`` minus the closed walks that
    are not cycles, which are counted by lower powers, degrees ``d`` and triangles. Through node ``i``, with
    ``w_k = diag(A^k)``: ``c3 = w3 / 2``; ``c4 = (w4 - d (d - 1) - A d) / 2``; ``c5 = (w5 - 2 d w3 - A w3 + 5 w3 -
    2 (A o A^2) d) / 2`` (``o``: elementwise); per graph ``C_k = sum_i c_k / k``, and ``C6`` by the trace formula of
    Alon, Yuster and Zwick ("Finding and counting given length cycles", Algorithmica 1997) as DiGress uses it.
    Exact in float64; in float32 exact while the walk counts stay below ``2^24`` (degrees up to about 15).
    """
    a = adj
    d = a.sum(-1)
    a2 = a @ a
    a3 = a2 @ a
    a4 = a3 @ a
    a5 = a4 @ a
    a6 = a5 @ a
    w2, w3, w4, w5 = (m.diagonal(dim1=-2, dim2=-1) for m in (a2, a3, a4, a5))
    c3 = w3 / 2
    c4 = (w4 - d * (d - 1) - (a @ d[..., None])[..., 0]) / 2
    c5 = (w5 - 2 * d * w3 - (a @ w3[..., None])[..., 0] + 5 * w3 - 2 * ((a * a2) @ d[..., None])[..., 0]) / 2
    c6 = (a6.diagonal(dim1=-2, dim2=-1).sum(-1) - 3 * (w3 ** 2).sum(-1)
          + 9 * (a * a2 ** 2).sum((-2, -1)) - 6 * (w2 * w4).sum(-1) + 6 * w4.sum(-1) - 4 * w3.sum(-1)
          + 4 * (w2 ** 3).sum(-1) + 3 * a3.sum((-2, -1)) - 12 * (w2 ** 2).sum(-1) + 4 * w2.sum(-1)) / 12
    node = torch.stack([c3, c4, c5], -1)
    graph = torch.stack([c3.sum(-1) / 3, c4.sum(-1) / 4, c5.sum(-1) / 5, c6], -1)
    return node, graph


def spectral_features(adj: Tensor, mask: Tensor, k: int = N_EIGENVALUES, scales: Sequence[float] = HEAT_SCALES
                      ) -> dict[str, Tensor]:
    """Connectivity and Laplacian spectrum of graphs ``adj [B, n, n]`` (0/1, symmetric, zero diagonal) on the nodes
    ``mask [B, n]`` (DiGress's spectral features, Vignac et al. 2023, App. B.2):

    * ``components [B]``: the number of connected components (isolated nodes count), ``component_size [B, n]`` and
      ``in_largest [B, n]`` (1 on a largest component), exactly, from the reachability matrix ``(I + A)^n > 0``
      (``ceil(log2 n)`` boolean squarings) rather than by thresholding eigenvalues;
    * ``eigenvalues [B, k]``: the ``k`` smallest non-zero eigenvalues of the combinatorial Laplacian ``L = D - A``
      (its zero eigenvalues are the components), 0 where the graph has fewer;
    * ``heat [B, n, len(scales)]``: the heat-kernel diagonal ``exp(-s L)_ii``, a spectral summary of the eigenvector
      entries (``sum_j exp(-s lambda_j) v_j(i)^2``) that, unlike the eigenvectors, is unique (no sign or basis choice).

    Padded nodes get ``2 n`` on the Laplacian's diagonal (as in DiGress), above every real eigenvalue (``<= n``);
    their outputs are zero. No host reads: shapes only decide the number of squarings.
    """
    b, n = mask.shape
    m = mask.to(adj.dtype)
    a = adj * m[:, :, None] * m[:, None, :]
    eye = torch.eye(n, dtype=adj.dtype, device=adj.device)
    reach = ((a + eye) > 0).to(adj.dtype)
    for _ in range(max(math.ceil(math.log2(max(n - 1, 1))), 0)):
        reach = ((reach @ reach) > 0).to(adj.dtype)
    reach = reach * m[:, :, None] * m[:, None, :]
    size = reach.sum(-1)
    components = (m / size.clamp_min(1.0)).sum(-1)
    largest = size.amax(-1, keepdim=True)
    in_largest = ((size == largest) & mask).to(adj.dtype)
    lap = torch.diag_embed(a.sum(-1)) - a + torch.diag_embed((1 - m) * 2 * n)
    evals, evecs = torch.linalg.eigh(lap)
    count = m.sum(-1)
    idx = components.round()[:, None] + torch.arange(k, device=adj.device, dtype=adj.dtype)
    present = idx < count[:, None]
    picked = evals.gather(1, idx.clamp_max(n - 1).long())
    eigenvalues = torch.where(present, picked, torch.zeros_like(picked))
    heat = torch.stack([((evecs ** 2) * torch.exp(-s * evals)[:, None, :]).sum(-1) for s in scales], -1)
    return {"components": components, "component_size": size, "in_largest": in_largest,
            "eigenvalues": eigenvalues, "heat": heat * m[..., None]}


def pair_features(adj: Tensor, mask: Tensor) -> Tensor:
    """Per node pair of graphs ``adj [B, n, n]`` (0/1, symmetric, zero diagonal) on nodes ``mask [B, n]``: the
    numbers of paths of length 2 and 3 between ``i`` and ``j`` (``(A^2)_ij``, the common neighbours, and
    ``(A^3)_ij``), as ``log(1 + c) / 4``: ``[B, n, n, 2]``, zero on the diagonal and on padded pairs.

    Not in DiGress, whose extra features are per node and per graph only: the edge a clean graph has between ``i``
    and ``j`` depends on how the two are already connected (a triangulation closes pairs with common neighbours, a
    grid or a tree never does), which message passing over the noisy edges has to infer; the counts are
    permutation-equivariant (they permute with both indices) and come from the adjacency powers the cycle counts
    already need."""
    m = mask.to(adj.dtype)
    pair = m[:, :, None] * m[:, None, :] * (1 - torch.eye(adj.shape[-1], dtype=adj.dtype, device=adj.device))
    a = adj * pair
    a2 = a @ a
    a3 = a2 @ a
    return torch.stack([a2, a3], -1).log1p() / 4 * pair[..., None]


def structural_features(adj: Tensor, mask: Tensor, structure: str, n_max: int) -> tuple[Tensor, Tensor]:
    """The model's structural input features of noisy graphs ``adj [B, n, n]`` on nodes ``mask [B, n]``:
    ``(per node [B, n, f], per graph [B, g])`` for the feature set ``structure`` (``"basic"``: degrees and
    triangles; ``"full"``: also :func:`cycle_counts` and :func:`spectral_features`), zero on padded nodes. Counts
    enter as ``log(1 + c)`` so that dense noisy graphs (early sampling steps) stay in range."""
    m = mask.to(adj.dtype)
    count = m.sum(-1).clamp_min(1.0)
    a = adj * m[:, :, None] * m[:, None, :]
    deg = a.sum(-1)
    if structure == "basic":  # the version-1 features, unchanged so that saved "structure": true models still load
        tri = ((a @ a) * a).sum(-1) / 2
        node = [deg / 10, tri / 10]
        graph = [deg.sum(1) / count / 10, tri.sum(1) / 3 / count]
        return torch.stack(node, -1) * m[..., None], torch.stack(graph, -1)
    cyc_node, cyc_graph = cycle_counts(a)
    cyc_node, cyc_graph = cyc_node.clamp_min(0).log1p(), cyc_graph.clamp_min(0).log1p()
    spec = spectral_features(a, mask)
    node = torch.cat([(deg / 10)[..., None], cyc_node / 4, spec["in_largest"][..., None],
                      (spec["component_size"] / n_max)[..., None], spec["heat"]], -1)
    graph = torch.cat([(deg.sum(1) / count / 10)[:, None], cyc_graph / 4, (spec["components"] / 10)[:, None],
                       spec["eigenvalues"] / 10], -1)
    return node * m[..., None], graph


class GraphLayer(nn.Module):
    """One DiGress transformer layer (Vignac et al. 2023, App. B.1, Fig. 6) on ``(X, E, y)`` with node mask."""

    def __init__(self, dx: int, de: int, dy: int, heads: int, ff: int):
        super().__init__()
        if dx % heads:
            raise ValueError(f"node width {dx} must be divisible by heads = {heads}")
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(dx, dx), nn.Linear(dx, dx), nn.Linear(dx, dx)
        self.e_mul, self.e_add = nn.Linear(de, dx), nn.Linear(de, dx)
        self.y_e_mul, self.y_e_add = nn.Linear(dy, dx), nn.Linear(dy, dx)
        self.y_x_mul, self.y_x_add = nn.Linear(dy, dx), nn.Linear(dy, dx)
        self.x_out, self.e_out = nn.Linear(dx, dx), nn.Linear(dx, de)
        self.y_y, self.x_y, self.e_y = nn.Linear(dy, dy), nn.Linear(4 * dx, dy), nn.Linear(4 * de, dy)
        self.y_out = nn.Sequential(nn.Linear(dy, dy), nn.ReLU(), nn.Linear(dy, dy))
        self.norm_x1, self.norm_e1, self.norm_y1 = nn.LayerNorm(dx), nn.LayerNorm(de), nn.LayerNorm(dy)
        self.norm_x2, self.norm_e2, self.norm_y2 = nn.LayerNorm(dx), nn.LayerNorm(de), nn.LayerNorm(dy)
        self.ff_x = nn.Sequential(nn.Linear(dx, ff), nn.ReLU(), nn.Linear(ff, dx))
        self.ff_e = nn.Sequential(nn.Linear(de, ff), nn.ReLU(), nn.Linear(ff, de))
        self.ff_y = nn.Sequential(nn.Linear(dy, ff), nn.ReLU(), nn.Linear(ff, dy))

    def forward(self, x: Tensor, e: Tensor, y: Tensor, node: Tensor, pair: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, n, dx = x.shape
        h = self.heads
        q, k, v = self.q(x) * node, self.k(x) * node, self.v(x) * node
        scores = q[:, :, None] * k[:, None] / math.sqrt(dx // h)  # [B, n, n, dx], per channel
        scores = scores * (self.e_mul(e) + 1) + self.e_add(e)
        new_e = self.y_e_add(y)[:, None, None] + (self.y_e_mul(y)[:, None, None] + 1) * scores
        new_e = self.e_out(new_e) * pair
        # attention over j per channel, padded nodes (and nothing else) excluded
        logits = scores.masked_fill(node[:, None, :, :] == 0, float("-inf"))
        attn = torch.softmax(logits, dim=2).nan_to_num(0.0)
        new_x = (attn * v[:, None]).sum(2)
        new_x = self.y_x_add(y)[:, None] + (self.y_x_mul(y)[:, None] + 1) * new_x
        new_x = self.x_out(new_x) * node
        new_y = self.y_y(y) + self.x_y(_pool(x, node, (1,))) + self.e_y(_pool(e, pair, (1, 2)))
        new_y = self.y_out(new_y)
        x = self.norm_x1(x + new_x)
        e = self.norm_e1(e + new_e)
        y = self.norm_y1(y + new_y)
        x = self.norm_x2(x + self.ff_x(x)) * node
        e = self.norm_e2(e + self.ff_e(e)) * pair
        y = self.norm_y2(y + self.ff_y(y))
        return x, e, y


@register_model()
class GraphTransformer(nn.Module):
    """``F(nodes [B, n] long, edges [B, n, n] long, mask [B, n] bool, t [B], cond) -> (node logits [B, n, Kx],
    edge logits [B, n, n, Ke])``: the logits of the clean node and edge types (DiGress, Sec. 4, App. B.1).

    Args:
        node_types: ``Kx`` clean node types (1 for plain graphs).
        edge_types: ``Ke`` clean edge types, 0 = no edge (2 for plain graphs).
        n_max: the largest node count (the count feature is ``n / n_max``).
        node_states, edge_states: input vocabulary sizes (default ``Kx``, ``Ke``; ``+1`` for a mask state).
        hidden_x, hidden_e, hidden_y: widths of node, edge and global features.
        layers, heads, ff: transformer depth, heads (channels are grouped for the score scale), feed-forward width.
        structure: the structural features of the noisy graph: ``"full"`` (cycles and spectrum, DiGress's extra
            features), ``"pairs"`` (``"full"`` and, per node pair, :func:`pair_features`), ``"basic"`` (degrees and
            triangles; what ``True`` meant before ``"full"`` existed) or ``"none"`` (``False``); see
            :func:`structural_features`.
        vocab: the words of the text encoder (None: an unconditional model); ``text_dim`` its embedding width.
        process: JSON metadata kept with the weights: the forward process the model was trained under and the
            node-count distribution to sample ``n`` from (``steerdiff.discrete.graph_train``); not used here.
    """

    def __init__(
        self,
        node_types: int = 1,
        edge_types: int = 2,
        n_max: int = 20,
        node_states: int | None = None,
        edge_states: int | None = None,
        hidden_x: int = 32,
        hidden_e: int = 16,
        hidden_y: int = 32,
        layers: int = 3,
        heads: int = 4,
        ff: int = 64,
        structure: bool | str = "full",
        vocab: Sequence[str] | None = None,
        text_dim: int = 32,
        process: dict | None = None,
    ):
        super().__init__()
        for name, val, lo in (("node_types", node_types, 1), ("edge_types", edge_types, 2), ("n_max", n_max, 1),
                              ("layers", layers, 1), ("heads", heads, 1)):
            if isinstance(val, bool) or not isinstance(val, int) or val < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {val!r}")
        structure = _structure_name(structure)
        node_states = node_types if node_states is None else node_states
        edge_states = edge_types if edge_states is None else edge_states
        vocab = None if vocab is None else [UNK, *[w for w in vocab if w != UNK]]
        self.config = json_config(node_types=node_types, edge_types=edge_types, n_max=n_max, node_states=node_states,
                                  edge_states=edge_states, hidden_x=hidden_x, hidden_e=hidden_e, hidden_y=hidden_y,
                                  layers=layers, heads=heads, ff=ff, structure=structure,
                                  vocab=None if vocab is None else vocab[1:], text_dim=text_dim,
                                  process=process)
        self.node_types, self.edge_types, self.n_max = node_types, edge_types, n_max
        self.node_states, self.edge_states = node_states, edge_states
        self.structure = structure
        self.vocab = vocab
        self.word_index = None if vocab is None else {w: i for i, w in enumerate(vocab)}
        n_struct = _NODE_FEATURES[structure]
        y_in = 2 + _GRAPH_FEATURES[structure] + (text_dim if vocab is not None else 0)
        self.in_x = nn.Sequential(nn.Linear(node_states + n_struct, hidden_x), nn.ReLU(), nn.Linear(hidden_x, hidden_x))
        self.in_e = nn.Sequential(nn.Linear(edge_states + _PAIR_FEATURES[structure], hidden_e), nn.ReLU(),
                                  nn.Linear(hidden_e, hidden_e))
        self.in_y = nn.Sequential(nn.Linear(y_in, hidden_y), nn.ReLU(), nn.Linear(hidden_y, hidden_y))
        if vocab is not None:
            self.words = nn.Embedding(len(vocab), text_dim)
            self.null_text = nn.Parameter(torch.zeros(text_dim))
            self.text = nn.Sequential(nn.Linear(text_dim, text_dim), nn.ReLU(), nn.Linear(text_dim, text_dim))
        self.blocks = nn.ModuleList(GraphLayer(hidden_x, hidden_e, hidden_y, heads, ff) for _ in range(layers))
        self.out_x = nn.Sequential(nn.Linear(hidden_x, hidden_x), nn.ReLU(), nn.Linear(hidden_x, node_types))
        self.out_e = nn.Sequential(nn.Linear(hidden_e, hidden_e), nn.ReLU(), nn.Linear(hidden_e, edge_types))

    # -------------------------------------------------------------------------------------------- text
    def tokenize(self, prompts: Sequence[str], length: int | None = None, device=None) -> Tensor:
        """Word ids ``[B, T]`` (long, ``-1`` padding) of ``prompts``; unknown words map to ``<unk>``; an empty
        prompt is the null condition (a row of ``-1``)."""
        if self.vocab is None:
            raise ValueError("this GraphTransformer has no text encoder (vocab=None): it takes no prompt")
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise TypeError("prompts must be a list of strings")
        ids = [[self.word_index.get(w, 0) for w in words(p)] for p in prompts]
        width = max([1, *(len(i) for i in ids)]) if length is None else length
        out = torch.full((len(ids), width), -1, dtype=torch.long)
        for r, row in enumerate(ids):
            row = row[:width]
            out[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out.to(device) if device is not None else out

    def encode_text(self, cond: Tensor, batch: int, dtype: torch.dtype) -> Tensor:
        """``[B, text_dim]``: the bag-of-words embedding of word ids ``cond [B, T]`` (rows of ``-1``: the null)."""
        if cond is None:
            return self.null_text.to(dtype).expand(batch, -1)
        if cond.dtype != torch.long or cond.ndim != 2 or cond.shape[0] != batch:
            raise ValueError(f"cond must be word ids [B={batch}, T] (long, -1 padding), got "
                             f"{tuple(cond.shape)} {cond.dtype}")
        present = (cond >= 0).to(dtype)
        emb = self.words(cond.clamp_min(0)).to(dtype) * present[..., None]
        count = present.sum(1, keepdim=True)
        mean = emb.sum(1) / count.clamp_min(1.0)
        return torch.where(count > 0, self.text(mean), self.null_text.to(dtype).expand(batch, -1))

    # -------------------------------------------------------------------------------------------- forward
    def forward(self, nodes: Tensor, edges: Tensor, mask: Tensor, t: Tensor, cond: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        b, n = nodes.shape
        if edges.shape != (b, n, n) or mask.shape != (b, n) or t.shape != (b,):
            raise ValueError(f"expected nodes [B, n], edges [B, n, n], mask [B, n], t [B]; got {tuple(nodes.shape)}, "
                             f"{tuple(edges.shape)}, {tuple(mask.shape)}, {tuple(t.shape)}")
        dtype = next(self.parameters()).dtype
        node = mask.to(dtype)[..., None]  # [B, n, 1]
        eye = torch.eye(n, dtype=torch.bool, device=nodes.device)
        pair = (mask[:, :, None] & mask[:, None, :] & ~eye)[..., None].to(dtype)  # [B, n, n, 1]
        xo = nn.functional.one_hot(nodes.clamp(0, self.node_states - 1), self.node_states).to(dtype) * node
        eo = nn.functional.one_hot(edges.clamp(0, self.edge_states - 1), self.edge_states).to(dtype) * pair
        count = node.sum((1, 2))
        feats_y = [t.to(dtype)[:, None], (count / self.n_max)[:, None]]
        if self.structure != "none":
            # the noisy graph's adjacency (any edge type != 0), its cycles and spectrum (DiGress App. B.2); computed
            # in float32 at least (eigh, counts), without gradient (a function of the discrete input)
            fdtype = torch.promote_types(dtype, torch.float32)
            with torch.no_grad():
                # an edge is a revealed type 1..Ke-1: the mask state (index Ke of an absorbing model's input,
                # edge_states = Ke + 1) is unknown, not an edge (for other models every input is below Ke)
                a = ((edges > 0) & (edges < self.edge_types) & (pair[..., 0] > 0)).to(fdtype)
                fx, fy = structural_features(a, mask, self.structure, self.n_max)
                fe = pair_features(a, mask) if self.structure == "pairs" else None
            xo = torch.cat([xo, fx.to(dtype)], -1)
            feats_y.append(fy.to(dtype))
            if fe is not None:
                eo = torch.cat([eo, fe.to(dtype)], -1)
        if self.vocab is not None:
            feats_y.append(self.encode_text(cond, b, dtype))
        x = self.in_x(xo) * node
        e = self.in_e(eo) * pair
        e = (e + e.transpose(1, 2)) / 2
        y = self.in_y(torch.cat(feats_y, -1))
        for block in self.blocks:
            x, e, y = block(x, e, y, node, pair)
        lx = self.out_x(x)
        le = self.out_e(e)
        le = (le + le.transpose(1, 2)) / 2
        return lx, le

    def probs(self, nodes: Tensor, edges: Tensor, mask: Tensor, t: Tensor, cond: Tensor | None = None
              ) -> tuple[Tensor, Tensor]:
        """The graph denoiser: ``(p_nodes [B, n, Kx], p_edges [B, n, n, Ke])``, the clean types' probabilities;
        padded nodes are type 0 and pairs with a padded node or on the diagonal are "no edge" with probability 1."""
        lx, le = self(nodes, edges, mask, t, cond)
        n = nodes.shape[1]
        eye = torch.eye(n, dtype=torch.bool, device=nodes.device)
        pair = mask[:, :, None] & mask[:, None, :] & ~eye
        px = torch.where(mask[..., None], lx.float().softmax(-1),
                         nn.functional.one_hot(torch.zeros_like(nodes), self.node_types).float())
        pe = torch.where(pair[..., None], le.float().softmax(-1),
                         nn.functional.one_hot(torch.zeros_like(edges), self.edge_types).float())
        return px, pe


def with_pair_features(model: GraphTransformer) -> GraphTransformer:
    """A ``"pairs"`` copy of a ``"full"`` model that computes the same function: the same weights, and zero weights
    from the new :func:`pair_features` inputs of the edge embedding (function-preserving widening, as Net2Net, Chen
    et al., ICLR 2016, Sec. 2), so training continues from the ``"full"`` model and learns to use the pair counts."""
    if model.structure != "full":
        raise ValueError(f"model must have structure 'full', got {model.structure!r}")
    config = {**model.config, "structure": "pairs"}
    wide = GraphTransformer(**config).to(next(model.parameters()).dtype)
    state = model.state_dict()
    first = state["in_e.0.weight"]
    pad = torch.zeros(first.shape[0], _PAIR_FEATURES["pairs"], dtype=first.dtype, device=first.device)
    state["in_e.0.weight"] = torch.cat([first, pad], 1)
    wide.load_state_dict(state)
    return wide.to(first.device).train(model.training)
