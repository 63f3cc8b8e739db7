"""Discrete diffusion against an exact table (``docs/methods/discrete.md``, "Exact checks").

A Dirichlet-flat table over 4 positions x 3 tokens (81 sequences) is the exact denoiser (``TableModel``). Printed and
written to ``benchmarks/results/discrete_exact/``:

* ``samplers``: total variation of each sampler's empirical law (N draws) to the table, beside the Monte Carlo floor
  (the 99% quantile of the TV of N exact draws), the TV of the sampler's exact law (``ancestral_law``; the exact chain
  for one-token-per-step unmasking), NFE and CPU seconds;
* ``steering``: the reward ``r(x) = #(token 2)``, ``alpha = 1``: TV to the exact tilt ``p e^{r/alpha}`` of SMC
  (256 groups x 32 particles, evidence-pooled weights), of best-of-N at the same NFE per output, and of the untilted
  sampler.

    OMP_NUM_THREADS=1 python benchmarks/discrete_exact.py [--n 20000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import steerdiff.discrete as dd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

L, K = 4, 3
RUNS = [("absorbing", "linear", "unmask", 4), ("absorbing", "loglinear", "unmask", 4),
        ("absorbing", "cosine", "unmask", 2), ("absorbing", "linear", "maskgit", 4),
        ("absorbing", "linear", "ancestral", 4), ("absorbing", "linear", "ancestral", 16),
        ("absorbing", "linear", "ancestral", 64), ("uniform", "cosine", "ancestral", 8),
        ("uniform", "cosine", "ancestral", 32), ("uniform", "cosine", "ancestral", 128),
        ("marginal", "cosine", "ancestral", 128)]


def samplers(table: torch.Tensor, n: int) -> list[dict]:
    floor = dd.tv_floor(table, n)
    rows = []
    for name, schedule, method, steps in RUNS:
        proc = dd.make_process(name, K, schedule=schedule, **({"pi": [0.5, 0.3, 0.2]} if name == "marginal" else {}))
        t = time.process_time()
        x, st = dd.sample(dd.TableModel(table, L, proc), proc, steps, shape=(n, L), method=method,
                          generator=torch.Generator().manual_seed(0), return_stats=True)
        cpu = time.process_time() - t
        law = dd.ancestral_law(dd.TableModel(table, L, proc), proc, steps) if method == "ancestral" else \
            (table if method == "unmask" and steps == L else None)  # one token per step: the exact chain
        rows.append({"process": name, "schedule": schedule, "method": method, "steps": steps, "nfe": st.nfe,
                     "tv": dd.total_variation(dd.empirical(x, K), table), "mc_floor_99": floor,
                     "law_tv": None if law is None else dd.total_variation(law, table), "cpu_s": cpu})
    return rows


def steering(table: torch.Tensor) -> list[dict]:
    proc = dd.make_process("absorbing", K, schedule="linear")
    model = dd.TableModel(table, L, proc)

    def reward(x):
        return (x == 2).sum(-1).double()

    tilt = table * torch.exp(reward(dd.all_sequences(L, K)))
    tilt = tilt / tilt.sum()
    g, p = 256, 32
    res = dd.smc(model, proc, reward, length=L, steps=L, alpha=1.0, num_samples=g, particles=p, generator=0)
    w = res.weights()
    rows = [{"method": f"smc {g}x{p}", "nfe_per_output": res.nfe,
             "tv_to_tilt": dd.total_variation(dd.empirical(res.samples, K, w), tilt),
             "mc_floor_99": dd.tv_floor(tilt, int(1 / float((w ** 2).sum())))}]
    bon = dd.best_of_n(model, proc, reward, length=L, steps=L, n=p, num_samples=g * 8, method="unmask", generator=0)
    rows.append({"method": f"best-of-{p}", "nfe_per_output": bon.nfe,
                 "tv_to_tilt": dd.total_variation(dd.empirical(bon.samples, K), tilt),
                 "mc_floor_99": dd.tv_floor(tilt, g * 8)})
    rows.append({"method": "untilted p", "nfe_per_output": L, "tv_to_tilt": dd.total_variation(table, tilt),
                 "mc_floor_99": 0.0})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="draws per sampler")
    args = ap.parse_args(argv)
    table = dd.random_table(L, K, seed=1)
    meta = provenance(argv, __file__)
    out = {"meta": meta, "samplers": samplers(table, args.n), "steering": steering(table)}
    text = ["# Discrete diffusion against an exact 4 x 3 table", "", provenance_line(meta), "",
            markdown_table(["process", "schedule", "method", "steps", "NFE", "TV (draws)", "MC floor (99%)",
                            "TV (exact law)", "CPU s"],
                           [[r["process"], r["schedule"], r["method"], r["steps"], r["nfe"], f"{r['tv']:.4f}",
                             f"{r['mc_floor_99']:.4f}", "-" if r["law_tv"] is None else f"{r['law_tv']:.4f}",
                             f"{r['cpu_s']:.1f}"] for r in out["samplers"]]), "",
            markdown_table(["method", "NFE / output", "TV to tilt", "MC floor (99%)"],
                           [[r["method"], r["nfe_per_output"], f"{r['tv_to_tilt']:.4f}", f"{r['mc_floor_99']:.4f}"]
                            for r in out["steering"]])]
    d = results_dir("discrete_exact")
    write_json(d / "results.json", out)
    write_text(d / "README.md", "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
