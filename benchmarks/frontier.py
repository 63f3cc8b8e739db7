"""The few-step frontier: every sampler x schedule (and the optimised schedule) at 3, 5, 8, 10, 20 NFE.

    python benchmarks/frontier.py --part mixture --quick
    python benchmarks/frontier.py --part digits  --quick
    python benchmarks/frontier.py --part flow    --quick
    python benchmarks/frontier.py --part report
    python benchmarks/frontier_learned.py --check-n 1000   (the learned few-step solver; a section of the report)

Parts:

* ``mixture``: the exact mixture ``gmm2d`` (8 anisotropic modes on a ring, steerdiff/models/gmm.py). Score: the sliced
  2-Wasserstein distance (512 projections) of ``n`` samples to ``n`` exact samples of the mixture, and the
  endpoint error (mean squared distance to the ODE solution from the same noise, Heun on 200 Karras steps) for the
  deterministic samplers. Every registered deterministic sampler and the main stochastic ones, every schedule;
  the optimised schedule (steerdiff/core/schedule_opt.py, AYS-style) for every deterministic sampler and NFE.
* ``digits``: the shipped EDM ``digits`` UNet; FID-digits (the shipped classifier's features against all 1,797
  digits, as benchmarks/few_step.py) of ``n`` class-conditional samples (class ``i % 10``, noise row ``i`` from seed
  ``seed * 10**6 + i``, the same rows in every cell: the comparisons are paired). The optimised schedule for the
  samplers in ``--opt-samplers`` at 5 and 10 NFE (fit on other noise: seed ``seed + 1``). Then the 100-NFE FID of
  the best combination at 5 and at 10 NFE and of DPM-Solver++ 2M on Karras (the targets' reference).
* ``flow``: the shipped rectified-flow ``digits_flow`` from ``sigma = inf``; the schedules built in the flow time
  ``t`` (ComfyUI's convention for flow models: ``sigma_max = 1``, table ``t = k / 1000``), then ``sigma = t/(1-t)``.

Schedules on the EDM model and the mixture: ``karras`` (rho 7), ``exponential``, ``kl_optimal`` on
``[0.002, 80]``; ``simple``, ``ddim_uniform``, ``sgm_uniform``, ``beta`` on ComfyUI's continuous-EDM table
``exp(linspace(log 0.002, log 80, 1000))``; ``linear_quadratic`` scaled to 80. (``polyexponential`` with ComfyUI's
default rho 1 is ``exponential``.) NFE is counted honestly: each sampler gets the largest step count whose NFE (from
its registry entry) is at most the target, and the NFE it used is stored in each cell (a 2-evaluation sampler at
10 NFE runs 5 steps; a schedule that merges repeated levels, as ``beta`` can, runs fewer).
``--quick`` sizes (the whole run in about 15 CPU minutes on one thread) are written in the JSON and the table.
Writes ``benchmarks/results/frontier/frontier_<part>.json`` and, merged, ``frontier.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.core.schedule_opt import optimise_schedule, reference_solution
from steerdiff.core.sigmas import SCHEDULES, flow_t_to_sigma

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

NFES = (3, 5, 8, 10, 20)
REFERENCE_NFE = 100
OUT = results_dir("frontier")
PARTS = ("mixture", "digits", "flow")


def json_path(part: str) -> Path:
    """Each part in its own file (the parts run in parallel); ``--part report`` merges them."""
    return OUT / f"frontier_{part}.json"
SCHEDULE_NAMES = ("karras", "exponential", "kl_optimal", "simple", "ddim_uniform", "sgm_uniform", "beta",
                  "linear_quadratic")
STOCHASTIC = ("euler_ancestral", "dpmpp_2m_sde", "dpmpp_sde")  # the stochastic ones practitioners reach for
SIZES = {  # part -> (quick, full)
    "mixture": ({"n": 2000, "opt_n": 256, "sweeps": 3, "evals": 6, "opt_nfes": (5, 10)},
                {"n": 10000, "opt_n": 512, "sweeps": 4, "evals": 8, "opt_nfes": NFES}),
    "digits": ({"n": 200, "opt_n": 64, "sweeps": 1, "evals": 5, "ref_steps": 50, "opt_nfes": (5, 10),
                "samplers": ("dpmpp_2m", "unipc", "euler", "heun", "euler_ancestral"),
                "schedules": ("karras", "exponential", "kl_optimal"), "opt_samplers": ("dpmpp_2m",)},
               {"n": 2000, "opt_n": 256, "sweeps": 3, "evals": 8, "ref_steps": 200, "opt_nfes": (5, 10),
                "samplers": None, "schedules": SCHEDULE_NAMES,
                "opt_samplers": ("euler", "dpmpp_2m", "unipc", "ipndm", "deis")}),
    "flow": ({"n": 200, "opt_n": 64, "sweeps": 1, "evals": 5, "ref_steps": 50, "opt_nfes": (5, 10),
              "samplers": ("dpmpp_2m", "euler"), "schedules": ("karras", "simple", "beta"),
              "opt_samplers": ("dpmpp_2m",)},
             {"n": 2000, "opt_n": 256, "sweeps": 3, "evals": 8, "ref_steps": 200, "opt_nfes": (5, 10),
              "samplers": None, "schedules": SCHEDULE_NAMES, "opt_samplers": ("euler", "dpmpp_2m", "unipc")}),
}


def samplers(flow_model: bool) -> list[str]:
    """The registered deterministic samplers that need no extra input, then the main stochastic ones."""
    det = [n for n, s in sd.core.SAMPLERS.items()
           if not s.required and not s.stochastic(s.default_eta) and (s.inf_start or not flow_model)]
    return det + [n for n in STOCHASTIC if n in sd.core.SAMPLERS and (sd.core.SAMPLERS.get(n).inf_start
                                                                      or not flow_model)]


def steps_for(sampler: str, nfe: int) -> int:
    """The largest step count whose NFE (from the sampler's registry entry) is at most ``nfe`` (at least 1)."""
    return max([k for k in range(1, nfe + 1) if sd.core.nfe_of(sampler, k) <= nfe] or [1])


def schedule(name: str, steps: int, flow_model: bool) -> torch.Tensor:
    """``name`` at ``steps`` steps on the EDM range (table: ComfyUI's continuous-EDM one) or, for a flow model, in
    the flow time then mapped to sigma."""
    if flow_model:
        lo, hi, table = 1e-3, 1.0, torch.arange(1, 1001, dtype=torch.float64) / 1000
    else:
        lo, hi = 0.002, 80.0
        table = torch.linspace(math.log(lo), math.log(hi), 1000, dtype=torch.float64).exp()
    fn = SCHEDULES.get(name)
    if name in ("simple", "ddim_uniform", "sgm_uniform", "beta"):
        sig = fn(steps, table=table)
    elif name == "linear_quadratic":
        sig = fn(steps, sigma_max=hi)
    else:
        sig = fn(steps, sigma_min=lo, sigma_max=hi)
    if flow_model and sig[0] > 1 - 1e-9:  # kl_optimal's tan(atan(1)) is 1 - 1e-16: the top is t = 1, pure noise
        sig[0] = 1.0
    return flow_t_to_sigma(sig) if flow_model else sig


def _run(model, noise, sig, sampler, cond, seed) -> tuple[torch.Tensor, float]:
    spec = sd.core.SAMPLERS.get(sampler)
    gen = seed * 10**6 + 17 if spec.stochastic(spec.default_eta) else None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        x, stats = sd.sample(model, noise, sig, method=sampler, cond=cond, generator=gen, return_stats=True,
                             allow_out_of_range=True)
    return x, float(stats.nfe)


class Scorer:
    """Scores samples: sliced W2 to exact samples (mixture) or FID-digits (images)."""

    def __init__(self, part: str, n: int, seed: int):
        self.part = part
        if part == "mixture":
            from steerdiff.metrics.distributions import sliced_wasserstein

            self.model = sd.models.gmm.builtin_mixture("gmm2d")
            self.exact = self.model.sample(n, generator=torch.Generator().manual_seed(seed + 99))
            self.noise = sd.core.randn((n, self.model.dim), seeds=seed * 10**6, dtype=torch.float64)
            self.cond, self._sw = None, sliced_wasserstein
            self.ref = reference_solution(self.model, self.noise, 80.0, 0.002)
        else:
            from steerdiff.data.digits import load_digits
            from steerdiff.metrics.images import classifier_features, frechet_distance

            self.clf = sd.models.load("digits_classifier")
            self._feat, self._fd = classifier_features, frechet_distance
            self.f_all = classifier_features(self.clf, load_digits("all")[0])
            self.model = sd.models.load("digits" if part == "digits" else "digits_flow")
            self.cond = torch.arange(n) % 10
            self.noise = sd.core.randn((n, *self.model.sample_shape), seeds=seed * 10**6)

    def __call__(self, x: torch.Tensor) -> dict:
        if not torch.isfinite(x).all():
            return {"score": math.inf}
        if self.part == "mixture":
            return {"score": self._sw(x, self.exact, n_projections=512, seed=0),
                    "endpoint_mse": float((x - self.ref).pow(2).mean())}
        return {"score": self._fd(self.f_all, self._feat(self.clf, x.clamp(-1, 1)))}


def run_part(part: str, quick: bool, seed: int) -> dict:
    size = SIZES[part][0 if quick else 1]
    torch.manual_seed(seed)
    flow_model = part == "flow"
    sc = Scorer(part, size["n"], seed)
    names = size.get("samplers") or samplers(flow_model)
    names = [s for s in names if s in sd.core.SAMPLERS]
    scheds = size.get("schedules") or SCHEDULE_NAMES
    opt_samplers = size.get("opt_samplers") or [s for s in names if not sd.core.SAMPLERS.get(s).stochastic(
        sd.core.SAMPLERS.get(s).default_eta)]
    opt_nfes = size["opt_nfes"]
    cells, schedules_used = {}, {}
    for sampler in names:
        for target in NFES:
            steps = steps_for(sampler, target)
            for sname in scheds:
                try:
                    sig = schedule(sname, steps, flow_model)
                    x, nfe = _run(sc.model, sc.noise, sig, sampler, sc.cond, seed)
                except (ValueError, FloatingPointError) as err:
                    cells[f"{sampler}/{sname}/{target}"] = {"error": str(err)[:200]}
                    continue
                cells[f"{sampler}/{sname}/{target}"] = {"sampler": sampler, "schedule": sname, "target_nfe": target,
                                                        "steps": len(sig) - 1, "nfe": nfe, **sc(x)}
            if sampler in opt_samplers and target in opt_nfes and steps >= 2:
                t0 = time.process_time()
                kw = {k: size[k] for k in ("sweeps", "evals", "ref_steps") if k in size}
                init = schedule("karras", steps, flow_model) if flow_model else None
                cond = None if sc.cond is None else torch.arange(size["opt_n"]) % 10
                res = optimise_schedule(sc.model, sampler, steps, n=size["opt_n"], seed=seed + 1, init=init,
                                        cond=cond, dtype=sc.noise.dtype, **kw)
                x, nfe = _run(sc.model, sc.noise, res.sigmas, sampler, sc.cond, seed)
                schedules_used[f"{sampler}/{target}"] = ["inf" if math.isinf(v) else v for v in res.sigmas.tolist()]
                cells[f"{sampler}/optimised/{target}"] = {
                    "sampler": sampler, "schedule": "optimised", "target_nfe": target, "steps": steps, "nfe": nfe,
                    "opt_cpu_s": round(time.process_time() - t0, 1), **sc(x)}
        print(part, sampler, flush=True)
    best = {str(t): _best(cells, t) for t in NFES}
    refs = {}
    if part != "mixture":  # the 100-NFE reference FID of the best at 5 and 10 NFE and of DPM-Solver++ 2M on Karras
        # an optimised schedule is fitted per step count: its reference is its sampler on Karras
        wanted = {b.replace("/optimised", "/karras") for b in (best["5"], best["10"]) if b} | {"dpmpp_2m/karras"}
        for key in sorted(wanted):
            sampler, sname = key.split("/")
            steps = steps_for(sampler, REFERENCE_NFE)
            x, nfe = _run(sc.model, sc.noise, schedule(sname, steps, flow_model), sampler, sc.cond, seed)
            refs[key] = {"nfe": nfe, **sc(x)}
    return {"size": {k: list(v) if isinstance(v, tuple) else v for k, v in size.items()}, "quick": quick,
            "seed": seed, "cells": cells, "best_at_nfe": best, "reference_100": refs,
            "optimised_sigmas": schedules_used}


def digits_check(n: int, seed: int) -> dict:
    """The digits targets' cells again at a larger ``n``: DPM-Solver++ 2M on Karras, exponential and the optimised
    schedules the digits part fitted (read from its JSON, not refitted), at 5 and 10 NFE, and Karras / exponential at
    100 NFE (the reference)."""
    fitted = json.loads(json_path("digits").read_text())["optimised_sigmas"]
    sc = Scorer("digits", n, seed)
    cells = {}
    for target in (5, 10, REFERENCE_NFE):
        for sname in ("karras", "exponential", "optimised"):
            key = f"dpmpp_2m/{target}"
            if sname == "optimised" and key not in fitted:
                continue
            sig = (torch.tensor([float(v) for v in fitted[key]], dtype=torch.float64) if sname == "optimised"
                   else schedule(sname, target, False))
            x, nfe = _run(sc.model, sc.noise, sig, "dpmpp_2m", sc.cond, seed)
            cells[f"dpmpp_2m/{sname}/{target}"] = {"nfe": nfe, **sc(x)}
            print("check", sname, target, cells[f"dpmpp_2m/{sname}/{target}"], flush=True)
    return {"n": n, "seed": seed, "cells": cells}


def mixture_floor(n: int, seed: int) -> float:
    """The sliced W2 between two independent ``n``-sample sets of the exact mixture: below this, differences
    between cells are sampling noise."""
    from steerdiff.metrics.distributions import sliced_wasserstein

    mix = sd.models.gmm.builtin_mixture("gmm2d")
    a = mix.sample(n, generator=torch.Generator().manual_seed(seed + 99))
    b = mix.sample(n, generator=torch.Generator().manual_seed(seed + 12345))
    return sliced_wasserstein(b, a, n_projections=512, seed=0)


def _best(cells: dict, target: int) -> str | None:
    ok = [(c["score"], f"{c['sampler']}/{c['schedule']}") for c in cells.values()
          if "score" in c and c["target_nfe"] == target and math.isfinite(c["score"])]
    return min(ok)[1] if ok else None


def targets(part: dict) -> dict:
    """The issue's targets on one part: optimised vs Karras at equal sampler and NFE; best vs DPM++ 2M Karras; best
    within 10% (5 NFE) / 3% (10 NFE) of its own 100-NFE score."""
    cells = part["cells"]
    out = {"optimised_beats_karras": {}}
    for c in cells.values():
        if c.get("schedule") == "optimised":
            kar = cells.get(f"{c['sampler']}/karras/{c['target_nfe']}", {})
            if "score" in kar:
                row = {"optimised": c["score"], "karras": kar["score"], "beats": c["score"] < kar["score"]}
                if "endpoint_mse" in c and "endpoint_mse" in kar:
                    row.update(endpoint_optimised=c["endpoint_mse"], endpoint_karras=kar["endpoint_mse"],
                               endpoint_beats=c["endpoint_mse"] < kar["endpoint_mse"])
                out["optimised_beats_karras"][f"{c['sampler']}@{c['target_nfe']}"] = row
    for t, tol in (("5", 1.10), ("10", 1.03)):
        b = part["best_at_nfe"].get(t)
        if b is None:
            continue
        score = cells[f"{b}/{t}"]["score"]
        d2m = cells.get(f"dpmpp_2m/karras/{t}", {}).get("score")
        ref_key = b if b in part["reference_100"] else f"{b.split('/')[0]}/karras"
        ref = part["reference_100"].get(ref_key, {}).get("score")
        out[f"best@{t}"] = {"best": b, "score": score, "dpmpp_2m_karras": d2m,
                            "ahead_of_dpmpp_2m_karras": None if d2m is None else score < d2m,
                            "reference_100": ref, "reference_of": ref_key,
                            "ratio_to_100": None if not ref else score / ref,
                            "within": None if not ref else score / ref <= tol}
    return out


def markdown(res: dict) -> str:
    lines = ["# Few-step frontier: every sampler x schedule, and the optimised schedule", ""]
    metric = {"mixture": "sliced W2 to exact samples (gmm2d)", "digits": "FID-digits (EDM digits UNet)",
              "flow": "FID-digits (digits_flow, from sigma = inf)"}
    for name in ("mixture", "digits", "flow"):
        part = res.get(name)
        if part is None:
            continue
        cells = part["cells"]
        lines += [f"## {name}: {metric[name]}, lower is better", "",
                  f"Sizes ({'--quick' if part['quick'] else 'full'}): {json.dumps(part['size'])}; seed "
                  f"{part['seed']}; {provenance_line(part['meta'])}", "",
                  "Each cell: score (NFE used). Rows: sampler x schedule.", ""]
        combos = sorted({(c["sampler"], c["schedule"]) for c in cells.values() if "score" in c})
        table = []
        for sampler, sname in combos:
            row = [sampler, sname]
            for t in NFES:
                c = cells.get(f"{sampler}/{sname}/{t}")
                row.append("" if c is None or "score" not in c else f"{c['score']:.4g} ({c['nfe']:g})")
            table.append(row)
        lines += [markdown_table(["sampler", "schedule", *(f"NFE {t}" for t in NFES)], table), ""]
        lines += ["Best per NFE: " + ", ".join(f"{t}: `{b}` ({cells[f'{b}/{t}']['score']:.4g})"
                                             for t, b in part["best_at_nfe"].items() if b), ""]
        if part["reference_100"]:
            lines += ["100-NFE reference: " + ", ".join(f"`{k}` {v['score']:.4g} ({v['nfe']:g} NFE)"
                                                      for k, v in part["reference_100"].items()), ""]
        tg = part.get("targets", {})
        rows = [[k, f"{v['optimised']:.4g}", f"{v['karras']:.4g}", "yes" if v["beats"] else "NO"]
                + ([f"{v['endpoint_optimised']:.3g}", f"{v['endpoint_karras']:.3g}",
                    "yes" if v["endpoint_beats"] else "NO"] if "endpoint_beats" in v else [])
                for k, v in tg.get("optimised_beats_karras", {}).items()]
        if rows:
            head = ["sampler@NFE", "optimised", "karras", "beats"]
            if len(rows[0]) > 4:
                head += ["endpoint MSE optimised", "endpoint MSE karras", "beats (endpoint)"]
            lines += ["Optimised schedule (fitted on other noise) vs Karras (rho 7), same sampler and NFE:", "",
                      markdown_table(head, rows), ""]
        if "floor" in part:
            lines += [f"Noise floor of the score at this n (two independent exact sample sets): {part['floor']:.4g}",
                      ""]
        for t in ("5", "10"):
            v = tg.get(f"best@{t}")
            if v:
                lines.append(f"- best at {t} NFE `{v['best']}` {v['score']:.4g}; DPM++ 2M Karras "
                             f"{v['dpmpp_2m_karras']}; ahead: {v['ahead_of_dpmpp_2m_karras']}; 100-NFE reference "
                             f"(`{v['reference_of']}`) {v['reference_100']}; ratio {v['ratio_to_100']}; within "
                             f"target: {v['within']}")
        chk = part.get("check")
        if chk:
            cc = chk["cells"]
            lines += ["", f"Check at n = {chk['n']} (seed {chk['seed']}; `--check-n {chk['n']}`), DPM-Solver++ 2M, "
                      "the same fitted optimised schedules:", ""]
            lines.append(markdown_table(["schedule", "NFE 5", "NFE 10", f"NFE {REFERENCE_NFE}"], [
                [sn] + [f"{cc[f'dpmpp_2m/{sn}/{t}']['score']:.4g}" if f"dpmpp_2m/{sn}/{t}" in cc else ""
                        for t in (5, 10, REFERENCE_NFE)] for sn in ("karras", "exponential", "optimised")]))
        errs = [k for k, c in cells.items() if "error" in c]
        if errs:
            lines += ["", f"Cells not run (the schedule refused the step count): {', '.join(errs)}"]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("mixture", "digits", "flow", "report"), required=True)
    ap.add_argument("--quick", action="store_true", help="the small sizes (SIZES[part][0])")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check-n", type=int, default=None,
                    help="with --part digits: rerun only the targets' cells at this n (after a digits run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.check_n is not None:
        if args.part != "digits":
            raise SystemExit("--check-n applies to --part digits")
        part = json.loads(json_path("digits").read_text())
        t0 = time.process_time()
        part["check"] = {**digits_check(args.check_n, args.seed), "cpu_s": round(time.process_time() - t0, 1)}
        write_json(json_path("digits"), part)
        args.part = "report"
    if args.part != "report":
        t0, c0 = time.perf_counter(), time.process_time()
        part = run_part(args.part, args.quick, args.seed)
        part["meta"] = {"wall_time_s": round(time.perf_counter() - t0, 1),
                        "cpu_s": round(time.process_time() - c0, 1), **provenance()}
        part["targets"] = targets(part)
        write_json(json_path(args.part), part)
    print(write_report())


def write_report() -> str:
    """``frontier.md`` from the parts' JSON files (and the learned solver's, ``benchmarks/frontier_learned.py``)."""
    res = {p: json.loads(json_path(p).read_text()) for p in PARTS if json_path(p).is_file()}
    for name, part in res.items():  # the summary is recomputed from the cells (a report of older runs is current)
        part["targets"] = targets(part)
        if name == "mixture" and "floor" not in part:
            part["floor"] = mixture_floor(part["size"]["n"], part["seed"])
            write_json(json_path(name), part)
    text = markdown(res)
    learned = OUT / "frontier_learned.json"
    if learned.is_file():
        from frontier_learned import markdown as learned_markdown

        text += "\n" + learned_markdown(json.loads(learned.read_text()))
    write_text(OUT / "frontier.md", text + "\n")
    return text


if __name__ == "__main__":
    main()
