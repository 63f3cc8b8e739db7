"""``steerdiff demo`` on the command line: bad input, atomic output, the section registry and its plug-in path."""

from __future__ import annotations

import html
import json

import pytest
import torch
from click.testing import CliRunner

from steerdiff.app.cli.demo import demo_cmd
from steerdiff.app.demo import Column, SectionResult, SectionUnavailable, Variant, registry, run_demo, section
from steerdiff.app.demo.runner import DemoError


@pytest.fixture
def fake_section():
    """A one-function section registered for the test (the template of a new method's section), removed after."""
    calls = []

    @section("fake_method", "Fake method vs baseline", requires=("steerdiff.core",), order=5)
    def run(ctx):
        calls.append(ctx.section)
        bar = ctx.bar(2, "fake")
        variants = []
        for name, shift in (("baseline", 0.0), ("fake", 0.5)):
            x = torch.linspace(-1, 1, 64).reshape(1, 1, 8, 8) * (1 - shift)
            variants.append(Variant(name, name, {"nfe": 10, "wall_s": 0.01, "score": 1 - shift},
                                    ctx.grid(x, f"{name}.png")))
            bar.update(1)
        return SectionResult("fake_method", "", about="A test.", legend="score: lower is better.",
                             columns=[Column("nfe", "NFE", "d"), Column("score", "score", ".2f", "lower")],
                             variants=variants, findings=[f"calls {len(calls)}"])

    yield calls
    registry.SECTIONS.remove("fake_method")


@pytest.fixture
def missing_section():
    """A section whose method module does not exist: always "not available", never run."""

    @section("missing_method", "Needs a module that does not exist", requires=("steerdiff.no_such_module",))
    def run(ctx):  # pragma: no cover - must not run
        raise AssertionError("a section with a missing module ran")

    yield "missing_method"
    registry.SECTIONS.remove("missing_method")


def test_plugged_in_section_and_unavailable_note(tmp_path, fake_section, missing_section, page_parser):
    out = tmp_path / "r"
    res = CliRunner().invoke(demo_cmd, ["--out", str(out), "--only", "fake_method,missing_method", "--no-progress"])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "results.json").read_text())
    assert [s["key"] for s in results["sections"]] == ["fake_method", "missing_method"]
    fake, comp = results["sections"]
    assert fake["status"] == "ok" and fake_section == ["fake_method"]
    assert comp["status"] == "unavailable" and comp["note"].startswith("not available")
    assert "steerdiff.no_such_module" in comp["note"]
    page = page_parser(out / "index.html")
    assert [r["variant"] for r in page.tables["fake_method"]] == ["baseline", "fake"]
    assert sorted(page.images) == ["img/fake_method/baseline.png", "img/fake_method/fake.png"]
    text = (out / "index.html").read_text()
    assert 'class="best" data-key="score" data-value="0.5"' in text  # the lower score is highlighted
    assert html.escape(comp["note"]) in text


def test_section_module_that_fails_to_import_is_listed(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "broken_one.py").write_text("import steerdiff.no_such_module\n")
    sections = __import__("steerdiff.app.demo.sections", fromlist=["x"])
    monkeypatch.setattr(sections, "__path__", [*sections.__path__, str(pkg)])
    spec = next(s for s in registry.all_sections() if s.key == "broken_one")
    assert spec.run is None and "steerdiff.no_such_module" in spec.note


def test_section_unavailable_at_run_time(tmp_path, fake_section):
    @section("no_model", "Needs a model that is not shipped", order=7)
    def run(ctx):
        ctx.grid(torch.zeros(1, 1, 8, 8), "early.png")
        raise SectionUnavailable("the shipped model 'nope' is missing")

    try:
        results = run_demo(tmp_path / "r", only=["fake_method", "no_model"], progress=False)
    finally:
        registry.SECTIONS.remove("no_model")
    fake, missing = results["sections"]
    assert fake["status"] == "ok"
    assert missing["status"] == "unavailable"
    assert missing["note"] == "not available: the shipped model 'nope' is missing"
    assert not (tmp_path / "r" / "img" / "no_model").exists()
    assert html.escape(missing["note"]) in (tmp_path / "r" / "index.html").read_text()


def test_planned_sections_are_listed():
    keys = registry.section_keys()
    assert keys[:3] == ["guidance", "align", "inverse"]


def test_unknown_section_is_refused(tmp_path):
    res = CliRunner().invoke(demo_cmd, ["--out", str(tmp_path / "r"), "--only", "guidance,nope"])
    assert res.exit_code == 2 and "--only" in res.output and "'nope'" in res.output and "guidance" in res.output
    assert not (tmp_path / "r").exists()
    with pytest.raises(DemoError, match="--only"):
        run_demo(tmp_path / "r", only=["nope"])


def test_out_that_is_a_file_is_refused(tmp_path, missing_section):
    f = tmp_path / "file"
    f.write_text("mine")
    res = CliRunner().invoke(demo_cmd, ["--out", str(f), "--only", "missing_method"])
    assert res.exit_code == 2 and "--out" in res.output and "not a directory" in res.output
    assert f.read_text() == "mine"
    res = CliRunner().invoke(demo_cmd, ["--out", str(f / "sub"), "--only", "missing_method"])
    assert res.exit_code == 2 and "--out" in res.output and "cannot write" in res.output


