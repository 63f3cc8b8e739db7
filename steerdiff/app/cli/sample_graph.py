"""``steerdiff sample --model <graph model>``: graphs from a graph diffusion model (``docs/methods/lggm.md``, "CLI").

A model directory (or shipped name) whose ``config.json`` names a graph model (:class:`steerdiff.models.
GraphTransformer`) is sampled here instead of the continuous path: ``--n`` graphs per ``--prompt`` (or ``--n``
unconditional graphs without one), graph ``j`` of prompt ``i`` from seed ``seed + i * n + j``, by the ancestral
graph chain (``--steps`` evaluations on the times ``(1 - i / steps) ** --time-power``: by default
:data:`steerdiff.discrete.graph_train.TEXT_TO_GRAPH_TIME_POWER` with a prompt, equal steps without), guided by logit
CFG at ``--scale`` (default 2 with a prompt; 0 = the unconditional model, 1 = the conditional one). The node count
is the one the prompt asks for (``"... 12 nodes ..."``), else drawn from the model's training node counts. Written
to ``--out``: ``graphs.json`` (per graph its prompt, node count, edge list and statistics), ``graphs.png`` (drawn)
and ``metrics.json`` (per prompt, the rate at which the asked statistics are met: node count exact, average degree
within 0.5, the domain's validity) and the NFE per graph.

Steered (``--particles P``, ``--smc-alpha``; ``docs/methods/lggm.md``, "Text-to-graph"): each graph is drawn by FK
steering (:func:`steerdiff.discrete.graph_train.steer_graphs`: SMC with ``P`` particles on the CFG-guided reverse
kernel, tilt temperature ``--smc-alpha``) toward its prompt's own check, the reward
:func:`steerdiff.discrete.lggm.prompt_reward` (the share of the asked statistics met), at ``P`` times the NFE. The
run is seeded by ``--seed`` as a whole (the particles of the graphs with ``n`` nodes use ``seed + 1_000_003 n +
j``), so one graph's result depends on the others asking the same node count.
"""

from __future__ import annotations

from pathlib import Path

import click
import torch

from ...io import write_json
from ._models import ModelKind, classify, model_dir, register_model_kind

# networkx, the graph chain and the graph metrics are imported when a graph model is sampled: the continuous
# `sample` path, which asks graph_model_dir first, does not pay for them

GRAPH_CLASSES = ("GraphTransformer",)
# sample options a graph model takes; every other one given on the command line is refused
GRAPH_OPTIONS = ("model_name", "prompts", "steps", "n", "seed", "scale", "out", "device", "progress", "particles",
                 "smc_alpha", "time_power")
DEFAULT_ALPHA = 0.05  # the text-to-graph benchmark's SMC temperature (docs/methods/lggm.md, "Text-to-graph")


def _detect_graph(_directory: Path, config: dict | None) -> ModelKind | None:
    cls = config.get("class") if isinstance(config, dict) else None
    return ModelKind("graph", cls) if cls in GRAPH_CLASSES else None


register_model_kind(
    "graph", detect=_detect_graph,
    describe=lambda name, _kind: f"{name} is a graph diffusion model: sample graphs with steerdiff sample --model "
                                 f"{name} --prompt '...'")


def graph_model_dir(model_name: str) -> Path | None:
    """The directory of ``model_name`` when it is a saved graph model (the model kind ``graph``), else None (the
    continuous path decides)."""
    directory = model_dir(model_name)
    return directory if directory is not None and classify(directory).kind == "graph" else None


