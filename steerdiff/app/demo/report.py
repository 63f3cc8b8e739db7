"""What a demo section returns, and the writers of ``results.json`` and ``index.html``.

The page is rendered from the same JSON-ready dictionary that is written to ``results.json``, so every number on
the page is in the JSON: table cells carry the exact value in ``data-value`` and show it formatted by the
column's format. The page is self-contained: inline CSS, no scripts, no fonts; images are PNG files beside it
(``img/<section>/...``), referenced by relative paths.
"""

from __future__ import annotations

import html
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 1
GENERATOR = "steerdiff demo"


@dataclass
class Column:
    """One metrics column of a section's table.

    Attributes:
        key: key of the value in each variant's ``values``.
        label: column heading.
        fmt: Python format spec for the value (``".3f"``, ``".0f"``, ``"+.2f"``, ``""`` for text).
        better: ``"higher"``, ``"lower"`` or ``""`` (neither: a cost or a setting).
    """

    key: str
    label: str
    fmt: str = ".3f"
    better: str = ""


@dataclass
class Variant:
    """One row of a section's table: a method at one setting, its images and its numbers.

    ``values`` holds every column's value (float, int, str or None for "does not apply"); it always has ``nfe``
    (denoiser evaluations per output) and ``wall_s`` (seconds for the variant's run in this process). Keys of
    measured times end in ``_s``: they are the only values allowed to differ between two runs with the same seed.
    """

    name: str
    method: str
    values: dict
    image: str | None = None
    caption: str = ""


@dataclass
class Figure:
    """A plot or a reference image of a section.

    ``kind`` is ``"plot"`` (shown under the table) or ``"reference"`` (an image shown before the variants' grids,
    e.g. the clean images of an inverse problem); ``group`` puts a reference beside the grids of the variants whose
    ``group_by`` value equals it.
    """

    path: str
    caption: str
    kind: str = "plot"
    group: str | float | None = None


@dataclass
class SectionResult:
    """Everything a section puts on the page.

    Attributes:
        key, title: as registered.
        about: what the experiment does (two sentences).
        legend: what the numbers mean and which direction is better.
        columns: the metric columns; the table always starts with the variant and method and shows ``columns``.
        variants: one per table row and image grid.
        findings: sentences computed from this run's numbers (e.g. which variant is best at a setting).
        figures: plots and reference images.
        config: the settings of the run (sample counts, steps, seeds, hyperparameters).
        group_by: key of the column whose rows are compared with each other when the best value of a column is
            highlighted (e.g. the guidance scale); ``""`` compares all rows.
        status: ``"ok"`` or ``"unavailable"``; note: why a section did not run.
        seconds, cpu_seconds: wall time and CPU time of the whole section (filled in by the runner; CPU time does
            not grow when other processes load the machine).
    """

    key: str
    title: str
    about: str = ""
    legend: str = ""
    columns: list[Column] = field(default_factory=list)
    variants: list[Variant] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    group_by: str = ""
    status: str = "ok"
    note: str = ""
    seconds: float | None = None
    cpu_seconds: float | None = None

    def to_dict(self) -> dict:
        """JSON-ready form (non-finite floats become None)."""
        return _clean(asdict(self))


