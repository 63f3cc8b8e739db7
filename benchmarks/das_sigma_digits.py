"""The sigma-bounded tempering against the default gradient-free DAS on the digits test protocol (issue 38;
``docs/methods/das.md``, "Tempering by sigma"; the protocol of ``benchmarks/das_diagnosis.py --part test``).

Shipped digits UNet (null label), rewards ``class:3`` / ``ink`` / ``symmetry`` at ``benchmarks/das.py``'s alphas, Karras
grid of 25 stochastic steps, P = 24 gradient-free particles per output (cost 600 = NFE + 2 VJP, as every row of the
test part), test seeds 0, 1, 2 (the same noise for every row: a paired comparison). Rows: the default
(``tempering="adaptive"``) and fixed levels ``lambda_i = min(1, (s / sigma_i)^2)`` for each ``--s`` (``s = 0`` is the
default). Scores per seed against each reward's tilted reference (a pool of plain samples weighted
``exp(r / alpha)``, ``das_diagnosis.reference``): mean target reward and its gap, FID-digits to the reference,
held-out reward, diversity, the mean ESS fraction and resampling events, and mode coverage: the TV between the
outputs' class histogram (shipped classifier's argmax) and the reference's weighted one.

    python benchmarks/das_sigma_digits.py [--s 0 1 0.75] [--groups 64] [--pool 8192] [--rewards ...] [--out digits]
    python benchmarks/das_sigma_digits.py --table      # markdown from every digits*.json in the results folder

Verdict per metric (``--table``): the candidate is "worse" where its seed mean is worse than the default's by more
than the larger of the two seed standard deviations (``das_diagnosis.test_criterion``'s rule for the held-out
reward), "better" where it is better by as much, "tie" otherwise; diversity by its distance to the reference's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import das_diagnosis as dd  # noqa: E402
from _common import markdown_table, provenance, results_dir, write_json  # noqa: E402

OUT = results_dir("das_sigma_bound")


def sigma_levels(s: float, sigmas: torch.Tensor) -> list[float] | str:
    """``min(1, (s / sigma_i)^2)`` on ``sigmas`` (one level per step); ``s = 0``: ``"adaptive"`` (the default)."""
    if s == 0:
        return "adaptive"
    return (s / sigmas.double()).pow(2).clamp(max=1.0).tolist()


def class_hist(clf, x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        pred = clf(x.float().clamp(-1, 1)).argmax(-1)
    one = torch.nn.functional.one_hot(pred, 10).double()
    return one.mean(0) if w is None else w @ one


# metric, direction (+1: larger is better), format; FID only where the reference's ESS allows it
METRICS = (("target_reward", 1, ".4f"), ("reward_gap_to_reference", -1, ".4f"), ("fid_to_reference", -1, ".2f"),
           ("cross_reward", 1, ".3f"), ("diversity", 1, ".2f"), ("class_tv", -1, ".3f"), ("mean_ess_frac", 1, ".2f"),
           ("resampling_events_per_group", -1, ".1f"))


def verdict(c: dict, d: dict, key: str, sign: int, ref: dict) -> str:
    """Diversity is judged by its distance to the reference's (the claim is closeness to the tilted target); the
    ESS and the resampling count describe the run and get no verdict."""
    if key in ("mean_ess_frac", "resampling_events_per_group"):
        return ""
    spread = max(c[key + "_sd"], d[key + "_sd"])
    if key == "diversity":
        diff = abs(d[key] - ref["diversity"]) - abs(c[key] - ref["diversity"])
    else:
        diff = sign * (c[key] - d[key])
    return " (better)" if diff > spread else " (worse)" if diff < -spread else " (tie)"


def table() -> str:
    blocks, lines = {}, []
    for path in sorted(OUT.glob("digits*.json")):
        for name, b in json.loads(path.read_text())["rewards"].items():
            blocks.setdefault(name, {"reference": b["reference"], "rows": {}})["rows"].update(b.get("rows", {}))
    for name, b in blocks.items():
        ref, rows = b["reference"], b["rows"]
        default = rows.get("default (adaptive)")
        out = []
        for label, r in rows.items():
            m = r["mean"]
            cells = [f"{m[k]:{f}} ± {m[k + '_sd']:{f}}" for k, _, f in METRICS]
            if default is not None and label != "default (adaptive)":
                d = default["mean"]
                cells = [f"{c}{verdict(m, d, k, sg, ref)}" for c, (k, sg, _) in zip(cells, METRICS, strict=True)]
            out.append((label, *cells))
        out.append((f"reference (pool {ref['pool']}, ESS {ref['ess']:.0f})", f"{ref['target_reward']:.4f}", "",
                    f"floor n=64: {ref['fid_floor_sir_draws']['64']:.2f}", f"{ref['cross_reward']:.3f}",
                    f"{ref['diversity']:.2f}", "", "", ""))
        lines += [f"**{name}**", "", markdown_table(
            ["tempering (P = 24, cost 600)", "target reward", "abs gap to ref", "FID to ref", "held-out reward",
             "diversity", "class TV to ref", "mean ESS / P", "resamplings / group"], out), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s", type=float, nargs="*", default=[0.0, 1.0])
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--seeds", type=int, nargs="*", default=list(dd.TEST_SEEDS))
    ap.add_argument("--pool", type=int, default=8192)
    ap.add_argument("--rewards", nargs="*", default=["class:3", "symmetry", "ink"])
    ap.add_argument("--out", default="digits")
    ap.add_argument("--table", action="store_true", help="print the markdown tables from the json files only")
    args = ap.parse_args()
    if args.table:
        print(table())
        return
    torch.set_num_threads(1)
    model, clf, _ = dd.load()
    heldout, _ = dd.bench.heldout_classifier()
    sig = dd.grid()[: dd.STEPS]
    path = OUT / f"{args.out}.json"
    out = json.loads(path.read_text()) if path.exists() else {"rewards": {}}
    out["config"] = {"groups": args.groups, "seeds": args.seeds, "pool": args.pool, "steps": dd.STEPS,
                     "particles": 24, "c_b": dd.C_B, "s": args.s}
    for name, reward, alpha, cross, ref in dd.reward_references(model, clf, heldout, args.pool, args.rewards):
        x_pool = torch.load(Path("/tmp") / f"das_diag_pool_{args.pool}.pt")
        with torch.no_grad():
            w = torch.softmax(reward(x_pool).double() / alpha, 0)
        ref_hist = class_hist(clf, x_pool, w)
        block = out["rewards"].setdefault(name, {})
        block.update(alpha=alpha, reference={k: v for k, v in ref.items() if k not in ("mu", "cov")},
                     reference_classes=ref_hist.tolist())
        rows = block.setdefault("rows", {})
        for s in args.s:
            label = "default (adaptive)" if s == 0 else f"sigma-bounded s={s:g}"
            kw = {"gradient": False, "tempering": sigma_levels(s, sig)}
            runs = []
            for seed in args.seeds:
                t0 = time.process_time()
                res = dd.run_config("das", model, reward, args.groups, 24, seed, kw, alpha=alpha)
                m = dd.score(res.samples, reward, clf, heldout, ref, cross=cross)
                m["class_tv"] = 0.5 * float((class_hist(clf, res.samples) - ref_hist).abs().sum())
                m["mean_ess_frac"] = float(np.nanmean(res.ess[:-1].numpy())) / 24
                m["resampling_events_per_group"] = float(res.resampled.double().sum(0).mean())
                m.update(seed=seed, cost=res.cost(dd.C_B), nfe=res.nfe, cpu_s=time.process_time() - t0)
                runs.append(m)
                print(f"{name:>9} {label:>22} seed {seed}: reward {m['target_reward']:.4f} (gap "
                      f"{m['reward_gap_to_reference']:.4f}) FID-ref {m['fid_to_reference']:.2f} cross "
                      f"{m['cross_reward']:.3f} div {m['diversity']:.2f} classTV {m['class_tv']:.3f} ESS "
                      f"{m['mean_ess_frac']:.2f} resamp {m['resampling_events_per_group']:.1f} cost {m['cost']:.0f} "
                      f"({m['cpu_s']:.0f} cpu s)", flush=True)
            keys = ("target_reward", "reward_gap_to_reference", "fid_to_reference", "cross_reward", "diversity",
                    "class_tv", "mean_ess_frac", "resampling_events_per_group", "cost")
            agg = {k: float(np.mean([r[k] for r in runs])) for k in keys}
            agg |= {k + "_sd": float(np.std([r[k] for r in runs])) for k in keys[:-1]}
            rows[label] = {"s": s, "mean": agg, "per_seed": runs}
            out["env"] = provenance()
            write_json(path, out)


if __name__ == "__main__":
    main()
