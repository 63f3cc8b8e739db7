"""Print steerdiff's package import graph and check its layers (what ``tests/test_layers.py`` enforces).

    python scripts/import_graph.py            # the graph, one line per package, and any violation
    python scripts/import_graph.py --dot      # the graph in Graphviz dot

Every import between two packages of ``steerdiff/`` counts, at module level or inside a function (a lazy import is a
dependency too). A package may import its own layer or the layers below it, never a higher one, and the graph must
have no cycle (not even within a layer). ``steerdiff/__init__.py``, the public facade that imports everything, is
not part of the graph. Exit status 1 when a rule is broken.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "steerdiff"

# Lowest first. A package (or top-level module) of steerdiff/ must appear here.
LAYERS: list[tuple[str, ...]] = [
    ("io",),
    ("core", "distributed"),
    ("models", "data", "metrics", "viz"),
    ("train",),
    ("guidance", "align", "inverse", "covariance", "constrain", "quant", "geometry", "control",
     "temporal", "discrete", "segment"),
    ("pipelines",),  # diffusers pipelines over the methods: guided by guidance's registered guiders
    ("app",),  # the application (cli, demo, protocols, recipes): on top, imported by nothing
]
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _module_name(path: Path, root: Path = ROOT) -> tuple[str, bool]:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level == 0:
        return [node.module] if node.module else []
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    if node.module:
        return [".".join([*base, node.module])]
    return [".".join([*base, a.name]) for a in node.names]  # `from . import x`: x may be a package


def package_of(module: str) -> str | None:
    """``steerdiff.core.sampling`` -> ``core``; the root package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "steerdiff" else None


def import_edges(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """``{(importer package, imported package): [file:line, ...]}`` over every ``.py`` file under ``root``."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module, is_package = _module_name(path, root)
        src = package_of(module)
        if src is None:  # steerdiff/__init__.py
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, module, is_package):
                dst = package_of(target) if target.startswith("steerdiff") else None
                if dst is not None and dst != src:
                    where = f"{path.relative_to(root.parent)}:{node.lineno}"
                    edges.setdefault((src, dst), []).append(where)
    return edges


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first = last), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def violations(edges: dict[tuple[str, str], list[str]], root: Path = ROOT) -> list[str]:
    """Every broken rule, as a sentence naming the files: unknown packages, upward imports, a cycle."""
    out = []
    modules = {package_of(_module_name(p, root)[0]) for p in root.rglob("*.py")}
    packages = ({p for edge in edges for p in edge} | modules) - {None}
    for pkg in sorted(p for p in packages if p not in LAYER_OF):
        out.append(f"package {pkg!r} has no layer: add it to LAYERS in scripts/import_graph.py")
    for (src, dst), where in sorted(edges.items()):
        if src in LAYER_OF and dst in LAYER_OF and LAYER_OF[dst] > LAYER_OF[src]:
            out.append(f"upward import {src} (layer {LAYER_OF[src]}) -> {dst} (layer {LAYER_OF[dst]}): "
                       f"{', '.join(where)}")
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
    cycle = find_cycle(graph)
    if cycle:
        steps = [f"{a} -> {b} ({edges[(a, b)][0]})" for a, b in zip(cycle, cycle[1:], strict=False)]
        out.append("import cycle: " + "; ".join(steps))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dot", action="store_true", help="print the graph in Graphviz dot")
    args = parser.parse_args(argv)
    edges = import_edges()
    graph: dict[str, set[str]] = {p: set() for p in LAYER_OF if (ROOT / p).exists() or (ROOT / f"{p}.py").exists()}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
    if args.dot:
        print("digraph steerdiff {\n  rankdir=BT;")
        for src in sorted(graph):
            for dst in sorted(graph[src]):
                print(f'  "{src}" -> "{dst}";')
        print("}")
    else:
        for i, layer in enumerate(LAYERS):
            for pkg in layer:
                if pkg in graph:
                    print(f"[{i}] {pkg:<12} -> {', '.join(sorted(graph[pkg])) or '(nothing)'}")
    problems = violations(edges)
    for p in problems:
        print("VIOLATION:", p, file=sys.stderr)
    if not args.dot:
        print(f"{len(edges)} import arrows between packages")
        print("layers respected, no cycle" if not problems else f"{len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
