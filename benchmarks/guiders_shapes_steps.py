"""Why APG at w = 7.5 on shapes disagreed between two tables: ``benchmarks/guiders.py`` run at 128 images x Heun 12
(FID 7.18, conformity 0.828; CFG 9.27 / 0.797) and ``benchmarks/guidance.py`` (Euler 32 steps, 1,000 images: APG
FID 1.04, accuracy 0.996). Same model, options (eta 0, momentum -0.5, r_rms 0.1), seeds and measures
(``benchmarks/guidance.py``'s ``load_setup`` / ``evaluate``); only the sampler and step count vary here, CFG beside
APG, 128 images per row.

    OMP_NUM_THREADS=1 python benchmarks/guiders_shapes_steps.py

Writes ``benchmarks/results/guidance/archive/guiders_shapes_heun12_diag.{json,md}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import guidance as gbench  # noqa: E402
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

from steerdiff.guidance import build_guider  # noqa: E402
from steerdiff.metrics.images import classifier_features  # noqa: E402

RUNS = (("heun", 12), ("euler", 23), ("heun", 20), ("euler", 32))  # Heun 12 and Euler 23: the same NFE (23)
GUIDERS = (("cfg", {}), ("apg", {"eta": 0.0, "momentum": -0.5, "r_rms": 0.1}))


def main(argv=None) -> int:
    torch.set_num_threads(1)
    meta = provenance(argv, script=__file__)
    setup = gbench.load_setup("shapes", 1000)
    if setup is None:
        return 1
    real_f = classifier_features(setup["classifier"], setup["real"])
    rows = []
    for sampler, steps in RUNS:
        setup["sampler"] = sampler
        for name, opts in GUIDERS:
            with torch.no_grad():
                r = gbench.evaluate(setup, build_guider(name, 7.5, **opts), 128, steps, 0, real_f)
            rows.append({"sampler": sampler, "steps": steps, "guider": name, **r})
            print(rows[-1], flush=True)
    folder = results_dir("guidance") / "archive"
    write_json(folder / "guiders_shapes_heun12_diag.json", {"meta": meta, "w": 7.5, "n": 128, "rows": rows})
    table = markdown_table(["sampler", "steps", "guider", "feature FID", "conformity", "precision", "recall", "dS",
                            "NFE"],
                           [[r["sampler"], r["steps"], r["guider"], f"{r['fid']:.3f}", f"{r['accuracy']:.3f}",
                             f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['saturation_offset']:+.3f}",
                             f"{r['nfe']:g}"] for r in rows])
    write_text(folder / "guiders_shapes_heun12_diag.md", "\n".join([
        "# Shapes at w = 7.5: the sampler, not the guider\n", provenance_line(meta), "", __doc__.split("\n\n")[0],
        "", table]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
