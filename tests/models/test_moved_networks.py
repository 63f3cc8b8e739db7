"""Networks moved under ``steerdiff.models`` (issue 34): every shipped asset still loads by its registered class
name, and the loaded networks are the classes of ``steerdiff.models`` (old import paths: tests/test_moved_paths.py)."""

from __future__ import annotations

import json

import pytest
import torch

import steerdiff as sd
from steerdiff.constrain.io import load_namm
from steerdiff.models.io import ASSETS_DIR, MODEL_REGISTRY

ASSETS = sorted(p.name for p in ASSETS_DIR.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def _classes(spec: dict) -> list[str]:
    """Every registered class name a ``{"class", "config"}`` spec names, nested specs included."""
    out = [spec["class"]] if isinstance(spec.get("class"), str) else []
    for value in (spec.get("config") or {}).values():
        if isinstance(value, dict):
            out += _classes(value)
    return out


def _load(name: str) -> list[torch.nn.Module]:
    """The modules of shipped asset ``name``, loaded the way its users load it."""
    directory = ASSETS_DIR / name
    if (directory / "namm.json").is_file():
        namm, mirror = load_namm(name)
        return [namm.forward_map, mirror]
    if (directory / "model_index.json").is_file():
        return [sd.pipelines.load(directory).denoiser]
    if (directory / "motiondreamer.json").is_file():  # tokeniser + generator folders (steerdiff.motion)
        from steerdiff.motion.dreamer import MotionDreamer

        md = MotionDreamer.load(directory)
        return [md.tokenizer, md.generator]
    if name == "diffdis":  # a segmenter folder (steerdiff.segment), not a registered class
        from steerdiff.segment import load_segmenter

        return [load_segmenter(directory)]
    if name.endswith("_ocm"):
        return [sd.covariance.load_head_for(name.removesuffix("_ocm"))]
    return [sd.models.load(name)]


def test_every_shipped_asset_is_covered():
    """The listing below is not empty and holds the kinds whose networks moved (a vacuous loop would test nothing)."""
    assert {"digits_ocm", "digits_namm", "circle_namm", "digits_styles_dit", "shapes_pipeline", "digits"} <= set(ASSETS)


@pytest.mark.parametrize("name", ASSETS)
def test_every_shipped_asset_loads(name):
    loaded = _load(name)
    assert all(m is not None for m in loaded[:1]), name
    config = ASSETS_DIR / name / "config.json"
    if config.is_file() and name != "diffdis":  # its class names are registered, and the loaded network is that class
        names = _classes(json.loads(config.read_text()))
        assert names and all(n in MODEL_REGISTRY for n in names), names
        assert type(loaded[0]) is MODEL_REGISTRY.get(names[0])


def test_moved_network_classes_load_as_the_models_classes():
    """The registered names in shipped configs resolve to the classes now in ``steerdiff.models``."""
    from steerdiff.models.icnn import ICNNMap
    from steerdiff.models.ocm_heads import TrunkHead
    from steerdiff.models.sequence import SequenceTransformer
    from steerdiff.models.style_dit import StyleTokenDiT

    assert MODEL_REGISTRY.get("ICNNMap") is ICNNMap and MODEL_REGISTRY.get("TrunkHead") is TrunkHead
    assert MODEL_REGISTRY.get("StyleTokenDiT") is StyleTokenDiT
    assert MODEL_REGISTRY.get("SequenceTransformer") is SequenceTransformer
    assert isinstance(sd.models.load("digits_styles_dit").net, StyleTokenDiT)
    assert isinstance(sd.covariance.load_head_for("digits"), TrunkHead)
    assert isinstance(load_namm("circle_namm")[0].forward_map, ICNNMap)
