"""Re-create the checkpoints shipped in ``steerdiff/assets/`` (``make assets``), with their logs and metrics.

    python scripts/make_assets.py [--only digits_classifier,digits,toy2d] [--resume] [--threads 2]

* ``digits_classifier``: the CNN whose features define FID-digits / precision / recall (target: test accuracy
  >= 97%).
* ``digits``: the class-conditional UNet of ``configs/digits_unet.json``; evaluated with 2,000 samples at guidance
  scales 1, 2, 3 (class accuracy, FID-digits against the test split, precision, recall), beside the FID-digits
  between the train and test splits themselves.
* ``shapes_classifier``: two-head CNN (shape, colour) on the ``full`` coloured shapes (target: >= 0.99 per head on
  fresh data, the bar the shapes tests assume; docs/methods/coind.md, "The coloured-shapes data"); its features
  define FID / precision / recall on shapes.
* ``shapes``: the class-conditional model of ``configs/shapes_unet.json`` (16 classes = shape x 4 + colour, the
  model of the APG image test, docs/methods/guidance.md "Image test (A1-A5)"; ``--shapes-recipe shapes_dit`` trains
  the in-context DiT first proposed for it instead, which gave blobby shapes on this budget); evaluated like
  ``digits`` against fresh shapes.
* ``shapes_band`` / ``shapes_coind``: two-slot (shape, colour) UNets on the ``band`` split (8 of 16 combos seen),
  vanilla (``configs/shapes_band_vanilla.json``, ``lambda = 0``) and CoInD (``configs/shapes_coind.json``,
  ``lambda = 1``; docs/methods/coind.md, "The CI training objective" and "The coloured-shapes test (P1-P4)"),
  identical otherwise; each ships an ``attributes.json`` (slot names and values, ``has_null``) for ``Compose`` /
  ``sample --expr``. Metrics: the CI loss on training data and AND conformity on held-out / seen combos at
  ``w = 3.5``; the full comparison is ``benchmarks/coind.py``.
* ``digits_flow``: the class-conditional rectified-flow UNet of ``configs/digits_flow.json`` (the ``digits``
  architecture, velocity loss, logit-normal times; ``steerdiff.train.flow``), shipped as a ``FlowModel``; evaluated
  like ``digits`` (2,000 samples, class accuracy, FID-digits against the test split) with Euler from ``sigma = inf``
  on the flow grid ``sd.sigmas.flow(steps)``, at 20 and 50 steps and with CFG 2 at 20 steps.
* ``digits_weak``: AutoGuidance's weak model for ``digits`` (``configs/digits_weak.json``: the same UNet at smaller
  width, one residual block per level, 1000 steps); scored unguided like ``digits``.
* ``shapes_weak``: AutoGuidance's weak model for ``shapes`` (``configs/shapes_weak.json``: the same UNet at half
  the width, one residual block per level, a third of the steps); scored unguided like ``shapes``.
* ``graphs_lggm``: the LGGM text-to-graph model (a small DiGress graph transformer with a bag-of-words prompt
  encoder, all graph domains; ``steerdiff.app.recipes.graphs_lggm``; docs/methods/lggm.md), with ``training.json``
  (CPU and wall time, the recipe); its text-to-graph conformity is ``benchmarks/text_to_graph.py``.
* ``toy2d``: the two-moons MLP of ``configs/toy2d_mlp.json``; sliced W2 of its samples against fresh data.
* ``digits_mlp``: the unconditional MLP prior (a) of the inverse-problem digits protocol (docs/methods/inverse.md,
  "The digits protocol"; ``configs/digits_mlp.json``, about 5 CPU-minutes); FID-digits / precision / recall of its
  unconditional samples against the test split.
* ``digits_ocm``: the OCM covariance head (Ou et al., ICLR 2025; docs/methods/ocm.md, "Heads" and "Digits gate")
  of the shipped ``digits`` UNet, trained on its frozen trunk with ``OCM_DIGITS_RECIPE``; stores the denoiser's
  fingerprint and the head's accuracy against a 64-probe Monte Carlo diagonal
  (``steerdiff.app.recipes.ocm_digits``). Needs
  ``digits``; retrain it whenever ``digits`` changes.

* ``advection_dydiff`` / ``advection_baseline``: Dynamical Diffusion (``r = 0.5``) and its standard conditional
  baseline (``r = 0``) on the 1-D stochastic advection-diffusion field (``configs/advection_*.json``; the equal-budget
  protocol of docs/methods/dydiff.md, about 1-2 CPU-minutes each on one thread); ``metrics.json`` holds the test-set
  ensemble-mean MSE and fair CRPS beside persistence and the oracle. ``benchmarks/dydiff.py`` trains its seed-0 1-D
  arms in the same run directories, so ``--resume`` after it ships those runs.

* ``motiondreamer_biped`` / ``motiondreamer_quadruped`` / ``motiondreamer_snake``: MotionDreamer (Wang et al., ICLR
  2025; docs/methods/motiondreamer.md, "Shipped models"): the motion tokeniser and the local masked generator of each
  skeleton's reference motion (``steerdiff.app.recipes.motiondreamer``: tokeniser 500 steps, generator 2000; about
  85 CPU s each); ``motiondreamer.json`` records the training CPU and wall time. Not in the default ``--only``.
* ``diffdis``: the DiffDIS segmenter (docs/methods/diffdis.md, "Inference and the shipped model";
  ``steerdiff.app.recipes.diffdis``): the VAE fine-tuned on the images and maps, mask decoder, latent prior and
  one-step DiffDIS fine-tuning on 1024 procedural 64x64 images, then the light mask decoder in ``light_decoder/``
  (docs/methods/diffdis.md, "The light mask decoder") and the light image encoder in ``light_encoder/`` ("The
  light image encoder"); ``config.json``'s ``metadata`` records the CPU and wall seconds of every stage (the light
  decoder's and encoder's in their own ``config.json``).

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
from steerdiff.app.protocols.quality import evaluate_conditional
from steerdiff.data.digits import load_digits
from steerdiff.metrics.images import class_accuracy, classifier_features, feature_scores
from steerdiff.models.classifier import ImageClassifier
from steerdiff.models.io import load, save
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
    save(model, tmp)
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
    save(model, tmp)
    _install(tmp, "shapes_classifier", metrics)
    print(f"shapes_classifier: {json.dumps({k: v for k, v in metrics.items() if 'accuracy' in k})}")
    return metrics


def make_shapes(threads: int, resume: bool, n_eval: int, recipe_name: str = "shapes_unet") -> dict:
    from steerdiff.data.shapes import generate

    start = time.perf_counter()
    recipe = ROOT / "configs" / f"{recipe_name}.json"
    result = train_from_config(recipe, resume=resume, out_dir=ROOT / "runs" / recipe_name)
    model = result.model.eval()
    clf = load(ASSETS / "shapes_classifier")
    real, real_y = generate(n_eval, "full", "train", seed=777)
    real2, _ = generate(n_eval, "full", "train", seed=778)
    f_real, f_real2 = classifier_features(clf, real), classifier_features(clf, real2)
    reference = {f"{k}_fresh_vs_fresh": v for k, v in feature_scores(f_real, f_real2).items()}
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


COMPOSABLE_SHAPES = {"shapes_band": "shapes_band_vanilla", "shapes_coind": "shapes_coind"}  # asset -> recipe


def make_shapes_composable(name: str, threads: int, resume: bool, n_per_combo: int = 10,
                           stop_after: int | None = None, out_dir: Path | None = None) -> dict:
    """Train (or finish, with ``--resume``) a two-slot band model and ship it with its attributes.

    ``stop_after`` ships the EMA of the checkpoint at that step of the recipe's run (same schedule, so it can be
    continued later with ``--resume``); both band models are shipped at the same step.
    """
    from steerdiff.data.shapes import COLOURS, SHAPES, generate, split_combos
    from steerdiff.guidance import Compose
    from steerdiff.guidance.coind_objective import ci_loss
    from steerdiff.guidance.composable import ATTRIBUTES_FILE
    from steerdiff.metrics.composition import conformity
    from steerdiff.train.recipes import read_json

    start = time.perf_counter()
    recipe_name = COMPOSABLE_SHAPES[name]
    recipe = ROOT / "configs" / f"{recipe_name}.json"
    run_dir = out_dir or ROOT / "runs" / recipe_name
    result = train_from_config(recipe, resume=resume, out_dir=run_dir, stop_after=stop_after)
    model = result.model.eval()
    final_dir = result.final_dir or save(model, Path(run_dir) / f"ema_step_{result.step}")
    attrs = {"shape": list(SHAPES), "colour": list(COLOURS)}
    clf = load(ASSETS / "shapes_classifier")
    g = torch.Generator().manual_seed(0)
    x0, y = generate(1024, "band", "train", seed=4242)
    x0, y = torch.as_tensor(x0), torch.as_tensor(y)
    sigma = (-1.2 + 1.2 * torch.randn(1024, generator=g)).exp()
    with torch.no_grad():
        l_ci = float(ci_loss(model, x0 + sigma[:, None, None, None] * torch.randn(x0.shape, generator=g), sigma, y,
                             torch.randint(2, (1024,), generator=g), model.sigma_data))
    cs = {}
    for part in ("test", "train"):
        scores = []
        for q, (s_, c_) in enumerate(split_combos("band", part)):
            guider = Compose(f"shape={SHAPES[s_]} & colour={COLOURS[c_]}", 3.5, attrs)
            noise = torch.randn(n_per_combo, 3, 12, 12, generator=torch.Generator().manual_seed(q))
            with torch.no_grad():
                x = sd.sample(model, noise, sd.sigmas.karras(24, 0.002, 80.0), method="euler",
                              cond=guider.cond(n_per_combo), guidance=guider)
            scores.append(conformity(clf.predict(x.clamp(-1, 1)), guider.terms))
        cs["held_out" if part == "test" else "seen"] = sum(scores) / len(scores)
    cfg = read_json(recipe)["train"]
    history = result.history
    metrics = {"l_ci_train_data": l_ci, "and_conformity_w3.5": cs, "n_per_combo": n_per_combo,
               "sampler": "euler, 24 steps, karras(0.002, 80)", "train_steps": result.step,
               "recipe_steps": cfg["steps"], "stopped_early": not result.finished,
               "coind_lambda": cfg.get("coind_lambda", 0.0), "ci_fraction": cfg.get("ci_fraction", 1.0),
               "train_seconds_logged": history[-1]["seconds"] if history else None,
               "recipe": f"configs/{recipe_name}.json", "benchmark": "python benchmarks/coind.py --part shapes",
               **_provenance(start, threads)}
    dest = _install(final_dir, name, metrics)
    (dest / ATTRIBUTES_FILE).write_text(json.dumps({"attributes": attrs, "has_null": True,
                                                    "p_null": cfg.get("p_null"), "split": "band"}, indent=2) + "\n")
    print(f"{name}: {json.dumps({k: metrics[k] for k in ('l_ci_train_data', 'and_conformity_w3.5')})}")
    return metrics


def make_digits(threads: int, resume: bool, n_eval: int) -> dict:
    start = time.perf_counter()
    recipe = ROOT / "configs" / "digits_unet.json"
    result = train_from_config(recipe, resume=resume, out_dir=ROOT / "runs" / "digits_unet")
    model = result.model.eval()
    clf = load(ASSETS / "digits_classifier")
    x_train, _ = load_digits("train")
    x_test, _ = load_digits("test")
    f_train, f_test = classifier_features(clf, x_train), classifier_features(clf, x_test)
    reference = {f"{k}_train_vs_test": v for k, v in feature_scores(f_test, f_train).items()}
    by_scale = {}
    for scale in (1.0, 2.0, 3.0):
        by_scale[str(scale)] = evaluate_conditional(model, clf, x_test, num_classes=10, n=n_eval, steps=30,
                                                    scale=scale, seed=0)
        print(f"digits scale {scale}: {json.dumps(by_scale[str(scale)])}")
    metrics = {"reference": reference, "by_scale": by_scale, "sampler": "heun, 30 steps, karras(0.002, 80)",
               "train_steps": result.step, "recipe": "configs/digits_unet.json", **_provenance(start, threads)}
    _install(result.final_dir, "digits", metrics)
    return metrics


def make_digits_weak(threads: int, resume: bool, n_eval: int) -> dict:
    """AutoGuidance's weak digits model (``configs/digits_weak.json``), scored unguided like ``digits``."""
    start = time.perf_counter()
    recipe = ROOT / "configs" / "digits_weak.json"
    result = train_from_config(recipe, resume=resume, out_dir=ROOT / "runs" / "digits_weak", progress=False)
    model = result.model.eval()
    clf = load(ASSETS / "digits_classifier")
    x_test, _ = load_digits("test")
    unguided = evaluate_conditional(model, clf, x_test, num_classes=10, n=n_eval, steps=30, scale=1.0, seed=0)
    history = result.history
    metrics = {"by_scale": {"1.0": unguided}, "sampler": "heun, 30 steps, karras(0.002, 80)",
               "train_steps": result.step, "recipe": "configs/digits_weak.json",
               "final_train_loss": history[-1]["loss"] if history else None,
               "role": "the weak model of AutoGuidance for the shipped digits model (steerdiff.guidance.AutoGuidance)",
               **_provenance(start, threads)}
    _install(result.final_dir, "digits_weak", metrics)
    print(f"digits_weak: {json.dumps(unguided)}")
    return metrics


