"""Library docstrings and comments cite papers and ``docs/methods/`` pages, never a document outside the repository
(issue 34), and every ``docs/methods/<page>.md "Heading"`` they cite names a page and a heading that exist.

The scan reads comments (``tokenize``) and docstrings (``ast``) of every module under ``steerdiff/``; other string
literals (error messages, CLI help) are code and are not scanned.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "steerdiff"
METHOD_DOCS = ROOT / "docs" / "methods"

# A citation of a document outside the repository: the design notes and method specs kept beside the checkout
# (``shared/...``, ``DESIGN.md``, ``STYLE.md``, ``AMENDMENTS.md``) or a section of "the spec" ("spec B.3",
# "section C.7 of the spec", "the spec's 1500"). "spec" in its other meaning (a checkpoint's parsed config.json,
# a reward spec string) is not matched.
OUTSIDE = re.compile(
    r"shared/"
    r"|\b(?:DESIGN|STYLE|AMENDMENTS)\.md\b"
    r"|\bspec\s+(?:section\s+)?[A-D0-9]\.?[0-9]"
    r"|\b(?:of|in)\s+the\s+spec\b"
    r"|\bthe\s+spec's\b"
    r"|\bspec\s+section\b"
)

# Files allowed an outside citation, or a docs/methods heading that the page lacks, for the time of a change that
# rewrites them (empty now: every file cites the paper and docs/methods). test_allow_lists_are_current fails for an
# entry that no longer has a hit, so that a stale entry is removed rather than kept.
OUTSIDE_ALLOWED: set[str] = set()
HEADING_ALLOWED: set[str] = set()

CITATION = re.compile(r'docs/methods/([\w-]+)\.md(?:,?\s+"([^"]+)")?')


def commentary(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and every docstring line of a module's source."""
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                out += [(first + k, line) for k, line in enumerate(doc.split("\n"))]
    return sorted(out)


def docstrings_and_comments(source: str) -> list[tuple[int, str]]:
    """Each docstring, and each block of comments on consecutive lines, as one whitespace-normalised text (a
    citation may wrap across lines)."""
    out: list[tuple[int, str]] = []
    last = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if last is not None and tok.start[0] == last + 1:
                out[-1] = (out[-1][0], f"{out[-1][1]} {text}")
            else:
                out.append((tok.start[0], text))
            last = tok.start[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            doc = ast.get_docstring(node)
            if doc is not None:
                out.append((node.body[0].lineno, re.sub(r"\s+", " ", doc)))
    return out


def outside_hits(source: str) -> list[tuple[int, str]]:
    """The comment and docstring lines of ``source`` that cite a document outside the repository."""
    return [(line, text.strip()) for line, text in commentary(source) if OUTSIDE.search(text)]


def headings(page: Path) -> list[str]:
    """The Markdown headings of a page, without their ``#`` marks."""
    return [re.sub(r"^#+\s*", "", line).strip() for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")]


def bad_citations(source: str) -> list[tuple[int, str]]:
    """``docs/methods`` citations of ``source`` naming a missing page, or a heading no heading of the page starts
    with."""
    bad = []
    for line, text in docstrings_and_comments(source):
        for page, heading in CITATION.findall(text):
            path = METHOD_DOCS / f"{page}.md"
            if not path.is_file():
                bad.append((line, f"docs/methods/{page}.md does not exist"))
            elif heading and not any(h.startswith(heading) for h in headings(path)):
                bad.append((line, f'docs/methods/{page}.md has no heading "{heading}"'))
    return bad


def modules() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))]


def test_library_cites_no_document_outside_the_repository():
    found = [f"{name}:{line}: {text}" for name, src in modules() if name not in OUTSIDE_ALLOWED
             for line, text in outside_hits(src)]
    assert not found, ("cite the paper and a docs/methods/<page>.md heading instead (add the paragraph to the page "
                       "if it is missing):\n" + "\n".join(found))


def test_docs_methods_citations_name_existing_headings():
    found = [f"{name}:{line}: {why}" for name, src in modules() if name not in HEADING_ALLOWED
             for line, why in bad_citations(src)]
    assert not found, "\n".join(found)


def test_allow_lists_are_current():
    sources = dict(modules())
    stale = [f"OUTSIDE_ALLOWED: {name}" for name in sorted(OUTSIDE_ALLOWED)
             if name not in sources or not outside_hits(sources[name])]
    stale += [f"HEADING_ALLOWED: {name}" for name in sorted(HEADING_ALLOWED)
              if name not in sources or not bad_citations(sources[name])]
    assert not stale, "fixed or gone: remove from the allow-list:\n" + "\n".join(stale)


SAMPLE = '''"""A module (Someone et al., 2025; section B.3 of the spec, docs/methods/geometry.md "Definitions")."""

RADIUS = 0.05  # r in z units (spec B.3)
LIMIT = 128  # see shared/methods/temporal_geometry_control.md


def load(spec: dict) -> dict:
    """Load a checkpoint from its parsed config ``spec``.

    Raises:
        ValueError: the spec is malformed (see DESIGN.md).
    """
    if not spec:
        raise ValueError("spec B.6: a string literal that is code, not commentary")
    return {"spec": dict(spec)}  # a checkpoint spec, not a citation
'''


def test_the_scan_finds_outside_citations_in_docstrings_and_comments_only():
    assert [line for line, _ in outside_hits(SAMPLE)] == [1, 3, 4, 11]


@pytest.mark.parametrize("text, cites", [
    ("(spec C.6 (2))", True), ("the spec's 1500", True), ("part C of the spec, docs/...", True),
    ("spec section 0", True), ("docs/methods/geometry.md", False), ("``matches(spec) -> bool``", False),
    ("the spec is malformed", False), ("a reward spec string", False), ("its spec ``{class, config}``", False),
])
def test_outside_pattern(text, cites):
    assert bool(OUTSIDE.search(text)) is cites


def test_citation_check_catches_a_missing_page_and_heading():
    src = ('"""See docs/methods/geometry.md "Which map" and docs/methods/geometry.md "No such heading", and\n'
           'docs/methods/nonexistent.md."""\n# docs/methods/dydiff.md "The validation\n# protocol"\n')
    assert [why for _, why in bad_citations(src)] == [
        'docs/methods/geometry.md has no heading "No such heading"', "docs/methods/nonexistent.md does not exist"]
