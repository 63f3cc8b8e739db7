"""``sd.pipelines.load(dir)``: a local diffusers ``save_pretrained`` directory as a :class:`Pipeline`, loaded safely.

Before anything is loaded, ``model_index.json`` is checked: the pipeline class and every component class must be
classes of the ``diffusers`` or ``transformers`` libraries themselves (no custom pipeline code, no
``trust_remote_code``), and every component's weights must include safetensors files (a folder with only pickle
weights, ``.bin`` / ``.ckpt`` / ``.pt`` / ``.pth`` / ``.pkl``, is refused: loading them would unpickle). Then
``diffusers.DiffusionPipeline.from_pretrained(dir, use_safetensors=True, local_files_only=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .pipeline import Pipeline, from_diffusers

_LIBRARIES = ("diffusers", "transformers")
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


def shipped_pipelines() -> list[str]:
    """Names of the pipelines shipped in ``steerdiff/assets/`` (``load(name)`` loads one)."""
    if not ASSETS_DIR.is_dir():
        return []
    return sorted(p.name for p in ASSETS_DIR.iterdir() if (p / "model_index.json").is_file())


def resolve(path: str | Path) -> Path:
    """A pipeline directory, or the directory of the shipped pipeline named ``path`` (a plain name that is not a
    directory here, e.g. ``"shapes_pipeline"``)."""
    root = Path(path)
    if not root.is_dir() and isinstance(path, str) and "/" not in path and "\\" not in path:
        shipped = ASSETS_DIR / path
        if (shipped / "model_index.json").is_file():
            return shipped
        raise FileNotFoundError(f"pipeline {path!r} is neither a directory nor a shipped pipeline; shipped "
                                f"pipelines: {shipped_pipelines() or 'none'}")
    return root
_PICKLE_SUFFIXES = (".bin", ".ckpt", ".pt", ".pth", ".pkl", ".pickle")


def check_pipeline_dir(path: str | Path) -> dict:
    """Validate a ``save_pretrained`` directory without loading it; returns its ``model_index.json``.

    Raises:
        FileNotFoundError: no such directory, or no ``model_index.json`` in it.
        ValueError: a class outside diffusers / transformers (custom code), or a component whose weights are only
            pickle files.
    """
    root = resolve(path)
    if not root.is_dir():
        raise FileNotFoundError(f"pipeline directory {str(root)!r} does not exist")
    index_file = root / "model_index.json"
    if not index_file.is_file():
        raise FileNotFoundError(f"{str(root)!r} has no model_index.json: sd.pipelines.load needs a local diffusers "
                                "save_pretrained directory")
    try:
        index = json.loads(index_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{index_file} is not valid JSON: {e}") from None
    if not isinstance(index, dict):
        raise ValueError(f"{index_file} must hold a JSON object")
    import diffusers
    import transformers

    libraries = {"diffusers": diffusers, "transformers": transformers}
    name = index.get("_class_name")
    if not isinstance(name, str) or not isinstance(getattr(diffusers, name, None), type):
        raise ValueError(f"model_index.json names the pipeline class {name!r}, which is not a diffusers pipeline; "
                         "custom pipeline code is never loaded")
    for key in ("_custom_pipeline", "custom_pipeline", "trust_remote_code", "auto_map"):
        if key in index:
            raise ValueError(f"model_index.json sets {key!r}: custom code is never loaded")
    for component, spec in index.items():
        if component.startswith("_"):
            continue
        if not (isinstance(spec, list) and len(spec) == 2) or spec == [None, None]:
            continue  # a pipeline config value (requires_safety_checker, ...) or an absent component
        if not all(isinstance(s, str) for s in spec):
            raise ValueError(f"model_index.json entry {component!r} must be [library, class], got {spec!r}")
        library, cls = spec
        if library not in _LIBRARIES or not isinstance(getattr(libraries[library], cls, None), type):
            raise ValueError(f"model_index.json component {component!r} is {library}.{cls}, not a class of "
                             f"{' or '.join(_LIBRARIES)}; custom component code is never loaded")
        folder = root / component
        if folder.is_dir():
            files = [p for p in folder.rglob("*") if p.is_file()]
            pickles = [p.name for p in files if p.suffix in _PICKLE_SUFFIXES]
            if pickles and not any(p.suffix == ".safetensors" for p in files):
                raise ValueError(f"component {component!r} has only pickle weights {sorted(pickles)}, which are "
                                 "never loaded (unpickling runs code); convert them to safetensors first")
    return index


def load(path: str | Path) -> Pipeline:
    """Load a local diffusers ``save_pretrained`` directory (safetensors only, no custom code), or a shipped
    pipeline by name (``"shapes_pipeline"``), as a :class:`Pipeline` (see :func:`check_pipeline_dir` for what is
    refused before loading)."""
    path = resolve(path)
    index = check_pipeline_dir(path)
    import diffusers

    # Components saved as absent ([null, null], e.g. SD3 without its T5 encoder) are passed as None: diffusers
    # would otherwise refuse a pipeline whose class lists them as required.
    absent = {k: None for k, v in index.items() if not k.startswith("_") and v == [None, None]}
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(path), use_safetensors=True, local_files_only=True,
                                                       **absent)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    return from_diffusers(pipe)
