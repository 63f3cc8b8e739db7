"""The shipped ``graphs_lggm`` model: a small LGGM text-to-graph model over every registered graph domain
(``docs/methods/lggm.md``, "The shipped model").

A :class:`~steerdiff.models.GraphTransformer` (``structure="pairs"``: cycle, spectral and pair-path features) with
the bag-of-words text encoder, trained with the DiGress loss
(:func:`steerdiff.discrete.graph_train.train_graphs`) on ``count`` graphs of each domain of
:mod:`steerdiff.data.graphs`, each with a partial description (:func:`steerdiff.discrete.lggm.training_prompts`),
condition dropout 0.1 (so the null prompt is the unconditional, LGGM-style pre-trained model); then, with the
recipe's ``anneal`` stage, more steps from those weights with a fresh AdamW whose learning rate decays to 0 (cosine),
batches drawn with more of the domains named in ``boost`` and, with ``pair_features``, the network widened to take
the pair counts (:func:`steerdiff.models.graph_transformer.with_pair_features`; ``docs/methods/lggm.md``, "The
shipped model").
Resumable: the run directory keeps atomic checkpoints of both stages (the second in ``<run_dir>/anneal``).

    python scripts/make_assets.py --only graphs_lggm
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from ...data.graphs import DOMAINS, GraphBatch
from ...discrete.graph_train import GraphTrainConfig, data_prior, train_graphs
from ...discrete.lggm import domain_data, domain_weights, training_prompts, vocabulary
from ...io import write_json
from ...models import GraphTransformer, load, save
from ...models.graph_transformer import with_pair_features

GRAPHS_LGGM_RECIPE = {
    # "pairs": DiGress's cycle and spectral features and the 2- and 3-path counts per node pair, from scratch
    # (docs/methods/lggm.md, "Structural features"; planar validity 0.05 -> 0.40 at CFG 2 against "full")
    "model": {"hidden_x": 32, "hidden_e": 16, "hidden_y": 32, "layers": 3, "heads": 4, "ff": 64, "text_dim": 32,
              "structure": "pairs"},
    "train": {"steps": 10000, "batch": 32, "lr": 2e-3, "p_uncond": 0.1, "seed": 0, "checkpoint_every": 500},
    # p_part 0.95: each part of a graph's description kept with probability 0.95, so 86% of the graphs carry their
    # whole description (0.8: 51%); text-to-graph with CFG 0.79 -> 0.82 on the selection prompt sets at equal steps,
    # 0.86 with the time-power grid; domain-only prompts lose (docs/methods/lggm.md, "Full descriptions in training and
    # a late-crowded grid")
    "data": {"count": 200, "seed": 0, "n_max": 20, "p_part": 0.95},
    # the second stage: the same data, a fresh optimizer, the learning rate annealed to 0 (docs/methods/lggm.md,
    # "The shipped model"); no domain boost (it did not help in a 1500-step trial); no widening (the network has
    # the pair features from the start)
    "anneal": {"steps": 2500, "batch": 32, "lr": 2e-3, "p_uncond": 0.1, "seed": 1, "lr_schedule": "cosine",
               "checkpoint_every": 500},
}


def build(recipe: dict = GRAPHS_LGGM_RECIPE, with_names: bool = False):
    """The untrained model, its training graphs (all domains) and their prompts' word ids (and, ``with_names``, each
    graph's domain)."""
    d = recipe["data"]
    data, names, stats = domain_data(DOMAINS.names(), d["count"], d["seed"], d["n_max"])
    if (copies := d.get("variants", 1)) > 1:  # each graph `copies` times, each copy with its own drawn description
        data = GraphBatch(data.nodes.repeat(copies, 1), data.edges.repeat(copies, 1, 1), data.mask.repeat(copies, 1))
        names, stats = names * copies, stats * copies
    # "process": the forward process (default DiGress's "marginal"); "absorbing" gives the network a mask state
    # on its edge input (docs/methods/lggm.md, "A confidence corrector and an absorbing-process model")
    kind = recipe.get("process", "marginal")
    extra = {"edge_states": 3} if kind == "absorbing" else {}
    model = GraphTransformer(n_max=d["n_max"], vocab=vocabulary(d["n_max"]), process=data_prior(data, kind=kind),
                             **recipe["model"], **extra)
    prompts = training_prompts(names, stats, seed=d["seed"], p_part=d["p_part"])
    return (model, data, model.tokenize(prompts), names) if with_names else (model, data, model.tokenize(prompts))


def train_graphs_lggm(run_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      recipe: dict = GRAPHS_LGGM_RECIPE, stage1_from: str | os.PathLike | None = None) -> dict:
    """Train (or finish) the recipe in ``run_dir`` and save the model to ``out_dir`` (``config.json``,
    ``model.safetensors``, ``training.json`` with the CPU and wall time and the command). Returns the training
    metadata.

    ``stage1_from``: a saved model to take the first stage's weights from instead of training them (a model this
    recipe's first stage made, e.g. an earlier ``graphs_lggm`` without the anneal stage; its ``training.json``'s CPU
    seconds are counted); the metadata says so."""
    torch.manual_seed(recipe["train"]["seed"])
    t0, c0 = time.perf_counter(), time.process_time()
    model, data, cond, names = build(recipe, with_names=True)
    if stage1_from is None:
        result = train_graphs(model, data, GraphTrainConfig(**recipe["train"]), cond=cond, out_dir=run_dir,
                              log_every=250)
        cpu, losses = result["cpu_seconds"], result["losses"]
    else:
        source = load(stage1_from)
        if source.config != model.config:
            raise ValueError(f"stage1_from={stage1_from} is not a model of this recipe's first stage (config differs)")
        model.load_state_dict(source.state_dict())
        cpu, losses = float(json.loads((Path(stage1_from) / "training.json").read_text())["training_cpu_seconds"]), []
    stages = {"stage1_cpu_seconds": round(cpu, 1)}
    if (anneal := recipe.get("anneal")) is not None:
        cfg = {k: v for k, v in anneal.items() if k not in ("boost", "pair_features")}
        if anneal.get("pair_features"):  # widened to take the pair counts, starting as the same function
            model = with_pair_features(model)
        result = train_graphs(model, data, GraphTrainConfig(**cfg), cond=cond, out_dir=Path(run_dir) / "anneal",
                              log_every=250, weights=domain_weights(names, anneal.get("boost")))
        stages["anneal_cpu_seconds"] = round(result["cpu_seconds"], 1)
        cpu, losses = cpu + result["cpu_seconds"], result["losses"]
    out = Path(out_dir)
    save(model, out)
    meta = {"recipe": recipe, "domains": DOMAINS.names(), "graphs": len(data) // recipe["data"].get("variants", 1),
            "training_rows": len(data),
            "parameters": sum(p.numel() for p in model.parameters()),
            "training_cpu_seconds": round(cpu, 1), **stages,
            "cpu_seconds_this_run": round(time.process_time() - c0, 1),
            "wall_seconds_this_run": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(),
            "final_loss_mean_last_250": sum(losses[-250:]) / max(len(losses[-250:]), 1),
            "command": "python scripts/make_assets.py --only graphs_lggm --threads 2"}
    if stage1_from is not None:
        meta["stage1_from"] = str(stage1_from)
    write_json(out / "training.json", meta)
    return meta
