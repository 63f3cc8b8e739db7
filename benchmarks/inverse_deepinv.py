"""deepinv's DPS, DiffPIR and DDRM beside steerdiff's solvers on the exact mixture posteriors, at equal NFE
(docs/methods/inverse.md, "Against deepinv").

Same problems, metrics and seeds as benchmarks/inverse_solvers.py (gauss, G1, ring, G2; posterior-mean error,
spread ratio, sliced W2 to exact samples, means over each set's problems), same prior (steerdiff's exact
``GaussianMixture`` wrapped as a deepinv ``Denoiser``, :mod:`_deepinv`) and same measurements. deepinv rows:

- ``dps score w=...``: steerdiff's DPS in the score form (``step_form="score"``, deepinv's): the weight grid below
  converted to steerdiff's units (``w / (2c)``, ``c`` the adapter's scaling); ``dps score best`` as below.
- ``deepinv dps w=...``: ``deepinv.sampling.DPS`` at its defaults (VP schedule, DDPM solver, norm guidance, final
  denoising step) with ``num_steps = NFE + 1`` (its ancestral solver makes ``num_steps - 1`` calls, plus the final
  denoising: NFE calls); the weight grid {1, 3, 10, 30, 100, 300} (1 is its default); ``deepinv dps best`` = the
  lowest mean error per set.
- ``deepinv diffpir``: ``deepinv.sampling.DiffPIR`` at its defaults (``lambda_ = 7``, ``zeta = 0.1``), ``max_iter =
  NFE``.
- ``deepinv ddrm``: ``deepinv.sampling.DDRM`` at its defaults (``eta = 0.85``, ``etab = 1``) on steerdiff's levels
  (``vp_linear_levels(NFE)``, in deepinv's units, then 0: its last call is the identity ``D(x, 0)``).
- ``deepinv ddrm (noise x sqrt2)``: the same with its fresh noise scaled back by ``sqrt(2)`` (deepinv draws
  ``std * randn / sqrt(2)``; the paper's eq. 8 has ``std * randn``): this is steerdiff's DDRM step for step
  (tests/inverse/test_deepinv_reference.py checks equality to 1e-5 on one seed).

deepinv is optional (not in steerdiff's requirements): install it beside the CPU torch with ``pip install --no-deps
--target DIR deepinv==0.5.0 einops natsort torchmetrics lightning-utilities h5py`` and run with ``PYTHONPATH=DIR``
(torchvision's PyPI wheel cannot load beside the CPU torch; :mod:`_deepinv` imports deepinv without it).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD:DIR python benchmarks/inverse_deepinv.py      # ~10 min CPU

steerdiff's rows are taken from ``solvers.json`` (``inverse_solvers.py``, the same problems, seeds and chains, so the
same numbers) when it has them; ``--rerun-ours`` recomputes them.

Writes ``benchmarks/results/inverse/deepinv.json`` and ``deepinv.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from steerdiff.core.sigmas import vp_linear_levels
from steerdiff.inverse.metrics import posterior_metrics
from steerdiff.io import atomic_write_text, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _deepinv as DI  # noqa: E402
from _common import markdown_table, provenance, provenance_line, results_dir  # noqa: E402
from inverse_solvers import DPS_GRID, KEYS, SOLVERS, problem_sets, run_one  # noqa: E402

DINV_DPS_GRID = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0)


class _SqrtTwoIsOne:
    """numpy for deepinv's DDRM module with ``sqrt(2) = 1`` (its noise divisor), everything else numpy's."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def sqrt(v):
        return 1.0 if v == 2.0 else np.sqrt(v)


def ddrm_paper_noise(adapter, chains, sigmas, seed):
    mod = sys.modules["deepinv.sampling.diffusion"]
    orig, mod.np = mod.np, _SqrtTwoIsOne()
    try:
        return adapter.ddrm(chains, sigmas, seed)
    finally:
        mod.np = orig