def make_shapes_weak(threads: int, resume: bool, n_eval: int) -> dict:
    """AutoGuidance's weak shapes model (``configs/shapes_weak.json``), scored unguided like ``shapes``: 16-way
    class conformity (shape and colour both right), feature FID / precision / recall against fresh shapes."""
    from steerdiff.data.shapes import generate

    start = time.perf_counter()
    cpu = time.process_time()
    recipe = ROOT / "configs" / "shapes_weak.json"
    result = train_from_config(recipe, resume=resume, out_dir=ROOT / "runs" / "shapes_weak", progress=False)
    train_cpu = time.process_time() - cpu
    model = result.model.eval()
    clf = load(ASSETS / "shapes_classifier")
    real, _ = generate(n_eval, "full", "train", seed=777)  # the fresh images ``make_shapes`` scores against
    unguided = evaluate_conditional(model, _JointLabels(clf), real, num_classes=16, n=n_eval, steps=30, scale=1.0,
                                    seed=0)
    history = result.history
    metrics = {"by_scale": {"1.0": unguided}, "sampler": "heun, 30 steps, karras(0.002, 80)",
               "labels": "class = shape * 4 + colour", "train_steps": result.step,
               "recipe": "configs/shapes_weak.json", "final_train_loss": history[-1]["loss"] if history else None,
               "train_cpu_s": round(train_cpu, 1),
               "role": "the weak model of AutoGuidance for the shipped shapes model (steerdiff.guidance.AutoGuidance)",
               **_provenance(start, threads)}
    _install(result.final_dir, "shapes_weak", metrics)
    print(f"shapes_weak: {json.dumps(unguided)}")
    return metrics