def sample_graph_model(ctx: click.Context, directory: Path, prompts: tuple[str, ...], n: int | None, seed: int,
                       steps: int, scale: float | None, out: str, device: str | None, particles: int | None = None,
                       alpha: float | None = None, time_power: float | None = None) -> None:
    """Sample a graph model (steered with ``particles``) and write ``graphs.json``, ``graphs.png`` and
    ``metrics.json`` to ``out``."""
    from ...data.graphs import describe, to_networkx
    from ...discrete.graph_train import TEXT_TO_GRAPH_TIME_POWER, draw_node_counts, generate_graphs, steer_graphs
    from ...discrete.lggm import asked_of, node_counts_for, prompt_reward
    from ...metrics.graphs import graph_conformity
    from ...models import load
    from ...viz import graph_grid
    from ._common import check_out
    from ._pipelines import reject_options

    others = [p.name for p in ctx.command.params if p.name not in GRAPH_OPTIONS]
    reject_options(ctx, others, f"not used with a graph model ({directory.name}): it takes --prompt, --n, --seed, "
                                "--steps, --scale, --particles, --smc-alpha, --time-power and --out")
    if particles is None:
        reject_options(ctx, ("smc_alpha",), "the SMC temperature applies with --particles only")
    elif not prompts:
        raise click.BadParameter("steering draws graphs toward a --prompt's asked statistics; give one",
                                 param_hint="--particles")
    out_dir = check_out(out)
    n = 4 if n is None else n
    model = load(directory, device=device or "cpu").eval()
    if prompts and model.vocab is None:
        raise click.BadParameter(f"{directory.name} is an unconditional graph model: it takes no --prompt",
                                 param_hint="--prompt")
    if scale is not None and not prompts:
        raise click.BadParameter("--scale guides a --prompt; give one", param_hint="--scale")
    scale = (2.0 if prompts else 1.0) if scale is None else scale
    if time_power is None:  # the grid text-to-graph was measured on; unconditional sampling keeps equal steps
        time_power = TEXT_TO_GRAPH_TIME_POWER if prompts else 1.0
    rows = [p for p in prompts for _ in range(n)] if prompts else [""] * n
    drawn = draw_node_counts(model, len(rows), torch.Generator().manual_seed(seed))
    counts = node_counts_for(rows, drawn)
    if int(counts.max()) > model.n_max or int(counts.min()) < 2:
        raise click.BadParameter(f"node counts must lie in 2..{model.n_max} for this model, the prompts ask "
                                 f"{sorted(set(counts.tolist()))}", param_hint="--prompt")
    if particles is None:
        gens = [seed + i for i in range(len(rows))]
        batch = generate_graphs(model, counts, steps=steps, prompts=rows if prompts else None, guidance_scale=scale,
                                generator=gens, time_power=time_power)
        nfe = steps * (1 if scale in (0.0, 1.0) else 2)  # CFG at w = 0 or 1 runs one branch only
    else:
        alpha = DEFAULT_ALPHA if alpha is None else alpha
        gens = [seed] * len(rows)
        batch, stats = steer_graphs(model, counts, prompt_reward([asked_of(p) for p in rows]), steps=steps,
                                    particles=particles, alpha=alpha, prompts=rows, guidance_scale=scale,
                                    generator=seed, return_stats=True, time_power=time_power)
        nfe = stats["nfe"]
    graphs = to_networkx(batch)
    records = [{"prompt": p, "seed": s, "nodes": g.number_of_nodes(), "edges": [list(e) for e in g.edges()],
                "stats": describe(g)} for p, s, g in zip(rows, gens, graphs, strict=True)]
    metrics = {"model": str(directory), "steps": steps, "time_power": time_power, "scale": scale,
               "nfe_per_graph": nfe, "per_prompt": {}}
    if particles is not None:
        metrics["steering"] = {"method": "smc", "particles": particles, "alpha": alpha,
                               "reward": "prompt_reward (share of the asked statistics met)"}
    for p in dict.fromkeys(rows):
        asked = asked_of(p)
        if asked:
            idx = [i for i, r in enumerate(rows) if r == p]
            metrics["per_prompt"][p] = {"asked": asked, "met": graph_conformity([graphs[i] for i in idx], asked)}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "graphs.json", records)
    write_json(out_dir / "metrics.json", metrics)
    graph_grid(graphs, out_dir / "graphs.png", titles=[f"{r or 'unconditional'} (seed {s})"[:60]
                                                       for r, s in zip(rows, gens, strict=True)])
    how = f"SMC, {particles} particles, alpha {alpha:g}, " if particles is not None else ""
    click.echo(f"wrote {len(graphs)} graphs to {out_dir}/graphs.json and graphs.png ({how}CFG {scale:g}, "
               f"time power {time_power:g}, {nfe:g} NFE per graph)")
    for p, m in metrics["per_prompt"].items():
        click.echo(f"{p!r}: " + ", ".join(f"{k} {v:.2f}" for k, v in m["met"].items()))
