"""The package layers: no package imports a higher layer, and the package graph has no cycle.

The rules and the graph come from ``scripts/import_graph.py`` (run it to print the graph); this test runs its
check over the installed source tree and, as a control, over a tree with a planted upward import.
"""

import shutil
from pathlib import Path

from script_modules import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "import_graph.py"
import_graph = load_script(SCRIPT, "import_graph")


def test_no_upward_or_cyclic_import_between_packages():
    problems = import_graph.violations(import_graph.import_edges())
    assert problems == [], "\n".join(problems)


def test_every_package_has_a_layer():
    packages = {p.name for p in import_graph.ROOT.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in import_graph.ROOT.glob("*.py") if p.stem != "__init__"}
    assert packages | modules <= set(import_graph.LAYER_OF)


def test_the_check_catches_an_upward_import_and_a_cycle(tmp_path):
    root = tmp_path / "steerdiff"
    for pkg in ("core", "io", "guidance"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("from . import core, guidance, io\n")
    (root / "core" / "sampling.py").write_text("def f():\n    from ..guidance import cfg  # lazy, still counted\n")
    (root / "io" / "files.py").write_text("from steerdiff.core import sampling\n")
    (root / "guidance" / "cfg.py").write_text("from ..core.sampling import f\n")
    problems = import_graph.violations(import_graph.import_edges(root), root)
    assert any(p.startswith("upward import core (layer 1) -> guidance") for p in problems), problems
    assert any(p.startswith("upward import io (layer 0) -> core") for p in problems), problems
    assert any(p.startswith("import cycle: core -> guidance") for p in problems), problems
    shutil.rmtree(root / "io")  # without the upward imports' partner the cycle remains, but io's edge is gone
    problems = import_graph.violations(import_graph.import_edges(root), root)
    assert not any("io (layer 0)" in p for p in problems)


def test_every_import_of_a_steerdiff_module_resolves():
    """Lazy imports inside functions run only when called: check that each one names a module that exists (and
    that a ``from module import name`` finds the name), so a moved module cannot leave a dead import behind."""
    import ast
    import importlib

    missing = []
    repo = import_graph.ROOT.parent
    files = [*import_graph.ROOT.rglob("*.py"), *(repo / "benchmarks").glob("*.py"), *(repo / "scripts").glob("*.py")]
    for path in sorted(files):
        # benchmarks and scripts are not packages: only their absolute steerdiff imports matter
        module, is_package = import_graph._module_name(path) if path.is_relative_to(import_graph.ROOT) else ("", False)
        for node in ast.walk(ast.parse(path.read_text())):
            for target in import_graph._imported(node, module, is_package):
                if not target.startswith("steerdiff"):
                    continue
                where = f"{path.relative_to(repo)}:{node.lineno}"
                try:
                    mod = importlib.import_module(target)
                except ImportError:
                    parent, _, name = target.rpartition(".")
                    if not (isinstance(node, ast.ImportFrom) and node.module is None
                            and hasattr(importlib.import_module(parent), name)):
                        missing.append(f"{where}: {target}")
                    continue
                if isinstance(node, ast.ImportFrom) and node.module is not None:
                    missing += [f"{where}: {target}.{a.name}" for a in node.names if not hasattr(mod, a.name)
                                and importlib.util.find_spec(f"{target}.{a.name}") is None]
    assert missing == [], "\n".join(missing)


def test_the_library_does_not_import_the_application():
    """``steerdiff.app`` (cli, demo, protocols, recipes) sits on top: no library module imports it, the public facade
    ``steerdiff/__init__.py`` (outside the package graph) included, and ``import steerdiff`` does not load it."""
    import ast
    import subprocess
    import sys

    offenders = []
    for path in sorted(import_graph.ROOT.rglob("*.py")):
        if path.is_relative_to(import_graph.ROOT / "app"):
            continue
        module, is_package = import_graph._module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            for target in import_graph._imported(node, module, is_package):
                if target == "steerdiff.app" or target.startswith("steerdiff.app."):
                    offenders.append(f"{path.relative_to(import_graph.ROOT.parent)}:{node.lineno} -> {target}")
    assert offenders == [], "\n".join(offenders)
    code = "import sys, steerdiff; print(sorted(m for m in sys.modules if m.startswith('steerdiff.app')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out


def test_the_check_catches_a_library_import_of_the_application(tmp_path):
    root = tmp_path / "steerdiff"
    for pkg in ("core", "app"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "core" / "sampling.py").write_text("def f():\n    from ..app import cli\n")
    problems = import_graph.violations(import_graph.import_edges(root), root)
    assert any(p.startswith("upward import core (layer 1) -> app") for p in problems), problems
