"""Re-runnable NAMM recipes (``configs/*namm*.json``): maps, mirror-space model, like-for-like plain model, bundle.

Recipe format (see ``configs/digits_namm.json``)::

    {"name", "data": {"name": "brightness_digits" | "unit_circle", ...},
     "namm": {"forward": {ICNNMap kwargs}, "inverse": {ResidualMLP kwargs}, "train": {NAMMConfig},
              "finetune": null | {"samples": n (0: no MDM samples, f continues on g(x) + σz), NAMMConfig overrides}},
     "model": {"class": "EDMPrecond", ...},   # the same architecture for the mirror-space and the plain model
     "train": {TrainConfig}, "sampler": {"steps", "sigma_min", "sigma_max"}, "out_dir"}

Stages (``python -m steerdiff.app.recipes.namm <recipe> --stages maps,mirror,plain,finetune,bundle``):

* ``maps``: :func:`~.namm.train_namm` -> ``<out>/maps`` (a NAMM directory without model);
* ``mirror``: the MDM on ``g(x)`` with the library trainer -> ``<out>/mirror`` (resumable);
* ``plain``: the same model and budget on ``x`` -> ``<out>/plain`` (the like-for-like baseline);
* ``finetune``: the paper's optional finetuning of ``f`` on MDM samples (``g`` frozen) -> ``<out>/maps_ft``;
* ``bundle``: maps (finetuned if present) + MDM -> ``<out>/bundle`` (what is shipped).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import Tensor

from ...constrain.distances import TotalBrightness, brightness_digits, unit_circle_data, unit_circle_distance
from ...constrain.inverse_net import ResidualMLP
from ...constrain.io import load_namm, save_namm
from ...constrain.mirror import MirrorDenoiser, train_mirror_model
from ...constrain.namm import NAMMConfig, train_namm
from ...io import read_json
from ...models.icnn import ConvICNNMap, ICNNMap
from ...models.io import build_model
from ...train.recipes import resolve_config
from ...train.trainer import TrainConfig, train

STAGES = ("maps", "mirror", "plain", "finetune", "bundle")


def load_constraint_data(spec: dict, split: str = "train") -> tuple[Tensor, Tensor | None, object]:
    """``(x, cond or None, distance)`` for a recipe's ``data`` entry; ``split="test"`` gives held-out data."""
    opts = dict(spec)
    name = opts.pop("name", None)
    if name == "brightness_digits":
        total = float(opts.get("total", 20.0))
        x, y = brightness_digits(split if split == "test" else opts.get("split", "train"), total)
        return x, y, TotalBrightness(total)
    if name == "unit_circle":
        n, seed = int(opts.get("n", 20000)), int(opts.get("seed", 0))
        if split == "test":
            n, seed = int(opts.get("n_test", 4000)), seed + 1000
        return unit_circle_data(n, seed), None, unit_circle_distance
    raise ValueError(f"unknown NAMM data {name!r}; expected 'brightness_digits' or 'unit_circle'")


def build_maps(namm_spec: dict):
    fwd = dict(namm_spec["forward"])
    cls = ConvICNNMap if fwd.pop("kind", "dense") == "conv" else ICNNMap
    return cls(**fwd), ResidualMLP(**namm_spec["inverse"])