def _score_flow(model, clf, x_test, n: int, steps: int, scale: float, method: str = "euler") -> dict:
    """Class accuracy / FID-digits / precision / recall of ``n`` flow samples (classes evenly spread, sample ``i``
    from seed ``i``) on ``sd.sigmas.flow(steps)``, the way ``steerdiff.app.protocols.quality`` scores the EDM models."""
    from steerdiff.metrics.images import pairwise_diversity

    labels = torch.arange(n) % 10
    start = time.perf_counter()
    guider = None if scale == 1.0 else sd.guidance.CFG(scale)
    with torch.no_grad():
        x, stats = sd.sample(model, sd.core.randn((n, 1, 8, 8), seeds=0), sd.sigmas.flow(steps), method=method,
                             cond=labels, guidance=guider, return_stats=True)
    wall = time.perf_counter() - start
    x = x.clamp(-1, 1)
    gen_f = classifier_features(clf, x)
    scores = feature_scores(classifier_features(clf, x_test), gen_f)
    return {"n": n, "steps": steps, "method": method, "schedule": f"sd.sigmas.flow({steps})", "scale": scale,
            "nfe": stats.nfe, "wall_time_s": wall, "class_accuracy": class_accuracy(clf, x, labels),
            "fid_features": scores["fid"], "precision": scores["precision"], "recall": scores["recall"],
            "diversity": pairwise_diversity(gen_f[:1000])}