def test_foreign_directory_is_not_replaced(tmp_path, missing_section):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep")
    res = CliRunner().invoke(demo_cmd, ["--out", str(d), "--only", "missing_method"])
    assert res.exit_code == 2 and "refusing" in res.output
    assert [p.name for p in d.iterdir()] == ["notes.txt"]


def test_a_report_with_a_users_files_added_or_inside_the_package_is_not_replaced(tmp_path, missing_section):
    from steerdiff.io import MARKER_NAME
    from steerdiff.models.io import ASSETS_DIR

    out = tmp_path / "r"
    run_demo(out, only=["missing_method"], progress=False)
    listed = json.loads((out / MARKER_NAME).read_text())["files"]
    assert "index.html" in listed and "results.json" in listed
    (out / "my_notes.md").write_text("keep")  # a user's file beside the report
    res = CliRunner().invoke(demo_cmd, ["--out", str(out), "--only", "missing_method"])
    assert res.exit_code == 2 and "--out" in res.output and "my_notes.md" in res.output, res.output
    assert (out / "my_notes.md").read_text() == "keep"
    (out / "my_notes.md").unlink()
    run_demo(out, only=["missing_method"], progress=False)  # the report alone is replaced
    # A report from before the marker (results.json says so, nothing else in it) is still replaced.
    (out / MARKER_NAME).unlink()
    run_demo(out, only=["missing_method"], progress=False)
    for target in (ASSETS_DIR / "report", ASSETS_DIR.parent / "report"):
        res = CliRunner().invoke(demo_cmd, ["--out", str(target), "--only", "missing_method"])
        assert res.exit_code == 2 and "inside the installed steerdiff package" in res.output, res.output
        assert not target.exists()


def test_a_failing_run_leaves_the_previous_report(tmp_path, fake_section):
    out = tmp_path / "r"
    run_demo(out, only=["fake_method"], progress=False)
    before = (out / "results.json").read_text()

    @section("boom", "Fails", order=6)
    def boom(ctx):
        ctx.grid(torch.zeros(1, 1, 8, 8), "half.png")
        raise RuntimeError("boom")

    try:
        with pytest.raises(RuntimeError, match="boom"):
            run_demo(out, only=["fake_method", "boom"], progress=False)
        with pytest.raises(RuntimeError, match="boom"):
            run_demo(tmp_path / "new", only=["boom"], progress=False)
    finally:
        registry.SECTIONS.remove("boom")
    assert (out / "results.json").read_text() == before
    assert not (out / "img" / "boom").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"], "temporary or half-written output left behind"


def test_rerun_replaces_an_earlier_report(tmp_path, fake_section, missing_section):
    out = tmp_path / "r"
    run_demo(out, only=["fake_method", "missing_method"], progress=False)
    assert (out / "img" / "fake_method").is_dir()
    run_demo(out, only=["missing_method"], progress=False)
    assert not (out / "img" / "fake_method").exists()
    assert json.loads((out / "results.json").read_text())["sections"][0]["key"] == "missing_method"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_registered_in_the_main_cli():
    from steerdiff.app.cli import main

    assert "demo" in main.commands, "add `main.add_command(demo_cmd)` to steerdiff/app/cli.py _register_subcommands"


def test_terminated_run_leaves_nothing(tmp_path):
    """SIGTERM in the middle of a run removes the temporary directory; no report appears."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "r"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "steerdiff.app.cli", "demo", "--quick", "--only", "guidance",
                             "--out", str(out), "--no-progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".r.tmp-*/img/guidance/*.png")):  # the run is writing images
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == [], [p.name for p in tmp_path.iterdir()]


def test_native_thread_pools_are_capped_during_the_run_and_restored_after(tmp_path):
    """``threads`` caps numpy's, scipy's and scikit-learn's BLAS and OpenMP pools as well as torch's (their idle
    OpenBLAS threads spin and cost CPU), and every pool gets its size back when the run ends."""
    from threadpoolctl import threadpool_info, threadpool_limits

    seen = []

    @section("pool_probe", "Thread pools inside a section", order=5)
    def run(ctx):
        seen.append({(p["filepath"], p["num_threads"]) for p in threadpool_info()})
        return SectionResult("pool_probe", "", variants=[Variant("only", "only", {"nfe": 0, "wall_s": 0.0})],
                             columns=[Column("nfe", "NFE", "d")])

    try:
        with threadpool_limits(limits=2):  # a known size to come back to, on any core count
            before = {(p["filepath"], p["num_threads"]) for p in threadpool_info()}
            run_demo(tmp_path / "r", only="pool_probe", progress=False, threads=1)
            after = {(p["filepath"], p["num_threads"]) for p in threadpool_info()}
    finally:
        registry.SECTIONS.remove("pool_probe")
    during = seen[0]
    apis = {p["user_api"] for p in threadpool_info()}
    assert {"blas", "openmp"} <= apis, apis  # scipy's OpenBLAS and an OpenMP runtime are loaded by the run
    assert {n for _, n in during} == {1}, during
    assert before <= after and {n for _, n in after} == {2}, after
