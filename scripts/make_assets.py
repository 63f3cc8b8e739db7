"""Re-create the checkpoints shipped in ``steerdiff/assets/`` (``make assets``), with their logs and metrics.

    python scripts/make_assets.py [--only digits_classifier,digits,toy2d] [--resume] [--threads 2]

* ``digits_classifier``: the CNN whose features define FID-digits / precision / recall (target: test accuracy
  >= 97%).
* ``digits``: the class-conditional UNet of ``configs/digits_unet.json``; evaluated with 2,000 samples at guidance
  scales 1, 2, 3 (class accuracy, FID-digits against the test split, precision, recall), beside the FID-digits
  between the train and test splits themselves.
* ``shapes_classifier``: two-head CNN (shape, colour) on the ``full`` coloured shapes (guidance.md 6.5: >= 0.99
  per head on fresh data); its features define FID / precision / recall on shapes.
* ``shapes``: the class-conditional model of ``configs/shapes_unet.json`` (16 classes = shape x 4 + colour,
  guidance.md 6.6; ``--shapes-recipe shapes_dit`` trains the spec's in-context DiT instead, which gave blobby shapes
  on this budget); evaluated like ``digits`` against fresh shapes.
* ``toy2d``: the two-moons MLP of ``configs/toy2d_mlp.json``; sliced W2 of its samples against fresh data.

Training runs write resumable checkpoints under ``runs/`` (``--resume`` continues them). Each asset directory
gets ``config.json`` + ``model.safetensors`` and a ``metrics.json`` recording how it was made and how it scores.
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
from steerdiff.data.digits import load_digits
from steerdiff.metrics.images import class_accuracy, classifier_features, frechet_distance, precision_recall
from steerdiff.metrics.quality import evaluate_conditional
from steerdiff.models import io
from steerdiff.models.classifier import ImageClassifier
from steerdiff.train.classifier import train_classifier
from steerdiff.train.recipes import train_from_config

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "steerdiff" / "assets"
CLASSIFIER_RECIPE = {
    "model": {"in_channels": 1, "classes": [10], "channels": [32, 64, 128], "feature_dim": 64, "dropout": 0.2},
    "train": {"steps": 1500, "batch_size": 128, "lr": 2e-3, "weight_decay": 1e-4, "max_shift": 1, "noise_std": 0.1,
              "seed": 0},
}


def _provenance(start: float, threads: int) -> dict:
    return {"wall_time_s": round(time.perf_counter() - start, 1), "threads": threads, "torch": torch.__version__,
            "machine": platform.machine(), "command": "python scripts/make_assets.py"}


def _install(src_dir: Path, name: str, metrics: dict) -> Path:
    """Copy a saved model into the package assets with its metrics (via a temporary dir, then rename)."""
    dest = ASSETS / name
    tmp = ASSETS / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src_dir, tmp)
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def make_digits_classifier(threads: int) -> dict:
    start = time.perf_counter()
    x, y = load_digits("train")
    xt, yt = load_digits("test")
    torch.manual_seed(CLASSIFIER_RECIPE["train"]["seed"])
    model = ImageClassifier(**CLASSIFIER_RECIPE["model"])
    train_classifier(x, y, model, **CLASSIFIER_RECIPE["train"])
    metrics = {"test_accuracy": class_accuracy(model, xt, yt), "train_accuracy": class_accuracy(model, x, y),
               "recipe": CLASSIFIER_RECIPE, **_provenance(start, threads)}
    tmp = ROOT / "runs" / "digits_classifier"
    io.save(model, tmp)
    _install(tmp, "digits_classifier", metrics)
    print(f"digits_classifier: test accuracy {metrics['test_accuracy']:.4f}")
    return metrics


SHAPES_CLASSIFIER_RECIPE = {
    "model": {"in_channels": 3, "classes": [4, 4], "channels": [32, 64, 128], "feature_dim": 64, "dropout": 0.2},
    "train": {"steps": 1500, "batch_size": 128, "lr": 2e-3, "weight_decay": 1e-4, "max_shift": 0, "noise_std": 0.1,
              "seed": 0},
    "data": {"n": 20000, "split": "full", "seed": 1},
}


def make_shapes_classifier(threads: int) -> dict:
    from steerdiff.data.shapes import generate

    start = time.perf_counter()
    rec = SHAPES_CLASSIFIER_RECIPE
    x, y = generate(rec["data"]["n"], rec["data"]["split"], "train", seed=rec["data"]["seed"])
    xt, yt = generate(4000, "full", "train", seed=12345)  # fresh images, never trained on
    torch.manual_seed(rec["train"]["seed"])
    model = ImageClassifier(**rec["model"])
    train_classifier(x, y, model, **rec["train"])
    pred = model.predict(xt)
    metrics = {"fresh_accuracy_shape": float((pred[:, 0] == yt[:, 0]).double().mean()),
               "fresh_accuracy_colour": float((pred[:, 1] == yt[:, 1]).double().mean()),
               "fresh_accuracy_both": class_accuracy(model, xt, yt), "recipe": rec, **_provenance(start, threads)}
    tmp = ROOT / "runs" / "shapes_classifier"
    io.save(model, tmp)
    _install(tmp, "shapes_classifier", metrics)
    print(f"shapes_classifier: {json.dumps({k: v for k, v in metrics.items() if 'accuracy' in k})}")
    return metrics


def make_shapes(threads: int, resume: bool, n_eval: int, recipe_name: str = "shapes_unet") -> dict:
    from steerdiff.data.shapes import generate

    start = time.perf_counter()
    recipe = ROOT / "configs" / f"{recipe_name}.json"
    result = train_from_config(recipe, resume=resume, out_dir=ROOT / "runs" / recipe_name)
    model = result.model.eval()
    clf = io.load(ASSETS / "shapes_classifier")
    real, real_y = generate(n_eval, "full", "train", seed=777)
    real2, _ = generate(n_eval, "full", "train", seed=778)
    f_real, f_real2 = classifier_features(clf, real), classifier_features(clf, real2)
    p_rr, r_rr = precision_recall(f_real, f_real2)
    reference = {"fid_fresh_vs_fresh": frechet_distance(f_real, f_real2), "precision_fresh_vs_fresh": p_rr,
                 "recall_fresh_vs_fresh": r_rr}
    by_scale = {}
    joint_clf = _JointLabels(clf)
    for scale in (1.0, 3.0):
        by_scale[str(scale)] = evaluate_conditional(model, joint_clf, real, num_classes=16, n=n_eval, steps=30,
                                                    scale=scale, seed=0)
        print(f"shapes scale {scale}: {json.dumps(by_scale[str(scale)])}")
    metrics = {"reference": reference, "by_scale": by_scale, "sampler": "heun, 30 steps, karras(0.002, 80)",
               "labels": "class = shape * 4 + colour", "train_steps": result.step,
               "recipe": f"configs/{recipe_name}.json",
               **_provenance(start, threads)}
    _install(result.final_dir, "shapes", metrics)
    return metrics


class _JointLabels(torch.nn.Module):
    """The two-head shapes classifier seen as one 16-way classifier (class = shape * 4 + colour)."""

    def __init__(self, clf: ImageClassifier):
        super().__init__()
        self.clf = clf

    def features(self, x):
        return self.clf.features(x)

    def predict(self, x):
        p = self.clf.predict(x)
        return p[:, 0] * 4 + p[:, 1]


def make_digits(threads: int, resume: bool, n_eval: int) -> dict:
    start = time.perf_counter()
    recipe = ROOT / "configs" / "digits_unet.json"
    result = train_from_config(recipe, resume=resume, out_dir=ROOT / "runs" / "digits_unet")
    model = result.model.eval()
    clf = io.load(ASSETS / "digits_classifier")
    x_train, _ = load_digits("train")
    x_test, _ = load_digits("test")
    f_train, f_test = classifier_features(clf, x_train), classifier_features(clf, x_test)
    p_tt, r_tt = precision_recall(f_test, f_train)
    reference = {"fid_train_vs_test": frechet_distance(f_test, f_train), "precision_train_vs_test": p_tt,
                 "recall_train_vs_test": r_tt}
    by_scale = {}
    for scale in (1.0, 2.0, 3.0):
        by_scale[str(scale)] = evaluate_conditional(model, clf, x_test, num_classes=10, n=n_eval, steps=30,
                                                    scale=scale, seed=0)
        print(f"digits scale {scale}: {json.dumps(by_scale[str(scale)])}")
    metrics = {"reference": reference, "by_scale": by_scale, "sampler": "heun, 30 steps, karras(0.002, 80)",
               "train_steps": result.step, "recipe": "configs/digits_unet.json", **_provenance(start, threads)}
    _install(result.final_dir, "digits", metrics)
    return metrics


def make_toy2d(threads: int, resume: bool) -> dict:
    start = time.perf_counter()
    result = train_from_config(ROOT / "configs" / "toy2d_mlp.json", resume=resume, out_dir=ROOT / "runs" / "toy2d_mlp")
    model = result.model.eval()
    noise = sd.randn((4000, 2), seeds=0)
    with torch.no_grad():
        x = sd.sample(model, noise, sd.sigmas.karras(50, 0.002, 80.0), method="heun")
    from steerdiff.data.toy2d import load_toy

    fresh, fresh2 = load_toy("moons", 4000, seed=101), load_toy("moons", 4000, seed=102)
    metrics = {"sliced_w2_to_data": sd.metrics.sliced_wasserstein(x, fresh),
               "sliced_w2_data_vs_data": sd.metrics.sliced_wasserstein(fresh2, fresh),
               "train_steps": result.step, "recipe": "configs/toy2d_mlp.json", **_provenance(start, threads)}
    _install(result.final_dir, "toy2d", metrics)
    print(f"toy2d: {json.dumps(metrics)}")
    return metrics


def main() -> None:
    ap = argparse.ArgumentParser(description="Re-create the shipped checkpoints.")
    ap.add_argument("--only", default="digits_classifier,digits,toy2d,shapes_classifier,shapes")
    ap.add_argument("--resume", action="store_true", help="continue interrupted training runs under runs/")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-eval", type=int, default=2000)
    ap.add_argument("--shapes-recipe", default="shapes_unet", help="configs/<name>.json for the shapes model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ASSETS.mkdir(parents=True, exist_ok=True)
    wanted = args.only.split(",")
    unknown = set(wanted) - {"digits_classifier", "digits", "toy2d", "shapes_classifier", "shapes"}
    if unknown:
        raise SystemExit(f"--only: unknown assets {sorted(unknown)}")
    if "digits_classifier" in wanted:
        make_digits_classifier(args.threads)
    if "digits" in wanted:
        make_digits(args.threads, args.resume, args.n_eval)
    if "toy2d" in wanted:
        make_toy2d(args.threads, args.resume)
    if "shapes_classifier" in wanted:
        make_shapes_classifier(args.threads)
    if "shapes" in wanted:
        make_shapes(args.threads, args.resume, args.n_eval, args.shapes_recipe)


if __name__ == "__main__":
    main()