def make_digits_flow(threads: int, resume: bool, n_eval: int) -> dict:
    start = time.perf_counter()
    recipe = ROOT / "configs" / "digits_flow.json"
    result = train_from_config(recipe, resume=resume, out_dir=ROOT / "runs" / "digits_flow", progress=False)
    model = result.model.eval()
    clf = load(ASSETS / "digits_classifier")
    x_train, _ = load_digits("train")
    x_test, _ = load_digits("test")
    reference = {f"{k}_train_vs_test": v for k, v in
                 feature_scores(classifier_features(clf, x_test), classifier_features(clf, x_train)).items()}
    by_sampler = {}
    for steps, scale in ((20, 1.0), (50, 1.0), (20, 2.0)):
        key = f"euler_{steps}" + ("" if scale == 1.0 else f"_cfg{scale:g}")
        by_sampler[key] = _score_flow(model, clf, x_test, n_eval, steps, scale)
        print(f"digits_flow {key}: {json.dumps(by_sampler[key])}")
    history = result.history
    metrics = {"reference": reference, "by_sampler": by_sampler,
               "sampler": "euler from sigma = inf on sd.sigmas.flow(steps) (t = 1 -> 0.001 -> 0)",
               "train_steps": result.step, "recipe": "configs/digits_flow.json",
               "train_seconds_logged": history[-1]["seconds"] if history else None,
               "final_train_loss": history[-1]["loss"] if history else None,
               "benchmark": "python benchmarks/few_step.py", **_provenance(start, threads)}
    _install(result.final_dir, "digits_flow", metrics)
    return metrics


