"""Train (or resume) and install the two small digits generators of the local-geometry claims as package assets.

"What Secrets Do Your Manifolds Hold?" (Humayun et al., 2025), section B.5 of the spec; docs/methods/geometry.md.

* ``digits_geometry``: ``configs/geometry_digits.json``, an unconditional 3 x 256 ReLU MLP EDM denoiser on all 1797
  digits (4000 steps, batch 256; about 1 CPU-minute on one thread);
* ``digits_geometry_mem``: ``configs/geometry_digits_mem.json``, the same network on 300 digits of which 10 appear
  100 times each (the memorising model of claim 6).

Runs train in ``runs/geometry/<name>`` (the directories ``benchmarks/geometry.py`` uses, so after that benchmark
this only installs). Each asset gets ``config.json`` + ``model.safetensors`` and a ``metrics.json`` with its
recipe, training loss and FID-digits / precision / recall of 500 samples (map (a): 20-step DDIM) against the test
split, and, for the memorising model, the share of samples within the memorisation threshold of a duplicated image.

    OMP_NUM_THREADS=1 python scripts/make_geometry_assets.py [--only digits_geometry]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.app.protocols.geometry import memorised
from steerdiff.app.recipes.geometry import duplicated_digits, train_recipe
from steerdiff.data.digits import load_digits
from steerdiff.metrics.images import classifier_features, feature_scores
from steerdiff.models.io import load

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "steerdiff" / "assets"
RECIPES = {"digits_geometry": "geometry_digits", "digits_geometry_mem": "geometry_digits_mem"}


def make(name: str, n_eval: int = 500) -> dict:
    start = time.perf_counter()
    recipe = ROOT / "configs" / f"{RECIPES[name]}.json"
    result = train_recipe(recipe, resume=True)
    model = result.model.eval()
    with torch.no_grad():
        x = sd.sample(model, sd.randn((n_eval, 1, 8, 8), seeds=0), sd.sigmas.karras(20, 0.002, 40.0),
                      method="ddim").clamp(-1, 1)
    clf = load("digits_classifier")
    scores = feature_scores(classifier_features(clf, load_digits("test")[0]), classifier_features(clf, x))
    metrics = {"fid_digits_vs_test": scores["fid"], "precision": scores["precision"], "recall": scores["recall"],
               "n": n_eval, "sampler": "ddim (eta 0), 20 steps, karras(0.002, 40, rho 7)", "train_steps": result.step,
               "final_loss": result.history[-1]["loss"] if result.history else None,
               "recipe": f"configs/{RECIPES[name]}.json"}
    if name == "digits_geometry_mem":
        data = duplicated_digits(**{k: v for k, v in json.loads(recipe.read_text())["data"].items() if k != "name"})
        mem, _, thr = memorised(x, data.duplicated, data.unique)
        metrics |= {"memorised_fraction": float(mem.double().mean()), "memorisation_threshold": thr}
    metrics |= {"wall_time_s": round(time.perf_counter() - start, 1), "threads": torch.get_num_threads(),
                "torch": torch.__version__, "machine": platform.machine(),
                "command": "python scripts/make_geometry_assets.py"}
    dest, tmp = ASSETS / name, ASSETS / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(result.final_dir, tmp)
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"{name}: {json.dumps(metrics)}")
    return metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(RECIPES), action="append")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.only or sorted(RECIPES):
        make(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
