"""Networks moved under ``steerdiff.models`` (issue 34): every shipped asset still loads by its registered class
name, the loaded networks are the classes of ``steerdiff.models``, and the old import paths re-export the same
objects with a DeprecationWarning (for one release) while the packages themselves import without one."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

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
    if config.is_file():  # its class names are registered, and the loaded network is that class
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


# old path -> (new module, names that must be the same objects)
MOVED = {
    "steerdiff.constrain.icnn": ("steerdiff.models.icnn", ("ICNNMap", "ConvICNNMap", "NEGATIVE_SLOPE")),
    "steerdiff.covariance.heads": ("steerdiff.models.ocm_heads", ("OCMHead", "InputHead", "TrunkHead", "PARAMS",
                                                                 "output_to_cov", "unet_trunk_head")),
    "steerdiff.control.style_dit": ("steerdiff.models.style_dit", ("StyleTokenDiT", "StyleTokenDenoiser",
                                                                  "no_style")),
    "steerdiff.temporal.sequence": ("steerdiff.models.sequence_attention", ("blocked_attention", "band_bias",
                                                                           "LOCAL_ATTENTION_FROM")),
}
# names that moved to a second new home
ALSO = {
    "steerdiff.covariance.heads": ("steerdiff.covariance.target", ("ocm_target", "hutchinson_diag")),
    "steerdiff.control.style_dit": ("steerdiff.control.styles", ("style_refs",)),
    "steerdiff.temporal.sequence": ("steerdiff.temporal", ("SequenceCond", "SequencePrecond", "SequenceTransformer",
                                                           "generate_sequence", "generate_autoregressive",
                                                           "sequence_model")),
}


def _import_fresh(name: str):
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_path_warns_and_gives_the_same_objects(old):
    with pytest.warns(DeprecationWarning, match=old.replace(".", r"\.") + " is deprecated"):
        module = _import_fresh(old)
    for new, names in (MOVED[old], ALSO.get(old, (None, ()))):
        if new is None:
            continue
        target = importlib.import_module(new)
        for n in names:
            assert getattr(module, n) is getattr(target, n), (old, n)


def test_the_library_imports_no_shim_and_warns_about_nothing():
    """Only users of the old paths are warned: a fresh ``import steerdiff`` (every package, the app too) raises no
    DeprecationWarning and loads none of the deprecated modules."""
    code = ("import sys, warnings; warnings.simplefilter('error', DeprecationWarning); import steerdiff, "
            "steerdiff.app.cli, steerdiff.app.demo, steerdiff.app.protocols, steerdiff.app.recipes; "
            f"print([m for m in {sorted(MOVED)!r} if m in sys.modules])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"