def make_digits_mlp(threads: int, resume: bool, n_eval: int) -> dict:
    start = time.perf_counter()
    recipe = ROOT / "configs" / "digits_mlp.json"
    result = train_from_config(recipe, resume=resume, out_dir=ROOT / "runs" / "digits_mlp")
    model = result.model.eval()
    clf = load(ASSETS / "digits_classifier")
    x_test, _ = load_digits("test")
    noise = sd.randn((n_eval, 1, 8, 8), seeds=0)
    with torch.no_grad():
        x = sd.sample(model, noise, sd.sigmas.karras(30, 0.002, 80.0), method="heun").clamp(-1, 1)
    f_gen, f_test = classifier_features(clf, x), classifier_features(clf, x_test)
    scores = feature_scores(f_test, f_gen)
    metrics = {"fid_digits_vs_test": scores["fid"], "precision": scores["precision"], "recall": scores["recall"],
               "n": n_eval, "sampler": "heun, 30 steps, karras(0.002, 80)", "train_steps": result.step,
               "recipe": "configs/digits_mlp.json", **_provenance(start, threads)}
    _install(result.final_dir, "digits_mlp", metrics)
    print(f"digits_mlp: {json.dumps(metrics)}")
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


FORECASTERS = ("advection_dydiff", "advection_baseline")  # asset name = configs/<name>.json


def make_forecaster(name: str, threads: int, resume: bool) -> dict:
    """A DyDiff forecaster of the 1-D advection field (r = 0.5) or its r = 0 baseline, scored on the fixed test set
    (A.9 protocol: Heun 12 steps, 8 members; ensemble-mean MSE and fair CRPS beside persistence and the oracle)."""
    from steerdiff.app.protocols.forecast import evaluate_forecaster
    from steerdiff.app.recipes.dydiff import train_forecaster

    start = time.perf_counter()
    result = train_forecaster(ROOT / "configs" / f"{name}.json", ROOT / "runs" / name, resume=resume)
    scores = evaluate_forecaster(result.model)
    metrics = {**scores, "r": result.model.r, "train_steps": result.step, "recipe": f"configs/{name}.json",
               "train_seconds": result.history[-1]["seconds"] if result.history else None,
               **_provenance(start, threads)}
    _install(result.final_dir, name, metrics)
    print(f"{name}: {json.dumps(metrics)}")
    return metrics


