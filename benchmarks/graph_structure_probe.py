"""Equal-step probe of the graph transformer's feature sets in the shipped text-to-graph recipe
(``docs/methods/lggm.md``, "Results").

Per feature set (``--structures``, :func:`steerdiff.models.graph_transformer.structural_features`; e.g. ``"full"``,
DiGress's cycle and spectral features, against ``"pairs"``, those and the 2- and 3-path counts per node pair) the
``graphs_lggm`` recipe's first stage (:data:`steerdiff.app.recipes.graphs_lggm.GRAPHS_LGGM_RECIPE`: all domains,
partial prompts, seed 0) is trained from scratch for ``--steps`` steps. Both runs see the same batches, times, noise
and condition dropout (one generator seeded by the recipe), so their training losses are paired. Reported: the
training loss over the last 250 steps and the held-out edge cross-entropy per domain (DiGress's edge term per real
pair, Vignac et al., ICLR 2023, Sec. 4.2, without the weight ``lambda``): fresh graphs (seed 5000, ``--per-domain``
of each domain) with their full prompts, noised at ``t`` in 0.1, 0.3, 0.5, 0.8 with fixed noise (the same for every
model), averaged over ``t``. Models and checkpoints live in ``--runs`` (resumable; a finished model is reused).

    OMP_NUM_THREADS=1 python benchmarks/graph_structure_probe.py --steps 2000 --runs runs/structure_probe
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

from steerdiff.app.recipes.graphs_lggm import GRAPHS_LGGM_RECIPE, build
from steerdiff.data.graphs import DOMAINS, describe, from_networkx, generate
from steerdiff.discrete.graph_train import GraphTrainConfig, digress_loss, process_of, train_graphs
from steerdiff.discrete.lggm import prompt
from steerdiff.models import load, save

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

TIMES = (0.1, 0.3, 0.5, 0.8)


def trained(structure: str, steps: int, runs: Path) -> tuple[Path, dict]:
    """The recipe's first stage with ``structure``, ``steps`` steps, saved in ``runs/<structure>_<steps>/model``."""
    out = runs / f"{structure}_{steps}"
    if (out / "model" / "train.json").exists():
        return out / "model", json.loads((out / "model" / "train.json").read_text())
    recipe = copy.deepcopy(GRAPHS_LGGM_RECIPE)
    recipe["model"]["structure"] = structure
    torch.manual_seed(recipe["train"]["seed"])
    model, data, cond = build(recipe)
    res = train_graphs(model, data, GraphTrainConfig(**{**recipe["train"], "steps": steps}), cond=cond,
                       out_dir=out / "run", log_every=250)
    save(model, out / "model")
    info = {"cpu_seconds": res["cpu_seconds"], "loss_last_250": sum(res["losses"][-250:]) / 250}
    (out / "model" / "train.json").write_text(json.dumps(info))
    return out / "model", info


@torch.no_grad()
def heldout_edge_ce(model_dir: Path, per_domain: int) -> dict[str, float]:
    """Per domain: the mean over ``TIMES`` of the edge cross-entropy per real pair on fresh prompted graphs."""
    model = load(model_dir)
    out = {}
    for d in DOMAINS.names():
        graphs = generate(d, per_domain, 5000)
        batch = from_networkx(graphs, model.n_max)
        cond = model.tokenize([prompt(d, describe(g)["nodes"], describe(g)["avg_degree"]) for g in graphs])
        process = process_of(model, batch.n)
        total = 0.0
        for t in TIMES:
            gen = torch.Generator().manual_seed(123)  # the same noisy graphs for every model
            total += float(digress_loss(model, process, batch, torch.full((len(graphs),), t), cond, gen, 1.0))
        out[d] = total / len(TIMES)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--structures", nargs="+", default=["full", "pairs"])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--per-domain", type=int, default=24)
    ap.add_argument("--runs", default="runs/structure_probe")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows, results = [], {}
    doms = DOMAINS.names()
    for s in args.structures:
        model_dir, info = trained(s, args.steps, Path(args.runs))
        ce = heldout_edge_ce(model_dir, args.per_domain)
        results[s] = {**info, "heldout_edge_ce": ce}
        rows.append([s, f"{info['loss_last_250']:.4f}", *(f"{ce[d]:.4f}" for d in doms),
                     f"{sum(ce.values()) / len(ce):.4f}", f"{info['cpu_seconds']:.0f}"])
    meta = provenance(argv, __file__)
    text = [f"# Feature sets at equal steps: the graphs_lggm recipe's first stage, {args.steps} steps", "",
            provenance_line(meta), "",
            f"Held-out edge cross-entropy per real pair (fresh graphs, seed 5000, {args.per_domain} per domain, full "
            f"prompts, mean over t in {', '.join(map(str, TIMES))}, fixed noise); training loss: the DiGress loss "
            "over the last 250 steps (same batches for every feature set).", "",
            markdown_table(["features", "train loss", *doms, "mean", "train CPU s"], rows)]
    d = results_dir("graph_structure_probe")
    write_json(d / f"results_{args.steps}.json", {"meta": meta, "args": vars(args), "results": results})
    write_text(d / f"README_{args.steps}.md", "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
