"""Load a repository script (``benchmarks/*.py``, ``scripts/*.py``) as a module, for the tests that check it: the
scripts are not a package, so they are executed from their path, and registered in ``sys.modules`` (as a dataclass
defined in a script needs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """The script at ``path`` (relative to the repository root, or absolute) as the module ``name`` (default: its
    folder and file stem joined by ``_``, e.g. ``benchmarks_lggm``)."""
    path = Path(path) if Path(path).is_absolute() else ROOT / path
    name = name or f"{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