OCM_DIGITS_RECIPE = {
    # param "softplus" (c = c_out^2 softplus(h + ln(e-1)) > 0 by construction) and the whole VP grid up to 157.4:
    # the former "direct" head with sigma_max 80 predicted c < 0 for 41.6% of the entries of a 10-step run
    # (all of them at sigma 157.4, outside its training range, and 81% at 54.6; issue 40)
    "head": {"hidden": 64, "depth": 2, "param": "softplus", "data_range": [-1.0, 1.0]},
    "train": {"steps": 1200, "batch_size": 128, "lr": 1e-3, "lr_schedule": "cosine", "n_probes": 1,
              "loss_weight": "balanced", "sigma_mode": "mixed", "sigma_max": None, "p_uncond": 0.1, "seed": 0},
    # Sampling default stored with the head: the official code's last-step clip (clip_sigma_idx = 1;
    # docs/methods/ocm.md, "Clamps and clips"), in grey levels.
    "sampling": {"clip_pixel": 1},
}


def make_digits_ocm(threads: int, resume: bool) -> dict:
    from steerdiff.app.recipes.ocm_digits import train_digits_head

    start = time.perf_counter()
    head, metrics = train_digits_head(load(ASSETS / "digits"), OCM_DIGITS_RECIPE, ROOT / "runs" / "digits_ocm",
                                      resume=resume)
    metrics.update({"recipe": OCM_DIGITS_RECIPE, **_provenance(start, threads)})
    from steerdiff.covariance.store import save_head

    tmp = save_head(head, ROOT / "runs" / "digits_ocm" / "final", denoiser=load(ASSETS / "digits"),
                    denoiser_name="digits")
    _install(tmp, "digits_ocm", metrics)
    print(f"digits_ocm: {json.dumps({k: v for k, v in metrics.items() if k != 'recipe'})}")
    return metrics


NAMM_ASSETS = {"digits_namm": "digits_namm", "circle_namm": "circle_namm"}  # asset name -> configs/<recipe>.json


def make_namm(name: str, threads: int, n_eval: int) -> dict:
    """NAMM bundle (maps + mirror-space model; Feng et al., ICLR 2025; docs/methods/namm.md): run the recipe's stages
    (resumable), evaluate plain vs NAMM (steerdiff.app.protocols.namm.compare), ship the bundle with the like-for-like
    plain model beside it (``<asset>/plain``)."""
    from steerdiff.app.protocols.namm import compare
    from steerdiff.app.recipes.namm import run

    start = time.perf_counter()
    recipe = NAMM_ASSETS[name]
    paths = run(recipe, ("maps", "mirror", "plain", "finetune", "bundle"))
    metrics = {**compare(recipe, n=n_eval if name == "digits_namm" else 4000),
               "recipe": f"configs/{recipe}.json", **_provenance(start, threads)}
    dest = _install(paths["bundle"], name, metrics)
    shutil.copytree(Path(paths["bundle"]).parent / "plain" / "final", dest / "plain")
    print(f"{name}: {json.dumps(metrics['rows'])}")
    return metrics


def make_graphs_lggm(threads: int, resume: bool) -> dict:
    """The LGGM text-to-graph model (``steerdiff.app.recipes.graphs_lggm``; docs/methods/lggm.md, "The shipped
    model"): trained in ``runs/graphs_lggm`` (atomic checkpoints; ``--resume`` continues an interrupted run),
    saved with its ``training.json``."""
    from steerdiff.app.recipes.graphs_lggm import train_graphs_lggm

    run_dir = ROOT / "runs" / "graphs_lggm"
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    tmp = ROOT / "runs" / "graphs_lggm_final"
    shutil.rmtree(tmp, ignore_errors=True)
    meta = train_graphs_lggm(run_dir, tmp)
    _install(tmp, "graphs_lggm", meta)
    return meta


MOTIONDREAMER = ("motiondreamer_biped", "motiondreamer_quadruped", "motiondreamer_snake")


def make_motiondreamer(name: str, threads: int) -> dict:
    """MotionDreamer of one skeleton (steerdiff.app.recipes.motiondreamer), trained in runs/ and installed."""
    from steerdiff.app.recipes.motiondreamer import make

    start = time.perf_counter()
    skel = name.removeprefix("motiondreamer_")
    md = make(skel, ROOT / "runs" / name)
    metrics = {**_provenance(start, threads), "train_cpu_s": md.meta["train_cpu_s"],
               "codebook_usage": md.meta["tokenizer_log"].get("usage"),
               "perplexity": md.meta["tokenizer_log"].get("perplexity")}
    _install(ROOT / "runs" / name, name, metrics)
    return metrics


