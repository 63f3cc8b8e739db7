"""DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity")
against the multi-step diffusion segmenter and the from-scratch network, with its ablations
(docs/methods/diffdis.md, "Benchmark").

Every latent arm is the same network (:class:`steerdiff.segment.DiffDISNet` on the prior's UNet: equal parameters
exactly), on the same codec (the shipped pipeline's VAE encoder, the fine-tuned mask decoder), the same training
latents, steps and batch; only what the issue varies differs:

* ``diffdis``: prior init, one step at ``sigma_t``, mask + edge rows in one batch (DBIA on). Inferred in one step.
* ``diffdis_10step``: the same trained model, run through 10 Euler steps from ``sigma_t`` (the multi-step ablation).
* ``no_edge``: prior init, one step, the mask alone (the edge-task ablation).
* ``scratch``: the same network from random weights, trained as ``diffdis`` (the from-scratch regressor: at
  ``sigma_t`` the noisy input carries no signal, so one-step training is regression from the image latent).
* ``multistep``: prior init, the EDM diffusion objective on the mask latents, sampled with 20 Euler steps and an
  ensemble of 4 samples averaged (the multi-step diffusion segmenter).

Scores (``steerdiff.metrics.segmentation.dis_metrics`` on 64 test images at 64x64): max F, weighted F, S, mean E,
MAE, HCE proxy, edge-band F (2 px), and the CPU seconds per image of inference (VAE encode, the model, decode).
Three seeds (initialisation, row and noise draws). Codec and prior come from the recipe's base
(``python -m steerdiff.app.recipes.diffdis``, written to ``<out>_base``) or the shipped ``steerdiff/assets/diffdis``.

    OMP_NUM_THREADS=1 python benchmarks/diffdis.py [--base DIR] [--seeds 0,1,2] [--steps 200] [--n-train 512]
    OMP_NUM_THREADS=1 python benchmarks/diffdis.py --seeds 1 &      # seeds in parallel, one file each
    python benchmarks/diffdis.py --table-only                         # the table from seeds/seed*.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from steerdiff.app.recipes.diffdis import encode_all, load_base, shipped_dir
from steerdiff.data import dis
from steerdiff.metrics.segmentation import dis_metrics
from steerdiff.segment import FinetuneConfig, Segmenter, build, finetune

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

ARMS = {  # name: (FinetuneConfig overrides, inference options)
    "diffdis": ({}, {"steps": 1}),
    "diffdis_10step": (None, {"steps": 10}),  # None: the diffdis model of the same seed
    "no_edge": ({"edge": False}, {"steps": 1}),
    "scratch": ({"init": "scratch"}, {"steps": 1}),
    "multistep": ({"objective": "diffusion", "edge": False}, {"steps": 20, "ensemble": 4}),
}
COLUMNS = ("maxF", "wF", "S", "meanE", "MAE", "HCE", "bandF", "cpu_s_per_image")


def score(seg: Segmenter, test: dis.DISBatch, opts: dict) -> dict:
    t0 = time.process_time()
    mask, _ = seg.segment(test.image, **opts)
    cpu = (time.process_time() - t0) / test.image.shape[0]
    return {**dis_metrics(mask.double(), test.mask), "cpu_s_per_image": cpu}


def run_seed(seed: int, args, codec, prior, lat: dict, test: dis.DISBatch, arms: list[str]) -> list[dict]:
    """Train and score every arm at one seed."""
    mask_sd = float(lat["mask"].std())
    trained: dict[str, Segmenter] = {}
    rows = []
    for arm in arms:
        over, opts = ARMS[arm]
        if over is None:
            seg = trained["diffdis"]
            info = {"shares": "diffdis"}
        else:
            cfg = FinetuneConfig(**{**asdict(FinetuneConfig()), "steps": args.steps, "seed": seed, **over})
            model = build(prior, mask_sd, cfg)
            info = finetune(model, lat["image"], lat["mask"], lat["edge"], cfg)
            seg = Segmenter(codec, model, edge=cfg.edge)
            trained[arm] = seg
        res = {"arm": arm, "seed": seed, **score(seg, test, opts), "train": info, "inference": opts,
               "parameters": seg.num_parameters()}
        rows.append(res)
        print(arm, seed, {k: round(res[k], 4) for k in COLUMNS if k in res}, flush=True)
    return rows


def build_table(out: Path) -> str:
    """``diffdis.md`` / ``diffdis.json`` from every ``seeds/seed<k>.json`` present (seeds may run in parallel)."""
    runs = [json.loads(f.read_text()) for f in sorted((out / "seeds").glob("seed*.json"))]
    if not runs:
        return ""
    arms = [r["arm"] for r in runs[0]["rows"]]
    rows = {a: [r for run in runs for r in run["rows"] if r["arm"] == a] for a in arms}
    seeds = [run["seed"] for run in runs]

    def mean(a: str, k: str) -> float:
        return sum(r[k] for r in rows[a]) / len(rows[a])

    def cell(a: str, k: str) -> str:
        v = torch.tensor([r[k] for r in rows[a]], dtype=torch.float64)
        if k == "cpu_s_per_image" or len(v) == 1:
            return f"{v.mean():.4f}"
        return f"{v.mean():.4f} ± {v.std():.4f}"

    table = markdown_table(("arm", "params", *COLUMNS),
                           [(a, rows[a][0]["parameters"], *(cell(a, k) for k in COLUMNS)) for a in arms],
                           "l" + "r" * (len(COLUMNS) + 1))
    checks = []
    if {"diffdis", "multistep", "scratch"} <= set(arms):
        d, m, s = ({k: mean(a, k) for k in COLUMNS} for a in ("diffdis", "multistep", "scratch"))
        checks = [f"one-step maxF >= multi-step: {d['maxF']:.4f} vs {m['maxF']:.4f} -> {d['maxF'] >= m['maxF']}",
                  f"one-step MAE <= multi-step: {d['MAE']:.4f} vs {m['MAE']:.4f} -> {d['MAE'] <= m['MAE']}",
                  f"CPU time per image, multi-step / one-step: {m['cpu_s_per_image'] / d['cpu_s_per_image']:.1f}x "
                  "(target >= 10x)",
                  f"edge-band F, DiffDIS vs scratch: {d['bandF']:.4f} vs {s['bandF']:.4f} -> {d['bandF'] > s['bandF']}"]
        per_seed = [a["bandF"] > b["bandF"] for a, b in zip(rows["diffdis"], rows["scratch"], strict=True)]
        checks.append(f"edge-band F, DiffDIS > scratch per seed {seeds}: {per_seed}")
    if {"diffdis", "no_edge"} <= set(arms):
        per_seed = [(round(a["bandF"] - b["bandF"], 4), round(a["maxF"] - b["maxF"], 4), round(a["MAE"] - b["MAE"], 4))
                    for a, b in zip(rows["diffdis"], rows["no_edge"], strict=True)]
        checks.append(f"edge task, diffdis minus no_edge per seed {seeds} (bandF, maxF, MAE): {per_seed}")
    meta = runs[0]["provenance"]
    text = (f"# DiffDIS vs multi-step and from-scratch ({len(seeds)} seeds {seeds}, mean ± std)\n\n"
            f"Command (per seed, run in parallel): `OMP_NUM_THREADS=1 python benchmarks/diffdis.py "
            f"{' '.join(runs[0]['argv'])}` with `--seeds` 0, 1, 2\n\n"
            f"{provenance_line(meta)}\n\n{table}\n\n" + "\n".join(f"- {c}" for c in checks) + "\n")
    write_text(out / "diffdis.md", text)
    write_json(out / "diffdis.json", {"runs": runs, "checks": checks})
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, default=shipped_dir(), help="directory with the codec and prior/")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=200, help="fine-tuning steps of every arm")
    p.add_argument("--n-train", type=int, default=512)
    p.add_argument("--n-test", type=int, default=64)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--table-only", action="store_true", help="rebuild the table from the seed files")
    args = p.parse_args(argv)
    argv_used = [a for a in (argv if argv is not None else sys.argv[1:])]
    out = results_dir("diffdis")
    if not args.table_only:
        seeds = [int(s) for s in args.seeds.split(",")]
        arms = args.arms.split(",")
        meta = provenance()
        codec, prior = load_base(args.base)
        data = dis.generate(args.n_train, 64, seed=0)
        test = dis.generate(args.n_test, 64, seed=0, part="test")
        lat = encode_all(codec, data)
        (out / "seeds").mkdir(exist_ok=True)
        for seed in seeds:
            rows = run_seed(seed, args, codec, prior, lat, test, arms)
            i = argv_used.index("--seeds") if "--seeds" in argv_used else None
            shown = argv_used[:i] + argv_used[i + 2:] if i is not None else argv_used
            write_json(out / "seeds" / f"seed{seed}.json", {"seed": seed, "provenance": meta, "argv": shown,
                                                           "args": {**vars(args), "base": str(args.base)},
                                                           "rows": rows})
    print(build_table(out))


if __name__ == "__main__":
    main()
