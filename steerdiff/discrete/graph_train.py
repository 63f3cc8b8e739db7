"""Training and sampling a graph denoiser the DiGress way (``docs/methods/lggm.md``, "Training").

DiGress (Vignac et al., ICLR 2023, Sec. 4.1-4.2 and App. B): the network predicts the clean graph from a noisy one
made by the marginal transitions (a corrupted edge is drawn from the training data's edge-type marginal), and is
trained with the cross-entropy on the clean node and edge types,

    l = CE(nodes) + lambda CE(edges),        lambda = 5 (their edge weight),

at a time ``t ~ U(0, 1)`` per graph; with a condition, rows are dropped to the null (``-1``) with probability
``p_uncond`` so that one network is both the conditional and the unconditional model (classifier-free guidance, Ho &
Salimans 2022). Sampling draws the node count ``n`` first from the training data's node-count distribution (as
DiGress) or takes it from the caller (a prompt), then runs the flattened graph chain of
:mod:`steerdiff.discrete.graph`.

The forward process a model was trained under (its kind, schedule and marginal) and its node-count distribution
travel in the model's config (``GraphTransformer(process=...)``), so a saved model samples without its data.
Training runs are resumable: with ``out_dir`` an atomic safetensors checkpoint (weights, optimizer, generator state,
losses) is written every ``checkpoint_every`` steps and at the end, and a run restarted on the same directory
continues from the newest one and ends where an uninterrupted run would (same batches, same noise).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..core.noise import GeneratorLike
from ..data.graphs import GraphBatch
from ..models.graph_transformer import GraphTransformer
from ..train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ..train.ema import EMA
from ..train.trainer import drop_condition
from .graph import GraphProcess, graph_process, sample_graphs, smc_graphs
from .guidance import CFG

EDGE_WEIGHT = 5.0  # DiGress's lambda (Vignac et al. 2023, Sec. 4.2 and their configs)
TEXT_TO_GRAPH_TIME_POWER = 3.5
"""The ancestral grid's ``time_power`` the CLI and the text-to-graph benchmark sample prompts with (steps crowded
near the data; chosen on prompt sets 7000 and 7001 only: ``docs/methods/lggm.md``, "Text-to-graph")."""


# ------------------------------------------------------------------------------------------------ process metadata
def data_prior(batch: GraphBatch, kind: str = "marginal", schedule: str = "cosine") -> dict:
    """The JSON metadata of a model trained on ``batch``: the process ``kind`` and ``schedule``, the edge-type
    marginal over real node pairs (DiGress's ``m``, floored at 1e-3 so every type stays reachable), the slots
    ``n`` and the node-count distribution ``{count: frequency}``."""
    e = batch.edges
    pair = batch.mask[:, :, None] & batch.mask[:, None, :] & ~torch.eye(batch.n, dtype=torch.bool)
    ke = max(2, int(e.max()) + 1)
    freq = torch.bincount(e[pair], minlength=ke).double()
    freq = (freq / freq.sum()).clamp_min(1e-3)
    counts = torch.bincount(batch.num_nodes, minlength=batch.n + 1)
    return {"kind": kind, "schedule": schedule, "n": batch.n, "edge_marginal": (freq / freq.sum()).tolist(),
            "node_counts": {str(k): int(c) for k, c in enumerate(counts.tolist()) if c > 0}}


def group_edge_marginals(batch: GraphBatch, groups: Sequence[str]) -> Tensor:
    """``[N, Ke]``: for each graph of ``batch``, the edge marginal (:func:`data_prior`'s, floored the same way) of
    the graphs of its group (``groups [N]``, e.g. each graph's domain), for :func:`train_graphs`' ``edge_marginals``."""
    if len(groups) != len(batch):
        raise ValueError(f"groups must name one group per graph ({len(batch)}), got {len(groups)}")
    ke = max(2, int(batch.edges.max()) + 1)
    out = torch.empty(len(batch), ke, dtype=torch.float64)
    for g in dict.fromkeys(groups):
        idx = torch.tensor([i for i, name in enumerate(groups) if name == g])
        m = torch.tensor(data_prior(batch[idx])["edge_marginal"], dtype=torch.float64)
        out[idx] = torch.nn.functional.pad(m, (0, ke - len(m)), value=0.0)
    return out


def process_of(model: GraphTransformer, n: int | None = None, prior: dict | None = None) -> GraphProcess:
    """The :class:`GraphProcess` a model was trained under (from ``model.config["process"]``), with ``n`` slots; with
    ``prior`` (metadata of :func:`data_prior`) that process instead: the same network sampled under another data
    set's edge marginal, as LGGM samples its pre-trained network zero-shot on a held-out domain."""
    meta = prior if prior is not None else model.config.get("process")
    if not meta:
        raise ValueError("the model carries no process metadata (GraphTransformer(process=data_prior(...)))")
    return graph_process(meta["kind"], n or meta["n"], edge_classes=model.edge_types, schedule=meta["schedule"],
                         edge_marginal=meta["edge_marginal"] if meta["kind"] == "marginal" else None)


def draw_node_counts(model: GraphTransformer, count: int, generator: torch.Generator | None = None) -> Tensor:
    """``[count]`` node counts drawn from the model's training node-count distribution (DiGress, Sec. 4)."""
    law = model.config["process"]["node_counts"]
    values = torch.tensor([int(k) for k in law])
    probs = torch.tensor([float(v) for v in law.values()])
    return values[torch.multinomial(probs, count, replacement=True, generator=generator)]


# ------------------------------------------------------------------------------------------------ loss and training
def digress_loss(model: GraphTransformer, process: GraphProcess, batch: GraphBatch, t: Tensor, cond: Tensor | None,
                 generator: torch.Generator | None = None, edge_weight: float = EDGE_WEIGHT,
                 edge_marginal: Tensor | None = None) -> Tensor:
    """``CE(nodes) + lambda CE(edges)`` of the model on ``batch`` noised at times ``t [B]`` (DiGress Sec. 4.2): means
    over real nodes and over real unordered pairs; the node term only with more than one node type.

    Under the absorbing process the means run over the *masked* nodes and pairs only (MaskGIT's loss, Chang et al.
    2022, Sec. 3.1; MDLM's cross-entropy on masked tokens, Sahoo et al. 2024, Sec. 3.3, without its time weight):
    a revealed entry is always the clean one, so it carries no signal; a batch with nothing masked adds 0.

    ``edge_marginal [B, Ke]``: each graph noised toward its own edge marginal (:meth:`GraphProcess.corrupt`)."""
    noisy = process.corrupt(batch, t, generator, edge_marginal)
    lx, le = model(noisy.nodes, noisy.edges, noisy.mask, t, cond)
    n = batch.n
    r, c = torch.triu_indices(n, n, 1)
    pair = batch.mask[:, r] & batch.mask[:, c]
    node = batch.mask
    if process.absorbing:
        pair = pair & (noisy.edges[:, r, c] == process.ke)
        node = node & (noisy.nodes == process.kx)
    loss = _mean_ce(le[:, r, c][pair], batch.edges[:, r, c][pair]) * edge_weight
    if model.node_types > 1:
        loss = loss + _mean_ce(lx[node], batch.nodes[node])
    return loss


def _mean_ce(logits: Tensor, target: Tensor) -> Tensor:
    """The mean cross-entropy over rows, 0 (with a gradient path) when there are none."""
    if target.numel() == 0:
        return logits.sum() * 0.0
    return torch.nn.functional.cross_entropy(logits.float(), target)


@dataclass
class GraphTrainConfig:
    """Settings of :func:`train_graphs` (defaults: a few CPU-minutes for a ~50k-parameter model)."""

    steps: int = 1000
    batch: int = 32
    lr: float = 2e-3           # AdamW; DiGress uses 2e-4 for much longer runs
    weight_decay: float = 1e-12  # DiGress's AdamW setting
    edge_weight: float = EDGE_WEIGHT
    p_uncond: float = 0.1      # condition dropout (with a condition)
    seed: int = 0
    checkpoint_every: int = 0  # 0: only at the end (with out_dir)
    grad_clip: float = 1.0
    lr_schedule: str = "constant"  # or "cosine": lr * (1 + cos(pi * step / steps)) / 2, annealed to 0 at the end
    ema_decay: float = 0.0     # > 0: train_graphs leaves the EMA of the weights in the model (steerdiff.train.ema.EMA)


def train_graphs(model: GraphTransformer, data: GraphBatch, config: GraphTrainConfig | None = None, *,
                 cond: Tensor | None = None, out_dir: str | Path | None = None, log_every: int = 0,
                 weights: Tensor | None = None, edge_marginals: Tensor | None = None) -> dict:
    """Train ``model`` in place on the graphs ``data`` (``cond [N, T]`` word ids per graph, optional) with the DiGress
    loss under the process in ``model.config["process"]``. Returns ``{"losses", "cpu_seconds", "steps"}`` (losses
    per step and training CPU seconds, this and earlier runs on ``out_dir`` together).

    Batches draw graphs uniformly with replacement, or with probabilities proportional to ``weights [N]`` (e.g. more
    of the domains a model finds hard; :func:`steerdiff.discrete.lggm.domain_weights`).

    ``edge_marginals [N, Ke]`` noises each graph toward its own edge marginal instead of the model's process's one
    (:func:`group_edge_marginals`: each domain of a corpus toward its own density); the model's process metadata,
    which sampling uses, is unchanged.

    ``config.ema_decay > 0`` keeps an exponential moving average of the weights (:class:`steerdiff.train.ema.EMA`,
    its warm-up ramp on, so the average starts from the weights the run starts from) and leaves it in ``model`` at the
    end; the checkpoints keep the raw weights and the average apart, so a resumed run continues both.

    Resumable: with ``out_dir``, an existing checkpoint there is loaded (weights, optimizer, generator, average) and
    training continues to ``config.steps``.
    """
    cfg = config or GraphTrainConfig()
    if cond is not None and (cond.ndim != 2 or cond.shape[0] != len(data)):
        raise ValueError(f"cond must be word ids [N={len(data)}, T], got {tuple(cond.shape)}")
    if weights is not None:
        weights = torch.as_tensor(weights, dtype=torch.float64)
        if weights.shape != (len(data),) or not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()) \
                or not bool(weights.sum() > 0):
            raise ValueError(f"weights must be [N={len(data)}] finite, >= 0 and not all 0, got {tuple(weights.shape)}")
    if edge_marginals is not None:
        edge_marginals = torch.as_tensor(edge_marginals, dtype=torch.float64)
        if edge_marginals.shape != (len(data), model.edge_types) or not bool(torch.isfinite(edge_marginals).all()) \
                or bool((edge_marginals < 0).any()) or not bool((edge_marginals.sum(-1) > 0).all()):
            raise ValueError(f"edge_marginals must be [N={len(data)}, Ke={model.edge_types}], finite, >= 0 with "
                             f"positive rows, got {tuple(edge_marginals.shape)}")
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {cfg.lr_schedule!r}")
    if not 0.0 <= cfg.ema_decay < 1.0:
        raise ValueError(f"ema_decay must lie in [0, 1) (0: no average), got {cfg.ema_decay}")
    process = process_of(model, data.n)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    ema = EMA(model, cfg.ema_decay) if cfg.ema_decay > 0 else None
    losses: list[float] = []
    start, cpu_before = 0, 0.0
    if out_dir is not None and (ck := latest_checkpoint(out_dir)) is not None:
        saved = load_checkpoint(ck)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        gen.set_state(saved["rng"]["generator"])
        if (ema is None) != ("ema_updates" not in saved["state"]):  # raw weights and an average are not the same model
            raise ValueError(f"the checkpoint in {ck} was trained {'with' if ema is None else 'without'} an EMA of "
                             f"the weights, and config.ema_decay is {cfg.ema_decay}; use a fresh out_dir")
        if ema is not None:
            ema.load_state_dict(saved["ema"], saved["state"]["ema_updates"])
        losses = list(saved["state"]["losses"])
        start = int(saved["state"]["step"])
        cpu_before = float(saved["state"].get("cpu_seconds", 0.0))
    model.train()
    t0 = time.process_time()

    def checkpoint(step: int) -> None:
        save_checkpoint(out_dir, step, model, {} if ema is None else ema.state_dict(), opt,
                        {"generator": gen.get_state()},
                        {"losses": losses, "config": asdict(cfg),
                         "cpu_seconds": cpu_before + time.process_time() - t0,
                         **({} if ema is None else {"ema_updates": ema.num_updates})})

    for step in range(start, cfg.steps):
        if cfg.lr_schedule == "cosine":  # a function of the step, so a resumed run follows the same schedule
            for group in opt.param_groups:
                group["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        if weights is None:
            idx = torch.randint(len(data), (cfg.batch,), generator=gen)
        else:
            idx = torch.multinomial(weights, cfg.batch, replacement=True, generator=gen)
        batch = data[idx]
        t = torch.rand(cfg.batch, generator=gen)
        c = None if cond is None else drop_condition(cond[idx], p_uncond=cfg.p_uncond, generator=gen)
        loss = digress_loss(model, process, batch, t, c, gen, cfg.edge_weight,
                            None if edge_marginals is None else edge_marginals[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if ema is not None:
            ema.update(model)
        losses.append(float(loss.detach()))
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}: loss {sum(losses[-log_every:]) / log_every:.4f}", flush=True)
        if out_dir is not None and cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
            checkpoint(step + 1)
    if out_dir is not None and start < cfg.steps:
        checkpoint(cfg.steps)
    if ema is not None:
        ema.copy_to(model)
    model.eval()
    return {"losses": losses, "cpu_seconds": cpu_before + time.process_time() - t0, "steps": cfg.steps}


# ------------------------------------------------------------------------------------------------ sampling
def generate_graphs(model: GraphTransformer, num_nodes: Sequence[int] | Tensor, *, steps: int = 50,
                    prompts: Sequence[str] | None = None, guidance_scale: float = 1.0,
                    generator: GeneratorLike = 0, method: str = "ancestral", prior: dict | None = None,
                    time_power: float = 1.0) -> GraphBatch:
    """Graphs with ``num_nodes [B]`` nodes from a trained model by the flattened graph chain
    (:func:`steerdiff.discrete.graph.sample_graphs`, ancestral by default, ``steps`` evaluations); with ``prompts``
    conditioned on them, guided by logit CFG at ``guidance_scale`` (``w = 1``: the conditional model, ``0``: the
    unconditional one; ``docs/methods/discrete.md``, "Guidance"). ``prior`` (:func:`data_prior` metadata) replaces
    the model's own process: its edge marginal sets the starting noise and the reverse kernel (LGGM's zero-shot
    protocol, ``docs/methods/lggm.md``, "The LGGM benchmark"). ``time_power``: the ancestral grid's times
    ``(1 - i / steps) ** time_power`` (:func:`steerdiff.discrete.sampling.ancestral_grid`; text-to-graph samples the
    shipped model at :data:`TEXT_TO_GRAPH_TIME_POWER`, ``docs/methods/lggm.md``, "Text-to-graph")."""
    counts = torch.as_tensor(num_nodes, dtype=torch.long).flatten()
    n = max(int(counts.max()), 2)
    process = process_of(model, n, prior)
    cond = guidance = None
    if prompts is not None:
        if len(prompts) != len(counts):
            raise ValueError(f"prompts must have one entry per graph ({len(counts)}), got {len(prompts)}")
        cond = model.tokenize(list(prompts))
        guidance = CFG(guidance_scale)
    with torch.no_grad():
        return sample_graphs(model.probs, process, steps, num_nodes=counts, cond=cond, guidance=guidance,
                             generator=generator, method=method, time_power=time_power)


GraphReward = Callable[[GraphBatch, Tensor], Tensor]
"""``r(graphs, index) -> [N]``: a reward per graph, ``index [N]`` the output (prompt) each graph is a candidate for."""


def steer_graphs(model: GraphTransformer, num_nodes: Sequence[int] | Tensor, reward: GraphReward, *,
                 steps: int = 50, particles: int = 8, alpha: float = 0.1, prompts: Sequence[str] | None = None,
                 guidance_scale: float = 1.0, generator: int = 0, method: str = "ancestral",
                 prior: dict | None = None, potential: str = "difference", resampler: str = "ssp",
                 ess_threshold: float = 0.5, return_stats: bool = False, time_power: float = 1.0):
    """Graphs with ``num_nodes [B]`` nodes steered toward ``p(G | prompt_i) exp(r(G, i) / alpha)`` by FK steering
    (SMC; Singhal et al. 2025, Sec. 3; :func:`steerdiff.discrete.smc`, ``docs/methods/discrete.md``, "Steering"):
    per output ``i``, ``particles`` particles follow the (CFG-guided, ``guidance_scale``) reverse kernel of
    :func:`generate_graphs` and are reweighted and resampled on the reward of their denoised estimate at every step;
    the output is one particle drawn from the group's final weights (FK steering's one sample per group). The
    steering row of text-to-graph (``docs/methods/lggm.md``, "Text-to-graph"): with a reward such as
    :func:`steerdiff.discrete.lggm.prompt_reward` it samples the prompt-conditional law tilted toward graphs that
    meet the prompt, at ``particles`` times the NFE of :func:`generate_graphs`.

    Outputs are grouped by node count (every slot of a group real, one SMC call per count); the particles of the
    group for node count ``n`` use the seeds ``generator + 1_000_003 n + j`` (``j`` the particle row in that call).
    ``time_power``: the grid of :func:`generate_graphs`.
    ``reward`` sees ``graphs`` with ``n`` slots and ``index`` the output each particle belongs to. Returns a padded
    :class:`GraphBatch` (and ``{"nfe": ...}``, denoiser evaluations per output, with ``return_stats``).
    """
    counts = torch.as_tensor(num_nodes, dtype=torch.long).flatten()
    if counts.numel() == 0 or bool((counts < 2).any()):
        raise ValueError(f"num_nodes must hold node counts >= 2, got {counts.tolist()}")
    if isinstance(generator, bool) or not isinstance(generator, int):
        raise TypeError(f"generator must be an int seed, got {type(generator).__name__}")
    b, n_max = len(counts), int(counts.max())
    cond = guidance = None
    if prompts is not None:
        if len(prompts) != b:
            raise ValueError(f"prompts must have one entry per graph ({b}), got {len(prompts)}")
        cond = model.tokenize(list(prompts))
        guidance = CFG(guidance_scale)
    nodes = torch.zeros(b, n_max, dtype=torch.long)
    edges = torch.zeros(b, n_max, n_max, dtype=torch.long)
    mask = torch.zeros(b, n_max, dtype=torch.bool)
    nfe = 0.0
    for n in sorted(set(counts.tolist())):
        idx = (counts == n).nonzero().flatten()
        process = process_of(model, n, prior)
        owner = idx.repeat_interleave(particles)

        def group_reward(batch: GraphBatch, owner: Tensor = owner) -> Tensor:
            return reward(batch, owner)

        with torch.no_grad():
            res = smc_graphs(model.probs, process, group_reward, steps=steps, alpha=alpha, num_samples=len(idx),
                             particles=particles, method=method, cond=None if cond is None else cond[idx],
                             guidance=guidance, generator=generator + 1_000_003 * n, potential=potential,
                             resampler=resampler, ess_threshold=ess_threshold, time_power=time_power)
        pick_gen = torch.Generator().manual_seed(generator + 1_000_003 * n + 2**41)
        pick = torch.multinomial(res.log_weights.exp().float(), 1, generator=pick_gen).flatten()
        chosen = process.unflatten(res.samples[torch.arange(len(idx)) * particles + pick])
        nodes[idx, :n], edges[idx, :n, :n], mask[idx, :n] = chosen.nodes, chosen.edges, chosen.mask
        nfe = res.nfe
    out = GraphBatch(nodes, edges, mask)
    return (out, {"nfe": nfe}) if return_stats else out