def run_deepinv(p, label: str, nfe: int, seed: int) -> tuple[dict, float, int]:
    ad = DI.Adapter(p)
    t = time.process_time()
    if label.startswith("deepinv dps w="):
        x = ad.dps(p.chains, nfe + 1, float(label.split("=")[1]), seed)
    elif label == "deepinv diffpir":
        x = ad.diffpir(p.chains, nfe, seed)
    elif label == "deepinv ddrm":
        x = ad.ddrm(p.chains, vp_linear_levels(nfe).tolist(), seed)
    else:
        x = ddrm_paper_noise(ad, p.chains, vp_linear_levels(nfe).tolist(), seed)
    cpu = time.process_time() - t
    calls = ad.nfe - (1 if "ddrm" in label else 0)  # DDRM's last call is D(x, 0) = x
    return posterior_metrics(x, p.posterior, seed=seed), cpu, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nfe", default="100,400")
    ap.add_argument("--chains", type=int, default=1000)
    ap.add_argument("--rerun-ours", action="store_true", help="rerun steerdiff's solvers instead of taking their rows "
                    "from solvers.json (inverse_solvers.py: same problems, seeds and chains)")
    args = ap.parse_args()
    dinv = DI.load()
    nfes = [int(v) for v in args.nfe.split(",")]
    sets = problem_sets(args.chains)
    score = [f"dps score w={w:g}" for w in DINV_DPS_GRID]  # steerdiff's DPS in deepinv's (score) form, its grid
    ours = [*SOLVERS, "dps auto", *(f"dps s={s:g}" for s in DPS_GRID), *score]
    saved = results_dir("inverse") / "solvers.json"
    reuse = {}
    if not args.rerun_ours and saved.exists():
        prev = json.loads(saved.read_text())
        if prev.get("chains") == args.chains:
            reuse = prev["rows"]
    theirs = [*(f"deepinv dps w={w:g}" for w in DINV_DPS_GRID), "deepinv diffpir", "deepinv ddrm",
              "deepinv ddrm (noise x sqrt2)"]
    out: dict = {"meta": provenance() | {"deepinv": dinv.__version__}, "nfe": nfes, "chains": args.chains,
                 "rows": {}}
    for set_name, problems in sets.items():
        exact = [posterior_metrics(p.posterior.sample(p.chains, generator=torch.Generator().manual_seed(77)),
                                   p.posterior, seed=1000 * j) for j, p in enumerate(problems)]
        out["rows"][f"{set_name} | exact"] = {k: float(np.mean([r[k] for r in exact])) for k in KEYS}
        for nfe in nfes:
            for label in ours + theirs:
                key = f"{set_name} | {nfe} | {label}"
                if label in ours and key in reuse:  # deterministic (seeded): the same numbers as a rerun
                    out["rows"][key] = dict(reuse[key])
                    continue
                rows, cpu = [], 0.0
                for j, p in enumerate(problems):
                    if label in score:  # deepinv's w on ||r|| in its [0, 1] units is w / (2c) in ours
                        w = float(label.split("=")[1]) / (2 * DI.Adapter(p).c)
                        r, c = run_one(p, "dps", nfe, 1000 * j, step_form="score", scale=w)
                    elif label in ours:
                        method, opts = (("dps", {"scale": "auto"}) if label == "dps auto" else
                                        ("dps", {"scale": float(label.split("=")[1])}) if label.startswith("dps")
                                        else (label, {}))
                        r, c = run_one(p, method, nfe, 1000 * j, **opts)
                    else:
                        r, c, calls = run_deepinv(p, label, nfe, 1000 * j)
                        assert calls == nfe, (label, calls, nfe)
                    rows.append(r)
                    cpu += c
                mean = {k: float(np.mean([r[k] for r in rows])) for k in KEYS} | {"cpu_s": cpu}
                out["rows"][f"{set_name} | {nfe} | {label}"] = mean
                print(set_name, nfe, label, {k: round(v, 3) for k, v in mean.items()}, flush=True)
            for name, grid in (("dps best", [f"dps s={s:g}" for s in DPS_GRID]), ("dps score best", score),
                               ("deepinv dps best", [f"deepinv dps w={w:g}" for w in DINV_DPS_GRID])):
                best = min(grid, key=lambda g: out["rows"][f"{set_name} | {nfe} | {g}"]["mean_err"])
                out["rows"][f"{set_name} | {nfe} | {name}"] = dict(out["rows"][f"{set_name} | {nfe} | {best}"],
                                                                    of=best)
    path = results_dir("inverse")
    write_json(path / "deepinv.json", out)
    lines = ["# steerdiff's inverse solvers beside deepinv's DPS / DiffPIR / DDRM on exact posteriors", "",
             provenance_line(out["meta"]) + f"; deepinv {dinv.__version__}", "",
             f"{args.chains} chains per problem, equal NFE; the same exact GaussianMixture prior (wrapped as a deepinv "
             "Denoiser in deepinv's [0, 1] units, benchmarks/_deepinv.py) and measurements; mean over each set's "
             "problems of posterior-mean error / spread ratio (tr Cov(samples) / tr Cov(posterior)) / sliced W2 to "
             "exact samples. `exact` = exact posterior samples of the same size (Monte Carlo floor). `best` rows: "
             "the grid value with the lowest mean error on that set (named in `of`).", "",
             "Command: `OMP_NUM_THREADS=1 PYTHONPATH=$PWD:DIR python benchmarks/inverse_deepinv.py` (DIR: deepinv "
             "installed with --no-deps, see the script).", ""]
    order = [*SOLVERS, "dps auto", "dps best", "dps score best", *score, "deepinv dps best", *theirs]
    for set_name in sets:
        rows = [["exact", "-", *(f"{out['rows'][f'{set_name} | exact'][k]:.3f}" for k in KEYS), "-", ""]]
        for nfe in nfes:
            for label in order:
                r = out["rows"][f"{set_name} | {nfe} | {label}"]
                rows.append([label, nfe, *(f"{r[k]:.3f}" for k in KEYS), f"{r['cpu_s']:.1f}", r.get("of", "")])
        lines += [f"## {set_name}", "", markdown_table(["solver", "NFE", "mean err", "spread", "SW2", "CPU s", "of"],
                                                        rows, "lrrrrrl"), ""]
    atomic_write_text(path / "deepinv.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
