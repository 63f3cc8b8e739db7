"""Composable models: a checkpoint directory may carry ``attributes.json`` beside its ``config.json``, naming its
condition slots and their values (``{"attributes": {name: [values]}, "has_null": bool}``); :func:`load_composable`
loads the model and attaches them, so :meth:`steerdiff.guidance.Compose.for_model` can read an expression's names
(docs/methods/coind.md, "Expressions and the Compose guider").
"""

from __future__ import annotations

import json
from pathlib import Path

from .compose_expr import normalize_attributes

ATTRIBUTES_FILE = "attributes.json"


def load_composable(name_or_dir: str | Path, device: str = "cpu"):
    """Load a model (:func:`steerdiff.models.load`: a directory, or a shipped model by name) and attach
    ``attributes`` and ``has_null`` from the ``attributes.json`` next to its ``config.json``, if there is one."""
    from ..models.io import ASSETS_DIR, load

    model = load(name_or_dir, device)
    p = Path(name_or_dir)
    directory = (p.parent if p.is_file() else p) if p.exists() else ASSETS_DIR / str(name_or_dir)
    meta_path = directory / ATTRIBUTES_FILE
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        model.attributes = normalize_attributes(meta["attributes"])
        model.has_null = bool(meta.get("has_null", True))
    return model
