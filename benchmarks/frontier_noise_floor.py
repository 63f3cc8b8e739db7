"""How far apart are FID-digits values that should be equal? The noise floor of the 5-NFE target of issue 40.

    python benchmarks/frontier_noise_floor.py
    python benchmarks/frontier_noise_floor.py --solvers benchmarks/results/frontier/learned_digits_5.safetensors \
        /tmp/h40/solvers/*.safetensors

The 100-NFE reference (DPM-Solver++ 2M on Karras, as ``benchmarks/frontier.py``) is sampled on several independent
held-out noise sets (``--sets seed:n``; row ``i`` of set ``seed`` from seed ``seed * 10**6 + i``, class ``i % 10``,
as the frontier; seed 1 is skipped: the fits draw their noises next to it). Cut into blocks of the benchmark's
``--block`` samples (1000, the n of ``frontier_learned.py``), these give independent FID-digits values of one and the
same sampler: their spread is the floor below which two FID values at that n cannot be told apart. Every solver file
in ``--solvers`` is run on the same noises (5 NFE, paired with the reference row by row) and scored per block, per
set and pooled over all sets (n = 5000 by default), with its ratio to the reference on the same noises, and a 95%
interval of the pooled ratio from a paired bootstrap stratified by class (``--boot`` resamples of the pooled rows, the
same rows for the solver and the reference). ``--plain`` adds DPM-Solver++ 2M at 5 NFE on Karras and on the
frontier's optimised schedule (what the learned solver starts from), to show what a resolved gap looks like.

The reference samples are cached in ``--cache`` (deterministic). Writes ``benchmarks/results/frontier/
noise_floor.json`` and ``noise_floor.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.core.learned_solver import LearnedSolver

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, markdown_table, provenance, provenance_line, write_json, write_text  # noqa: E402
from frontier import OUT, REFERENCE_NFE, _run, json_path, schedule  # noqa: E402


class FID:
    """FID-digits as ``frontier.Scorer`` computes it (the shipped classifier's features against all 1,797 digits)."""

    def __init__(self):
        from steerdiff.data.digits import load_digits
        from steerdiff.metrics.images import classifier_features, frechet_distance

        self.clf = sd.models.load("digits_classifier")
        self._feat, self._fd = classifier_features, frechet_distance
        self.f_all = classifier_features(self.clf, load_digits("all")[0])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self._feat(self.clf, x.clamp(-1, 1))

    def __call__(self, feats: torch.Tensor) -> float:
        return self._fd(self.f_all, feats)


def reference_set(model, seed: int, n: int, cache: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(noise, cond, x_100)`` of held-out set ``seed`` (the reference cached as ``frontier_learned_variants.py``
    caches seed 0's)."""
    noise = sd.core.randn((n, *model.sample_shape), seeds=seed * 10**6)
    cond = torch.arange(n) % 10
    path = cache / f"digits_{REFERENCE_NFE}nfe_{n}_{seed}.pt"
    if path.is_file():
        return noise, cond, torch.load(path)
    x, _ = _run(model, noise, schedule("karras", REFERENCE_NFE, False), "dpmpp_2m", cond, seed)
    torch.save(x, path)
    return noise, cond, x


def _shown(path: str) -> str:
    p = Path(path).resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def summarise(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else float("nan"),
            "min": min(values), "max": max(values), "values": values}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="0:1000,2:2000,3:2000", help="held-out noise sets, seed:n")
    ap.add_argument("--block", type=int, default=1000, help="the benchmark's n: the sets are cut into such blocks")
    ap.add_argument("--solvers", nargs="*", default=[str(OUT / "learned_digits_5.safetensors")])
    ap.add_argument("--plain", default="karras,optimised", help="DPM-Solver++ 2M at 5 NFE on these schedules "
                    "('' none), optimised/NFE, or SAMPLER/SCHEDULE/NFE, e.g. dpmpp_2m/exponential/10 (the 10-NFE "
                    "target's best)")
    ap.add_argument("--boot", type=int, default=200, help="bootstrap resamples of the pooled ratio")
    ap.add_argument("--cache", default="/tmp/steerdiff_frontier_cache")
    ap.add_argument("--tag", default="", help="suffix of the output files (noise_floor_TAG.md)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    c0 = time.process_time()
    model = sd.models.load("digits")
    fid = FID()
    sets = [tuple(int(v) for v in s.split(":")) for s in args.sets.split(",")]
    if any(seed == 1 for seed, _ in sets):
        raise SystemExit("--sets: seed 1's rows overlap the fitting noises (seed 1 * 1_000_003 + i)")
    feats: dict[str, list[torch.Tensor]] = {"reference": []}
    blocks: list[tuple[int, int, int]] = []  # (set seed, start, stop)
    solvers = {_shown(p): LearnedSolver.load(p) for p in args.solvers}
    plain = {}
    for kind in filter(None, args.plain.split(",")):
        if kind == "karras":
            plain["dpmpp_2m Karras"] = schedule("karras", 5, False)
        elif kind == "optimised":
            plain["dpmpp_2m optimised"] = torch.tensor([float(v) for v in json.loads(json_path("digits").read_text())[
                "optimised_sigmas"]["dpmpp_2m/5"]], dtype=torch.float64)
        elif kind.startswith("optimised/") and kind.split("/")[1].isdigit():  # the frontier's schedule at that NFE
            nfe = kind.split("/")[1]
            table = json.loads(json_path("digits").read_text())["optimised_sigmas"]
            if f"dpmpp_2m/{nfe}" not in table:
                raise SystemExit(f"--plain {kind}: the frontier optimised dpmpp_2m at {sorted(table)} only")
            plain[f"dpmpp_2m optimised {nfe} NFE"] = torch.tensor([float(v) for v in table[f"dpmpp_2m/{nfe}"]],
                                                                  dtype=torch.float64)
        elif kind.count("/") == 2 and kind.split("/")[2].isdigit():
            sampler, sched, nfe = kind.split("/")
            if sampler not in sd.core.SAMPLERS:
                raise SystemExit(f"--plain: unknown sampler {sampler!r}")
            plain[f"{sampler} {sched} {nfe} NFE"] = (schedule(sched, int(nfe), False), sampler)
        else:
            raise SystemExit(f"--plain: karras, optimised or SAMPLER/SCHEDULE/NFE, got {kind!r}")
    for name in [*plain, *solvers]:
        feats[name] = []
    for seed, n in sets:
        noise, cond, x_ref = reference_set(model, seed, n, cache)
        feats["reference"].append(fid.features(x_ref))
        for name, sig in plain.items():
            sig, sampler = sig if isinstance(sig, tuple) else (sig, "dpmpp_2m")
            x, _ = _run(model, noise, sig, sampler, cond, seed)
            feats[name].append(fid.features(x))
        for name, sol in solvers.items():
            with torch.no_grad():
                x = sd.sample(model, noise, sol.sigmas, method="learned", solver=sol, cond=cond)
            feats[name].append(fid.features(x))
        blocks += [(seed, a, min(a + args.block, n)) for a in range(0, n, args.block)]
        print(f"set {seed}:{n} done, {time.process_time() - c0:.0f} CPU s", flush=True)
    offsets, at = {}, 0
    for seed, n in sets:
        offsets[seed] = at
        at += n
    allf = {k: torch.cat(v) for k, v in feats.items()}
    classes = torch.cat([torch.arange(n) % 10 for _, n in sets])
    gen = torch.Generator().manual_seed(0)
    boots = []  # stratified by class: each resample keeps every class's count (the frontier's design)
    for _ in range(args.boot):
        boots.append(torch.cat([(c := (classes == k).nonzero().flatten())[torch.randint(len(c), (len(c),),
                                                                                       generator=gen)]
                                for k in range(10)]))

    def score(name: str, rows: slice) -> float:
        return fid(allf[name][rows])

    res: dict = {"sets": [f"{s}:{n}" for s, n in sets], "block": args.block, "pooled_n": at, "boot": args.boot,
                 "rows": {}}
    for name in feats:
        per_block = [score(name, slice(offsets[s] + a, offsets[s] + b)) for s, a, b in blocks]
        per_set = [score(name, slice(offsets[s], offsets[s] + n)) for s, n in sets]
        row = {"blocks": summarise(per_block), "sets": per_set, "pooled": score(name, slice(0, at))}
        if name != "reference":
            ref = res["rows"]["reference"]
            row["block_ratios"] = summarise([v / r for v, r in zip(per_block, ref["blocks"]["values"], strict=True)])
            row["set_ratios"] = [v / r for v, r in zip(per_set, ref["sets"], strict=True)]
            row["pooled_ratio"] = row["pooled"] / ref["pooled"]
            if boots:
                ratios = sorted(fid(allf[name][b]) / fid(allf["reference"][b]) for b in boots)
                row["pooled_ratio_95"] = [ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]]
        res["rows"][name] = row
    res["cpu_s"] = round(time.process_time() - c0, 1)
    res["meta"] = provenance()
    stem = "noise_floor" + (f"_{args.tag}" if args.tag else "")
    write_json(OUT / f"{stem}.json", res)
    write_text(OUT / f"{stem}.md", markdown(res))
    print(markdown(res))


def markdown(res: dict) -> str:
    ref = res["rows"]["reference"]
    rb = ref["blocks"]
    nb = len(rb["values"])
    lines = ["# The noise floor of FID-digits at the frontier's n (`benchmarks/frontier_noise_floor.py`)", "",
             provenance_line(res["meta"]), "",
             f"Held-out noise sets {', '.join(res['sets'])} (seed:n), cut into {nb} independent blocks of "
             f"{res['block']}; pooled n = {res['pooled_n']}. Reference: DPM-Solver++ 2M on Karras at "
             f"{REFERENCE_NFE} NFE. Ratios are paired (the solver and the reference on the same noises).", "",
             f"**{REFERENCE_NFE}-NFE FID-digits per block of {res['block']}**: "
             + ", ".join(f"{v:.4f}" for v in rb["values"])
             + f" (mean {rb['mean']:.4f}, sd {rb['sd']:.4f}, range {rb['max'] - rb['min']:.4f}); per set "
             + ", ".join(f"{v:.4f}" for v in ref["sets"]) + f"; pooled {ref['pooled']:.4f}.", ""]
    rows = []
    for name, r in res["rows"].items():
        if name == "reference":
            continue
        b, br = r["blocks"], r["block_ratios"]
        rows.append([f"`{name}`", " ".join(f"{v:.4f}" for v in b["values"]), f"{b['mean']:.4f} ± {b['sd']:.4f}",
                     " ".join(f"{v:.3f}" for v in br["values"]), f"{br['mean']:.3f} ± {br['sd']:.3f}",
                     " ".join(f"{v:.3f}" for v in r["set_ratios"]), f"{r['pooled']:.4f}",
                     f"{r['pooled_ratio']:.3f}" + (" [{:.3f}, {:.3f}]".format(*r["pooled_ratio_95"])
                                                   if "pooled_ratio_95" in r else "")])
    lines.append(markdown_table(
        ["solver (5 NFE unless named)", f"FID per block of {res['block']}", "mean ± sd", "ratio per block", "mean ± sd",
         "ratio per set", f"FID pooled (n = {res['pooled_n']})", "ratio pooled [95% bootstrap]"], rows))
    lines += ["", f"{res['cpu_s']} CPU s (one thread; the {REFERENCE_NFE}-NFE samples cached after the first run).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