def _clean(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _clean(obj.item())
    return obj


def format_value(value, fmt: str) -> str:
    """The text a table cell shows for ``value`` (``"–"`` for None)."""
    if value is None:
        return "–"
    if isinstance(value, str) or not fmt:
        return str(value)
    return format(value, fmt)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and move it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(results: dict, path: Path) -> None:
    """Write the results dictionary as strict JSON (no NaN)."""
    write_text_atomic(path, json.dumps(_clean(results), indent=1, allow_nan=False) + "\n")


# --- HTML -------------------------------------------------------------------------------------------------------
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1200px; padding: 1.5em; color: #1a1a1a; line-height: 1.45; }
h1 { margin-bottom: .2em; } h2 { border-bottom: 2px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
.meta, .config { color: #555; font-size: .9em; }
nav a { margin-right: 1em; }
.legend { background: #f4f7fb; border-left: 4px solid #4a7ab8; padding: .4em .8em; }
.unavailable { background: #fbf6e9; border-left: 4px solid #c9a227; padding: .4em .8em; }
table.metrics { border-collapse: collapse; font-size: .88em; margin: .8em 0; }
table.metrics th, table.metrics td { border: 1px solid #ccc; padding: .25em .55em; text-align: right; }
table.metrics td.text, table.metrics th.text { text-align: left; }
table.metrics tr:nth-child(even) { background: #fafafa; }
td.best { font-weight: bold; background: #e6f3e6; }
.grids, .plots, .refs { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
figure { margin: 0 0 .8em 0; text-align: center; font-size: .8em; color: #333; min-width: 0;
         max-width: min(100%, 560px); }
.plots figure { max-width: 100%; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figure img.grid, figure img.ref { image-rendering: pixelated; }
code { background: #f2f2f2; padding: 0 .25em; }
"""

ARROW = {"higher": " ↑", "lower": " ↓", "": ""}


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _best(section: dict, column: dict) -> set[int]:
    """Rows holding the best value of a column among the rows of their group (same ``group_by`` value)."""
    if column["better"] not in ("higher", "lower"):
        return set()
    groups: dict = {}
    for i, v in enumerate(section["variants"]):
        value = v["values"].get(column["key"])
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            groups.setdefault(v["values"].get(section.get("group_by") or "", None), []).append((value, i))
    out = set()
    for rows in groups.values():
        if len(rows) < 2 or len({value for value, _ in rows}) == 1:  # nothing to choose between
            continue
        target = (max if column["better"] == "higher" else min)(r[0] for r in rows)
        out |= {i for value, i in rows if value == target}
    return out


def _table(section: dict) -> list[str]:
    cols = section["columns"]
    best = {c["key"]: _best(section, c) for c in cols}
    head = ['<th class="text" data-key="variant">variant</th>', '<th class="text" data-key="method">method</th>']
    text = ' class="text"'
    head += [f'<th{"" if c["fmt"] else text} data-key="{_e(c["key"])}">{_e(c["label"])}{ARROW[c["better"]]}</th>'
             for c in cols]
    lines = [f'<table class="metrics" data-section="{_e(section["key"])}">', "<thead><tr>" + "".join(head)
             + "</tr></thead>", "<tbody>"]
    for i, v in enumerate(section["variants"]):
        cells = [f'<td class="text" data-key="variant">{_e(v["name"])}</td>',
                 f'<td class="text" data-key="method">{_e(v["method"])}</td>']
        for c in cols:
            value = v["values"].get(c["key"])
            cls = ["text"] if isinstance(value, str) else []
            cls += ["best"] if i in best[c["key"]] else []
            raw = "" if value is None else (value if isinstance(value, str) else repr(value))
            cls_attr = f' class="{" ".join(cls)}"' if cls else ""
            cells.append(f'<td{cls_attr} data-key="{_e(c["key"])}" data-value="{_e(raw)}">'
                         f'{_e(format_value(value, c["fmt"]))}</td>')
        lines.append(f'<tr data-variant="{_e(v["name"])}">' + "".join(cells) + "</tr>")
    lines += ["</tbody>", "</table>"]
    return lines


def _figure(path: str, caption: str, cls: str) -> str:
    return (f'<figure><img class="{cls}" src="{_e(path)}" alt="{_e(caption)}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _grids(section: dict) -> list[str]:
    """Reference images and the variants' image grids, one row per ``group_by`` value."""
    key = section.get("group_by") or ""
    refs = [f for f in section["figures"] if f["kind"] == "reference"]
    grids = [v for v in section["variants"] if v.get("image")]
    groups: list = []
    for v in grids:
        g = v["values"].get(key) if key else None
        if g not in groups:
            groups.append(g)
    lines = []
    loose = [f for f in refs if f.get("group") is None or f.get("group") not in groups]
    if loose:
        lines.append('<div class="refs">' + "".join(_figure(f["path"], f["caption"], "ref") for f in loose) + "</div>")
    for g in groups:
        figs = [_figure(f["path"], f["caption"], "ref") for f in refs if f.get("group") is not None
                and f.get("group") == g]
        figs += [_figure(v["image"], v["caption"] or v["name"], "grid") for v in grids
                 if (v["values"].get(key) if key else None) == g]
        lines.append('<div class="grids">' + "".join(figs) + "</div>")
    return lines


def _section(section: dict) -> list[str]:
    key = _e(section["key"])
    lines = [f'<section id="{key}" data-section="{key}" data-status="{_e(section["status"])}">',
             f"<h2>{_e(section['title'])}</h2>"]
    if section["status"] != "ok":
        lines.append(f'<p class="unavailable">{_e(section["note"])}</p>')
        return lines + ["</section>"]
    lines.append(f'<p class="about">{_e(section["about"])}</p>')
    lines.append(f'<p class="legend">{_e(section["legend"])}</p>')
    if section["findings"]:
        lines.append('<ul class="findings">' + "".join(f"<li>{_e(f)}</li>" for f in section["findings"]) + "</ul>")
    lines += _table(section)
    plots = [f for f in section["figures"] if f["kind"] == "plot"]
    if plots:
        lines.append('<div class="plots">' + "".join(_figure(f["path"], f["caption"], "plot") for f in plots)
                     + "</div>")
    lines += _grids(section)
    config = ", ".join(f"{k} = {v}" for k, v in section["config"].items())
    seconds, cpu = section.get("seconds"), section.get("cpu_seconds")
    lines.append(f'<p class="config">Settings: {_e(config)}.'
                 + (f" Section time {seconds:.1f} s wall, {cpu:.1f} s CPU." if seconds is not None else "") + "</p>")
    return lines + ["</section>"]


def render_html(results: dict) -> str:
    """The report page for a results dictionary (as written to ``results.json``)."""
    results = _clean(results)
    meta = results["meta"]
    sections = results["sections"]
    nav = " ".join(f'<a href="#{_e(s["key"])}">{_e(s["key"])}</a>' for s in sections)
    ran = sum(s["status"] == "ok" for s in sections)
    lines = [
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>steerdiff demo</title>", f"<style>{CSS}</style>", "</head>", "<body>",
        "<header>", "<h1>steerdiff demo: each steering method beside its baselines</h1>",
        f'<p class="meta">Command <code>{_e(meta["command"])}</code> ({"quick" if meta["quick"] else "full"} '
        f'run, seed {meta["seed"]}, {meta["threads"]} thread(s), torch {_e(meta["torch"])}, steerdiff '
        f'{_e(meta["steerdiff"])}); {ran} of {len(sections)} sections ran, in {meta["total_s"]:.1f} s '
        f'({meta["cpu_s"]:.1f} s CPU). '
        "NFE = denoiser evaluations per output; every number was computed in this run on the shipped models.</p>",
        f"<nav>{nav}</nav>", "</header>",
    ]
    for s in sections:
        lines += _section(s)
    lines += ["</body>", "</html>"]
    return "\n".join(lines) + "\n"
