"""Smoke benchmark: particle methods on the shipped flow model with flow-SDE moves (docs/methods/flow_sde.md).

The shipped rectified-flow ``digits_flow`` model (unconditional use), from ``sigma = inf`` on ``sd.sigmas.flow(steps,
shift=3)`` (``vp_sigmas(steps)`` for the VP interpolant rows), reward ``class:3`` (log-probability of a 3 under the
shipped ``digits_classifier``), ``alpha = 0.1``. Each row is one method (best-of-N, FK steering, gradient-free DAS)
with one kernel: the default ancestral ``eta = 1`` move (= ``sde="edm"``), the deterministic flow ODE (``"ode"``:
best-of-N over ODE samples, SMC whose resampled copies never separate), RBF's ``g = c t`` at two scales and the VP
interpolant conversion (two scales, and the ancestral move on the VP grid to separate grid and coefficient).
Reported per output: mean reward ± its standard error over the groups, the share a held-out classifier (logistic
regression, independent of the reward's CNN) calls a 3, the mean number of distinct final particles per group (a
collapse check: resampled copies that never separate count once), NFE and CPU seconds. Same noise and seeds in every
row.

    python benchmarks/flow_sde.py [--groups 32] [--particles 8] [--steps 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.align import best_of_n, das, fk_steering
from steerdiff.align.rewards import ClassLogProb, heldout_digits_classifier
from steerdiff.core.flow_sde import FlowSDE, vp_sigmas

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

KERNELS = {  # name: (sde, grid)
    "ancestral eta=1 (edm)": (None, "flow"),
    "ode": ("ode", "flow"),
    "rbf c=1": (FlowSDE("rbf", 1.0), "flow"),
    "rbf c=3": (FlowSDE("rbf", 3.0), "flow"),
    "vp c=1 (VP grid)": (FlowSDE("vp", 1.0), "vp"),
    "vp c=3 (VP grid)": (FlowSDE("vp", 3.0), "vp"),
    "ancestral eta=1 (VP grid)": (None, "vp"),
}
METHODS = {
    "best_of_n": lambda den, r, x, sig, P, sde, seed: best_of_n(den, r, x, sig, particles=P, sde=sde, generator=seed),
    "fk": lambda den, r, x, sig, P, sde, seed: fk_steering(den, r, x, sig, alpha=0.1, particles=P, sde=sde,
                                                           generator=seed),
    "das": lambda den, r, x, sig, P, sde, seed: das(den, r, x, sig, alpha=0.1, particles=P, sde=sde, generator=seed),
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--particles", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    model = sd.models.load("digits_flow").eval()
    reward = ClassLogProb(sd.models.load("digits_classifier"), 3)
    heldout, acc = heldout_digits_classifier()
    G, P = args.groups, args.particles
    noise = sd.randn((G * P, *model.sample_shape), seeds=args.seed * 10**6)
    rows = []
    for method, run in METHODS.items():
        for name, (sde, grid) in KERNELS.items():
            sig = sd.sigmas.flow(args.steps, shift=3.0) if grid == "flow" else vp_sigmas(args.steps)
            t0 = time.process_time()
            with torch.no_grad() if method != "das" else torch.enable_grad():
                res = run(model, reward, noise, sig, P, sde, args.seed * 10**6 + 17)
            cpu = time.process_time() - t0
            x = res.samples.detach()
            with torch.no_grad():
                r = reward(x)
                is3 = heldout(x.flatten(1)).argmax(1) == 3
            finals = res.particles_final.detach().flatten(1).view(G, P, -1)
            distinct = sum(len({tuple(v) for v in (f * 1e4).round().tolist()}) for f in finals) / G
            rows.append({"method": method, "kernel": name, "mean_reward": float(r.mean()),
                         "reward_se": float(r.std() / G**0.5),
                         "heldout_p3": float(is3.double().mean()), "distinct_per_group": distinct, "particles": P,
                         "nfe": float(res.nfe), "cpu_s": cpu})
            print(rows[-1], flush=True)
    out = results_dir("flow_sde")
    prov = provenance()
    write_json(out / "flow_sde.json", {"provenance": prov, "args": vars(args), "heldout_accuracy": acc, "rows": rows})
    header = ["method", "kernel", "mean r (class:3) ± s.e.", "held-out P(3)", "distinct particles / P", "NFE / output",
              "CPU s"]
    table = markdown_table(header, [[r["method"], r["kernel"], f"{r['mean_reward']:.2f} ± {r['reward_se']:.2f}",
                                     f"{r['heldout_p3']:.3f}", f"{r['distinct_per_group']:.1f} / {r['particles']}",
                                     f"{r['nfe']:.0f}", f"{r['cpu_s']:.1f}"] for r in rows])
    write_text(out / "flow_sde.md", f"# Flow-SDE moves on digits_flow (class:3, alpha = 0.1)\n\n"
                                    f"{provenance_line(prov)}\n\n{G} groups x {P} particles, {args.steps} steps; "
                                    f"held-out classifier test accuracy {acc:.3f}.\n\n{table}\n")
    return {"rows": rows}


if __name__ == "__main__":
    main()
