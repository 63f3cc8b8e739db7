"""Train (or resume) and install the small models of the RB-Modulation digits protocol as package assets.

RB-Modulation (Rout et al., ICLR 2025), section C.7 of the spec; docs/methods/rb_modulation.md.

* ``digits_styles``: ``configs/rbmod_digits.json``, a class-conditional 3 x 384 ReLU MLP EDM denoiser on the digits in
  three stroke styles, without style labels (4000 steps, batch 256; about 70 s on one thread);
* ``digits_styles_cnn``: ``configs/rbmod_style_cnn.json``, the CSD-analogue style CNN (1500 steps; about 2 minutes);
* ``digits_styles_dit``: ``configs/rbmod_style_dit.json``, the style-token in-context DiT of the functional AFA test
  (4000 steps, batch 256; about 12 minutes on one shared thread). Needs ``digits_styles_cnn`` (its style bank).

Each asset gets ``config.json`` + ``model.safetensors`` and a ``metrics.json`` (recipe, loss or accuracies, time).

    OMP_NUM_THREADS=1 python scripts/make_control_assets.py [--only digits_styles]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.app.recipes.rbmod import train_recipe
from steerdiff.control.descriptors import train_style_cnn
from steerdiff.control.styles import styled_digits

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "steerdiff" / "assets"


def _install(src: Path, name: str, metrics: dict) -> None:
    dest, tmp = ASSETS / name, ASSETS / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"{name}: {json.dumps(metrics)}")


def _env(start: float) -> dict:
    return {"wall_time_s": round(time.perf_counter() - start, 1), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "machine": platform.machine(),
            "command": "python scripts/make_control_assets.py"}


def _make_recipe(recipe: str, name: str) -> dict:
    start = time.perf_counter()
    result = train_recipe(ROOT / "configs" / recipe, resume=True)
    last = result.history[-1] if result.history else {}
    metrics = {"recipe": f"configs/{recipe}", "train_steps": result.step, "final_loss": last.get("loss"),
               "train_seconds": last.get("seconds")} | _env(start)
    _install(Path(result.final_dir), name, metrics)
    return metrics


def make_generator() -> dict:
    return _make_recipe("rbmod_digits.json", "digits_styles")


def make_style_dit() -> dict:
    return _make_recipe("rbmod_style_dit.json", "digits_styles_dit")


def make_cnn() -> dict:
    start = time.perf_counter()
    cfg = json.loads((ROOT / "configs" / "rbmod_style_cnn.json").read_text())["train"]
    net = train_style_cnn(**cfg)
    x, y, s = styled_digits("all")
    with torch.no_grad():
        style_acc = float((net.style_logits(x).argmax(1) == s).float().mean())
        content_acc = float((net.content_logits(x).argmax(1) == y).float().mean())
    metrics = {"recipe": "configs/rbmod_style_cnn.json", "style_probe_accuracy_train": style_acc,
               "content_accuracy_train": content_acc} | cfg | _env(start)
    with tempfile.TemporaryDirectory() as tmp:
        sd.models.save(net, Path(tmp) / "m")
        _install(Path(tmp) / "m", "digits_styles_cnn", metrics)
    return metrics


MAKERS = {"digits_styles": make_generator, "digits_styles_cnn": make_cnn, "digits_styles_dit": make_style_dit}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(MAKERS), action="append")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.only or list(MAKERS):  # the DiT's style bank needs the CNN first
        MAKERS[name]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