def _build(recipe: dict, seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(recipe["model"])


def mirror_samples(md: MirrorDenoiser, n: int, recipe: dict, seed: int, cond: Tensor | None = None):
    """``n`` raw mirror-space samples of the MDM (sampler of the recipe), for finetuning."""
    from ...core import randn, sample, sigmas

    s = recipe.get("sampler", {})
    sig = sigmas.karras(s.get("steps", 30), s.get("sigma_min", 0.002), s.get("sigma_max", 80.0))
    out = []
    for i in range(0, n, 500):
        b = min(500, n - i)
        c = None if cond is None else cond[i:i + b]
        with torch.no_grad():
            out.append(sample(md, randn((b, *md.sample_shape), seeds=seed + i), sig, cond=c))
    return torch.cat(out)


def _has_checkpoint(directory: Path) -> bool:
    from ...train.checkpoint import latest_checkpoint

    return latest_checkpoint(directory) is not None  # resume an interrupted (or finished) run


def _maps_done(directory: Path, recipe: dict) -> bool:
    if not (directory / "namm.json").is_file():
        return False
    saved = read_json(directory / "namm.json").get("config", {})
    want = NAMMConfig.from_dict(recipe["namm"]["train"]).to_dict()
    return all(saved.get(k, v) == v for k, v in want.items() if k != "log_every")  # bookkeeping may differ


def run(recipe_path: str | Path, stages=STAGES, progress: bool = False, out_dir: str | Path | None = None) -> dict:
    """Run the named stages of a NAMM recipe (default run directory: the recipe's ``out_dir``); returns the paths."""
    path = resolve_config(recipe_path)
    recipe = read_json(path)
    out = Path(out_dir or recipe.get("out_dir") or Path("runs") / recipe.get("name", path.stem))
    x, cond, distance = load_constraint_data(recipe["data"])
    data = (x,) if cond is None else (x, cond)
    cfg = TrainConfig.from_dict(recipe["train"])
    paths: dict = {}
    for stage in stages:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {STAGES}")
    if "maps" in stages and _maps_done(out / "maps", recipe):
        paths["maps"] = out / "maps"  # already trained with this config: keep it (a mirror model may depend on it)
    elif "maps" in stages:
        ncfg = NAMMConfig.from_dict(recipe["namm"]["train"])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ncfg.seed)
            fwd, inv = build_maps(recipe["namm"])
        namm = train_namm(x, distance, fwd, inv, ncfg, progress=progress)
        xt, _, _ = load_constraint_data(recipe["data"], "test")
        paths["maps"] = save_namm(namm, out / "maps", extra={"heldout": namm.evaluate(xt)})
        print(f"maps: {json.dumps(namm.evaluate(xt))}", flush=True)
    if "mirror" in stages:
        namm, _ = load_namm(out / "maps", distance)
        res = train_mirror_model(namm, _build(recipe, cfg.seed), data, cfg, out / "mirror",
                                 resume=_has_checkpoint(out / "mirror"), progress=progress)
        paths["mirror"] = res.final_dir
    if "plain" in stages:
        res = train(_build(recipe, cfg.seed), data, cfg, out / "plain", resume=_has_checkpoint(out / "plain"),
                    progress=progress)
        paths["plain"] = res.final_dir
    if "finetune" in stages and recipe["namm"].get("finetune"):
        from ...models.io import load

        ft = dict(recipe["namm"]["finetune"])
        n = int(ft.pop("samples", 2000))
        namm, _ = load_namm(out / "maps", distance)
        samples = None  # samples 0: continue f alone on perturbed g(x) (g frozen)
        if n > 0:  # finetuning: perturbed MDM samples (drawn once, seed 10**6, like gen_mdm_data.py)
            model = load(out / "mirror" / "final")
            fp = read_json(out / "mirror" / "mirror.json")["forward_fingerprint"]
            md = MirrorDenoiser(model, namm, trained_on=fp)
            lab = None if cond is None else torch.arange(n) % int(cond.max() + 1)
            samples = mirror_samples(md, n, recipe, seed=10**6, cond=lab)
        namm.finetune(x, samples, {**namm.config, **ft}, progress=progress)
        xt, _, _ = load_constraint_data(recipe["data"], "test")
        paths["finetune"] = save_namm(namm, out / "maps_ft", extra={"heldout": namm.evaluate(xt)})
    if "bundle" in stages:
        from ...models.io import load

        maps = out / "maps_ft" if (out / "maps_ft" / "namm.json").is_file() else out / "maps"
        namm, _ = load_namm(maps, distance)
        model = load(out / "mirror" / "final")
        model.namm_fingerprint = read_json(out / "mirror" / "mirror.json")["forward_fingerprint"]
        xt, _, _ = load_constraint_data(recipe["data"], "test")
        paths["bundle"] = save_namm(namm, out / "bundle", mirror_model=model,
                                    extra={"heldout": namm.evaluate(xt), "recipe": str(path.name)})
    return paths


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Run a NAMM recipe (configs/*namm*.json).")
    ap.add_argument("recipe")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(run(args.recipe, args.stages.split(",")))


if __name__ == "__main__":
    main()
