"""Text-to-graph conformity of a text-conditioned graph model (``docs/methods/lggm.md``, "Text-to-graph").

LGGM's text-to-graph (Wang et al., ICLR 2025, Sec. 3.3 and 4.3): a graph generated from a description should have
the described properties. Test prompts describe fresh graphs of every domain (seed 5000, never trained on):
``"a <domain> graph with <n> nodes and average degree <d>"`` (``d`` rounded to 0.5). Each prompt is sampled at CFG
scales ``w`` (``w = 0``: the unconditional model, the baseline rate; ``w = 1``: the conditional model), always with
the asked node count (the sampler takes ``n`` from the prompt, as DiGress takes ``n`` from the data). Met: node count
exact, average degree within 0.5 of the asked value, the domain's validity (:func:`steerdiff.metrics.graphs.
is_valid`: a tree, planar and connected, a lobster, a grid, 3-regular, connected, ...), and all three.

Each CFG scale is run on every ancestral grid of ``--time-powers`` (times ``(1 - i / steps) ** p``: ``1`` equal
steps, ``p > 1`` steps crowded near the data, DeFoG's time distortion; the default adds
:data:`steerdiff.discrete.graph_train.TEXT_TO_GRAPH_TIME_POWER`, the grid the CLI samples prompts on), so the
unconditional rate is always read on the same grid as the guided one.

Steering rows (``--smc-particles P``; their own rows, not the CFG number; on the grid ``--steer-time-power``): at
the CFG scale ``--steer-scale``, FK steering (:func:`steerdiff.discrete.graph_train.steer_graphs`, ``P`` particles
per prompt, tilt temperature ``--smc-alpha``) toward the prompt's own check, the reward
:func:`steerdiff.discrete.lggm.prompt_reward` (the fraction of the asked statistics met, evaluated on every
particle's denoised estimate at every step), and best-of-N at the same NFE (``N = P`` independent CFG samples per
prompt, the one meeting most of the prompt kept; ties: the first).

    OMP_NUM_THREADS=1 python benchmarks/text_to_graph.py [--model graphs_lggm] [--per-domain 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from steerdiff.data.graphs import DOMAINS, describe, generate
from steerdiff.discrete.graph_train import TEXT_TO_GRAPH_TIME_POWER, generate_graphs, steer_graphs
from steerdiff.discrete.lggm import prompt, prompt_reward, round_degree
from steerdiff.metrics.graphs import graph_conformity
from steerdiff.models import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

KEYS = ("nodes", "avg_degree", "domain", "all")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="graphs_lggm", help="a shipped model name or a saved model directory")
    ap.add_argument("--per-domain", type=int, default=20)
    ap.add_argument("--scales", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=5000)
    ap.add_argument("--smc-particles", type=int, default=0, help="steering rows (SMC and best-of-N) with this many "
                    "particles / candidates per prompt (0: none)")
    ap.add_argument("--smc-alpha", type=float, default=0.1, help="SMC tilt temperature (reward in [0, 1])")
    ap.add_argument("--steer-scale", type=float, default=2.0, help="CFG scale of the steering rows")
    ap.add_argument("--time-powers", type=float, nargs="+", default=[1.0, TEXT_TO_GRAPH_TIME_POWER],
                    help="the ancestral grids of the CFG rows (time_power; 1: equal steps)")
    ap.add_argument("--steer-time-power", type=float, default=TEXT_TO_GRAPH_TIME_POWER,
                    help="the ancestral grid of the steering rows")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load(args.model).eval()
    prompts, asks, domains = [], [], []
    for d in DOMAINS.names():
        for g in generate(d, args.per_domain, args.seed):
            st = describe(g)
            prompts.append(prompt(d, st["nodes"], st["avg_degree"]))
            asks.append({"nodes": st["nodes"], "avg_degree": round_degree(st["avg_degree"]), "domain": d})
            domains.append(d)
    counts = [a["nodes"] for a in asks]
    rows, per_domain = [], {}
    for tp in args.time_powers:
        for w in args.scales:
            c0 = time.process_time()
            graphs = generate_graphs(model, counts, steps=args.steps, prompts=prompts, guidance_scale=w, generator=0,
                                     time_power=tp)
            conf = graph_conformity(graphs, asks)
            conf["all"] = conf.get("all", 0.0)
            rows.append({"scale": w, "time_power": tp, **{k: conf[k] for k in KEYS},
                         "cpu_s": time.process_time() - c0})
            per_domain[_label(w, tp)] = {d: graph_conformity(graphs[[i for i, x in enumerate(domains) if x == d]],
                                                             [a for a in asks if a["domain"] == d])
                                         for d in DOMAINS.names()}
            print(rows[-1], flush=True)
    steer_rows = []
    if args.smc_particles:
        p, w = args.smc_particles, args.steer_scale
        reward = prompt_reward(asks)
        c0 = time.process_time()
        graphs, st = steer_graphs(model, counts, reward, steps=args.steps, particles=p, alpha=args.smc_alpha,
                                  prompts=prompts, guidance_scale=w, generator=args.seed, return_stats=True,
                                  time_power=args.steer_time_power)
        grid = f", time power {args.steer_time_power:g}" if args.steer_time_power != 1 else ""
        steer_rows.append((f"SMC, {p} particles, alpha {args.smc_alpha:g}, CFG {w:g}{grid}", graphs, st["nfe"],
                           time.process_time() - c0))
        c0 = time.process_time()
        many = generate_graphs(model, [c for c in counts for _ in range(p)], steps=args.steps,
                               prompts=[q for q in prompts for _ in range(p)], guidance_scale=w, generator=args.seed,
                               time_power=args.steer_time_power)
        score = reward(many, torch.arange(len(prompts)).repeat_interleave(p)).view(len(prompts), p)
        pick = torch.arange(len(prompts)) * p + score.argmax(1)
        steer_rows.append((f"best-of-{p}, CFG {w:g}{grid}", many[pick], args.steps * p * (2 if w not in (0, 1) else 1),
                           time.process_time() - c0))
        for name, graphs, nfe, cpu in steer_rows:
            conf = graph_conformity(graphs, asks)
            rows.append({"scale": name, "time_power": args.steer_time_power, **{k: conf.get(k, 0.0) for k in KEYS},
                         "cpu_s": cpu, "nfe": nfe})
            per_domain[name] = {d: graph_conformity(graphs[[i for i, x in enumerate(domains) if x == d]],
                                                    [a for a in asks if a["domain"] == d]) for d in DOMAINS.names()}
            print(rows[-1], flush=True)
    for r in rows:
        if "nfe" not in r:  # CFG at w = 0 or 1 runs one branch only
            r["nfe"] = args.steps * (2 if r["scale"] not in (0, 1) else 1)
    meta = provenance(argv, __file__)
    cfg_rows = [r for r in rows if not isinstance(r["scale"], str)]
    best = max(cfg_rows, key=lambda r: r["all"])
    shown = [_label(best["scale"], best["time_power"]), _label(args.scales[0], best["time_power"])]
    text = [f"# Text-to-graph conformity ({len(prompts)} prompts, {args.per_domain} per domain)", "",
            provenance_line(meta), "",
            markdown_table(["CFG w / steering", "nodes", "avg degree (±0.5)", "domain valid", "all three",
                            "NFE per graph", "CPU s"],
                           [[_label(r["scale"], r["time_power"]), *(f"{r[k]:.2f}" for k in KEYS), f"{r['nfe']:g}",
                             f"{r['cpu_s']:.0f}"] for r in rows]), "",
            f"Per domain at {shown[0]}:", "",
            markdown_table(["domain", "avg degree (±0.5)", "domain valid", "all three", "unconditional: all three"],
                           [[d, f"{per_domain[shown[0]][d]['avg_degree']:.2f}",
                             f"{per_domain[shown[0]][d]['domain']:.2f}", f"{per_domain[shown[0]][d]['all']:.2f}",
                             f"{per_domain[shown[1]][d]['all']:.2f}"] for d in DOMAINS.names()])]
    if steer_rows:
        names = [name for name, *_ in steer_rows]
        same = _label(args.steer_scale, args.steer_time_power)
        text += ["", "Domain valid per domain, steering rows against CFG at the same scale and grid:", "",
                 markdown_table(["domain", same, *names],
                                [[d, (f"{per_domain[same][d]['domain']:.2f}" if same in per_domain else "-"),
                                  *(f"{per_domain[n][d]['domain']:.2f}" for n in names)] for d in DOMAINS.names()])]
    d = results_dir("text_to_graph")
    write_json(d / "results.json", {"meta": meta, "args": vars(args), "rows": rows, "per_domain": per_domain})
    write_text(d / "README.md", "\n".join(text) + "\n")
    print("\n".join(text))


def _label(scale, time_power: float = 1.0) -> str:
    """A row's name: a steering row's own, else the CFG scale and, off the equal grid, its time power."""
    if isinstance(scale, str):
        return scale
    name = "0 (unconditional)" if scale == 0 else f"{scale:g}"
    return name + (f", time power {time_power:g}" if time_power != 1 else "")


if __name__ == "__main__":
    main()