def make_diffdis(threads: int) -> dict:
    """DiffDIS segmenter (Yu et al., ICLR 2025; docs/methods/diffdis.md, "Inference and the shipped model"): the
    recipe's stages (VAE fine-tuning, mask decoder, latent prior, one-step fine-tuning with the edge task) in
    ``runs/diffdis``."""
    from steerdiff.app.recipes.diffdis import make, summary

    start = time.perf_counter()
    meta = make(ROOT / "runs" / "diffdis")
    metrics = {**_provenance(start, threads), **summary(meta),
               "command": "python scripts/make_assets.py --only diffdis"}
    _install(ROOT / "runs" / "diffdis", "diffdis", metrics)
    return metrics


def main() -> None:
    ap = argparse.ArgumentParser(description="Re-create the shipped checkpoints.")
    ap.add_argument("--only", default="digits_classifier,digits,toy2d,shapes_classifier,shapes,digits_ocm")
    ap.add_argument("--resume", action="store_true", help="continue interrupted training runs under runs/")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-eval", type=int, default=2000)
    ap.add_argument("--shapes-recipe", default="shapes_unet", help="configs/<name>.json for the shapes model")
    ap.add_argument("--band-stop-after", type=int, default=None,
                    help="ship shapes_band / shapes_coind from the checkpoint at this step (default: the full recipe)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ASSETS.mkdir(parents=True, exist_ok=True)
    wanted = args.only.split(",")
    unknown = set(wanted) - {"digits_classifier", "digits", "toy2d", "shapes_classifier", "shapes", "digits_ocm",
                             "digits_mlp", "digits_flow", "digits_weak", "shapes_weak",
                             "graphs_lggm", "diffdis", *COMPOSABLE_SHAPES, *NAMM_ASSETS, *FORECASTERS, *MOTIONDREAMER}
    if unknown:
        raise SystemExit(f"--only: unknown assets {sorted(unknown)}")
    if "digits_classifier" in wanted:
        make_digits_classifier(args.threads)
    if "digits" in wanted:
        make_digits(args.threads, args.resume, args.n_eval)
    if "toy2d" in wanted:
        make_toy2d(args.threads, args.resume)
    if "digits_flow" in wanted:  # not in the default --only (after digits_classifier)
        make_digits_flow(args.threads, args.resume, args.n_eval)
    if "digits_weak" in wanted:  # not in the default --only (after digits_classifier)
        make_digits_weak(args.threads, args.resume, args.n_eval)
    if "digits_mlp" in wanted:  # not in the default --only (after digits_classifier)
        make_digits_mlp(args.threads, args.resume, args.n_eval)
    if "shapes_classifier" in wanted:
        make_shapes_classifier(args.threads)
    if "shapes" in wanted:
        make_shapes(args.threads, args.resume, args.n_eval, args.shapes_recipe)
    if "shapes_weak" in wanted:  # not in the default --only (after shapes_classifier)
        make_shapes_weak(args.threads, args.resume, args.n_eval)
    for name in COMPOSABLE_SHAPES:  # not in the default --only: --only shapes_band,shapes_coind
        if name in wanted:
            make_shapes_composable(name, args.threads, args.resume, stop_after=args.band_stop_after)
    if "digits_ocm" in wanted:  # after digits: the head belongs to that exact network (its fingerprint)
        make_digits_ocm(args.threads, args.resume)
    for name in NAMM_ASSETS:  # not in the default --only: --only digits_namm,circle_namm (after digits_classifier)
        if name in wanted:
            make_namm(name, args.threads, args.n_eval)
    for name in FORECASTERS:  # not in the default --only: --only advection_dydiff,advection_baseline
        if name in wanted:
            make_forecaster(name, args.threads, args.resume)
    if "graphs_lggm" in wanted:  # not in the default --only: --only graphs_lggm
        make_graphs_lggm(args.threads, args.resume)
    for name in MOTIONDREAMER:  # not in the default --only
        if name in wanted:
            make_motiondreamer(name, args.threads)
    if "diffdis" in wanted:  # not in the default --only: --only diffdis
        make_diffdis(args.threads)


if __name__ == "__main__":
    main()
