"""The ``--quick`` report in a real browser: headless Chromium (Debian's ``chromium``) loads it from a loopback HTTP
server, every ``<img>`` has loaded (``naturalWidth > 0``), nothing is logged to the console, and a screenshot renders.

Chromium is required: CI installs it (``.ci/run``). Where it cannot be installed, set ``STEERDIFF_SKIP_BROWSER=1`` to
skip these tests with a message; without that variable a missing browser is a failure, so CI cannot pass silently
without it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--hide-scrollbars",
                  "--enable-logging=stderr", "--v=0"]
# Injected into a copy of the page (the report itself has no scripts): records load errors and console errors, then
# writes every image's state into the DOM for --dump-dom to return.
# The listeners go first in <head>: an image above a script at the end of <body> can fail (a 404) before the parser
# reaches that script, and its error event is then lost (seen twice on a loaded machine).
CHECK_LISTENERS = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(
  "error event on " + (e.target && e.target.tagName ? e.target.tagName + " " + (e.target.src || "") : e.message)),
  true);
const origError = console.error;
console.error = (...a) => { window.__errors.push("console.error: " + a.join(" ")); origError(...a); };
</script>"""
CHECK_SCRIPT = """<script>
window.addEventListener("load", () => {
  const box = e => e.getBoundingClientRect();
  const images = [...document.images].map(i => {
    const fig = i.closest("figure"), row = fig ? fig.parentElement : i.parentElement;
    const section = i.closest("section");
    return {src: i.getAttribute("src"), complete: i.complete, naturalWidth: i.naturalWidth,
            naturalHeight: i.naturalHeight, section: section ? section.dataset.section : null,
            left: box(i).left, right: box(i).right, width: box(i).width,
            figLeft: fig ? box(fig).left : null, figRight: fig ? box(fig).right : null,
            rowLeft: box(row).left, rowRight: box(row).right};
  });
  const pre = document.createElement("pre");
  pre.id = "steerdiff-check";
  pre.textContent = JSON.stringify({images: images, errors: window.__errors});
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if path:
        return path
    if os.environ.get("STEERDIFF_SKIP_BROWSER") == "1":
        pytest.skip("Chromium is not installed and STEERDIFF_SKIP_BROWSER=1: browser test skipped")
    pytest.fail("Chromium is not installed: `apt-get install -y chromium` (CI does this in .ci/run), or set "
                "STEERDIFF_SKIP_BROWSER=1 to skip the browser test where it cannot be installed")


@pytest.fixture
def serve():
    """Serve a directory on 127.0.0.1 (a free port); yields a function ``dir -> base URL``."""
    servers = []

    def start(root: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(root))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def run_chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def check_page(root: Path, page: str, tmp_path: Path, base_url: str, window: int = 1280) -> tuple[dict, list[str]]:
    """Load a copy of ``root/page`` with the check script in a window ``window`` pixels wide; return (the script's
    report, console lines)."""
    html = (root / page).read_text(encoding="utf-8")
    assert "</body>" in html and html.count("<head>") == 1
    html = html.replace("<head>", "<head>" + CHECK_LISTENERS).replace("</body>", CHECK_SCRIPT + "</body>")
    (root / "_check.html").write_text(html, encoding="utf-8")
    try:
        proc = run_chromium([f"--window-size={window},1600", "--virtual-time-budget=10000", "--dump-dom",
                             f"{base_url}/_check.html"], tmp_path)
    finally:
        (root / "_check.html").unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="steerdiff-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the check script did not report; stderr: {proc.stderr[-2000:]}"
    report = json.loads(found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return report, console


def test_every_image_loads_in_chromium(quick_report, tmp_path, serve, page_parser):
    out, _, _ = quick_report
    root = tmp_path / "site"
    shutil.copytree(out, root)
    report, console = check_page(root, "index.html", tmp_path, serve(root))
    expected = page_parser(root / "index.html").images
    assert [i["src"] for i in report["images"]] == expected
    broken = [i["src"] for i in report["images"] if not (i["complete"] and i["naturalWidth"] > 0)]
    assert broken == [], f"images that did not load in Chromium: {broken}"
    assert report["errors"] == [] and console == [], (report["errors"], console)


def test_the_check_catches_a_broken_image(quick_report, tmp_path, serve):
    """The browser check can fail: a page with one missing image is reported."""
    out, _, _ = quick_report
    root = tmp_path / "site"
    shutil.copytree(out, root)
    first = sorted((root / "img").rglob("*.png"))[0]
    first.unlink()
    report, _ = check_page(root, "index.html", tmp_path, serve(root))
    rel = first.relative_to(root).as_posix()
    broken = [i["src"] for i in report["images"] if not (i["complete"] and i["naturalWidth"] > 0)]
    assert broken == [rel], report
    assert any(rel in e for e in report["errors"]), report["errors"]


def test_screenshot(quick_report, tmp_path, serve):
    out, _, _ = quick_report
    shot = tmp_path / "report.png"
    proc = run_chromium(["--window-size=1280,1600", "--virtual-time-budget=10000", f"--screenshot={shot}",
                         f"{serve(out)}/index.html"], tmp_path)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    with Image.open(shot) as im:
        im.load()
        assert im.size == (1280, 1600)
        grey = im.convert("L")
        lo, hi = grey.getextrema()
        assert hi - lo > 100, "the screenshot is blank"
        # Something is drawn over most of the page height (text, tables, images), not only a header.
        rows = [grey.crop((0, y, 1280, y + 100)).getextrema() for y in range(0, 1600, 100)]
        assert sum(r[1] - r[0] > 100 for r in rows) >= 12


def overflowing(images: list[dict]) -> list[str]:
    """Images drawn wider than their figure or outside their row of figures (so they overlap a neighbour or are
    clipped), and figures of one row that overlap each other; half a pixel of rounding is allowed."""
    bad = []
    for i in images:
        if i["figLeft"] is not None and (i["left"] < i["figLeft"] - .5 or i["right"] > i["figRight"] + .5):
            bad.append(f"{i['section']}: {i['src']} ({i['width']:.0f} px) is wider than its figure "
                       f"({i['figRight'] - i['figLeft']:.0f} px)")
        if i["left"] < i["rowLeft"] - .5 or i["right"] > i["rowRight"] + .5:
            bad.append(f"{i['section']}: {i['src']} leaves its row ({i['left']:.0f}..{i['right']:.0f} px, "
                       f"row {i['rowLeft']:.0f}..{i['rowRight']:.0f} px)")
    return bad


@pytest.mark.parametrize("width", [1280, 800])
def test_no_image_overflows_its_figure_in_any_section(quick_report, tmp_path, serve, width):
    """Every section's figures fit their column at a desktop and a narrow window: a grid wider than its figure
    (420 px) used to spill over the next figure and past the page's right edge."""
    out, _, _ = quick_report
    root = tmp_path / "site"
    shutil.copytree(out, root)
    report, _ = check_page(root, "index.html", tmp_path, serve(root), window=width)
    sections = {i["section"] for i in report["images"]}
    assert len(sections) >= 5, sections  # the quick report's sections with figures were all measured
    assert overflowing(report["images"]) == []


def test_the_overflow_check_catches_a_wide_image(quick_report, tmp_path, serve):
    """The layout check can fail: an image forced to 2000 px is reported in its section."""
    out, _, _ = quick_report
    root = tmp_path / "site"
    shutil.copytree(out, root)
    page = root / "index.html"
    html = page.read_text(encoding="utf-8")
    page.write_text(html.replace("</style>", "figure img { width: 2000px !important; max-width: none !important; }"
                                 "</style>", 1), encoding="utf-8")
    report, _ = check_page(root, "index.html", tmp_path, serve(root))
    bad = overflowing(report["images"])
    assert len(bad) >= len(report["images"]), bad


def test_readme_screenshot_is_small_and_page_wide():
    """``docs/demo.png`` (regenerated with ``chromium --headless --window-size=1200,1750 --screenshot`` from the
    quick report) stays a small page-wide PNG for the README."""
    shot = Path(__file__).resolve().parents[2] / "docs" / "demo.png"
    assert shot.stat().st_size < 300_000
    with Image.open(shot) as im:
        assert im.format == "PNG" and im.size[0] == 1200 and im.size[1] >= 1000
