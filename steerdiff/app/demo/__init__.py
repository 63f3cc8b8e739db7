"""``steerdiff demo``: an HTML report of every landed steering method beside its baselines, on the shipped models.

    from steerdiff.app.demo import run_demo
    results = run_demo("out/demo", quick=True)   # writes index.html, results.json and img/

Sections live in :mod:`steerdiff.app.demo.sections` (one module per method, registered with
:func:`steerdiff.app.demo.registry.section`); the page and the JSON are written by :mod:`steerdiff.app.demo.report`.
"""

from .registry import SECTIONS, SectionSpec, SectionUnavailable, all_sections, section, section_keys
from .report import Column, Figure, SectionResult, Variant, render_html
from .runner import DemoContext, DemoError, run_demo

__all__ = [
    "SECTIONS",
    "Column",
    "DemoContext",
    "DemoError",
    "Figure",
    "SectionResult",
    "SectionSpec",
    "SectionUnavailable",
    "Variant",
    "all_sections",
    "render_html",
    "run_demo",
    "section",
    "section_keys",
]
