"""The learned few-step solver on the frontier's targets: digits FID at 5 and 10 NFE against the 100-NFE reference, and
the exact mixture's sliced W2 and endpoint error.

    python benchmarks/frontier_learned.py --check-n 1000

For each NFE in ``--nfes`` (default 5 and 10), a :class:`steerdiff.core.learned_solver.LearnedSolver` is fitted
(``fit_learned_solver``: Adam on the endpoint error against Heun on 200 Karras steps) starting from DPM-Solver++ 2M on
the optimised schedule that ``benchmarks/frontier.py`` fitted (read from ``frontier_<part>.json``, not refitted), on
the noises the schedule optimiser used (seed ``seed + 1``), and scored on the frontier's own noises (seed ``seed``,
held out):

* ``digits``: FID-digits of ``--check-n`` class-conditional samples (class ``i % 10``), beside DPM-Solver++ 2M on
  Karras and on the optimised schedule and the 100-NFE reference (DPM-Solver++ 2M on Karras) from the same noises;
* ``mixture``: ``gmm2d``, the sliced W2 (512 projections) of 2000 samples to 2000 exact ones and the endpoint error,
  beside DPM-Solver++ 2M on the optimised schedule and Karras, with the noise floor of the score.

Writes ``benchmarks/results/frontier/frontier_learned.json``, the fitted solvers ``learned_<part>_<nfe>.safetensors``
beside it (for ``steerdiff sample --solver``), and a section of ``frontier.md`` (``frontier.py --part report``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.core.learned_solver import fit_learned_solver

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import provenance, write_json  # noqa: E402
from frontier import OUT, REFERENCE_NFE, Scorer, _run, json_path, schedule  # noqa: E402

LEARNED_JSON = OUT / "frontier_learned.json"


def run(part: str, nfes: tuple[int, ...], n: int, seed: int, fit_n: int, iters: int, lr: float, loss: str = "l2",
        loss_sigma: float = 0.5, slack: float = 0.0) -> dict:
    fitted = json.loads(json_path(part).read_text())["optimised_sigmas"]
    sc = Scorer(part, n, seed)
    cells = {}
    for nfe in nfes:
        init = torch.tensor([float(v) for v in fitted[f"dpmpp_2m/{nfe}"]], dtype=torch.float64)
        cond = None if sc.cond is None else torch.arange(fit_n) % 10
        t0 = time.process_time()
        sol = fit_learned_solver(sc.model, init, n=fit_n, seed=seed + 1, cond=cond, iters=iters, lr=lr, loss=loss,
                                 loss_sigma=loss_sigma, slack=slack, dtype=sc.noise.dtype)
        fit_s = round(time.process_time() - t0, 1)
        sol.meta.update(model="digits" if part == "digits" else "gmm2d", command=" ".join(sys.argv))
        sol.save(OUT / f"learned_{part}_{nfe}.safetensors")
        for name, sig, method, kw in (("karras", schedule("karras", nfe, False), "dpmpp_2m", {}),
                                      ("optimised", init, "dpmpp_2m", {}),
                                      ("learned", sol.sigmas, "learned", {"solver": sol})):
            with torch.no_grad():
                x = sd.sample(sc.model, sc.noise, sig, method=method, cond=sc.cond, **kw)
            cells[f"{name}/{nfe}"] = {"nfe": nfe, **sc(x)}
            print(part, name, nfe, cells[f"{name}/{nfe}"], flush=True)
        cells[f"learned/{nfe}"].update(fit_cpu_s=fit_s, train_loss_init=sol.meta["init_loss"],
                                       train_loss=sol.meta["loss"], sigmas=sol.sigmas.tolist())
    if part == "digits":
        x, nfe = _run(sc.model, sc.noise, schedule("karras", REFERENCE_NFE, False), "dpmpp_2m", sc.cond, seed)
        cells[f"karras/{REFERENCE_NFE}"] = {"nfe": nfe, **sc(x)}
    fit = {"n": fit_n, "seed": seed + 1, "iters": iters, "lr": lr, "loss": loss}
    if loss == "denoiser":
        fit["loss_sigma"] = loss_sigma
    if slack > 0:
        fit["slack"] = slack
    return {"n": n, "seed": seed, "fit": fit, "cells": cells}


def _fmt(v: dict) -> str:
    return f"{v['score']:.4g}" + (f" ({v['endpoint_mse']:.3g})" if "endpoint_mse" in v else "")


def markdown(res: dict) -> str:
    lines = ["## Learned few-step solver (`benchmarks/frontier_learned.py`)", "",
             "DPM-Solver++ 2M's multistep weights, levels and evaluation levels fitted to the fine ODE's endpoints on "
             "the schedule optimiser's noises, from DPM-Solver++ 2M on the optimised schedule "
             "(steerdiff/core/learned_solver.py); scored on the frontier's held-out noises.", ""]
    for part in ("digits", "mixture"):
        p = res.get(part)
        if not p:
            continue
        c = p["cells"]
        what = "FID-digits" if part == "digits" else "sliced W2 (endpoint MSE)"
        meta = p.get("meta") or res.get("meta", {})
        fit = p["fit"]
        loss = fit.get("loss", "l2") + (f" (sigma {fit['loss_sigma']:g})" if "loss_sigma" in fit else "")
        loss += f", LD3 slack {fit['slack']:g}" if "slack" in fit else ""
        lines += [f"{part}: {what} at n = {p['n']}, fit on n = {fit['n']} other noises, {fit['iters']} "
                  f"Adam iterations, loss {loss}; `{meta.get('command')}`, {meta.get('cpu_s')} CPU s in all", ""]
        head = "| NFE | DPM++ 2M Karras | DPM++ 2M optimised | learned | fit CPU s |"
        if part == "digits":
            head += f" ratio to {REFERENCE_NFE}-NFE |"
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for nfe in sorted({int(k.split("/")[1]) for k in c if k.startswith("learned/")}):
            row = [str(nfe), *(_fmt(c[f"{k}/{nfe}"]) for k in ("karras", "optimised", "learned")),
                   str(c[f"learned/{nfe}"]["fit_cpu_s"])]
            if part == "digits":
                row.append(f"{c[f'learned/{nfe}']['score'] / c[f'karras/{REFERENCE_NFE}']['score']:.3f}")
            lines.append("| " + " | ".join(row) + " |")
        if part == "digits":
            lines += ["", f"{REFERENCE_NFE}-NFE reference (DPM++ 2M Karras, same noises): "
                          f"{c[f'karras/{REFERENCE_NFE}']['score']:.4g}"]
            if (OUT / "learned_variants.md").is_file():
                lines += ["", "Other fitting objectives (multiscale, denoiser-perceptual, LD3 slack, longer fits) on "
                              "the same cells: `learned_variants.md` (`benchmarks/frontier_learned_variants.py`)."]
            floor = OUT / "noise_floor.json"
            shipped = "benchmarks/results/frontier/learned_digits_5.safetensors"
            if floor.is_file() and shipped in (fl := json.loads(floor.read_text()))["rows"]:
                ref, row = fl["rows"]["reference"], fl["rows"][shipped]
                ci = " [{:.3f}, {:.3f}]".format(*row["pooled_ratio_95"]) if "pooled_ratio_95" in row else ""
                lines += ["", f"Noise floor (`noise_floor.md`, `benchmarks/frontier_noise_floor.py`): the "
                              f"{REFERENCE_NFE}-NFE FID-digits of {len(ref['blocks']['values'])} independent blocks "
                              f"of {fl['block']} noises spans {ref['blocks']['min']:.4f} - {ref['blocks']['max']:.4f}"
                              f" (sd {ref['blocks']['sd']:.4f}); the learned solver's paired ratio per block "
                              f"{row['block_ratios']['mean']:.3f} ± {row['block_ratios']['sd']:.3f}; pooled over "
                              f"n = {fl['pooled_n']}: {row['pooled']:.4f} vs {ref['pooled']:.4f}, ratio "
                              f"{row['pooled_ratio']:.3f}{ci} (95% paired bootstrap)."]
        elif "floor" in p:
            lines += ["", f"Noise floor of the sliced W2 at this n: {p['floor']:.4g}"]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check-n", type=int, default=1000, help="digits samples scored")
    ap.add_argument("--nfes", default="5,10")
    ap.add_argument("--parts", default="digits,mixture")
    ap.add_argument("--fit-n", type=int, default=256)
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--loss", default="l2", help="the fitting objective (fit_learned_solver's loss)")
    ap.add_argument("--loss-sigma", type=float, default=0.5, help="--loss denoiser: its noise level")
    ap.add_argument("--slack", type=float, default=0.0, help="LD3's relaxed objective: the ball's relative radius")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    nfes = tuple(int(v) for v in args.nfes.split(","))
    done = {}
    for part in args.parts.split(","):
        c0 = time.process_time()
        n = args.check_n if part == "digits" else 2000
        done[part] = run(part, nfes, n, args.seed, args.fit_n, args.iters, args.lr, args.loss, args.loss_sigma,
                         args.slack)
        if part == "mixture":
            from frontier import mixture_floor

            done[part]["floor"] = mixture_floor(n, args.seed)
        done[part]["meta"] = {"cpu_s": round(time.process_time() - c0, 1), **provenance()}
    # the parts run one at a time (each its own command): merge into what is there when writing
    res = json.loads(LEARNED_JSON.read_text()) if LEARNED_JSON.is_file() else {}
    res.update(done)
    write_json(LEARNED_JSON, res)
    from frontier import write_report

    write_report()
    print(markdown(res))


if __name__ == "__main__":
    main()
