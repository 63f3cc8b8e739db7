"""Shared fixtures for the demo tests: one ``--quick`` report per session, and a stdlib parser of the page."""

from __future__ import annotations

import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from steerdiff.app.demo import run_demo


class PageParser(HTMLParser):
    """Collects what the tests check on ``index.html``: images, tables (cells with their ``data-*``), sections,
    findings, and anything that would make the page depend on the network or run code."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.images: list[str] = []
        self.sections: dict[str, dict] = {}
        self.tables: dict[str, list[dict]] = {}
        self.headers: dict[str, list[str]] = {}
        self.findings: dict[str, list[str]] = {}
        self.external: list[str] = []
        self.scripts = 0
        self._section = None
        self._row = None
        self._cell = None
        self._text: list[str] | None = None
        self._in_findings = False
        self._table = None
        self._in_head = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href"):
            value = a.get(key) or ""
            if value.startswith(("http:", "https:", "//", "file:", "data:text/javascript")):
                self.external.append(value)
        if tag in ("script", "link", "iframe", "object", "embed"):
            self.scripts += 1
        if tag == "section":
            self._section = a["data-section"]
            self.sections[self._section] = {"status": a.get("data-status"), "text": []}
        elif tag == "img":
            self.images.append(a["src"])
        elif tag == "table" and "metrics" in (a.get("class") or ""):
            self._table = a["data-section"]
            self.tables[self._table] = []
            self.headers[self._table] = []
        elif tag == "thead":
            self._in_head = True
        elif tag == "th" and self._table is not None:
            self.headers[self._table].append(a.get("data-key"))
        elif tag == "tr" and self._table is not None and not self._in_head:
            self._row = {"variant": a.get("data-variant"), "cells": {}}
            self.tables[self._table].append(self._row)
        elif tag == "td" and self._row is not None:
            self._cell = (a["data-key"], a.get("data-value"))
            self._text = []
        elif tag == "ul" and "findings" in (a.get("class") or ""):
            self._in_findings = True
            self.findings[self._section] = []
        elif tag == "li" and self._in_findings:
            self._text = []
        elif tag == "p" and self._section and "unavailable" in (a.get("class") or ""):
            self._text = []

    def handle_endtag(self, tag):
        if tag == "thead":
            self._in_head = False
        elif tag == "td" and self._cell is not None:
            key, value = self._cell
            self._row["cells"][key] = {"text": "".join(self._text), "value": value}
            self._cell, self._text = None, None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "li" and self._in_findings and self._text is not None:
            self.findings[self._section].append("".join(self._text))
            self._text = None
        elif tag == "ul":
            self._in_findings = False
        elif tag == "p" and self._text is not None and self._section:
            self.sections[self._section]["text"].append("".join(self._text))
            self._text = None
        elif tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)


def parse_page(path: Path) -> PageParser:
    parser = PageParser()
    parser.feed(Path(path).read_text(encoding="utf-8"))
    parser.close()
    return parser


@pytest.fixture(scope="session")
def quick_report(tmp_path_factory):
    """``steerdiff demo --quick`` run once: ``(out_dir, results, seconds)``."""
    out = tmp_path_factory.mktemp("demo") / "report"
    start = time.perf_counter()
    results = run_demo(out, quick=True, progress=False, command="steerdiff demo --quick")
    return out, results, time.perf_counter() - start


@pytest.fixture(scope="session")
def page_parser():
    return parse_page
