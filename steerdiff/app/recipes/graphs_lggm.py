"""The shipped ``graphs_lggm`` model: a small LGGM text-to-graph model over every registered graph domain
(``docs/methods/lggm.md``, "The shipped model").

A :class:`~steerdiff.models.GraphTransformer` with the bag-of-words text encoder, trained with the DiGress loss
(:func:`steerdiff.discrete.graph_train.train_graphs`) on ``count`` graphs of each domain of
:mod:`steerdiff.data.graphs`, each with a partial description (:func:`steerdiff.discrete.lggm.training_prompts`),
condition dropout 0.1 (so the null prompt is the unconditional, LGGM-style pre-trained model). Resumable: the run
directory keeps atomic checkpoints.

    python scripts/make_assets.py --only graphs_lggm
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from ...data.graphs import DOMAINS
from ...discrete.graph_train import GraphTrainConfig, data_prior, train_graphs
from ...discrete.lggm import domain_data, training_prompts, vocabulary
from ...io import write_json
from ...models import GraphTransformer, save

GRAPHS_LGGM_RECIPE = {
    # "full": DiGress's cycle and spectral features (docs/methods/lggm.md, "Structural features")
    "model": {"hidden_x": 32, "hidden_e": 16, "hidden_y": 32, "layers": 3, "heads": 4, "ff": 64, "text_dim": 32,
              "structure": "full"},
    "train": {"steps": 10000, "batch": 32, "lr": 2e-3, "p_uncond": 0.1, "seed": 0, "checkpoint_every": 500},
    "data": {"count": 200, "seed": 0, "n_max": 20, "p_part": 0.8},
}


def build(recipe: dict = GRAPHS_LGGM_RECIPE) -> tuple[GraphTransformer, object, torch.Tensor]:
    """The untrained model, its training graphs (all domains) and their prompts' word ids."""
    d = recipe["data"]
    data, names, stats = domain_data(DOMAINS.names(), d["count"], d["seed"], d["n_max"])
    model = GraphTransformer(n_max=d["n_max"], vocab=vocabulary(d["n_max"]), process=data_prior(data),
                             **recipe["model"])
    prompts = training_prompts(names, stats, seed=d["seed"], p_part=d["p_part"])
    return model, data, model.tokenize(prompts)


def train_graphs_lggm(run_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      recipe: dict = GRAPHS_LGGM_RECIPE) -> dict:
    """Train (or finish) the recipe in ``run_dir`` and save the model to ``out_dir`` (``config.json``,
    ``model.safetensors``, ``training.json`` with the CPU and wall time and the command). Returns the training
    metadata."""
    torch.manual_seed(recipe["train"]["seed"])
    t0, c0 = time.perf_counter(), time.process_time()
    model, data, cond = build(recipe)
    result = train_graphs(model, data, GraphTrainConfig(**recipe["train"]), cond=cond, out_dir=run_dir,
                          log_every=250)
    out = Path(out_dir)
    save(model, out)
    meta = {"recipe": recipe, "domains": DOMAINS.names(), "graphs": len(data),
            "parameters": sum(p.numel() for p in model.parameters()),
            "training_cpu_seconds": round(result["cpu_seconds"], 1),
            "cpu_seconds_this_run": round(time.process_time() - c0, 1),
            "wall_seconds_this_run": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(),
            "final_loss_mean_last_250": sum(result["losses"][-250:]) / max(len(result["losses"][-250:]), 1),
            "command": "python scripts/make_assets.py --only graphs_lggm --threads 2"}
    write_json(out / "training.json", meta)
    return meta
